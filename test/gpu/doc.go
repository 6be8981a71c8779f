// Package gpu holds kvxfer's checks that need a GPU, run by make gpu-check
// (gpu-check.sh): device discovery, the device-pool demo (two engines,
// device pools, event fences, the cudaipc backend, bytes verified on the
// device) and the device-to-device bandwidth of cudaipc beside a raw
// cuMemcpyDtoD of the same size, and a chunk handed over through capi (the
// C ABI's kvxfer_chunk_cuda) behind a borrowed CUDA event. Without a GPU
// every check skips, saying why; TestFakeDriver then runs the demo and the
// CUDA-event chunk against the fake driver of cuda/cudatest, so that their
// logic is exercised everywhere.
package gpu
