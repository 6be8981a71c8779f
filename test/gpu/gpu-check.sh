#!/usr/bin/env bash
# gpu-check: kvxfer's checks on one GPU, in under five minutes.
#
#   1. discovery: kvxfer info (GPUs, CUDA driver, UCX, backends);
#   2. the rdma conformance suite on cudaipc, plus its cross-process,
#      registration and no-late-write tests, package cuda's unit tests, and
#      node's cudaipc tests (two processes, GPU to GPU, bytes verified) with
#      the ctx/gen roles, all on the real driver;
#   3. the demo: two engines with device pools and event fences, every
#      byte verified on the device; and a chunk handed over through the C
#      ABI's Go layer (capi) behind a borrowed CUDA event recorded after a
#      memset, its bytes verified;
#   4. device-to-device bandwidth of cudaipc beside a raw cuMemcpyDtoD of
#      the same size, with their ratio; and the cost of one cuEventQuery
#      (the event poller's cost per outstanding wait and pass).
#
# Without a usable GPU it prints why after step 1 and exits 0. Self-contained:
# run from anywhere with the repository and Go (it runs `make deps` first
# unless GPU_CHECK_SKIP_DEPS=1). GO overrides the go binary; BENCHTIME the
# iterations per bandwidth measurement (default 100x).
set -euo pipefail

cd "$(dirname "$0")/../.."
GO=${GO:-go}
BENCHTIME=${BENCHTIME:-100x}
START=$SECONDS

step() { printf '\n== gpu-check: %s (%ds)\n' "$1" $((SECONDS - START)); }

# run_tests PKG RUN SKIP [ENV...]: go test -v -run RUN -skip SKIP; fails
# when a test fails or skips (on a GPU nothing may skip).
run_tests() {
	local pkg=$1 run=$2 skip=$3 out
	shift 3
	out=$(mktemp)
	if ! env "$@" timeout 240 "$GO" test -count=1 -v -timeout 4m -run "$run" -skip "$skip" "$pkg" >"$out" 2>&1; then
		cat "$out"
		rm -f "$out"
		echo "gpu-check: FAIL: $pkg -run '$run'" >&2
		exit 1
	fi
	grep -E -e '^\s*--- (PASS|FAIL|SKIP)' -e '^(ok|FAIL)\s' -e 'demo:' "$out" || true
	if grep -q -e '--- SKIP' "$out"; then
		grep -A2 -e '--- SKIP' "$out"
		rm -f "$out"
		echo "gpu-check: FAIL: $pkg: a GPU test skipped" >&2
		exit 1
	fi
	rm -f "$out"
}

if [ "${GPU_CHECK_SKIP_DEPS:-0}" != 1 ]; then
	step "deps"
	make --no-print-directory deps
fi

step "build"
mkdir -p bin
"$GO" build -o bin/kvxfer ./cmd/kvxfer

step "1/4 discovery: kvxfer info"
bin/kvxfer info
if ! why=$(bin/kvxfer info --require-gpu 2>&1 >/dev/null); then
	printf '\ngpu-check: no GPU present (%s): skipping the GPU checks.\n' "${why#Error: }"
	exit 0
fi
run_tests ./test/gpu '^TestDiscovery$' '^$'

step "2/4 conformance: rdma/cudaipc and package cuda on the real driver"
run_tests ./rdma/cudaipc '^(TestConformance|TestCrossProcess|TestRegister|TestSubRegion|TestCloseNoLateWrite)$' '^$'
run_tests ./cuda '.' '^TestInitNoDevice$' KVXFER_LIBCUDA=libcuda.so.1 # that one needs the fake driver
# a node over cudaipc: two processes, device pools and framework memory, refusals; the ctx/gen roles
run_tests ./node '^TestCUDAIPC' '^$' KVXFER_LIBCUDA=libcuda.so.1
run_tests ./internal/proc '^TestCUDAIPCRoles$' '^$' KVXFER_LIBCUDA=libcuda.so.1

step "3/4 demo: device pools, event fences, cudaipc, bytes verified; a chunk behind a borrowed CUDA event"
run_tests ./test/gpu '^(TestDemo|TestChunkBehindCUDAEvent)$' '^$'

step "4/4 bandwidth: cudaipc beside raw cuMemcpyDtoD"
bench=$(timeout 240 "$GO" test -count=1 -run '^$' -bench '^BenchmarkDtoD$' -benchtime "$BENCHTIME" -timeout 4m ./test/gpu 2>&1 &&
	timeout 60 "$GO" test -count=1 -run '^$' -bench '^BenchmarkEventQuery$' -benchtime 1s ./test/gpu 2>&1) || {
	echo "$bench"
	echo "gpu-check: FAIL: bandwidth benchmark" >&2
	exit 1
}
echo "$bench" | grep -E '^Benchmark'
echo
echo "$bench" | awk '
	/^BenchmarkDtoD\/size=/ {
		split($1, p, "/"); size = substr(p[2], 6); kind = p[3]; sub(/-[0-9]+$/, "", kind)
		for (i = 2; i < NF; i++) if ($(i + 1) == "MB/s") bw[size, kind] = $i
		if (!(size in seen)) { seen[size] = 1; order[n++] = size }
	}
	END {
		printf "%-8s %14s %14s %8s\n", "size", "raw GB/s", "cudaipc GB/s", "ratio"
		for (i = 0; i < n; i++) {
			s = order[i]; r = bw[s, "raw"]; c = bw[s, "cudaipc"]
			printf "%-8s %14.1f %14.1f %8.2f\n", s, r / 1000, c / 1000, (r > 0 ? c / r : 0)
		}
	}'

printf '\ngpu-check: all GPU checks passed in %ds.\n' $((SECONDS - START))
