# kvxfer build. `make test` installs what it needs (Debian packages) first.
SHELL := /bin/bash
GO ?= go
DEB_PKGS := libzmq3-dev libucx-dev ucx-utils pkg-config protobuf-compiler \
	python3-numpy python3-torch python3-pytest python3-pip python3-setuptools python3-wheel
BENCHTIME ?= 1x
PKGS ?= ./...

.PHONY: all deps build test check fmt vet staticcheck bench demo fuzz proto

all: build

## deps: install the Debian packages the project needs, when missing.
deps:
	@missing=""; for p in $(DEB_PKGS); do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "deps: all present"; fi

build: deps
	$(GO) build $(PKGS)
	$(GO) build -o bin/kvxfer ./cmd/kvxfer

## demo: the README's run command (the main job).
demo: deps
	$(GO) build -o bin/kvxfer ./cmd/kvxfer
	./bin/kvxfer demo
	./bin/kvxfer demo --processes 2

## demo-cluster: an embedded etcd, a context TP2 (two processes) and a
## generation TP1 process discovering each other through it.
.PHONY: demo-cluster
demo-cluster: deps
	$(GO) build -o bin/kvxfer ./cmd/kvxfer
	./bin/kvxfer demo --cluster

## test: the README's test command: every package under the race
## detector (the simulator runs 200 seeds there), the simulator's 2,000
## seeds without it, then a short slice of every fuzz target.
## Tests build with the kvxfer_invariants tag: invariant checks, mutations
## and crash injection (a default build has none of them).
TESTTAGS ?= kvxfer_invariants
test: deps
	$(GO) test -race -count=1 -tags $(TESTTAGS) $(PKGS)
	$(GO) test -count=1 -tags $(TESTTAGS) ./test/sim
	$(GO) test -count=1 -tags $(TESTTAGS) ./test/sim -run '^TestSeeds$$' -suspect-partitions
	$(MAKE) --no-print-directory ctest
	$(MAKE) --no-print-directory pytest
	$(MAKE) --no-print-directory wheel-check
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZTIME_CI) FUZZTIME_SLOW=$(FUZZTIME_SLOW_CI) FUZZMINIMIZE=$(FUZZMINIMIZE_CI)

FUZZTIME ?= 2m
# CI fuzzes for a count of executions, not a duration: Go 1.26's fuzz
# coordinator can report a spurious "context deadline exceeded" when a
# duration budget ends (golang/go#75804, fixed in Go 1.27); a count has no
# deadline to race.
FUZZTIME_CI ?= 40000x
# Each new input the fuzzer finds is minimized for up to FUZZMINIMIZE (the
# go test default, 60s); the trace targets' seeds are whole traces (tens
# of KiB), whose minimization would stretch CI's slice by minutes.
FUZZMINIMIZE ?= 60s
FUZZMINIMIZE_CI ?= 3s
FUZZ_TARGETS := ./messages:FuzzDecode ./messages:FuzzDecodeSplit ./rdma/ucx:FuzzWorkerAddress \
	./rdma/ucx:FuzzDecodeMessage ./rdma/ucx:FuzzParseAddress ./rdma/ucx:FuzzParseKey ./rdma/ucx:FuzzRkey \
	./discovery:FuzzMembersPut ./capi:FuzzParseConfig ./control/zmq:FuzzListenerHandle \
	./actors:FuzzResolveRequest
# Targets whose inputs are whole files (a trace: tens of KiB, ~1 ms an
# execution), or whose every input is decoded at each of its prefixes
# (an etcd record): CI gives them a smaller count.
FUZZ_TARGETS_SLOW := ./trace:FuzzReplay ./trace:FuzzExportPerfetto ./discovery:FuzzDecodeRecord
FUZZTIME_SLOW ?= $(FUZZTIME)
FUZZTIME_SLOW_CI ?= 6000x

## fuzz: run every fuzz target for FUZZTIME each (make fuzz FUZZTIME=10m).
fuzz:
	@for t in $(FUZZ_TARGETS) $(FUZZ_TARGETS_SLOW:%=%:slow); do \
		pkg=$${t%%:*}; fn=$${t#*:}; fn=$${fn%%:*}; n=$(FUZZTIME); \
		case $$t in *:slow) n=$(FUZZTIME_SLOW);; esac; \
		echo "fuzz $$pkg $$fn for $$n"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $$n -fuzzminimizetime $(FUZZMINIMIZE) $$pkg || exit 1; \
	done

fmt:
	@out=$$(gofmt -l . ); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

staticcheck:
	$(GO) tool staticcheck $(PKGS)

## check: gofmt, vet, staticcheck, then the tests.
check: deps fmt vet staticcheck test

## bench: every testing.B benchmark once per size (BENCHTIME=1s for real figures).
bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(PKGS)

## proto: regenerate messages/pb from messages/proto/kvxfer.proto with Debian's
## protoc and the protoc-gen-go pinned as a tool in go.mod (commit the output).
proto: deps
	protoc --plugin=protoc-gen-go="$$($(GO) tool -n protoc-gen-go)" \
		--go_out=. --go_opt=module=github.com/kvxfer/kvxfer \
		messages/proto/kvxfer.proto

## sim: the deterministic simulator (test/sim) over SEEDS seeds on every core;
## prints seeds/s, fault kinds fired and race coverage per 1,000 seeds, and for
## each failing seed a command that reproduces it and the path of its trace.
## SIMFLAGS: by default the failure detector also suspects partitioned (alive)
## peers (issue 17); stalled writers and clock drift are fault kinds of every run.
SEEDS ?= 10000
SEEDBASE ?= 1
SIMFLAGS ?= -suspect-partitions
.PHONY: sim
sim:
	$(GO) test -tags $(TESTTAGS) ./test/sim -run '^TestSeeds$$' -count=1 -v -timeout 30m -seeds=$(SEEDS) -seedbase=$(SEEDBASE) $(SIMFLAGS)

## gpu-check: kvxfer's checks on one GPU (test/gpu/gpu-check.sh): discovery,
## the cudaipc conformance suite, the device-pool demo and cudaipc's
## bandwidth beside raw cuMemcpyDtoD. Exits 0 after saying so without a GPU.
.PHONY: gpu-check
gpu-check:
	GO=$(GO) test/gpu/gpu-check.sh

## lib: the C ABI, lib/libkvxfer.so (cgo -buildmode=c-shared, from
## cmd/libkvxfer) with its documented header include/kvxfer.h; fails when the
## library's exported kvxfer_* symbols and the header's declarations differ.
LIBDIR := lib
# Debian's interpreter, the one python3-numpy/-torch/-pytest install for.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
.PHONY: lib ctest pytest bench-python wheel wheel-check
# kvxfer_nonvml: package cuda without go-nvml (GPU discovery), whose
# unresolved NVML symbols a shared library cannot carry; the library needs
# only the CUDA driver, which package cuda loads with dlopen.
lib:
	$(GO) build -tags kvxfer_nonvml -buildmode=c-shared -o $(LIBDIR)/libkvxfer.so ./cmd/libkvxfer
	@rm -f $(LIBDIR)/libkvxfer.h
	@diff <(nm -D --defined-only $(LIBDIR)/libkvxfer.so | awk '$$3 ~ /^kvxfer_/ {print $$3}' | sort) \
		<(grep -oE '\bkvxfer_[a-z_]+\(' include/kvxfer.h | tr -d '(' | sort -u) \
		|| { echo "lib: libkvxfer.so exports (<) and include/kvxfer.h declares (>) differ"; exit 1; }
	@echo "lib: $(LIBDIR)/libkvxfer.so, include/kvxfer.h (ABI $$(sed -n 's/^#define KVXFER_ABI_VERSION //p' include/kvxfer.h))"

## ctest: the C ABI's test program (test/c) against lib/libkvxfer.so, then
## again on cuda/cudatest's fake CUDA driver (layer parts behind CUDA events),
## then over a library that moves a goroutine's stack at every call
## (runtime.mayMoreStackMove): a C value the library holds as a Go pointer
## and that is none (a callback's user data, an empty array's dangling
## pointer) aborts that run at once, where a plain build aborts only now and
## then. cmd/libkvxfer itself is built there without optimisation (-N -l),
## so that every local it has lives on the stack the move checks: an
## optimised build keeps many in registers, and only now and then not.
ctest: lib
	$(CC) -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude -o $(LIBDIR)/kvxfer_test test/c/kvxfer_test.c \
		-L$(LIBDIR) -lkvxfer -lpthread -ldl -Wl,-rpath,'$$ORIGIN'
	$(LIBDIR)/kvxfer_test
	@mkdir -p $(LIBDIR)/fakecuda
	$(CC) -shared -fPIC -O2 -Wall -o $(LIBDIR)/fakecuda/libcuda.so.1 cuda/cudatest/csrc/fakecuda.c -lpthread
	KVXFER_LIBCUDA=$(CURDIR)/$(LIBDIR)/fakecuda/libcuda.so.1 FAKECUDA_COPY_DELAY_US=2000 $(LIBDIR)/kvxfer_test
	@mkdir -p $(LIBDIR)/stackmove
	$(GO) build -tags kvxfer_nonvml -buildmode=c-shared -gcflags=all=-d=maymorestack=runtime.mayMoreStackMove \
		'-gcflags=./cmd/libkvxfer=-N -l -d=maymorestack=runtime.mayMoreStackMove' \
		-o $(LIBDIR)/stackmove/libkvxfer.so ./cmd/libkvxfer
	@rm -f $(LIBDIR)/stackmove/libkvxfer.h
	$(CC) -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude -o $(LIBDIR)/stackmove/kvxfer_test test/c/kvxfer_test.c \
		-L$(LIBDIR)/stackmove -lkvxfer -lpthread -ldl -Wl,-rpath,'$$ORIGIN'
	$(LIBDIR)/stackmove/kvxfer_test

## pytest: the Python package (python/kvxfer) over lib/libkvxfer.so.
pytest: lib
	cd python && KVXFER_LIB=../$(LIBDIR)/libkvxfer.so $(PYTHON) -m pytest -q tests

## wheel: the Python package as a wheel with lib/libkvxfer.so inside,
## dist/kvxfer-VERSION-py3-none-linux_ARCH.whl (pip install it; the system
## needs libzmq and UCX at run time, as the library does).
WHEELDIR := build/wheel
wheel: lib
	@rm -rf $(WHEELDIR) && mkdir -p $(WHEELDIR) dist
	cp -r python/kvxfer python/pyproject.toml python/setup.py python/README.md $(WHEELDIR)/
	rm -rf $(WHEELDIR)/kvxfer/__pycache__
	cp $(LIBDIR)/libkvxfer.so $(WHEELDIR)/kvxfer/
	rm -f dist/kvxfer-*.whl
	cd $(WHEELDIR) && PIP_ROOT_USER_ACTION=ignore $(PYTHON) -m pip wheel -q --no-deps --no-build-isolation --no-index -w $(CURDIR)/dist .
	@ls dist/kvxfer-*.whl

## wheel-check: installs the wheel into an empty directory and runs
## python/wheel_smoke.py from outside the repository, without KVXFER_LIB:
## the package must load the library it carries and move a request.
wheel-check: wheel
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	PIP_ROOT_USER_ACTION=ignore $(PYTHON) -m pip install -q --no-deps --no-index --target "$$tmp/site" dist/kvxfer-*.whl && \
	cp python/wheel_smoke.py "$$tmp/" && cd "$$tmp" && \
	env -u KVXFER_LIB WHEEL_SMOKE_DIR="$$tmp/site" PYTHONPATH="$$tmp/site" $(PYTHON) wheel_smoke.py

## bench-python: per-call cost of a chunk hand-over from Python (p50/p99)
## and a Python-driven transfer beside the same transfer driven from Go, in
## one process (512-token chunks).
bench-python: lib
	cd python && KVXFER_LIB=../$(LIBDIR)/libkvxfer.so $(PYTHON) bench_kvxfer.py
