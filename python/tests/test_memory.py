"""The framework's own KV tensors as kvxfer memory (kv_memory): vLLM NHD
torch tensors on the prefill side, HND ones on the decode side."""

import numpy as np
import pytest
import torch

import kvxfer
from kvxfer import KvxferError, Outcome, Status

from conftest import small_config, unique

# The tiny layout of conftest: 4 layers, 2 KV heads, head size 8, bf16,
# 16 tokens per block.
LAYERS, HEADS, HEAD, TPB = 4, 2, 8, 16


def engine(instance, kind, caches):
    cfg = small_config(instance, memory=kvxfer.kv_memory(kind, caches))
    del cfg["pool_bytes"]
    return kvxfer.Engine(cfg, kv_caches=caches)


def test_vllm_nhd_tensors_into_hnd_tensors():
    """Per-layer NHD tensors [2, num_blocks, block_size, heads, head_dim] on
    the context side, HND [2, num_blocks, heads, block_size, head_dim] on the
    generation side, separate allocations per layer; every element of the
    framework's destination blocks equals the source's, and nothing else is
    written."""
    nblocks, prompt = 24, 150
    n = -(-prompt // TPB)
    src = [torch.zeros((2, nblocks, TPB, HEADS, HEAD), dtype=torch.bfloat16) for _ in range(LAYERS)]
    dst = [torch.zeros((2, nblocks, HEADS, TPB, HEAD), dtype=torch.bfloat16) for _ in range(LAYERS)]
    before = kvxfer.handle_count()
    ctx, gen = engine(unique("ctx"), "nhd", src), engine(unique("gen"), "hnd", dst)
    try:
        src_ids = ctx.alloc(0, n)
        dst_ids = [nblocks - 1 - 2 * i for i in range(n)]  # the framework's own
        torch.manual_seed(11)
        truth = torch.randn((LAYERS, 2, prompt, HEADS, HEAD)).to(torch.bfloat16)
        for i in range(LAYERS):
            for t in range(prompt):
                src[i][:, src_ids[t // TPB], t % TPB] = truth[i, :, t]
        rx = gen.receive("mem-1", prompt, ctx.instance, blocks=[dst_ids])
        tx = ctx.send("mem-1", prompt)
        for start in range(0, prompt, 64):
            end = min(start + 64, prompt)
            b0, b1 = start // TPB, -(-end // TPB)
            tx.chunk(start, end, [(b0, src_ids[b0:b1])]).ready()
        ev = tx.wait()
        assert ev.outcome == Outcome.DONE and ev.error == Status.OK, ev
        ev = rx.wait()
        assert ev.outcome == Outcome.READY, (ev, rx.error_message())
        assert rx.blocks(0) == (0, dst_ids)
        compared = 0
        for i in range(LAYERS):
            for t in range(prompt):
                got = dst[i][:, dst_ids[t // TPB], :, t % TPB]  # [2, heads, head_dim]
                assert torch.equal(got, truth[i, :, t]), "layer %d token %d" % (i, t)
                compared += got.numel()
            others = [b for b in range(nblocks) if b not in dst_ids]
            assert torch.count_nonzero(dst[i][:, others]) == 0, "layer %d: a block outside the request written" % i
        assert compared == LAYERS * 2 * prompt * HEADS * HEAD
        tx.release()
        rx.release()
        ctx.free(0, src_ids)
        assert ctx.used(0) == 0 and gen.used(0) == 0
    finally:
        ctx.close()
        gen.close()
    assert kvxfer.handle_count() == before


def test_kv_memory_refuses_what_it_cannot_describe():
    t = torch.zeros((2, 4, TPB, HEADS, HEAD), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kind"):
        kvxfer.kv_memory("nchw", [t])
    with pytest.raises(ValueError, match="dimensions"):
        kvxfer.kv_memory("split_kv", [t])
    with pytest.raises(ValueError, match=r"layers\[1\] has different strides from layers\[0\]"):
        # Same shape, HND storage: the strides differ.
        kvxfer.kv_memory("nhd", [t, torch.zeros((2, 4, HEADS, TPB, HEAD), dtype=torch.bfloat16).transpose(2, 3)])
    # A reversed view (negative strides, NumPy's [::-1]) is named, not
    # passed on for the library to refuse as a JSON type error.
    rev = np.zeros((2, 4, TPB, HEADS, HEAD), dtype=np.float16)[:, ::-1]
    with pytest.raises(ValueError, match=r"layers\[0\] has a negative stride .* in dimension 1"):
        kvxfer.kv_memory("nhd", [rev])
    # Too few layers for the rank: the library names the count.
    cfg = small_config(unique("bad"), memory=kvxfer.kv_memory("nhd", [t]))
    del cfg["pool_bytes"]
    with pytest.raises(KvxferError, match="1 addresses, rank"):
        kvxfer.Engine(cfg, kv_caches=[t])


def test_kv_memory_refuses_layers_unlike_layer_0():
    """Every layer's tensor (V tensors too) must have layer 0's shape,
    dtype and strides: a layer of 2 blocks among layers of 64 has the same
    strides, and would be written past its end (num_blocks comes from layer
    0). The first that differs is named with both shapes."""
    k = [torch.zeros((64, TPB, HEADS, HEAD), dtype=torch.bfloat16) for _ in range(LAYERS)]
    v = [torch.zeros((64, TPB, HEADS, HEAD), dtype=torch.bfloat16) for _ in range(LAYERS)]
    short = torch.zeros((2, TPB, HEADS, HEAD), dtype=torch.bfloat16)
    assert short.stride() == k[0].stride()
    for layers, v_layers, needle in [
        (k[:3] + [short], v, r"layers\[3\] is of shape \(2, 16, 2, 8\), layers\[0\] of \(64, 16, 2, 8\)"),
        (k, v[:2] + [short] + v[3:], r"v_layers\[2\] is of shape \(2, 16, 2, 8\), layers\[0\] of \(64, 16, 2, 8\)"),
        (k[:1] + [k[1].to(torch.float16)] + k[2:], v, r"layers\[1\] is torch.float16, layers\[0\] torch.bfloat16"),
    ]:
        with pytest.raises(ValueError, match=needle):
            kvxfer.kv_memory("split_kv", layers, v_layers)
    a = np.zeros((2, 8, TPB, HEADS, HEAD), np.float16)
    with pytest.raises(ValueError, match=r"layers\[1\] is of shape \(2, 4, 16, 2, 8\), "
                                         r"layers\[0\] of \(2, 8, 16, 2, 8\)"):
        kvxfer.kv_memory("nhd", [a, np.zeros((2, 4, TPB, HEADS, HEAD), np.float16)])


def test_tensors_of_another_dtype_are_refused():
    """float32 tensors under the layout's dtype_bytes 2 would get half of
    each element: the engine refuses them, naming both sizes."""
    dst = [torch.zeros((2, 8, TPB, HEADS, HEAD), dtype=torch.float32) for _ in range(LAYERS)]
    assert kvxfer.kv_memory("nhd", dst)["dtype_bytes"] == 4
    before = kvxfer.handle_count()
    with pytest.raises(KvxferError) as e:
        engine(unique("f32"), "nhd", dst)
    assert e.value.status == Status.CONFIG
    assert "memory.dtype_bytes = 4" in e.value.message and "dtype_bytes is 2" in e.value.message, e.value.message
    assert kvxfer.handle_count() == before
