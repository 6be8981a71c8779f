"""test_vllm_gpu_layouts.py's child: one side over a fake-CUDA cross-layer KV cache in a vLLM
backend's HND order, given to a node as kv_memory of strided views."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import kvxfer  # noqa: E402
from fakecuda import DeviceTensor, Driver  # noqa: E402

L, H, D, BS, NB = 4, 2, 8, 16, 16
ORDERS = {"FA": ((2, NB, BS, H, D), (2, 4, 0, 1, 3, 5)), "FI": ((NB, 2, BS, H, D), (1, 2, 4, 0, 3, 5))}


class Strided(DeviceTensor):
    def __init__(self, shape, stride, addr, index):
        super().__init__(shape, addr, index)
        self._stride = tuple(stride)

    def is_contiguous(self):
        return False


def logical_views(backend, t):
    """Per-layer (2, nb, bs, H, D) views of the physical tensor t."""
    shape, order = ORDERS[backend]
    inv = [order.index(i) for i in range(6)]
    per = t.permute(*inv)
    if backend == "FI":
        per = per.permute(0, 2, 1, 3, 4, 5)
    return per


def main():
    a = json.loads(sys.argv[1])
    backend, dev = a["backend"], a.get("device", 0)
    drv = Driver(a["cuda"], dev)
    shape, order = ORDERS[backend]
    physical = tuple(((L,) + shape)[i] for i in order)
    nbytes = 2 * L * NB * 2 * BS * H * D
    base = drv.alloc(nbytes)
    host = torch.zeros(physical, dtype=torch.bfloat16)
    per = logical_views(backend, host)  # (L, 2, NB, BS, H, D)
    views = []
    for i in range(L):
        v = per[i]
        off = (v.data_ptr() - host.data_ptr())
        views.append(Strided(v.shape, v.stride(), base + off, dev))
    cfg = dict(a["config"], layout={"layers": L, "kv_heads": H, "head_dim": D, "dtype_bytes": 2,
                                    "tokens_per_block": BS}, memory=kvxfer.kv_memory("nhd", views))
    node = kvxfer.Node(cfg)
    node.alloc(0, node.groups[0].blocks)
    g = torch.Generator().manual_seed(7)
    truth = torch.randn((L, 2, 3, BS, H, D), generator=g).to(torch.bfloat16)
    out = {"role": a["role"]}
    ok = False
    try:
        node.wait_peers(20000)
        if a["role"] == "ctx":
            src = [9, 2, 14]
            for b, blk in enumerate(src):
                per[:, :, blk] = truth[:, :, b]
            drv.htod(base, host.view(torch.int8).numpy().tobytes())
            tx = node.send("rv-gpu", 40)
            tx.chunk(0, 40, [(0, src)]).ready()
            ev = tx.wait(30)
            out["outcome"] = ev.outcome.name
            ok = ev.outcome.name == "DONE"
            tx.release()
        else:
            dst = [1, 12, 5]
            rx = node.receive("rv-gpu", 40, a["context"], blocks=[dst])
            ev = rx.wait(30)
            out["outcome"] = ev.outcome.name
            ok = ev.outcome == kvxfer.Outcome.READY
            raw = drv.dtoh(base, nbytes)
            got = torch.frombuffer(bytearray(raw), dtype=torch.int8).view(torch.bfloat16).view(physical)
            gp = logical_views(backend, got)
            bad = []
            for b, blk in enumerate(dst):
                for t in range(BS if b < 2 else 40 - 2 * BS):
                    if not torch.equal(gp[:, :, blk, t], truth[:, :, b, t]):
                        bad.append((b, t))
            out["bad"] = bad[:5]
            ok = ok and not bad
            rx.release()
    finally:
        node.close(10000)
    print(json.dumps(out), flush=True)
    sys.exit(0 if ok else 1)


main()
