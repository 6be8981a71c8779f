// Package cuda is kvxfer's GPU side: device discovery and topology
// through NVML (go-nvml), and the CUDA driver API loaded at run time —
// device memory for a block pool, streams and copies, events as readiness
// fences, and IPC handles that back the intra-node GPU-to-GPU data plane
// (rdma/cudaipc). No CUDA toolkit is needed to build.
//
// # Loading
//
// Init opens libcuda.so.1 (or $KVXFER_LIBCUDA) with dlopen, resolves the
// ~30 entry points the package uses (declared here, no CUDA header), and
// calls cuInit — once per process; every entry point calls it. A machine
// without the library, without a device or with too old a driver gets an
// error wrapping ErrNoDevice that says which, never a crash. Discover
// loads libnvidia-ml.so.1 the same way through go-nvml: its absence is
// ErrNoDevice ("no NVIDIA driver"). Builds without cgo compile and report
// ErrNoDevice everywhere.
//
// # Contexts and goroutines
//
// A Device retains its primary context. Every driver call is a C wrapper
// that makes the context current on the calling thread and then calls the
// driver, in one cgo call, so any goroutine may use any Device, Memory,
// Stream or Event without locking OS threads. They are safe for concurrent
// use; Close methods are idempotent, and an object must not be used by
// anyone once it is closed (calls after Close return ErrClosed, but a call
// racing Close is the caller's bug).
//
// Synchronous copies (Device.CopyHtoD, CopyDtoH, CopyDtoD) return once the
// bytes landed. Stream copies are asynchronous: the stream runs its work in
// order; a host buffer handed to one must stay unchanged and alive until
// the copy completed. Streams are non-blocking: they do not synchronise
// with the legacy default stream.
//
// # Fences and the poller
//
// A Fence says when a producer's writes are done: OnReady(f) calls f
// exactly once, from any goroutine, with nil or the producer's error — the
// shape of the engine's actors.Fence, which both fences here satisfy
// without this package importing actors. An EventFence is a CUDA event
// recorded on a stream; a HostFence is fired by hand (the host fallback);
// a BorrowedFence (WatchEvent) watches an event the caller created and
// owns — a framework's, e.g. a recorded torch.cuda.Event's cuda_event
// handle — which the package queries and never records or destroys: the
// caller keeps it alive, and does not record it again, until the fence
// fired or Release returned.
//
// Nobody blocks on an event. One Poller goroutine per process
// (DefaultPoller) queries every outstanding event with cuEventQuery, each
// pass, and runs the callbacks of those that completed; after a pass that
// completed nothing it sleeps DefaultPollInterval (50 µs). A pass costs
// one non-blocking driver call (expected under 1 µs; make gpu-check
// measures it) per outstanding fence and per busy Queue — a Queue is an
// ordered sequence of waits of one stream, of which only the head is
// queried — so k outstanding waits cost about k µs of CPU per 50 µs, and a
// completion is seen at most one interval (plus the scheduler's wake-up)
// after it happened. With nothing outstanding the goroutine exits.
// Callbacks run on the poller goroutine, one at a time: they must not
// block.
//
// # Device pools
//
// Device.NewRegion allocates device memory and returns it as a
// kvcache.Region of kind DeviceMem (Bytes() is nil: the CPU cannot address
// it), with the Memory that owns it; Device.NewPool carves a kvcache.Pool
// from such a region. Register the region with a GPU-capable rdma backend
// (rdma/cudaipc); the host backends refuse device memory.
//
// # Tests
//
// The package's tests run against a fake driver library
// (cuda/cudatest: host memory, one thread per stream) unless
// $KVXFER_LIBCUDA names a library, so they run everywhere a C compiler
// does; KVXFER_LIBCUDA=libcuda.so.1 runs them on the real GPU.
package cuda
