"""receive(context_pp_stages=): a context instance whose pipeline stages
split the layers otherwise than kvxfer's default (kvxfer_receive_stages)."""

import numpy as np
import pytest

import kvxfer
from kvxfer import KvxferError, Outcome, Status

from conftest import small_config, unique


def _stage_engines(instance, stages, arrays):
    """The two pipeline-stage ranks of context instance `instance` (PP 2,
    split `stages`), each over its array."""
    return [kvxfer.Engine(small_config(instance, pp=2, pp_stages=stages, rank_pp=r), memory=arrays[r])
            for r in range(2)]


@pytest.mark.parametrize("split", ["1,3", [1, 3]])
def test_receive_from_a_context_of_another_split(split):
    """A context of PP 2 whose stages hold 1 and 3 of the 4 layers (kvxfer's
    default: 2 and 2): the receive that names the split gets each stage's
    layers where they belong (a generation block is the first stage's
    block of layer 0, then the second's of layers 1..3)."""
    before = kvxfer.handle_count()
    instance = unique("ctx-stages")
    arrays = [np.zeros(1 << 20, dtype=np.uint8) for _ in range(2)]
    ctx = _stage_engines(instance, "1,3", arrays)
    try:
        with kvxfer.Engine(small_config(unique("gen-stages"))) as gen:
            rng = np.random.default_rng(7)
            srcs = []
            for e, arr in zip(ctx, arrays):
                g = e.groups[0]
                src = e.alloc(0, 2)
                for b in src:
                    arr[g.offset + b * g.block_bytes:g.offset + (b + 1) * g.block_bytes] = \
                        rng.integers(0, 256, g.block_bytes, dtype=np.uint8)
                srcs.append(src)
            assert [e.groups[0].block_bytes for e in ctx] == [gen.groups[0].block_bytes // 4,
                                                               gen.groups[0].block_bytes * 3 // 4]
            rx = gen.receive("st-1", 32, instance, context_tp=1, context_pp=2, context_pp_stages=split)
            txs = [e.send("st-1", 32) for e in ctx]
            for tx, src in zip(txs, srcs):
                tx.chunk(0, 32, [(0, src)], fenced=False)
            for tx in txs:
                assert tx.wait(10).outcome == Outcome.DONE
            ev = rx.wait(10)
            assert ev.outcome == Outcome.READY, (ev, rx.error_message())
            first, dst = rx.blocks(0)
            assert first == 0 and len(dst) == 2
            for k, d in enumerate(dst):
                want = b"".join(e.block_bytes(0, src[k]) for e, src in zip(ctx, srcs))
                assert gen.block_bytes(0, d) == want, "block %d" % k
            rx.free_blocks()
            for tx, e, src in zip(txs, ctx, srcs):
                e.free(0, src)
                tx.release()
            rx.release()
    finally:
        for e in ctx:
            e.close()
    assert kvxfer.handle_count() == before


def test_bad_context_split_is_refused_naming_it(pair, monkeypatch):
    """A split that is no list of context_pp layer counts adding up to the
    model's 4 layers raises INVALID_ARGUMENT naming it and opens nothing;
    a value of another type is a TypeError; a library without
    kvxfer_receive_stages is named, not called, and None or "" keeps
    kvxfer_receive."""
    ctx, gen = pair
    for stages, pp, needle in [("1,x", 2, "stage 1's layer count \"x\""),
                               ("1,3", 3, "2 stages, the context's PP (context_pp) is 3"),
                               ("2,3", 2, "5 layers in all, the model has 4"),
                               ([2, 1], 2, "3 layers in all")]:
        with pytest.raises(KvxferError) as e:
            gen.receive("st-bad", 32, ctx.instance, context_tp=1, context_pp=pp, context_pp_stages=stages)
        shown = stages if isinstance(stages, str) else ",".join(map(str, stages))
        assert e.value.status == Status.INVALID_ARGUMENT, e.value
        assert "context_pp_stages \"%s\"" % shown in e.value.message and needle in e.value.message, e.value.message
    with pytest.raises(TypeError, match="context_pp_stages = 4"):
        gen.receive("st-bad", 32, ctx.instance, context_tp=1, context_pp=1, context_pp_stages=4)
    assert gen.used(0) == 0
    monkeypatch.setattr(kvxfer._lib, "missing", {"kvxfer_receive_stages"})
    with pytest.raises(KvxferError) as e:
        gen.receive("st-old", 32, ctx.instance, context_tp=1, context_pp=2, context_pp_stages="1,3")
    assert e.value.status == Status.UNSUPPORTED, e.value
    assert "kvxfer_receive_stages (KVXFER_ABI_MINOR 9)" in e.value.message, e.value.message
    for k, empty in enumerate((None, "")):
        rx = gen.receive("st-plain-%d" % k, 32, ctx.instance, context_pp_stages=empty)
        rx.cancel()
        assert rx.wait(10).outcome == Outcome.CANCELLED
        rx.release()
