"""kvxfer from Python beside kvxfer from Go (`make bench-python`).

1. The per-call cost of a chunk hand-over from Python: kvxfer_chunk with a
   fence, then kvxfer_fence_ready, each timed alone (p50/p99 in µs), on
   512-token chunks.
2. Where a Python-driven request's time goes, call by call, while the
   transfers run.
3. The same transfer driven from Python through the C ABI and from Go
   (kvxfer_bench_go: the same capi calls without the boundary), on the same
   two engines in the same process: each round runs both back to back, in
   alternating order; medians, and the median of the per-round ratios.

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


def alloc_src(ctx, prompt):
    return [ctx.alloc(g, -(-prompt // ctx.tokens_per_block)) for g in range(len(ctx.groups))]


def free_src(ctx, src):
    for g, ids in enumerate(src):
        ctx.free(g, ids)


def python_transfer(ctx, gen, prompt, iters, tag):
    """The loop of capi.BenchGo, driven through the C ABI from Python: the
    same source blocks (allocated first, freed last), the same calls."""
    tpb = ctx.tokens_per_block
    moved = 0
    src = alloc_src(ctx, prompt)
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
        rx.free_blocks()
        tx.release()
        rx.release()
    secs = time.perf_counter() - t0
    free_src(ctx, src)
    return secs, moved


def go_transfer(ctx, gen, prompt, iters):
    secs, moved = ctypes.c_double(), ctypes.c_uint64()
    st = lib.kvxfer_bench_go(ctx.handle, gen.handle, prompt, CHUNK, iters, ctypes.byref(secs), ctypes.byref(moved))
    if st != 0:
        raise kvxfer.KvxferError(st, lib.kvxfer_last_error().decode())
    return secs.value, moved.value


def per_call(ctx, gen, prompt, requests):
    """Times kvxfer_chunk (fenced) and kvxfer_fence_ready alone, per call,
    and kvxfer_receive and kvxfer_send once a request."""
    tpb = ctx.tokens_per_block
    src = alloc_src(ctx, prompt)
    chunk_ns, ready_ns, recv_ns, send_ns = [], [], [], []
    for i in range(requests):
        rid = "bench-call-%d" % i
        t0 = time.perf_counter_ns()
        rx = gen.receive(rid, prompt, ctx.instance)
        t1 = time.perf_counter_ns()
        tx = ctx.send(rid, prompt)
        t2 = time.perf_counter_ns()
        recv_ns.append(t1 - t0)
        send_ns.append(t2 - t1)
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
    free_src(ctx, src)
    return chunk_ns, ready_ns, recv_ns, send_ns


def in_flow(ctx, gen, prompt, requests):
    """Mean µs per request spent in each call of python_transfer's loop,
    while the transfers run (the calls share the CPUs with the copies)."""
    tpb = ctx.tokens_per_block
    pc = time.perf_counter
    t = dict.fromkeys(["kvxfer_receive", "kvxfer_send", "kvxfer_chunk (all chunks)", "kvxfer_fence_ready (all)",
                       "wait for DONE (poll)", "wait for READY (poll)", "kvxfer_request_free_blocks",
                       "kvxfer_request_release x2"], 0.0)
    src = alloc_src(ctx, prompt)
    for i in range(requests):
        rid = "bench-flow-%d" % i
        a = pc()
        rx = gen.receive(rid, prompt, ctx.instance)
        b = pc()
        tx = ctx.send(rid, prompt)
        c = pc()
        t["kvxfer_receive"] += b - a
        t["kvxfer_send"] += c - b
        for start in range(0, prompt, CHUNK):
            end = min(start + CHUNK, prompt)
            b0, b1 = start // tpb, -(-end // tpb)
            a = pc()
            f = tx.chunk(start, end, [(b0, ids[b0:b1]) for ids in src])
            b = pc()
            f.ready()
            c = pc()
            t["kvxfer_chunk (all chunks)"] += b - a
            t["kvxfer_fence_ready (all)"] += c - b
        a = pc()
        tx.wait()
        b = pc()
        rx.wait()
        c = pc()
        rx.free_blocks()
        d = pc()
        tx.release()
        rx.release()
        e = pc()
        t["wait for DONE (poll)"] += b - a
        t["wait for READY (poll)"] += c - b
        t["kvxfer_request_free_blocks"] += d - c
        t["kvxfer_request_release x2"] += e - d
    free_src(ctx, src)
    return {k: v / requests * 1e6 for k, v in t.items()}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] / 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Llama-3.1-8B")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200, help="requests timed per call (prompt/512 chunks each)")
    ap.add_argument("--pool-mib", type=int, default=512)
    args = ap.parse_args()
    tag = "%d-%d" % (os.getpid(), args.prompt)
    ctx, gen = engines(args, tag)
    try:
        layout = "tiny (%d B/token)" % ctx.info.bytes_per_token if args.tiny else args.model
        per_req = args.prompt * ctx.info.bytes_per_token
        # warm-up
        python_transfer(ctx, gen, args.prompt, 1, tag + "-w")
        go_transfer(ctx, gen, args.prompt, 1)

        chunk_ns, ready_ns, recv_ns, send_ns = per_call(ctx, gen, args.prompt, args.calls)
        print("Per call from Python, %s, %d-token chunks, %d calls:\n" % (layout, CHUNK, len(chunk_ns)))
        print("| call | p50 µs | p99 µs |")
        print("|---|---:|---:|")
        print("| kvxfer_chunk (fenced, runs built from a list) | %.1f | %.1f |" % (pct(chunk_ns, 50), pct(chunk_ns, 99)))
        print("| kvxfer_fence_ready | %.1f | %.1f |" % (pct(ready_ns, 50), pct(ready_ns, 99)))
        both = [a + b for a, b in zip(chunk_ns, ready_ns)]
        print("| hand-over (both) | %.1f | %.1f |" % (pct(both, 50), pct(both, 99)))
        print("| kvxfer_receive (once a request) | %.1f | %.1f |" % (pct(recv_ns, 50), pct(recv_ns, 99)))
        print("| kvxfer_send (once a request) | %.1f | %.1f |" % (pct(send_ns, 50), pct(send_ns, 99)))

        flow = in_flow(ctx, gen, args.prompt, max(args.iters, 50))
        print("\nWhere a Python-driven request's time goes, mean µs per request, during transfers:\n")
        print("| call | µs |")
        print("|---|---:|")
        for k, v in flow.items():
            print("| %s | %.1f |" % (k, v))
        print("| total | %.1f |" % sum(flow.values()))

        py, go, ratio = [], [], []
        for r in range(args.rounds):
            order = ("py", "go") if r % 2 == 0 else ("go", "py")  # neither always goes first
            got = {}
            for who in order:
                if who == "py":
                    s, b = python_transfer(ctx, gen, args.prompt, args.iters, "%s-%d" % (tag, r))
                else:
                    s, b = go_transfer(ctx, gen, args.prompt, args.iters)
                assert b == per_req * args.iters, (who, b, per_req * args.iters)
                got[who] = b / s
            py.append(got["py"])
            go.append(got["go"])
            ratio.append(got["py"] / got["go"])
        gp, gg = statistics.median(py), statistics.median(go)
        print("\nTransfer, %s, %d-token prompt (%.1f MiB) in %d-token chunks, %d requests a round, medians of %d "
              "rounds (Python and Go back to back in each, order alternating):\n"
              % (layout, args.prompt, per_req / 2**20, CHUNK, args.iters, args.rounds))
        print("| driven from | GiB/s | requests/s | Python ÷ Go (median of per-round ratios, min–max) |")
        print("|---|---:|---:|---:|")
        print("| Go (kvxfer_bench_go) | %.2f | %.0f | |" % (gg / 2**30, gg / per_req))
        print("| Python (ctypes) | %.2f | %.0f | %.2f× (%.2f–%.2f) |" % (gp / 2**30, gp / per_req,
                                                                       statistics.median(ratio), min(ratio), max(ratio)))
        assert ctx.used(0) == 0 and gen.used(0) == 0
    finally:
        ctx.close()
        gen.close()


if __name__ == "__main__":
    main()
