"""kvxfer from Python beside kvxfer from Go (`make bench-python`).

1. The per-call cost of a chunk hand-over from Python: kvxfer_chunk with a
   fence, then kvxfer_fence_ready, each timed alone (p50/p99 in µs), on
   512-token chunks.
2. The same transfer driven from Python through the C ABI and from Go
   (kvxfer_bench_go: the same capi calls without the boundary), on the same
   two engines in the same process, alternating rounds; the median of each.

Prints both as Markdown tables. Options: --rounds, --iters, --prompt,
--model, --tiny (a 1 KiB/token layout where per-call cost dominates).
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kvxfer  # noqa: E402
from kvxfer import Outcome  # noqa: E402
from kvxfer._lib import lib  # noqa: E402
from kvxfer.core import _runs  # noqa: E402

CHUNK = 512


def engines(args, tag):
    cfg = {"transfer_timeout_ms": 60000, "pool_bytes": args.pool_mib << 20}
    if args.tiny:
        cfg["layout"] = {"name": "tiny", "layers": 4, "kv_heads": 2, "head_dim": 32, "dtype_bytes": 2,
                         "tokens_per_block": 16}
    else:
        cfg["model"] = args.model
    ctx = kvxfer.Engine(dict(cfg, instance="bench-ctx-" + tag))
    gen = kvxfer.Engine(dict(cfg, instance="bench-gen-" + tag))
    return ctx, gen


def python_transfer(ctx, gen, src, prompt, iters, tag):
    """The loop of capi.BenchGo, driven through the C ABI from Python."""
    tpb = ctx.tokens_per_block
    moved = 0
    t0 = time.perf_counter()
    for i in range(iters):
        rid = "bench-py-%s-%d" % (tag, i)
        rx = gen.receive(rid, prompt, ctx.instance)
        tx = ctx.send(rid, prompt)
        for start in range(0, prompt, CHUNK):
            end = min(start + CHUNK, prompt)
            b0, b1 = start // tpb, -(-end // tpb)
            tx.chunk(start, end, [(b0, ids[b0:b1]) for ids in src]).ready()
        tx.wait()
        ev = rx.wait()
        if ev.outcome != Outcome.READY:
            raise RuntimeError("request %s: %s %s" % (rid, ev.outcome.name, rx.error_message()))
        moved += ev.bytes
        for g in range(len(src)):
            gen.free(g, rx.blocks(g)[1])
        tx.release()
        rx.release()
    return time.perf_counter() - t0, moved


def go_transfer(ctx, gen, prompt, iters):
    secs, moved = ctypes.c_double(), ctypes.c_uint64()
    st = lib.kvxfer_bench_go(ctx.handle, gen.handle, prompt, CHUNK, iters, ctypes.byref(secs), ctypes.byref(moved))
    if st != 0:
        raise kvxfer.KvxferError(st, lib.kvxfer_last_error().decode())
    return secs.value, moved.value


def per_call(ctx, gen, src, prompt, requests):
    """Times kvxfer_chunk (fenced) and kvxfer_fence_ready alone, per call."""
    tpb = ctx.tokens_per_block
    chunk_ns, ready_ns = [], []
    for i in range(requests):
        rid = "bench-call-%d" % i
        rx = gen.receive(rid, prompt, ctx.instance)
        tx = ctx.send(rid, prompt)
        for start in range(0, prompt, CHUNK):
            end = min(start + CHUNK, prompt)
            b0, b1 = start // tpb, -(-end // tpb)
            runs = [(b0, ids[b0:b1]) for ids in src]
            t0 = time.perf_counter_ns()
            arr, keep = _runs(runs)
            f = tx.chunk_raw(start, end, end == prompt, arr, len(runs), True, keep)
            t1 = time.perf_counter_ns()
            f.ready()
            t2 = time.perf_counter_ns()
            chunk_ns.append(t1 - t0)
            ready_ns.append(t2 - t1)
        tx.wait()
        rx.wait()
        for g in range(len(src)):
            gen.free(g, rx.blocks(g)[1])
        tx.release()
        rx.release()
    return chunk_ns, ready_ns


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] / 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Llama-3.1-8B")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200, help="requests timed per call (prompt/512 chunks each)")
    ap.add_argument("--pool-mib", type=int, default=512)
    args = ap.parse_args()
    tag = "%d-%d" % (os.getpid(), args.prompt)
    ctx, gen = engines(args, tag)
    try:
        src = [ctx.alloc(g, -(-args.prompt // ctx.tokens_per_block)) for g in range(len(ctx.groups))]
        layout = "tiny (%d B/token)" % ctx.info.bytes_per_token if args.tiny else args.model
        per_req = args.prompt * ctx.info.bytes_per_token
        # warm-up
        python_transfer(ctx, gen, src, args.prompt, 1, tag + "-w")
        go_transfer(ctx, gen, args.prompt, 1)

        chunk_ns, ready_ns = per_call(ctx, gen, src, args.prompt, args.calls)
        print("Per call from Python, %s, %d-token chunks, %d calls:\n" % (layout, CHUNK, len(chunk_ns)))
        print("| call | p50 µs | p99 µs |")
        print("|---|---:|---:|")
        print("| kvxfer_chunk (fenced, runs built from a list) | %.1f | %.1f |" % (pct(chunk_ns, 50), pct(chunk_ns, 99)))
        print("| kvxfer_fence_ready | %.1f | %.1f |" % (pct(ready_ns, 50), pct(ready_ns, 99)))
        both = [a + b for a, b in zip(chunk_ns, ready_ns)]
        print("| hand-over (both) | %.1f | %.1f |" % (pct(both, 50), pct(both, 99)))

        py, go = [], []
        for r in range(args.rounds):
            s, b = python_transfer(ctx, gen, src, args.prompt, args.iters, "%s-%d" % (tag, r))
            assert b == per_req * args.iters, (b, per_req * args.iters)
            py.append(b / s)
            s, b = go_transfer(ctx, gen, args.prompt, args.iters)
            assert b == per_req * args.iters, (b, per_req * args.iters)
            go.append(b / s)
        gp, gg = statistics.median(py), statistics.median(go)
        print("\nTransfer, %s, %d-token prompt (%.1f MiB) in %d-token chunks, %d requests a round, median of %d "
              "alternating rounds:\n" % (layout, args.prompt, per_req / 2**20, CHUNK, args.iters, args.rounds))
        print("| driven from | GiB/s | requests/s | Python ÷ Go |")
        print("|---|---:|---:|---:|")
        print("| Go (kvxfer_bench_go) | %.2f | %.0f | |" % (gg / 2**30, gg / per_req))
        print("| Python (ctypes) | %.2f | %.0f | %.2f× |" % (gp / 2**30, gp / per_req, gp / gg))
        for g in range(len(src)):
            ctx.free(g, src[g])
    finally:
        ctx.close()
        gen.close()


if __name__ == "__main__":
    main()
