"""kvxfer.trtllm.KvxferCacheTransceiver driven as TensorRT-LLM's executor
drives a cache transceiver (tensorrt_llm/_torch/disaggregation/
orchestration/coordinator.py, the commit kvxfer/trtllm.py cites):

  context:    send_completed_context -> respond_and_send_async(req) once
              the context phase is done; reap_context_sends ->
              check_context_transfer_status(n) -> (completed ids, error
              ids), the blocks of both freed (release_transfer).
  generation: receive_gen_init -> request_and_receive_async(req) with the
              blocks allocated; reap_gen_receives ->
              check_gen_transfer_status(n); try_finish_gen_receive on
              DISAGG_GENERATION_TRANS_COMPLETE -> commit_blocks_for_reuse.

Every rank of an instance is a thread with its own node and KV cache
manager stand-in (trtllm_helpers, with the lines of TensorRT-LLM each
mirrors); the ranks' check_* agree through an allgather over the threads.
Every byte of every layer's K and V of the prompt is compared between the
context ranks' blocks and the generation ranks' blocks, by global layer and
global head."""

import numpy as np
import pytest

from kvxfer import trtllm as kt

from trtllm_helpers import (DIM, HEADS, TPB, S, CacheTransceiverConfig, CacheType, DisaggregatedParams, LlmRequest,
                            cluster, gen_params, on_ranks, reap_ctx, reap_gen, receive, send)


def _compare(cm, cblocks, gm, gblocks, prompt, gen_layout="HND", skip_blocks=0):
    """Every K/V byte of every token of the prompt, by global layer and
    head: each generation rank's block i holds what the context rank with
    that layer and head holds in its block i. Returns the bytes compared."""
    compared = 0
    for g, (m, dst) in enumerate(zip(gm, gblocks)):
        gv = m.bytes_view(gen_layout)
        gh = m.num_kv_heads_per_layer[0]
        gtp = m.mapping.tp_rank
        for lg, layer in enumerate(m.pp_layers):
            for hg in range(gh):
                head = gtp * gh + hg if m.kv_factor == 2 else 0
                src = [(c, blocks) for c, blocks in zip(cm, cblocks) if layer in c.pp_layers and (
                    m.kv_factor == 1 and c.mapping.tp_rank == 0 or m.kv_factor == 2 and
                    c.mapping.tp_rank == head // c.num_kv_heads_per_layer[0])]
                assert len(src) == 1, (layer, head)
                c, sblocks = src[0]
                cv, ch = c.bytes_view(), c.num_kv_heads_per_layer[0]
                lc, hc = c.layer_offsets[layer], head % ch if m.kv_factor == 2 else 0
                for i in range(skip_blocks, len(dst)):
                    tokens = min(TPB, prompt - i * TPB)
                    want = cv[sblocks[i], lc, :, hc, :tokens]
                    got = gv[dst[i], lg, :, hg, :tokens]
                    assert (got == want).all(), (g, layer, head, i)
                    assert want.any()
                    compared += want.size
    return compared


PARALLEL = [
    pytest.param((1, 1), (1, 1), {}, id="tp1-to-tp1"),
    pytest.param((2, 1), (1, 1), {}, id="ctx-tp2-to-gen-tp1"),
    pytest.param((1, 1), (2, 1), {}, id="ctx-tp1-to-gen-tp2"),
    pytest.param((1, 2), (1, 1), {"num_layers": 5}, id="ctx-pp2-to-gen-pp1-5-layers"),
    pytest.param((1, 1), (1, 2), {"num_layers": 5}, id="ctx-pp1-to-gen-pp2-5-layers"),
]


@pytest.mark.parametrize("cpar,gpar,mgr_kw", PARALLEL)
def test_every_byte_lands_in_the_generation_blocks(cluster, cpar, gpar, mgr_kw):
    """A 10-token prompt (3 blocks, the last one partly filled) from the
    context ranks' blocks into other block ids on the generation ranks:
    every K and V byte of every layer and head lands where the generation
    rank's layers and heads are; the states are the ABC's postconditions,
    both sides report the request in the same call on every rank, nothing
    else in the generation pools is written. (Checked to fail: with the
    generation blocks' order reversed in request_and_receive_async, the
    bytes differ.)"""
    cx, cm, gx, gm = cluster(cpar, gpar, mgr_kw, mgr_kw)
    prompt = 10
    creqs, cblocks = send(cx, cm, 4242, prompt, seed=1)
    for req in creqs:
        assert kt.parse_endpoint(req.context_phase_params.disagg_info_endpoint) == (cx[0].instance,) + cpar
        assert req.context_phase_params.req_id == 4242
    greqs, gblocks = receive(gx, gm, 77, prompt, creqs[0])
    got = on_ranks([lambda x=x: reap_ctx(x, [4242]) for x in cx] + [lambda x=x: reap_gen(x, [77]) for x in gx])
    assert got == [{4242: "done"}] * len(cx) + [{77: "done"}] * len(gx), [x.failures for x in cx + gx]
    assert all(r.state == S.DISAGG_CONTEXT_TRANS_IN_PROGRESS for r in creqs)  # mark_complete=False: the caller's
    assert all(r.state == S.DISAGG_GENERATION_TRANS_COMPLETE for r in greqs)
    n = _compare(cm, cblocks, gm, gblocks, prompt)
    assert n == 2 * mgr_kw.get("num_layers", 4) * HEADS * prompt * DIM * 2
    for m, dst in zip(gm, gblocks):
        others = [b for b in range(32) if b not in dst]
        assert not m.bytes_view()[others].any()
    for x in cx + gx:
        assert x.check_gen_transfer_complete()
        assert not x.failures


PARTITIONS = [
    pytest.param((1, 2), [1, 3], (1, 1), None, id="ctx-pp2-partition-1-3-to-gen-pp1"),
    pytest.param((1, 1), None, (1, 2), [3, 1], id="ctx-pp1-to-gen-pp2-partition-3-1"),
    pytest.param((1, 2), [3, 1], (1, 2), [1, 3], id="ctx-partition-3-1-to-gen-partition-1-3"),
    # A stage that the partition gives the same layers as kvxfer's default
    # split (stage 2: [3, 4) either way) holds the partition's pp_stages
    # too: every rank of an instance says one split.
    pytest.param((1, 3), [1, 2, 1], (1, 1), None, id="ctx-pp3-partition-1-2-1-to-gen-pp1"),
    pytest.param((1, 1), None, (1, 3), [1, 2, 1], id="ctx-pp1-to-gen-pp3-partition-1-2-1"),
]


@pytest.mark.parametrize("cpar,cpart,gpar,gpart", PARTITIONS)
def test_a_pp_partition_is_carried_as_pp_stages(cluster, cpar, cpart, gpar, gpart):
    """A pipeline split by TensorRT-LLM's pp_partition other than kvxfer's
    default (2 + 2 layers of 4) is each node's pp_stages: the context's
    endpoint carries it, the generation side's receive names it, and every
    K and V byte of every layer lands where the generation rank's layers
    are. The route from the config's peers carries it too. (Checked to
    fail before: the transceiver refused the pp_partition at
    construction.)"""
    cx, cm, gx, gm = cluster(cpar, gpar, ctx_partition=cpart, gen_partition=gpart)
    stages = ",".join(map(str, cpart)) if cpart else None
    for x, part in [(x, cpart) for x in cx] + [(x, gpart) for x in gx]:
        assert x.pp_stages == (",".join(map(str, part)) if part else None)
    prompt = 10
    creqs, cblocks = send(cx, cm, 4343, prompt, seed=5)
    for req in creqs:
        assert kt.parse_route(req.context_phase_params.disagg_info_endpoint) == (cx[0].instance,) + cpar + (stages,)
        assert kt.parse_endpoint(req.context_phase_params.disagg_info_endpoint) == (cx[0].instance,) + cpar
    greqs, gblocks = receive(gx, gm, 78, prompt, creqs[0])
    got = on_ranks([lambda x=x: reap_ctx(x, [4343]) for x in cx] + [lambda x=x: reap_gen(x, [78]) for x in gx])
    assert got == [{4343: "done"}] * len(cx) + [{78: "done"}] * len(gx), [x.failures for x in cx + gx]
    assert _compare(cm, cblocks, gm, gblocks, prompt) == 2 * 4 * HEADS * prompt * DIM * 2
    # No kvxfer endpoint on the request: the config's context_instance and
    # its peers' parallel (with the split) route it.
    g = gx[0]
    g.context_instance = cx[0].instance
    assert g._route(LlmRequest(79, prompt, DisaggregatedParams(ctx_request_id=1))) == (cx[0].instance,) + cpar + (
        stages,)


def test_mark_complete_and_the_reuse_commit(cluster):
    """check_context_transfer_status(n, mark_complete=True) moves a
    completed send to DISAGG_CONTEXT_COMPLETE; commit_blocks_for_reuse
    stores the received blocks (store_blocks_for_reuse, unpinned) when the
    manager reuses blocks, as KvCacheTransceiverV2's V1 adapter."""
    cx, cm, gx, gm = cluster((1, 1), (1, 1), None, {"enable_block_reuse": True})
    creqs, _ = send(cx, cm, 9, 8, seed=2)
    greqs, _ = receive(gx, gm, 10, 8, creqs[0])
    assert reap_gen(gx[0], [10]) == {10: "done"}
    st = cx[0].check_context_transfer_status(1, mark_complete=True)
    while not st.completed_request_ids:
        st = cx[0].check_context_transfer_status(1, mark_complete=True)
    assert list(st) == [[9], []]  # unpacks as (completed, errors), as TensorRT-LLM's CtxTransferStatus
    assert creqs[0].state == S.DISAGG_CONTEXT_COMPLETE
    greqs[0].state = S.GENERATION_IN_PROGRESS  # try_finish_gen_receive
    gx[0].commit_blocks_for_reuse(greqs[0])
    assert gm[0].stored == [(10, False)]


def test_generation_prefix_hit_blocks_are_not_written(cluster):
    """The generation side's manager already holds the prompt's first block
    (prepopulated_prompt_len, block reuse on): it is named as a prefix hit
    and left as it was; the rest lands. (Checked to fail with the hit
    taken as 0: block 20 is overwritten.)"""
    cx, cm, gx, gm = cluster((1, 1), (1, 1), None, {"enable_block_reuse": True})
    creqs, cblocks = send(cx, cm, 11, 12, seed=3)
    dst = [[20, 21, 22]]
    gm[0].fill([20], seed=99)  # the cached prefix: other bytes than the context's
    cached = gm[0].bytes_view()[20].copy()
    m = gm[0]
    m.add_sequence(12, dst[0])
    req = LlmRequest(12, 12, gen_params(creqs[0]))
    req.prepopulated_prompt_len = 5  # block-aligned down: 1 block
    gx[0].request_and_receive_async(req)
    got = on_ranks([lambda: reap_ctx(cx[0], [11]), lambda: reap_gen(gx[0], [12])])
    assert got == [{11: "done"}, {12: "done"}], gx[0].failures
    assert (gm[0].bytes_view()[20] == cached).all()
    _compare(cm, cblocks, gm, dst, 12, skip_blocks=1)


def test_mla_context_tp2_to_generation_tp1(cluster):
    """MLA (kv_factor 1, one latent head replicated over TP): with the
    generation's parallelism in the context's config (generation_tp,
    generation_pp) the context rank that writes nothing reports its send
    DONE at once; the latent of every layer lands. (Checked to fail without
    generation_tp passed to the send: that rank's send ends at its
    deadline, and the other rank reports the request failed with it.)"""
    mla = {"kv_cache_type": CacheType.SELFKONLY, "num_kv_heads": 1, "head_dim": 16}
    cx, cm, gx, gm = cluster((2, 1), (1, 1), mla, mla, ctx_kw={"generation_tp": 1, "generation_pp": 1})
    assert cx[0].mla and cx[0].node.info.kv_heads == 1
    creqs, cblocks = send(cx, cm, 13, 9, seed=4, replicated=True)
    greqs, gblocks = receive(gx, gm, 14, 9, creqs[0])
    got = on_ranks([lambda x=x: reap_ctx(x, [13]) for x in cx] + [lambda: reap_gen(gx[0], [14])])
    assert got == [{13: "done"}, {13: "done"}, {14: "done"}], [x.failures for x in cx + gx]
    assert _compare(cm, cblocks, gm, gblocks, 9) == 4 * 9 * 16 * 2


def test_nhd_generation_pool_from_hnd_context_ranks(cluster):
    """A generation instance whose attention backend reads the pool as NHD
    ("kv_layout": "NHD": each layer's K/V described through its strides)
    from two HND context ranks: every head of every token lands where NHD
    puts it. (Checked to fail with the pool taken as HND whatever
    kv_layout says.)"""
    cx, cm, gx, gm = cluster((2, 1), (1, 1), None, None, gen_kw={"kv_layout": "NHD"})
    creqs, cblocks = send(cx, cm, 15, 7, seed=5)
    greqs, gblocks = receive(gx, gm, 16, 7, creqs[0])
    got = on_ranks([lambda x=x: reap_ctx(x, [15]) for x in cx] + [lambda: reap_gen(gx[0], [16])])
    assert got == [{15: "done"}, {15: "done"}, {16: "done"}], [x.failures for x in cx + gx]
    _compare(cm, cblocks, gm, gblocks, 7, gen_layout="NHD")
    # and not where HND would have put it
    with pytest.raises(AssertionError):
        _compare(cm, cblocks, gm, gblocks, 7, gen_layout="HND")


def test_route_from_the_config_without_an_endpoint(cluster):
    """A generation request whose params carry no kvxfer ctx_info_endpoint
    (another router) goes to the config's context_instance, whose
    parallelism comes from the static peers."""
    cx, cm, gx, gm = cluster((2, 1), (1, 1))
    for x in gx:
        x.context_instance = cx[0].instance
    creqs, cblocks = send(cx, cm, 17, 6, seed=6)
    m = gm[0]
    m.add_sequence(18, [3, 4])
    req = LlmRequest(18, 6, DisaggregatedParams(request_type="generation_only", ctx_request_id=17))
    gx[0].request_and_receive_async(req)
    got = on_ranks([lambda x=x: reap_ctx(x, [17]) for x in cx] + [lambda: reap_gen(gx[0], [18])])
    assert got == [{17: "done"}, {17: "done"}, {18: "done"}], gx[0].failures
    _compare(cm, cblocks, gm, [[3, 4]], 6)


def test_disagg_request_id_is_both_sides_id(cluster):
    """With a disagg_request_id (both requests' underlying id), the context
    reports it, and a generation request without ctx_request_id receives
    under it."""
    cx, cm, gx, gm = cluster((1, 1), (1, 1))
    cm[0].add_sequence(5000, [1, 2])
    cm[0].fill([1, 2], seed=7)
    creq = LlmRequest(5000, 8, DisaggregatedParams(request_type="context_only", disagg_request_id=5000))
    cx[0].respond_and_send_async(creq)
    gm[0].add_sequence(5000, [8, 9])
    greq = LlmRequest(5000, 8, DisaggregatedParams(request_type="generation_only", disagg_request_id=5000,
                                                   ctx_info_endpoint=creq.context_phase_params.disagg_info_endpoint))
    gx[0].request_and_receive_async(greq)
    got = on_ranks([lambda: reap_ctx(cx[0], [5000]), lambda: reap_gen(gx[0], [5000])])
    assert got == [{5000: "done"}, {5000: "done"}]
    assert (gm[0].bytes_view()[[8, 9]] == cm[0].bytes_view()[[1, 2]]).all()


def test_zero_disagg_request_id_sets_nothing(cluster):
    """A disagg_request_id of 0 is not an id to TensorRT-LLM (it gives the
    request its own py_request_id, and frees the blocks of the ids
    reported): the context reports request_id, and a generation request
    with 0 receives under ctx_request_id and reports request_id. (Checked
    to fail: with 0 taken as the id, the receive was reported as request
    0, never as 42, so TensorRT-LLM would never free its blocks.)"""
    cx, cm, gx, gm = cluster((1, 1), (1, 1))
    cm[0].add_sequence(41, [1, 2])
    cm[0].fill([1, 2], seed=9)
    creq = LlmRequest(41, 8, DisaggregatedParams(request_type="context_only", disagg_request_id=0))
    cx[0].respond_and_send_async(creq)
    gm[0].add_sequence(42, [8, 9])
    greq = LlmRequest(42, 8, gen_params(creq, disagg_request_id=0))
    gx[0].request_and_receive_async(greq)
    got = on_ranks([lambda: reap_ctx(cx[0], [41], timeout=20), lambda: reap_gen(gx[0], [42], timeout=20)])
    assert got == [{41: "done"}, {42: "done"}]
    assert (gm[0].bytes_view()[[8, 9]] == cm[0].bytes_view()[[1, 2]]).all()


def test_synchronousreceive(cluster):
    """request_and_receive_sync (TRTLLM_DISABLE_KV_CACHE_TRANSFER_OVERLAP=1):
    returns with DISAGG_GENERATION_TRANS_COMPLETE, nothing left in flight."""
    cx, cm, gx, gm = cluster((1, 1), (1, 1))
    creqs, cblocks = send(cx, cm, 19, 5, seed=8)
    gm[0].add_sequence(20, [6, 7])
    req = LlmRequest(20, 5, gen_params(creqs[0]))
    gx[0].request_and_receive_sync(req)
    assert req.state == S.DISAGG_GENERATION_TRANS_COMPLETE, gx[0].failures
    assert gx[0].check_gen_transfer_complete()
    assert reap_ctx(cx[0], [19]) == {19: "done"}
    _compare(cm, cblocks, gm, [[6, 7]], 5)


def test_check_status_types(cluster):
    """Without TensorRT-LLM, check_* return this module's named tuples
    with TensorRT-LLM's field names, and nothing in flight reports nothing."""
    cx, cm, gx, gm = cluster((1, 1), (1, 1))
    st = cx[0].check_context_transfer_status(0)
    assert isinstance(st, kt.CtxTransferStatus) and st.completed_request_ids == [] and st.error_request_ids == []
    gst = gx[0].check_gen_transfer_status(0)
    assert isinstance(gst, kt.GenTransferStatus) and tuple(gst) == ([], [], [])
    assert gx[0].get_disaggregated_params() == {}
    assert gx[0].check_gen_transfer_complete()
    assert "0 sends, 0 receives" in gx[0].get_status_dump()
    assert isinstance(cx[0], kt.KvxferCacheTransceiver)
    assert np.dtype("uint8")  # numpy present for the byte views
    assert CacheTransceiverConfig().kv_transfer_sender_future_timeout_ms == 200
