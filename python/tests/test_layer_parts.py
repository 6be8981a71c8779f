"""Chunks handed in layer parts (Request.chunk's layers=, kvxfer_chunk_layers),
as vLLM's save_kv_layer produces them."""

import ctypes

import numpy as np
import pytest

import kvxfer
from kvxfer import KvxferError, LayerPart, Outcome, Status

from conftest import small_config, unique

# The tiny layout of conftest: 4 layers in one layer group, so that layer L
# of a block is its L-th quarter (a block is ordered layer, part, head,
# token, dim).
LAYERS, TPB = 4, 16


class Pool:
    """A context engine over a NumPy pool, writing layers of its blocks."""

    def __init__(self, engine, arr):
        self.engine, self.arr = engine, arr
        self.g = engine.groups[0]
        self.per = self.g.block_bytes // LAYERS

    def write(self, block, layers, rng):
        """Random bytes into layers [lo, hi) of pool block `block`."""
        lo, hi = layers
        at = self.g.offset + block * self.g.block_bytes
        self.arr[at + lo * self.per:at + hi * self.per] = rng.integers(0, 256, (hi - lo) * self.per, dtype=np.uint8)

    def block(self, block):
        at = self.g.offset + block * self.g.block_bytes
        return bytes(self.arr[at:at + self.g.block_bytes])


@pytest.fixture
def layered():
    """A context engine over a zeroed NumPy pool and a generation engine."""
    before = kvxfer.handle_count()
    arr = np.zeros(1 << 20, dtype=np.uint8)
    ctx = kvxfer.Engine(small_config(unique("ctx")), memory=arr)
    gen = kvxfer.Engine(small_config(unique("gen")))
    yield Pool(ctx, arr), gen
    ctx.close()
    gen.close()
    assert kvxfer.handle_count() == before


def test_chunks_in_layer_parts(layered):
    """Every chunk leaves in uneven layer parts, each handed before its
    layers are written and fenced once they are (one chunk through
    chunk_raw, one whole through (0, 0, 0)); both sides finish with exactly
    the prompt's bytes (a part carrying every layer would move more) and
    every byte of every destination block is the source's."""
    pool, gen = layered
    ctx = pool.engine
    prompt, nb = 100, 7
    src = ctx.alloc(0, nb)
    rx = gen.receive("lp-1", prompt, ctx.instance)
    tx = ctx.send("lp-1", prompt)
    rng = np.random.default_rng(5)
    split = [LayerPart(0, 1, LAYERS), (1, 3, LAYERS), LayerPart(3, 4, LAYERS)]
    for i, start in enumerate(range(0, prompt, 32)):
        end = min(start + 32, prompt)
        b0, b1 = start // TPB, -(-end // TPB)
        runs = [(b0, src[b0:b1])]
        for part in ([(0, 0, 0)] if i == 2 else split):
            if i == 1:  # the hot path, a prebuilt BlockRun array
                arr, keep = kvxfer.core._runs(runs)
                fence = tx.chunk_raw(start, end, end == prompt, arr, len(runs), layers=part)
            else:
                fence = tx.chunk(start, end, runs, layers=part)
            lo, hi = (part[0], part[1]) if part[2] else (0, LAYERS)
            for b in range(b0, b1):
                pool.write(src[b], (lo, hi), rng)
            fence.ready()
    want = nb * pool.g.block_bytes
    ev = tx.wait()
    assert ev.outcome == Outcome.DONE and ev.error == Status.OK and ev.bytes == want, ev
    ev = rx.wait()
    assert ev.outcome == Outcome.READY and ev.bytes == want, (ev, rx.error_message())
    first, dst = rx.blocks(0)
    assert first == 0 and len(dst) == nb
    checked = 0
    for s, d in zip(src, dst):
        got, exp = gen.block_bytes(0, d), pool.block(s)
        assert got == exp, "block %d differs from source %d" % (d, s)
        assert exp != bytes(len(exp))  # every layer was written
        checked += len(got)
    assert checked == want
    rx.free_blocks()
    tx.release()
    rx.release()
    ctx.free(0, src)


def test_layer_parts_refused(layered):
    """Bad layers and parts out of order raise BAD_CHUNK naming the layers
    (also behind a CUDA event, before any driver is needed), a malformed
    layers= a TypeError; no fence is made, and the right parts then
    complete the request with every byte."""
    pool, gen = layered
    ctx = pool.engine
    prompt = 64
    src = ctx.alloc(0, 4)
    rng = np.random.default_rng(9)
    for b in src:  # written before the chunks: no fences needed
        pool.write(b, (0, LAYERS), rng)
    rx = gen.receive("lp-2", prompt, ctx.instance)
    tx = ctx.send("lp-2", prompt)
    r0, r1 = [(0, src[:2])], [(2, src[2:])]
    handles = kvxfer.handle_count()

    def refused(start, end, runs, layers, needle, **kw):
        with pytest.raises(KvxferError) as e:
            tx.chunk(start, end, runs, layers=layers, **kw)
        assert e.value.status == Status.BAD_CHUNK and needle in e.value.message, e.value
        assert kvxfer.handle_count() == handles

    for layers, needle in [((0, 2, 8), "layers [0, 2) of 8: want 0 ≤ Lo < Hi ≤ Of = 4"),
                           ((-1, 2, 4), "layers [-1, 2) of 4"), ((2, 2, 4), "layers [2, 2) of 4"),
                           ((0, 5, 4), "layers [0, 5) of 4"), ((0, 2, 0), "layers [0, 2) of 0")]:
        refused(0, 32, r0, layers, needle)
        refused(0, 32, r0, layers, needle, cuda_event=0x1000)
    for bad in [(0, 2), 3, "0:2"]:
        with pytest.raises(TypeError):
            tx.chunk(0, 32, r0, layers=bad)
    refused(0, 32, r0, LayerPart(1, 2, 4), "the first part of a chunk starts at layer 0")
    tx.chunk(0, 32, r0, layers=LayerPart(0, 2, 4), fenced=False)
    refused(0, 32, r0, (3, 4, 4), "layers [3, 4) of 4: the next part of the chunk starts at layer 2")
    refused(32, 64, r1, (0, 4, 4), "layers [0, 2) of 4 are not handed yet")
    refused(32, 64, r1, None, "are not handed yet")
    refused(0, 32, [(0, src[2:])], (2, 4, 4), "source blocks differ from the chunk's first part")
    assert tx.chunk(0, 32, r0, layers=(2, 4, 4), fenced=False) is None
    for part in [(0, 1, 4), (1, 4, 4)]:
        assert tx.chunk(32, 64, r1, layers=part, fenced=False) is None
    refused(32, 64, r1, (0, 4, 4), "after the last chunk")
    ev = tx.wait()
    assert ev.outcome == Outcome.DONE and ev.bytes == 4 * pool.g.block_bytes, ev
    assert rx.wait().outcome == Outcome.READY, rx.error_message()
    first, dst = rx.blocks(0)
    assert first == 0 and [gen.block_bytes(0, d) for d in dst] == [pool.block(s) for s in src]
    rx.free_blocks()
    tx.release()
    rx.release()
    ctx.free(0, src)


def test_layer_part_prototypes():
    """The ABI's layer-part functions are declared with all their arguments."""
    lib = kvxfer._lib.lib
    assert len(lib.kvxfer_chunk_layers.argtypes) == 10
    assert lib.kvxfer_chunk_layers_cuda.argtypes[-2:] == [ctypes.c_uint64, ctypes.c_int32]
