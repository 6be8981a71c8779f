"""Moving one prompt between two in-process engines whose KV caches are in
kvxfer's own block layout (one pool) or in vLLM's FlashAttention HND
cross-layer order (block, head, layer, K/V, token, dim: strided
descriptors), side by side, alternating rounds; medians.

    make lib && cd python && KVXFER_LIB=../lib/libkvxfer.so python3 bench_layouts.py [rounds]
"""
import statistics
import sys
import time

import torch
import kvxfer
from kvxfer.connector import _nhd_views

L, H, D, T = 32, 8, 128, 16
NB, PROMPT = 160, 2048
ORDER = (2, 4, 0, 1, 3, 5)  # FlashAttention HND, with the layers dimension

def layout(inst):
    return {"instance": inst, "workers": 4, "transfer_timeout_ms": 60000,
            "layout": {"layers": L, "kv_heads": H, "head_dim": D, "dtype_bytes": 2, "tokens_per_block": T}}

def native(inst):
    t = torch.zeros((NB, L, 2, H, T, D), dtype=torch.bfloat16)
    cfg = layout(inst); cfg["pool_bytes"] = t.numel() * 2
    return kvxfer.Engine(cfg, memory=t), t

def strided(inst):
    logical = (L, 2, NB, T, H, D)
    phys = tuple(logical[i] for i in ORDER)
    cross = torch.zeros(phys, dtype=torch.bfloat16)
    lg = cross.permute(*[ORDER.index(i) for i in range(6)])
    kind, views = _nhd_views([lg[i] for i in range(L)])
    cfg = layout(inst); cfg["memory"] = kvxfer.kv_memory(kind, views)
    return kvxfer.Engine(cfg), cross

def run(make, n, tag):
    ctx, a = make("sb-ctx-" + tag); gen, b = make("sb-gen-" + tag)
    a.normal_()
    for e in (ctx, gen):
        for g, gi in enumerate(e.groups):
            e.alloc(g, gi.blocks)
    nb = PROMPT // T
    src = list(range(nb)); dst = list(range(NB - nb, NB))
    times = []
    for i in range(n):
        rid = "%s-%d" % (tag, i)
        rx = gen.receive(rid, PROMPT, ctx.instance, blocks=[dst])
        t0 = time.perf_counter()
        tx = ctx.send(rid, PROMPT)
        tx.chunk(0, PROMPT, [(0, src)], fenced=False)
        ev = rx.wait(60); times.append(time.perf_counter() - t0)
        assert ev.outcome.name == "READY", (ev, rx.error_message())
        tx.wait(60)
    ctx.close(); gen.close()
    return times

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
mb = L * 2 * H * T * D * 2 * (PROMPT // T) / 2**20
res = {"native": [], "fa-hnd": []}
for r in range(rounds):
    res["native"] += run(native, 3, "n%d" % r)
    res["fa-hnd"] += run(strided, 3, "s%d" % r)
for k, v in res.items():
    print("%-7s %d MiB: median %.1f ms (%.2f GB/s), range %.1f-%.1f ms" % (k, mb, statistics.median(v) * 1e3,
          mb * 2**20 / statistics.median(v) / 1e9, min(v) * 1e3, max(v) * 1e3))
print("fa-hnd / native: %.2fx" % (statistics.median(res["fa-hnd"]) / statistics.median(res["native"])))
