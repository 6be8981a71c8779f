"""The connector driven as vLLM's scheduler and model runner drive it
(vllm/v1/core/sched/scheduler.py, kv_connector_model_runner_mixin.py):
blocks allocated step by step, preemption, aborts, decode-side prefix
hits, malformed kv_transfer_params, failures that must stay one request's."""

import enum
import logging
from types import SimpleNamespace

import pytest
import torch

import kvxfer
from kvxfer.connector import KvxferSchedulerConnector, RecvSpec

from conftest import unique
from test_connector import LAYERS, TPB, worker, finished, load_and_check, pd_pair, prefill_request


def sched_out(num_scheduled, new=(), cached=(), preempted=(), finished_ids=(), resumed=()):
    """A SchedulerOutput as vLLM builds it: scheduled_new_reqs (NewRequestData:
    req_id, block_ids, num_computed_tokens) and scheduled_cached_reqs
    (CachedRequestData: req_ids, new_block_ids, resumed_req_ids) carry the
    block ids vLLM allocated this step (a resumed request's new_block_ids
    are its whole table)."""
    cached = list(cached)
    return SimpleNamespace(
        num_scheduled_tokens=dict(num_scheduled),
        scheduled_new_reqs=[SimpleNamespace(req_id=r, block_ids=(list(b),), num_computed_tokens=c)
                            for r, b, c in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached],
                                              new_block_ids=[(list(b),) for _, b in cached],
                                              resumed_req_ids=set(resumed)),
        preempted_req_ids=set(preempted), finished_req_ids=set(finished_ids))


class Blocks:
    """vLLM's KVCacheBlocks: get_block_ids() is a tuple, one list per group."""

    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (list(self.ids),)


def forward(wp, layers, meta, writes):
    """One execute_model: bind, start_load_kv, the layers write the KV
    (writes: [(block, slot, layer) -> tensor] via a callback), wait_for_save."""
    wp.bind_connector_metadata(meta)
    wp.start_load_kv(None)
    for i, (name, layer) in enumerate(layers.items()):
        writes(i, layer)
        wp.save_kv_layer(name, layer, None)
    wp.wait_for_save()
    wp.clear_connector_metadata()


def write_tokens(truth, table, lo, hi):
    def w(i, layer):
        for t in range(lo, hi):
            layer[table[t // TPB], :, t % TPB] = truth[i, :, t]
    return w


@pytest.mark.parametrize("layer_parts", [False, True])
def test_chunked_prefill_blocks_allocated_per_step(layer_parts):
    """vLLM allocates a prefill's blocks step by step: allocate_slots covers
    num_computed_tokens + num_new_tokens only, update_state_after_alloc is
    called once, from the WAITING loop, with the first step's blocks
    (scheduler.py: `self.connector.update_state_after_alloc(request,
    self.kv_cache_manager.get_blocks(request_id), ...)`), and the blocks of
    later steps reach the connector only as
    scheduler_output.scheduled_cached_reqs.new_block_ids (what NIXL's
    _build_save_meta reads through yield_req_data). A 200-token prompt in
    steps of 64 must still arrive whole."""
    prompt, rid = 200, "chunky"
    table = [50, 3, 41, 7, 22, 9, 60, 14, 33, 2, 48, 19, 27]  # 13 blocks, handed out 4, 4, 5
    torch.manual_seed(21)
    truth = torch.randn((LAYERS, 2, prompt, 2, 8)).to(torch.bfloat16)
    with pd_pair(prefill=dict(layer_parts=layer_parts)) as (sp, sd, wp, p_layers, wd, d_layers):
        req = prefill_request(rid, prompt)
        assert sp.get_num_new_matched_tokens(req, 0) == (0, False)
        sp.update_state_after_alloc(req, Blocks(table[:4]), 0)   # the first step's blocks only
        steps = [(0, 64, sched_out({rid: 64}, new=[(rid, table[:4], 0)])),
                 (64, 128, sched_out({rid: 64}, cached=[(rid, table[4:8])])),
                 (128, 200, sched_out({rid: 72}, cached=[(rid, table[8:])]))]
        for lo, hi, so in steps:
            forward(wp, p_layers, sp.build_connector_meta(so), write_tokens(truth, table, lo, hi))
            wp.get_finished(set())
        keep, params = sp.request_finished(req, table)
        assert keep and params is not None
        d_blocks = [list(range(1, 14))]
        load_and_check(sd, wd, d_layers, params, truth, prompt, d_blocks, "chunky-d")
        finished(wp, "send", rid, finished_req_ids={rid})


def test_producer_preempted_mid_prefill():
    """vLLM preempts a running prefill when it runs out of blocks
    (scheduler.py _preempt_request: kv_cache_manager.free(request),
    num_computed_tokens = 0, back to WAITING): its blocks go back at once,
    with no request_finished, and the workers hear of it only through
    scheduler_output.preempted_req_ids (KVConnectorBase_V1.handle_preemptions,
    'BEFORE their blocks are overwritten'). Resumed, the request is computed
    again from token 0 into new blocks (update_state_after_alloc is called
    again with them). The decode side must still get the prompt's KV, not
    the old, freed blocks (now another request's) nor the wrong new ones."""
    prompt, rid = 100, "preempted"
    old, new = [10, 11, 12, 13, 14, 15, 16], [30, 31, 32, 33, 34, 35, 36]
    torch.manual_seed(22)
    truth = torch.randn((LAYERS, 2, prompt, 2, 8)).to(torch.bfloat16)
    with pd_pair(prefill=dict(transfer_timeout_ms=10000)) as (sp, sd, wp, p_layers, wd, d_layers):
        req = prefill_request(rid, prompt)
        sp.update_state_after_alloc(req, Blocks(old), 0)
        forward(wp, p_layers, sp.build_connector_meta(sched_out({rid: 64}, new=[(rid, old, 0)])),
                write_tokens(truth, old, 0, 64))
        wp.get_finished(set())
        # Preempted: its blocks are freed and another request's KV lands there.
        so = sched_out({}, preempted=[rid])
        wp.bind_connector_metadata(sp.build_connector_meta(so))
        if hasattr(wp, "handle_preemptions"):
            wp.handle_preemptions(so.preempted_req_ids)
        for layer in p_layers.values():
            layer[old] = 7.0
        wp.clear_connector_metadata()
        # Resumed: the whole prompt again, into new blocks.
        sp.update_state_after_alloc(req, Blocks(new), 0)
        forward(wp, p_layers, sp.build_connector_meta(sched_out({rid: prompt}, cached=[(rid, new)], resumed=[rid])),
                write_tokens(truth, new, 0, prompt))
        keep, params = sp.request_finished(req, new)
        assert keep and params is not None
        load_and_check(sd, wd, d_layers, params, truth, prompt, [list(range(1, 8))], "preempted-d")


def test_decode_request_rescheduled_after_its_load():
    """A decode request whose KV was loaded can come back to vLLM's WAITING
    loop (preempted for blocks: num_computed_tokens = 0). vLLM then calls
    get_num_new_matched_tokens again, with its local prefix-cache hit, which
    for a request that generated tokens can exceed the prompt (hits cover
    prompt + output tokens, up to num_tokens - 1). NIXL loads once: its
    update_state_after_alloc sets params["do_remote_prefill"] = False. The
    answer must be (0, False): a positive count with True asks the prefill
    instance for KV it freed long ago (a receive that ends only at the
    transfer timeout), and vLLM asserts `num_external_computed_tokens > 0`
    whenever load_kv_async is True, so 0 or a negative count with True
    kills the engine core."""
    sd = KvxferSchedulerConnector(unique("vllm-decode"), "consumer", TPB)
    prompt = 96
    params = {"do_remote_prefill": True, "remote_instance": "p", "remote_request_id": "r"}
    req = SimpleNamespace(request_id="d", prompt_token_ids=list(range(prompt)), kv_transfer_params=params)
    assert sd.get_num_new_matched_tokens(req, 0) == (prompt, True)
    sd.update_state_after_alloc(req, Blocks(range(6)), prompt)
    sd.build_connector_meta(sched_out({}))
    # ... loaded, reported in finished_recving, decoded 40 tokens, preempted.
    got = [sd.get_num_new_matched_tokens(req, hits) for hits in (0, 96, 128)]
    for n, load_async in got:
        assert not (load_async and n <= 0), "vLLM asserts num_external_computed_tokens > 0: %s" % (got,)
    assert got == [(0, False)] * 3, got


def full_prefill(sp, wp, p_layers, rid, table, truth, prompt, params=None):
    """A whole prompt computed in one step (its blocks allocated at once)."""
    req = SimpleNamespace(request_id=rid, prompt_token_ids=list(range(prompt)), kv_transfer_params=params,
                          status="FINISHED_LENGTH_CAPPED")
    sp.update_state_after_alloc(req, Blocks(table), 0)
    forward(wp, p_layers, sp.build_connector_meta(sched_out({rid: prompt}, new=[(rid, table, 0)])),
            write_tokens(truth, table, 0, prompt))
    return req


def test_decode_prefix_hit_blocks_are_not_written():
    """On the decode instance vLLM's prefix cache can hold the prompt's
    first blocks: get_num_new_matched_tokens gets num_computed_tokens (the
    local hit), and the KVCacheBlocks given to update_state_after_alloc
    start with those cached blocks, shared with every running request that
    has the same prefix. NIXL pulls into blocks.get_unhashed_block_ids_all_groups()
    only (nixl/scheduler.py update_state_after_alloc). The receive must not
    write the shared blocks (other requests read them while it lands);
    kvxfer's receive takes prefix_hit_blocks for this (docs/integration.md:
    'num_computed_tokens / block_size is PrefixHitBlocks')."""
    prompt, hit = 100, 32
    torch.manual_seed(23)
    truth = torch.randn((LAYERS, 2, prompt, 2, 8)).to(torch.bfloat16)
    with pd_pair() as (sp, sd, wp, p_layers, wd, d_layers):
        req = full_prefill(sp, wp, p_layers, "hit", list(range(7)), truth, prompt, params={"do_remote_decode": True})
        keep, params = sp.request_finished(req, list(range(7)))
        d_table = [40, 41, 42, 43, 44, 45, 46]
        for layer in d_layers.values():  # blocks 40, 41: cached locally, read by running requests
            layer[d_table[:2]] = 3.0
        snapshot = [layer[d_table[:2]].clone() for layer in d_layers.values()]
        dreq = SimpleNamespace(request_id="hit-d", prompt_token_ids=list(range(prompt)), kv_transfer_params=params)
        n, load_async = sd.get_num_new_matched_tokens(dreq, hit)
        assert (n, load_async) == (prompt - hit, True)
        sd.update_state_after_alloc(dreq, Blocks(d_table), n)
        wd.bind_connector_metadata(sd.build_connector_meta(sched_out({})))
        wd.start_load_kv(None)
        wd.clear_connector_metadata()
        finished(wd, "recv", "hit-d")
        assert wd.failed == {}, wd.failed
        for i, layer in enumerate(d_layers.values()):
            assert torch.equal(layer[d_table[:2]], snapshot[i]), "the receive wrote the shared prefix-hit blocks"
            for t in range(hit, prompt):
                assert torch.equal(layer[d_table[t // TPB], :, t % TPB], truth[i, :, t]), (i, t)
        finished(wp, "send", "hit", finished_req_ids={"hit"})


@pytest.mark.parametrize("params", [
    {"do_remote_prefill": True},                                        # no remote_instance
    {"do_remote_prefill": True, "remote_instance": "p", "remote_request_id": None},
    {"do_remote_prefill": True, "remote_instance": 7, "remote_request_id": "r"},
    # No remote_request_id: the decode request's own id never names the
    # prefill's send (vLLM makes internal ids unique per engine), so a
    # receive under it would only end at the transfer timeout.
    {"do_remote_prefill": True, "remote_instance": "p"},
])
def test_malformed_kv_transfer_params(params, caplog):
    """kv_transfer_params come from the client's JSON body. NIXL checks them
    in update_state_after_alloc and, when a field is missing, logs 'Got
    invalid KVTransferParams ... will not utilize KVTransfer'. An exception
    from a scheduler-side connector call kills vLLM's engine core (every
    request on the instance), one from start_load_kv the worker. A request
    with bad params is computed locally ((0, False)), with a warning naming
    the field; a request that got past that (bad values start_load_kv is
    given) fails alone, as a failed load."""
    d_name = unique("vllm-decode")
    sd = KvxferSchedulerConnector(d_name, "consumer", TPB)
    wd, _ = worker(d_name, transfer_timeout_ms=2000)
    try:
        req = SimpleNamespace(request_id="bad", prompt_token_ids=list(range(32)), kv_transfer_params=params)
        with caplog.at_level(logging.WARNING, logger="kvxfer.connector"):
            n, load_async = sd.get_num_new_matched_tokens(req, 0)
        assert (n, load_async) == (0, False)
        field = "remote_instance" if not isinstance(params.get("remote_instance"), str) else "remote_request_id"
        assert "request bad: invalid kv_transfer_params, %s = " % field in caplog.text, caplog.text
        # vLLM asks again at every step while the request waits for blocks:
        # the warning is not repeated.
        with caplog.at_level(logging.WARNING, logger="kvxfer.connector"):
            for _ in range(3):
                assert sd.get_num_new_matched_tokens(req, 0) == (0, False)
        assert caplog.text.count("request bad: invalid kv_transfer_params") == 1, caplog.text
        sd.update_state_after_alloc(req, Blocks([1, 2]), n)
        assert sd.request_finished(req, [1, 2]) == (False, None)
        meta = sd.build_connector_meta(sched_out({}))
        assert meta.reqs_to_recv == {} and meta.reqs_to_release == {}
        meta.reqs_to_recv["bad"] = RecvSpec(32, [[1, 2]], params.get("remote_instance"),
                                            params.get("remote_request_id", "bad"))
        wd.bind_connector_metadata(meta)
        wd.start_load_kv(None)
        wd.clear_connector_metadata()
        finished(wd, "recv", "bad", timeout=5.0)
        assert "bad" in wd.failed and wd.get_block_ids_with_load_errors() == {1, 2}
    finally:
        wd.shutdown()


@pytest.mark.parametrize("case", ["aborted", "not_pd"])
def test_producer_request_no_decode_will_read_frees_its_blocks(case):
    """NIXL's request_finished (nixl/scheduler.py) keeps a prefill's blocks
    only for a P/D request that completed: `if not
    params.get("do_remote_decode"): return False, None` and `if
    request.status != RequestStatus.FINISHED_LENGTH_CAPPED: ... return
    False, None` (an abort frees at once; the proxy never sends the decode
    request of a prefill it aborted). Here: a prefill aborted in the step
    that computed its last token, and a request sent to the prefill
    instance without do_remote_decode. No decode side will ever ask for
    their KV, so their blocks must come back now, not after the transfer
    timeout (60 s here, 30 s by default) holding KV cache the instance
    needs for new prefills."""
    before = kvxfer.handle_count()
    p_name = unique("vllm-prefill")
    sp = KvxferSchedulerConnector(p_name, "producer", TPB)
    wp, p_layers = worker(p_name, transfer_timeout_ms=60000)
    prompt, rid = 64, "gone-" + case
    truth = torch.randn((LAYERS, 2, prompt, 2, 8)).to(torch.bfloat16)
    try:
        params = {"do_remote_decode": True} if case == "aborted" else None
        req = full_prefill(sp, wp, p_layers, rid, [1, 2, 3, 4], truth, prompt, params=params)
        if case == "aborted":
            req.status = "FINISHED_ABORTED"
        keep, xfer = sp.request_finished(req, [1, 2, 3, 4])
        if keep:  # then the worker must report it soon
            wp.bind_connector_metadata(sp.build_connector_meta(sched_out({}, finished_ids=[rid])))
            wp.start_load_kv(None)
            wp.wait_for_save()
            wp.clear_connector_metadata()
            finished(wp, "send", rid, timeout=5.0, finished_req_ids={rid})
        assert xfer is None, "params for a request no decode instance will load: %s" % (xfer,)
    finally:
        wp.shutdown()
    assert kvxfer.handle_count() == before


def test_decode_request_aborted_before_it_was_scheduled():
    """A decode request aborted while still in vLLM's waiting queue
    (never allocated: no update_state_after_alloc, no receive). NIXL's
    request_finished sees do_remote_prefill still set and queues the
    request with empty blocks 'so that our worker side will notify and
    free blocks in the prefill instance' (nixl/scheduler.py). Here the
    prefill instance keeps the prompt's blocks until its transfer timeout
    (60 s here, 30 s by default) for every such abort."""
    prompt = 64
    truth = torch.randn((LAYERS, 2, prompt, 2, 8)).to(torch.bfloat16)
    with pd_pair(prefill=dict(transfer_timeout_ms=60000), decode=dict(transfer_timeout_ms=60000)) as (sp, sd, wp, p_layers, wd, _):
        req = full_prefill(sp, wp, p_layers, "p1", [1, 2, 3, 4], truth, prompt, params={"do_remote_decode": True})
        keep, params = sp.request_finished(req, [1, 2, 3, 4])
        assert keep and params
        dreq = SimpleNamespace(request_id="d1", prompt_token_ids=list(range(prompt)), kv_transfer_params=params,
                               status="FINISHED_ABORTED")
        assert sd.request_finished(dreq, []) == (False, None)
        for _ in range(3):  # the decode instance's next steps
            wd.bind_connector_metadata(sd.build_connector_meta(sched_out({}, finished_ids=["d1"])))
            wd.start_load_kv(None)
            wd.wait_for_save()
            wd.clear_connector_metadata()
            wd.get_finished({"d1"})
        finished(wp, "send", "p1", timeout=5.0, finished_req_ids={"p1"})


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_producer_preempted_outside_schedule(runner):
    """vLLM's Scheduler.reset_prefix_cache(reset_running_requests=True)
    preempts every running request outside schedule() (_preempt_request:
    blocks freed, num_computed_tokens = 0): no preempted_req_ids ever
    names them. The next step resumes a prefill from its first token into
    new blocks (V1: in scheduled_cached_reqs.resumed_req_ids with its
    whole table; Model Runner V2: in scheduled_new_reqs again), while
    that step's forward writes other requests' KV into its old blocks.
    The chunk handed before the reset still names the old blocks, unread
    while no decode side asked: the decode side must get the prompt's KV,
    not what the old blocks hold once reused."""
    prompt, rid = 100, "reset-" + runner
    old, new = [10, 11, 12, 13, 14, 15, 16], [30, 31, 32, 33, 34, 35, 36]
    torch.manual_seed(24)
    truth = torch.randn((LAYERS, 2, prompt, 2, 8)).to(torch.bfloat16)
    with pd_pair(prefill=dict(transfer_timeout_ms=60000), decode=dict(transfer_timeout_ms=60000)) as (sp, sd, wp, p_layers, wd, d_layers):
        req = prefill_request(rid, prompt)
        sp.update_state_after_alloc(req, Blocks(old), 0)
        forward(wp, p_layers, sp.build_connector_meta(sched_out({rid: 64}, new=[(rid, old, 0)])),
                write_tokens(truth, old, 0, 64))
        wp.get_finished(set())
        # reset_prefix_cache: the blocks go back, nothing tells the connector.
        sp.update_state_after_alloc(req, Blocks(new), 0)
        if runner == "v1":
            so = sched_out({rid: prompt}, cached=[(rid, new)], resumed=[rid])
        else:
            so = sched_out({rid: prompt}, new=[(rid, new, 0)])
        meta = sp.build_connector_meta(so)
        wp.handle_preemptions(meta.preempted_req_ids)  # vLLM: handle_preemptions(kv_connector_metadata)
        recompute = write_tokens(truth, new, 0, prompt)

        def step(i, layer):  # this step's forward: the prompt again, another request in the old blocks
            recompute(i, layer)
            layer[old] = 7.0
        forward(wp, p_layers, meta, step)
        keep, params = sp.request_finished(req, new)
        assert keep and params is not None
        load_and_check(sd, wd, d_layers, params, truth, prompt, [list(range(1, 8))], rid + "-d")
        finished(wp, "send", rid, finished_req_ids={rid})
        assert rid not in wp.failed, wp.failed


def test_producer_preempted_while_a_decode_side_reads():
    """A decode side that already receives a prefill vLLM then preempts
    (possible when its params reached it early) must not read the freed
    blocks: handle_preemptions returns once the send ended (its handle is
    released), the receive fails and its blocks are load errors (vLLM
    recomputes them), and the resumed prefill is handed over under a new
    id, which request_finished's params name."""
    prompt, rid = 100, "read-preempted"
    old, new, d_blocks = [10, 11, 12, 13, 14, 15, 16], [30, 31, 32, 33, 34, 35, 36], list(range(1, 8))
    truth = torch.randn((LAYERS, 2, prompt, 2, 8)).to(torch.bfloat16)
    with pd_pair(prefill=dict(transfer_timeout_ms=60000), decode=dict(transfer_timeout_ms=60000)) as (sp, sd, wp, p_layers, wd, d_layers):
        req = prefill_request(rid, prompt)
        sp.update_state_after_alloc(req, Blocks(old), 0)
        forward(wp, p_layers, sp.build_connector_meta(sched_out({rid: 64}, new=[(rid, old, 0)])),
                write_tokens(truth, old, 0, 64))
        early = {"do_remote_prefill": True, "remote_instance": sp.instance, "remote_request_id": rid}
        dreq = SimpleNamespace(request_id="early-d", prompt_token_ids=list(range(prompt)), kv_transfer_params=early)
        sd.update_state_after_alloc(dreq, Blocks(d_blocks), prompt)
        forward(wd, d_layers, sd.build_connector_meta(sched_out({})), lambda i, layer: None)
        so = sched_out({}, preempted=[rid])
        wp.bind_connector_metadata(sp.build_connector_meta(so))
        handles = kvxfer.handle_count()
        wp.handle_preemptions(so.preempted_req_ids)
        assert kvxfer.handle_count() == handles - 1, "handle_preemptions returned before the send ended"
        wp.clear_connector_metadata()
        finished(wd, "recv", "early-d", timeout=5.0)
        assert "early-d" in wd.failed
        assert wd.get_block_ids_with_load_errors() == set(d_blocks)
        sp.update_state_after_alloc(req, Blocks(new), 0)
        forward(wp, p_layers, sp.build_connector_meta(sched_out({rid: prompt}, cached=[(rid, new)], resumed=[rid])),
                write_tokens(truth, new, 0, prompt))
        keep, params = sp.request_finished(req, new)
        assert keep and params["remote_request_id"] != rid, params
        load_and_check(sd, wd, d_layers, params, truth, prompt, [d_blocks], "resumed-d")
        finished(wp, "send", rid, finished_req_ids={rid})
        assert rid not in wp.failed, wp.failed


@pytest.mark.parametrize("layer_parts", [False, True])
def test_refused_chunk_fails_its_request_alone(layer_parts):
    """A chunk the engine refuses (here: a block id outside the pool)
    raises nothing out of execute_model (vLLM would end the worker and
    every request on it): the request's send is cancelled and kept in
    failed with the error, the other request of the step is handed over
    whole, the decode side's receive of the failed one fails with load
    errors, and the failed send is reported once its request finished."""
    prompt = 32
    truth = torch.randn((LAYERS, 2, prompt, 2, 8)).to(torch.bfloat16)
    with pd_pair(prefill=dict(layer_parts=layer_parts, transfer_timeout_ms=60000), decode=dict(transfer_timeout_ms=60000)) as (sp, sd, wp, p_layers, wd, d_layers):
        bad, good = prefill_request("bad", prompt), prefill_request("good", prompt)
        sp.update_state_after_alloc(bad, Blocks([1, 10000]), 0)
        sp.update_state_after_alloc(good, Blocks([2, 3]), 0)
        forward(wp, p_layers, sp.build_connector_meta(sched_out({"bad": prompt, "good": prompt})),
                write_tokens(truth, [2, 3], 0, prompt))
        assert isinstance(wp.failed.get("bad"), kvxfer.KvxferError), wp.failed
        assert "10000" in str(wp.failed["bad"]), wp.failed["bad"]
        keep, params = sp.request_finished(good, [2, 3])
        load_and_check(sd, wd, d_layers, params, truth, prompt, [[5, 6]], "good-d")
        finished(wp, "send", "good", finished_req_ids={"good"})
        params = {"do_remote_prefill": True, "remote_instance": sp.instance, "remote_request_id": "bad"}
        dreq = SimpleNamespace(request_id="bad-d", prompt_token_ids=list(range(prompt)), kv_transfer_params=params)
        sd.update_state_after_alloc(dreq, Blocks([7, 8]), prompt)
        forward(wd, d_layers, sd.build_connector_meta(sched_out({})), lambda i, layer: None)
        finished(wd, "recv", "bad-d", timeout=5.0)
        assert "bad-d" in wd.failed and wd.get_block_ids_with_load_errors() == {7, 8}
        sp.request_finished(bad, [1, 10000])
        finished(wp, "send", "bad", timeout=5.0, finished_req_ids={"bad"})


def test_failed_entries_are_dropped_once_reported():
    """vLLM never looks at the worker's failed dict: an entry lives until
    the get_finished call after the one that reported it, so a worker that
    runs for weeks does not keep every failure."""
    before = kvxfer.handle_count()
    d_name = unique("vllm-decode")
    sd = KvxferSchedulerConnector(d_name, "consumer", TPB)
    wd, _ = worker(d_name, transfer_timeout_ms=60000)
    prefill = unique("vllm-prefill")  # never opened: nothing reaches these receives

    def load(rid, blocks):
        params = {"do_remote_prefill": True, "remote_instance": prefill, "remote_request_id": "same"}
        req = SimpleNamespace(request_id=rid, prompt_token_ids=list(range(32)), kv_transfer_params=params)
        sd.update_state_after_alloc(req, Blocks(blocks), 32)
        forward(wd, {}, sd.build_connector_meta(sched_out({})), None)

    try:
        load("live", [1, 2])
        for i in range(5):  # each refused: "same" is already receiving
            load("refused-%d" % i, [3, 4])
            assert wd.get_finished(set()) == (None, {"refused-%d" % i})
            assert list(wd.failed) == ["refused-%d" % i], wd.failed
            assert wd.get_block_ids_with_load_errors() == {3, 4}
        assert wd.get_finished(set()) == (None, None)
        assert wd.failed == {}, wd.failed
        finished(wd, "recv", "live", timeout=5.0, finished_req_ids={"live"})  # vLLM aborts it
        wd.get_finished(set())
        assert wd.failed == {}, wd.failed
    finally:
        wd.shutdown()
    assert kvxfer.handle_count() == before


class RequestStatus(enum.IntEnum):
    """vLLM's RequestStatus (vllm/v1/request.py), in part: an IntEnum,
    whose str() is its number."""

    FINISHED_STOPPED = 6
    FINISHED_LENGTH_CAPPED = 7
    FINISHED_ABORTED = 8


@pytest.mark.parametrize("status, keep", [(RequestStatus.FINISHED_LENGTH_CAPPED, True),
                                          (RequestStatus.FINISHED_ABORTED, False),
                                          (RequestStatus.FINISHED_STOPPED, False)])
def test_request_finished_reads_vllms_status_enum(status, keep):
    """request_finished reads vLLM's RequestStatus by name: only a P/D
    prefill that ended FINISHED_LENGTH_CAPPED gets params; any other end
    has its send cancelled in the next step's metadata."""
    sp = KvxferSchedulerConnector(unique("vllm-prefill"), "producer", TPB)
    req = prefill_request("r", 32, status)
    sp.update_state_after_alloc(req, Blocks([1, 2]), 0)
    assert sp.build_connector_meta(sched_out({"r": 32}, new=[("r", [1, 2], 0)])).reqs_to_send
    done, params = sp.request_finished(req, [1, 2])
    assert done and (params is not None) == keep, params
    assert sp.build_connector_meta(sched_out({})).reqs_to_cancel == (set() if keep else {"r"})


def test_preemption_while_the_engine_closes_raises_nothing_into_vllm(monkeypatch):
    """handle_preemptions waits for the cancelled send's event; an engine
    that closes under that wait (KvxferError CLOSED) must not raise out
    of vLLM's scheduler step: the preemption is logged and the send left
    to the close. (Checked to fail: without the except, the KvxferError
    escapes.)"""
    prompt, rid = 100, "closing-preempted"
    blocks = [10, 11, 12, 13, 14, 15, 16]
    truth = torch.randn((LAYERS, 2, prompt, 2, 8)).to(torch.bfloat16)
    with pd_pair(prefill=dict(transfer_timeout_ms=60000)) as (sp, sd, wp, p_layers, wd, d_layers):
        req = prefill_request(rid, prompt)
        sp.update_state_after_alloc(req, Blocks(blocks), 0)
        forward(wp, p_layers, sp.build_connector_meta(sched_out({rid: 64}, new=[(rid, blocks, 0)])),
                write_tokens(truth, blocks, 0, 64))

        def closed(*args, **kwargs):
            raise kvxfer.KvxferError(kvxfer.Status.CLOSED, "engine closed")

        monkeypatch.setattr(wp.engine, "wait", closed)
        so = sched_out({}, preempted=[rid])
        wp.bind_connector_metadata(sp.build_connector_meta(so))
        wp.handle_preemptions(so.preempted_req_ids)  # must not raise
        wp.clear_connector_metadata()
        monkeypatch.undo()
        assert rid not in wp._sends
