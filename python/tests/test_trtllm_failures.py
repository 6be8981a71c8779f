"""kvxfer.trtllm's failure paths, driven as TensorRT-LLM's executor meets
them (orchestration/coordinator.py and py_executor.py at the commits
kvxfer/trtllm.py cites):

  - a peer that never comes, on either side: the request ends
    DISAGG_TRANS_ERROR, reported by check_* once kvxfer's event for it came
    (kvxfer's transfer timeout), nothing raised into the loop;
  - cancel_request (py_executor's _try_cancel_request for a user cancel, or
    the coordinator's request_cancellation for kv_transfer_timeout_ms): True
    only once kvxfer's event came (the executor then frees the blocks),
    never reported by check_* afterwards; the peer's request fails;
  - per-request refusals (a generation-first request, no id, no route, a
    beam width > 1, too few blocks, a block kvxfer refuses) end in the
    error state at the next check_*, nothing raised;
  - ranks that disagree: a request one rank failed is cancelled on the
    others and reported failed once their events came; completed only
    when every rank completed;
  - construction refusals, a ValueError naming the value;
  - shutdown: what was live ends failed; a close that did not finish keeps
    the pool (the manager's shutdown no longer releases it)."""

import logging
import tempfile
import threading
import time

import pytest

import kvxfer
from kvxfer import trtllm as kt
from kvxfer.core import KvxferError, Status

from conftest import unique, wait_until
from trtllm_helpers import (S, AttentionType, CacheTransceiverConfig, CacheType, DataType, DisaggregatedParams,
                            DisaggScheduleStyle, KVCacheManager, LlmRequest, Mapping, cluster, gen_params,
                            instance_configs, keypair, make_instance, ns, reap_ctx, reap_gen, send)


def _cancel_until_true(x, req, timeout=30):
    """Calls cancel_request on every executor iteration until it says the
    blocks may be freed; the number of False answers before."""
    falses = 0
    deadline = time.monotonic() + timeout
    while not x.cancel_request(req):
        falses += 1
        assert time.monotonic() < deadline, x.get_status_dump()
    return falses


@pytest.mark.parametrize("missing", ["context", "generation"])
def test_peer_never_comes(cluster, missing):
    """No context instance at all (the generation's receive), or a
    generation instance that never receives (the context's send): the
    request ends DISAGG_TRANS_ERROR at kvxfer's transfer timeout, reported
    once, naming the timeout; nothing raises; check_* go on answering."""
    kw = {"transfer_timeout": "2s"}
    if missing == "context":
        cx, cm, gx, gm = cluster((1, 1), (1, 1), gen_kw=kw, start_ctx=False)
        gx[0].context_instance = gx[0]._peers[0]["instance"]  # configured, never started
        gm[0].add_sequence(1, [3, 4])
        req = LlmRequest(1, 6, DisaggregatedParams(request_type="generation_only", ctx_request_id=100))
        gx[0].request_and_receive_async(req)
        assert reap_gen(gx[0], [1], timeout=20) == {1: "error"}
        x = gx[0]
    else:
        cx, cm, gx, gm = cluster((1, 1), (1, 1), ctx_kw=kw)
        (req,), _ = send(cx, cm, 2, 6, seed=1)
        assert reap_ctx(cx[0], [2], timeout=20) == {2: "error"}
        x = cx[0]
    assert req.state == S.DISAGG_TRANS_ERROR
    assert "TIMEOUT" in x.failures[req.request_id] and "trtllm-" in x.failures[req.request_id], x.failures
    assert tuple(x.check_context_transfer_status(0)) == ([], [])
    assert tuple(x.check_gen_transfer_status(0)) == ([], [], [])


def test_kvxfer_timeout_follows_kv_transfer_timeout_ms(cluster):
    """Without a transfer_timeout in the config, kvxfer's is the
    executor's kv_transfer_timeout_ms (1.5 s here, kvxfer's default 30 s):
    the receive with no writer has failed well before 15 s. (Checked to
    fail without the derived timeout.)"""
    ctc = CacheTransceiverConfig(kv_transfer_timeout_ms=1500)
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        gk = keypair()
        (x,), (m,) = make_instance(tmp, unique("trt-gen"), (1, 1), unique("trt-ctx"), (1, 1), gk, keypair()[0],
                                   ctc=ctc, transfer_timeout=None)
        try:
            assert x.kv_transfer_timeout_ms == 1500
            x.context_instance = x._peers[0]["instance"]  # configured, never started
            m.add_sequence(1, [3])
            req = LlmRequest(1, 2, DisaggregatedParams(ctx_request_id=5))
            x.request_and_receive_async(req)
            assert reap_gen(x, [1], timeout=15) == {1: "error"}
        finally:
            x.shutdown()


@pytest.mark.parametrize("who", ["context", "generation"])
def test_cancel_is_true_only_once_kvxfer_ended_the_request(cluster, who):
    """cancel_request on a send waiting for its receive (who = context), or
    a receive waiting for its send (generation): False until kvxfer's event
    for it came, then True with the kvxfer request released (no write can
    land, nothing reads the blocks); check_* never report it; the peer's
    request, opened afterwards, ends DISAGG_TRANS_ERROR. (Checked to fail
    with cancel_request answering True at once: the kvxfer request handle
    is still live then.)"""
    kw = {"transfer_timeout": "3s"}
    cx, cm, gx, gm = cluster((1, 1), (1, 1), ctx_kw=kw, gen_kw=kw)
    before = kvxfer.handle_count()
    if who == "context":
        (req,), _ = send(cx, cm, 3, 6, seed=2)
        x = cx[0]
    else:
        gm[0].add_sequence(4, [8, 9])
        req = LlmRequest(4, 6, DisaggregatedParams(ctx_request_id=3, ctx_info_endpoint=cx[0].endpoint))
        gx[0].request_and_receive_async(req)
        x = gx[0]
    assert x.has_inflight_transfer(req)
    _cancel_until_true(x, req)
    assert kvxfer.handle_count() == before  # the kvxfer request's handle was released: its event came
    assert x.ended[req.request_id][1] == "CANCELLED" and not x.has_inflight_transfer(req)
    assert req.state in (S.DISAGG_CONTEXT_TRANS_IN_PROGRESS, S.DISAGG_GENERATION_TRANS_IN_PROGRESS)  # the caller's
    assert x.cancel_request(req)  # again: nothing in flight
    if who == "context":
        assert tuple(x.check_context_transfer_status(0)) == ([], [])
        gm[0].add_sequence(4, [8, 9])
        peer = LlmRequest(4, 6, gen_params(req))
        gx[0].request_and_receive_async(peer)
        assert reap_gen(gx[0], [4], timeout=20) == {4: "error"}
    else:
        assert tuple(x.check_gen_transfer_status(0)) == ([], [], [])
        assert x.check_gen_transfer_complete()
        (peer,), _ = send(cx, cm, 3, 6, seed=3)
        assert reap_ctx(cx[0], [3], timeout=20) == {3: "error"}
    assert peer.state == S.DISAGG_TRANS_ERROR


def _refused(x, req, side, *words):
    """req, handed to x, fails (nothing raised), reported by check_*,
    failures naming every word."""
    if side == "send":
        x.respond_and_send_async(req)
        assert reap_ctx(x, [req.request_id], timeout=20) == {req.request_id: "error"}, x.failures
    else:
        x.request_and_receive_async(req)
        assert reap_gen(x, [req.request_id], timeout=20) == {req.request_id: "error"}, x.failures
    assert req.state == S.DISAGG_TRANS_ERROR
    for w in words:
        assert w in x.failures[req.request_id], (w, x.failures[req.request_id])


def test_requests_kvxfer_refuses_fail_alone(cluster):
    """Each refusal ends its request in DISAGG_TRANS_ERROR at the next
    check_*, naming the value; nothing raises; a good request goes on."""
    cx, cm, gx, gm = cluster((1, 1), (1, 1))
    c, g = cx[0], gx[0]
    gen_first = DisaggregatedParams(request_type="context_only", schedule_style=DisaggScheduleStyle.GENERATION_FIRST)
    cm[0].add_sequence(1, [1, 2])
    c.prepare_context_requests([LlmRequest(1, 5, gen_first)])  # logged; the send fails
    _refused(c, LlmRequest(1, 5, gen_first), "send", "GENERATION_FIRST")
    cm[0].add_sequence(2, [1, 2])
    _refused(c, LlmRequest(2, 5, beam_width=2), "send", "beam width 2")
    cm[0].add_sequence(3, [1])
    _refused(c, LlmRequest(3, 5), "send", "holds 1 blocks for request 3", "needs 2")
    cm[0].add_sequence(4, [1, 999])
    _refused(c, LlmRequest(4, 5), "send", "trtllm-4", "999")

    gm[0].add_sequence(10, [5, 6])
    _refused(g, LlmRequest(10, 5, DisaggregatedParams(request_type="generation_only")), "receive",
             "no ctx_request_id")
    gm[0].add_sequence(11, [5, 6])
    _refused(g, LlmRequest(11, 5, DisaggregatedParams(ctx_request_id=1, ctx_info_endpoint="tcp://10.0.0.1:5000")),
             "receive", "tcp://10.0.0.1:5000", "context_instance")
    gm[0].add_sequence(12, [5, 999])
    _refused(g, LlmRequest(12, 5, DisaggregatedParams(ctx_request_id=1, ctx_info_endpoint=c.endpoint)), "receive",
             "trtllm-1", "999")
    gm[0].add_sequence(14, [5, 6])
    _refused(g, LlmRequest(14, 5, DisaggregatedParams(ctx_request_id=1, ctx_info_endpoint=kt.context_endpoint(
        "nobody", 1, 1))), "receive", "writer nobody/0 is not among this node's peers")
    # The same request opened twice: the second call is ignored.
    gm[0].add_sequence(13, [5, 6])
    twice = LlmRequest(13, 5, DisaggregatedParams(ctx_request_id=20, ctx_info_endpoint=c.endpoint))
    g.request_and_receive_async(twice)
    g.request_and_receive_async(twice)
    (good,), _ = send(cx, cm, 20, 5, seed=4)
    assert reap_ctx(c, [20]) == {20: "done"} and reap_gen(g, [13]) == {13: "done"}


class _ScriptedDist:
    """Rank 0 of 2: allgather returns [this rank's, the other rank's next
    scripted report] (its last one once the script is spent)."""

    world_size, rank = 2, 0

    def __init__(self):
        self.script = [[[], []]]
        self.calls = 0

    def allgather(self, obj):
        self.calls += 1
        other = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return [obj, other]


def test_ranks_agree_on_each_outcome():
    """Generation rank 0 of a TP2 instance whose rank 1's reports are
    scripted: a receive READY here is not reported while rank 1's is in
    flight, and completed once rank 1's is; a receive live here that rank 1
    failed is cancelled here and reported failed only once its own event
    came (not in the call that learnt it). (Checked to fail with a failure
    anywhere reported at once.)"""
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        ck, gk = keypair(), keypair()
        cname, gname = unique("trt-ctx"), unique("trt-gen")
        (c,), (cmgr,) = make_instance(tmp, cname, (1, 1), gname, (2, 1), ck, gk[0])
        dist = _ScriptedDist()
        from trtllm_helpers import instance_configs

        cfg = instance_configs(tmp, gname, (2, 1), cname, (1, 1), gk[1], ck[0])[0]
        gmgr = KVCacheManager(Mapping(2, 1, rank=0))
        g = kt.KvxferCacheTransceiver(Mapping(2, 1, rank=0), dist, gmgr, None, CacheTransceiverConfig(), config=cfg)
        try:
            g.node.wait_peers(20000)
            (creq,), _ = send([c], [cmgr], 7, 8, seed=5)
            gmgr.add_sequence(70, [4, 5])
            req = LlmRequest(70, 8, gen_params(creq))
            g.request_and_receive_async(req)
            wait_until(lambda: g._reap(10) or g._recvs[70].settled, 20, "rank 0's receive")
            assert g._recvs[70].ok
            for _ in range(3):
                assert tuple(g.check_gen_transfer_status(0)) == ([], [], [])  # rank 1 has not settled it
            assert req.state == S.DISAGG_GENERATION_TRANS_IN_PROGRESS
            dist.script = [[[70], []]]
            assert tuple(g.check_gen_transfer_status(0)) == ([70], [], [])
            assert req.state == S.DISAGG_GENERATION_TRANS_COMPLETE

            gmgr.add_sequence(71, [6, 7])
            live = LlmRequest(71, 8, DisaggregatedParams(ctx_request_id=8, ctx_info_endpoint=c.endpoint))
            g.request_and_receive_async(live)  # no context sends 8: live until cancelled
            dist.script = [[[], [71]]]
            assert tuple(g.check_gen_transfer_status(0)) == ([], [], [])  # cancelled here, its event not yet in
            assert "failed on another rank" in g._recvs[71].reason
            st = g.check_gen_transfer_status(0)
            deadline = time.monotonic() + 20
            while not st.error_request_ids:
                assert time.monotonic() < deadline
                st = g.check_gen_transfer_status(1)
            assert tuple(st) == ([], [71], [])
            assert live.state == S.DISAGG_TRANS_ERROR and g.ended[71] == ("receive", "FAILED")
        finally:
            g.shutdown()
            c.shutdown()


def _lone_receiver(cluster, monkeypatch, deadline_s, rid=1):
    """A generation instance whose context instance is configured but never
    started (kvxfer's transfer timeout 60 s), its blocking waits cut to
    deadline_s; the request rid to receive."""
    cx, cm, gx, gm = cluster((1, 1), (1, 1), gen_kw={"transfer_timeout": "60s"}, start_ctx=False)
    x = gx[0]
    x.context_instance = x._peers[0]["instance"]
    monkeypatch.setattr(x, "_wait_all_s", lambda: deadline_s)
    gm[0].add_sequence(rid, [3, 4])
    return x, LlmRequest(rid, 6, DisaggregatedParams(request_type="generation_only", ctx_request_id=100))


def test_synchronous_receive_ends_by_its_deadline(cluster, monkeypatch):
    """request_and_receive_sync (TRTLLM_DISABLE_KV_CACHE_TRANSFER_OVERLAP=1:
    nothing reports the request later) with no writer and kvxfer's timeout
    far away: at its deadline the receive is cancelled, its event waited
    for, and the call returns with DISAGG_TRANS_ERROR, the kvxfer request
    released, nothing in flight. (Checked to fail without the change: the
    call returned with the request DISAGG_GENERATION_TRANS_IN_PROGRESS.)"""
    before = kvxfer.handle_count()
    x, req = _lone_receiver(cluster, monkeypatch, 1.0)
    x.request_and_receive_sync(req)
    assert req.state == S.DISAGG_TRANS_ERROR, x.get_status_dump()
    assert "no kvxfer event within 1 s: cancelled" in x.failures[1], x.failures
    assert x.ended[1] == ("receive", "FAILED")
    assert x.check_gen_transfer_complete() and not x.has_inflight_transfer(req)
    assert kvxfer.handle_count() == before + 1  # the node alone: the receive's handle was released
    assert tuple(x.check_gen_transfer_status(0)) == ([], [], [])  # reported by the call, never again


def test_synchronous_receive_without_an_event_after_its_cancel_keeps_the_blocks(cluster, monkeypatch):
    """No event even after the cancel (kvxfer's poll answers nothing): a
    RuntimeError naming the request, which stays in transfer with its
    receive tracked (cancel_request False: its blocks are not freed). Once
    the event comes, cancel_request answers True. (Checked to fail without
    the change, the request left in transfer with no error, and with it
    ended DISAGG_TRANS_ERROR at the second deadline instead.)"""
    x, req = _lone_receiver(cluster, monkeypatch, 0.3)
    real_poll = x.node.poll
    monkeypatch.setattr(x.node, "poll", lambda timeout_ms=0: (threading.Event().wait(timeout_ms / 1000.0), [])[1])
    with pytest.raises(RuntimeError, match=r"receive of request 1 \(trtllm-100\): no event"):
        x.request_and_receive_sync(req)
    assert req.state == S.DISAGG_GENERATION_TRANS_IN_PROGRESS
    assert x.has_inflight_transfer(req) and not x.cancel_request(req)
    monkeypatch.setattr(x.node, "poll", real_poll)
    _cancel_until_true(x, req)


class _OtherRank:
    """Rank 0 of 2: allgather returns [this rank's, answer(this rank's)]."""

    world_size, rank = 2, 0

    def __init__(self):
        self.answer = None
        self.calls = []

    def allgather(self, obj):
        self.calls.append(obj)
        return [obj, self.answer(obj)]


def test_synchronous_receive_agrees_across_ranks():
    """Generation rank 0 of a TP2 instance, rank 1's answers scripted: a
    receive READY here ends DISAGG_GENERATION_TRANS_COMPLETE only when rank
    1's did too; DISAGG_TRANS_ERROR when rank 1's failed or rank 1 received
    another request in that call; one allgather per call. (Checked to fail
    without the agreement: COMPLETE whatever rank 1 says.)"""
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        ck, gk = keypair(), keypair()
        cname, gname = unique("trt-ctx"), unique("trt-gen")
        (c,), (cmgr,) = make_instance(tmp, cname, (1, 1), gname, (2, 1), ck, gk[0])
        dist = _OtherRank()
        cfg = instance_configs(tmp, gname, (2, 1), cname, (1, 1), gk[1], ck[0])[0]
        gmgr = KVCacheManager(Mapping(2, 1, rank=0))
        g = kt.KvxferCacheTransceiver(Mapping(2, 1, rank=0), dist, gmgr, None, CacheTransceiverConfig(), config=cfg)
        try:
            g.node.wait_peers(20000)
            cases = [(lambda mine: [mine[0], True], S.DISAGG_GENERATION_TRANS_COMPLETE, None),
                     (lambda mine: [mine[0], False], S.DISAGG_TRANS_ERROR, "failed on another rank"),
                     (lambda mine: [mine[0] + 1, True], S.DISAGG_TRANS_ERROR, "received requests")]
            for i, (answer, state, why) in enumerate(cases):
                rid = 80 + i
                (creq,), _ = send([c], [cmgr], rid, 8, seed=20 + i)
                gmgr.add_sequence(rid, [4 + 2 * i, 5 + 2 * i])
                req = LlmRequest(rid, 8, gen_params(creq))
                dist.answer = answer
                g.request_and_receive_sync(req)
                assert dist.calls[-1] == [rid, True] and len(dist.calls) == i + 1
                assert req.state == state, (rid, g.failures)
                if why:
                    assert why in g.failures[rid], g.failures
                assert g.check_gen_transfer_complete()  # (the context's send waits for rank 1, never started)
        finally:
            g.shutdown()
            c.shutdown()


def test_shutdown_ends_what_is_live_and_is_idempotent(cluster):
    cx, cm, gx, gm = cluster((1, 1), (1, 1))
    (req,), _ = send(cx, cm, 30, 6, seed=6)
    cx[0].shutdown()
    assert tuple(cx[0].check_context_transfer_status(0)) == ([], [30])
    assert req.state == S.DISAGG_TRANS_ERROR and "was closed" in cx[0].failures[30]
    cx[0].shutdown()
    assert cx[0].cancel_request(req)
    late = LlmRequest(31, 6)
    cm[0].add_sequence(31, [1, 2])
    cx[0].respond_and_send_async(late)  # after shutdown: fails, nothing raises
    assert tuple(cx[0].check_context_transfer_status(None)) == ([], [31])
    assert not cm[0].impl.released  # the executor's resource manager releases the pool, not the transceiver


@pytest.mark.parametrize("first", ["transceiver", "manager"])
def test_close_that_did_not_finish_keeps_the_pool(cluster, monkeypatch, first):
    """A node close that timed out (a peer may still write), reached
    through the transceiver's shutdown or the manager's: shutdown()
    answers False (again when asked again), the KV cache manager's shutdown
    does not release the pool, and says why; the receive in flight stays
    so (not reported, cancel_request False: its blocks are not freed);
    nothing raises. (Checked to fail without the guard: release_pools
    runs; with the live receive ended at such a close: it is reported
    failed; and with shutdown() answering None.)"""
    cx, cm, gx, gm = cluster((1, 1), (1, 1))
    x, m = gx[0], gm[0]
    m.add_sequence(40, [2, 3])
    req = LlmRequest(40, 6, DisaggregatedParams(ctx_request_id=41, ctx_info_endpoint=cx[0].endpoint))
    x.request_and_receive_async(req)  # no context sends 41: live
    node = x.node
    real_close = node.close

    def timed_out(timeout_ms=5000):
        raise KvxferError(Status.TIMEOUT, "close: 1 request did not drain")

    monkeypatch.setattr(node, "close", timed_out)
    if first == "transceiver":
        assert x.shutdown() is False
        m.shutdown()
    else:
        m.shutdown()
        assert x.shutdown() is False
    m.shutdown()
    assert not m.impl.released and x.shutdown() is False
    assert tuple(x.check_gen_transfer_status(0)) == ([], [], [])
    assert not x.cancel_request(req) and not x.check_gen_transfer_complete()
    assert req.state == S.DISAGG_GENERATION_TRANS_IN_PROGRESS
    monkeypatch.setattr(node, "close", real_close)
    node.close()  # for the fixture's handle count


def _expect_refusal(match, mapping=None, mgr=None, dist=None, mamba=None, attention_type=None, **cfg_kw):
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        pub, sec = keypair()
        cfg = {"instance": unique("trt-r"), "backend": "ucx", "bind": "ipc://%s/r.sock" % tmp, "secret_key": sec,
               "peers": []}
        cfg.update(cfg_kw)
        cfg = {k: v for k, v in cfg.items() if v is not None}
        mapping = mapping or Mapping()
        mgr = mgr or KVCacheManager(mapping)
        before = kvxfer.handle_count()
        with pytest.raises(ValueError, match=match):
            kt.KvxferCacheTransceiver(mapping, dist, mgr, attention_type, CacheTransceiverConfig(), mamba,
                                      config=cfg)
        assert kvxfer.handle_count() == before  # a node opened was closed


# A Distributed for the refusals (never reached: they come first).
_DIST = ns(allgather=lambda obj: [obj])


def test_a_config_pp_stages_spelling_out_the_default_is_taken():
    """A config's pp_stages that spells out kvxfer's default split ("2,2"
    for 4 layers over 2 stages, the manager's own split) is that split, as
    the node takes it, not a disagreement with the manager (it was refused
    naming both)."""
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        pub, sec = keypair()
        mapping = Mapping(1, 2, rank=0)
        cfg = {"instance": unique("trt-d"), "backend": "ucx", "bind": "ipc://%s/d.sock" % tmp, "secret_key": sec,
               "peers": [], "pp_stages": "2,2"}
        before = kvxfer.handle_count()
        x = kt.KvxferCacheTransceiver(mapping, _DIST, _mgr(mapping), None, CacheTransceiverConfig(), None, config=cfg)
        try:
            assert x.pp_stages is None
        finally:
            x.shutdown()
        assert kvxfer.handle_count() == before


def _mgr(mapping=None, **kw):
    return KVCacheManager(mapping or Mapping(), **kw)


def _with(mgr, **attrs):
    for k, v in attrs.items():
        setattr(mgr, k, v)
    return mgr


class _NoPoolManager:
    """KVCacheManagerV2's shape: no C++ primary pool."""

    pp_layers, num_kv_heads_per_layer, tokens_per_block, head_dim, kv_factor = [0], [4], 4, 8, 2


class _FixedShutdownManager(KVCacheManager):
    """A manager whose shutdown cannot be replaced on the instance."""

    shutdown = property(lambda self: self.impl.release_pools)


def test_construction_refusals_name_the_value():
    """What kvxfer cannot do exactly is a ValueError naming the value,
    every node opened on the way closed."""
    _expect_refusal("node's keys", bind=None, secret_key=None, peers=None, insecure=None)
    _expect_refusal("enable_attention_dp", mapping=Mapping(2, 1, enable_attention_dp=True), dist=_DIST)
    _expect_refusal("cp_size = 2", mapping=Mapping(1, 1, cp_size=2))
    _expect_refusal("mamba_cache_manager", mamba=object())
    _expect_refusal("without get_unique_primary_pool", mgr=_NoPoolManager())
    _expect_refusal("num_pools = 2", mgr=_with(_mgr(), num_pools=2))
    _expect_refusal(r"blocks_in_secondary_pool = 64 \(KV cache host offload, host_cache_size\)",
                    mgr=_with(_mgr(), blocks_in_secondary_pool=64))
    _expect_refusal(r"max_attention_window_vec = \[128, 4096\]",
                    mgr=_with(_mgr(), max_attention_window_vec=[128, 4096]))
    _expect_refusal("max_attention_window = 1024 < max_seq_len = 4096",
                    mgr=_with(_mgr(), max_attention_window_vec=[1024]))
    _expect_refusal("enable_indexer_k_cache", mgr=_with(_mgr(), enable_indexer_k_cache=True))
    _expect_refusal("CROSS", mgr=_mgr(kv_cache_type=CacheType.CROSS))
    _expect_refusal("dtype NVFP4", mgr=_mgr(dtype=DataType.NVFP4))
    _expect_refusal("num_kv_heads = 4 over tp_size = 8", mapping=Mapping(8, 1), dist=_DIST,
                    mgr=_mgr(Mapping(8, 1)))
    _expect_refusal("attention_type MLA with kv_factor = 2", attention_type=AttentionType.MLA)
    # Stage layers no pipeline split says (a pp_partition is one: it is
    # taken as pp_stages): a layer mask that leaves a gap; one that cuts a
    # stage's edge, with no pp_partition, or other than the pp_partition
    # gives it; a pp_partition of other stages or layers than the
    # mapping's; a config pp_stages other than the manager's split.
    _expect_refusal(r"holds layers \[0, 2, 3\] of 4 \(kv_cache_manager.pp_layers\): not one contiguous range",
                    mgr=_mgr(num_layers=3, layer_mask=[True, False, True, True]))
    _expect_refusal(r"stage 0 of 1 holds layers \[1, 4\) of 4 .*default split gives it \[0, 4\), and the mapping "
                    r"has no pp_partition", mgr=_mgr(layer_mask=[False, True, True, True]))
    pmap = Mapping(1, 2, rank=1, pp_partition=[2, 2])
    _expect_refusal(r"stage 1 of 2 holds layers \[2, 3\) of 4 .*pp_partition \[2, 2\] gives it \[2, 4\)",
                    mapping=pmap, dist=_DIST, mgr=_mgr(pmap, layer_mask=[True, True, True, False]))
    _expect_refusal(r"pp_partition = \[1, 2\]: want 2 stages' layer counts, each >= 1, adding up to the 4 layers",
                    mapping=Mapping(1, 2, rank=0, pp_partition=[1, 2]), dist=_DIST,
                    mgr=_mgr(Mapping(1, 2, rank=0, pp_partition=[1, 3])))
    pmap = Mapping(1, 2, rank=0, pp_partition=[1, 3])
    _expect_refusal(r"pp_stages = '2,2' in the config, TensorRT-LLM's KV cache manager splits the layers 1,3",
                    mapping=pmap, dist=_DIST, mgr=_mgr(pmap), pp_stages="2,2")
    _expect_refusal(r"pp_stages = '' in the config, TensorRT-LLM's KV cache manager splits the layers 1,3",
                    mapping=pmap, dist=_DIST, mgr=_mgr(pmap), pp_stages="")
    _expect_refusal(r"pp_stages = '1,3' in the config, TensorRT-LLM's KV cache manager splits the layers as "
                    r"kvxfer's default", pp_stages="1,3")
    _expect_refusal("world_size = 2 without a Distributed", mapping=Mapping(2, 1), mgr=_mgr(Mapping(2, 1)))
    # The pool is not block-first: layer offset 1's view starts elsewhere.
    odd = _mgr()
    pool = odd.impl.pool
    odd.impl.get_primary_pool_data = lambda off: pool.reshape(2, -1, 2, pool.shape[3])[off]
    _expect_refusal("layer offset 0's pool view", mgr=odd)
    # The config against the manager.
    _expect_refusal("tokens_per_block = 16 in the config, TensorRT-LLM's KV cache manager has 4",
                    tokens_per_block=16)
    _expect_refusal("tp = 2 in the config, TensorRT-LLM's mapping has 1", tp=2)
    _expect_refusal("role = 'decode'", role="decode")
    _expect_refusal("kv_layout = 'HDN'", kv_layout="HDN")
    _expect_refusal("the config's layout has head_dim 16; TensorRT-LLM's KV cache manager head_dim 8",
                    layout={"name": "x", "layers": 4, "kv_heads": 4, "head_dim": 16, "dtype_bytes": 2,
                            "tokens_per_block": 4})
    _expect_refusal("backend = 'shm'", backend="shm")
    _expect_refusal("_FixedShutdownManager whose shutdown cannot be wrapped", mgr=_FixedShutdownManager(Mapping()))


@pytest.mark.parametrize("timeout_ms", [-1, 1 << 40])
def test_refused_shutdown_raises_and_leaves_the_transceiver_open(cluster, timeout_ms):
    """A shutdown kvxfer refuses (a negative timeout_ms: Status.INVALID_ARGUMENT;
    one that does not fit the C ABI's int32: ValueError) raises naming the
    value and leaves the node open: the send in flight goes on and is
    reported done, the manager's shutdown still closes the node and then
    releases the pool, and a later shutdown() closes it (True). (Checked to
    fail without the fix: shutdown(-1) answered False with no error and
    the node stayed open for good, nothing reaped; shutdown(1 << 40)
    raised but left _closing set, so nothing was reaped either.)"""
    cx, cm, gx, gm = cluster((1, 1), (1, 1))
    x, m = cx[0], cm[0]
    (creq,), cblocks = send(cx, cm, 60, 6, seed=9)
    with pytest.raises((KvxferError, ValueError), match=str(timeout_ms)) as info:
        x.shutdown(timeout_ms)
    if isinstance(info.value, KvxferError):
        assert info.value.status == Status.INVALID_ARGUMENT
    assert not x.closed and x.node.handle
    gm[0].add_sequence(61, [8, 9])
    req = LlmRequest(61, 6, gen_params(creq))
    gx[0].request_and_receive_async(req)
    assert reap_gen(gx[0], [61], timeout=20) == {61: "done"}, gx[0].failures
    assert reap_ctx(x, [60], timeout=20) == {60: "done"}, x.failures
    m.shutdown()  # the manager's: closes the node (finished), then releases the pool
    assert m.impl.released and x.closed
    assert x.shutdown() is True


def test_sync_receive_whose_close_finished_meanwhile_ends_failed(cluster, monkeypatch, caplog):
    """request_and_receive_sync on one thread, the transceiver's shutdown on
    another: the receive's wait sees the close under way, and the close
    finishes (every live transfer ended, no write lands any more) before the
    receive decides. The request ends DISAGG_TRANS_ERROR naming the close,
    with no "did not finish closing" warning, and nothing is left in flight;
    the close under way reads as not unfinished once it finished. (Checked
    to fail without the fix: _closing stayed set after the finished close,
    so the receive logged that the node did not finish closing and left the
    request DISAGG_GENERATION_TRANS_IN_PROGRESS.)"""
    cx, cm, gx, gm = cluster((1, 1), (1, 1))
    g = gx[0]
    gm[0].add_sequence(70, [2, 3])
    req = LlmRequest(70, 6, DisaggregatedParams(ctx_request_id=71, ctx_info_endpoint=cx[0].endpoint))  # never sent
    real_close, entered, go = g.node.close, threading.Event(), threading.Event()

    def held_close(timeout_ms=5000):
        entered.set()
        assert go.wait(20)
        real_close(timeout_ms)

    monkeypatch.setattr(g.node, "close", held_close)
    real_wait, waits, res = g._wait_settled, [], {}

    def wait_settled(t, deadline):
        waits.append(t)
        got = real_wait(t, deadline)
        if len(waits) == 2 and not got:  # the receive is about to decide: the close finishes first
            go.set()
            wait_until(lambda: "shutdown" in res, 20, "the shutdown to return")
        return got

    monkeypatch.setattr(g, "_wait_settled", wait_settled)

    def receive():
        try:
            res["receive"] = g.request_and_receive_sync(req)
        except BaseException as exc:  # noqa: BLE001 - reported below
            res["receive"] = exc

    a = threading.Thread(target=receive)
    b = threading.Thread(target=lambda: res.setdefault("shutdown", g.shutdown()))
    with caplog.at_level(logging.WARNING, logger="kvxfer.trtllm"):
        a.start()
        try:
            wait_until(lambda: waits, 20, "the receive to wait")
            b.start()
            assert entered.wait(20)
            a.join(30)
        finally:
            go.set()
            a.join(30)
            if b.ident is not None:
                b.join(30)
    assert not a.is_alive() and not b.is_alive()
    assert res == {"receive": None, "shutdown": True}, res
    assert "did not finish closing" not in caplog.text, caplog.text
    assert req.state == S.DISAGG_TRANS_ERROR and "was closed" in g.failures[70], (req.state, g.failures)
    assert g.check_gen_transfer_complete() and not g._close_unfinished()
    assert g.shutdown() is True


def test_concurrent_shutdowns_report_no_block_free_while_the_close_is_under_way(cluster, monkeypatch):
    """A shutdown on another thread whose node close is still draining: a
    second shutdown() answers False and closes nothing twice, the KV cache
    manager's shutdown does not release the pool, check_* report nothing,
    cancel_request answers False (kvxfer may still write the blocks); once
    the close finished the first answers True, the live receive is reported
    failed, the cancelled one may be freed, and shutdown() answers True
    without closing again. (A regression test: it passes without this
    branch's fixes too.)"""
    cx, cm, gx, gm = cluster((1, 1), (1, 1))
    g, m = gx[0], gm[0]
    reqs = []
    for rid, blocks in ((80, [2, 3]), (82, [4, 5])):
        m.add_sequence(rid, blocks)
        reqs.append(LlmRequest(rid, 6, DisaggregatedParams(ctx_request_id=rid + 1,
                                                           ctx_info_endpoint=cx[0].endpoint)))  # never sent
        g.request_and_receive_async(reqs[-1])
    live, cancelled = reqs
    real_close, entered, go, calls = g.node.close, threading.Event(), threading.Event(), []

    def held_close(timeout_ms=5000):
        calls.append(timeout_ms)
        entered.set()
        assert go.wait(20)
        real_close(timeout_ms)

    monkeypatch.setattr(g.node, "close", held_close)
    res = {}
    th = threading.Thread(target=lambda: res.setdefault("first", g.shutdown()))
    th.start()
    try:
        assert entered.wait(20)
        assert g.shutdown() is False
        m.shutdown()
        assert not m.impl.released
        assert tuple(g.check_gen_transfer_status(0)) == ([], [], [])
        assert tuple(g.check_gen_transfer_status(None)) == ([], [], [])
        assert not g.cancel_request(cancelled)
        assert g.has_inflight_transfer(live) and not g.check_gen_transfer_complete()
    finally:
        go.set()
        th.join(30)
    assert res == {"first": True} and calls == [5000]
    assert tuple(g.check_gen_transfer_status(0)) == ([], [80], [])
    assert live.state == S.DISAGG_TRANS_ERROR and "was closed" in g.failures[80]
    assert g.cancel_request(cancelled) and g.check_gen_transfer_complete()
    assert g.shutdown() is True and calls == [5000]
    m.shutdown()
    assert m.impl.released
