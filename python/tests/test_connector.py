"""The vLLM-shaped connector end to end: a prefill instance computes a
prompt in chunks and hands each over from wait_for_save; the decode
instance loads it into its own block table; the KV is equal per layer."""

import contextlib
import time
from types import SimpleNamespace

import pytest
import torch

import kvxfer
from kvxfer.connector import (
    KvxferSchedulerConnector,
    KvxferWorkerConnector,
)

from conftest import unique, wait_until

LAYERS, HEADS, HEAD, TPB, NBLOCKS = 4, 2, 8, 16, 64


def kv_caches():
    """vLLM's per-layer KV caches over one cross-layer tensor (the layout
    the worker connector registers), by layer name."""
    cache = torch.zeros((NBLOCKS, LAYERS, 2, HEADS, TPB, HEAD), dtype=torch.bfloat16)
    return {"model.layers.%d.self_attn" % i: cache[:, i].transpose(2, 3) for i in range(LAYERS)}


def worker(instance, **extra):
    layers = kv_caches()
    w = KvxferWorkerConnector(dict({"instance": instance, "workers": 2, "transfer_timeout_ms": 10000,
                                    "layout": {"layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD,
                                               "dtype_bytes": 2, "tokens_per_block": TPB}}, **extra))
    w.register_kv_caches(layers)
    return w, layers


@contextlib.contextmanager
def pd_pair(prefill=None, decode=None):
    """A prefill and a decode instance, each a scheduler connector and a
    worker (with the worker options given for its side), as
    (sp, sd, wp, p_layers, wd, d_layers). The workers shut down at the
    end; a body that did not raise leaves no kvxfer handle open."""
    before = kvxfer.handle_count()
    p_name, d_name = unique("vllm-prefill"), unique("vllm-decode")
    sp = KvxferSchedulerConnector(p_name, "producer", TPB)
    sd = KvxferSchedulerConnector(d_name, "consumer", TPB)
    wp, p_layers = worker(p_name, **(prefill or {}))
    wd, d_layers = worker(d_name, **(decode or {}))
    try:
        yield sp, sd, wp, p_layers, wd, d_layers
    finally:
        wp.shutdown()
        wd.shutdown()
    assert kvxfer.handle_count() == before


CAPPED, ABORTED = "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED"  # vLLM's RequestStatus names


def prefill_request(rid, prompt, status=CAPPED):
    """A P/D request on the prefill instance as vLLM's proxy sends it
    (kv_transfer_params with do_remote_decode), with the status
    request_finished sees: CAPPED, the one token the proxy asked for, or
    ABORTED."""
    return SimpleNamespace(request_id=rid, prompt_token_ids=list(range(prompt)),
                           kv_transfer_params={"do_remote_decode": True}, status=status)


def finished(w, side, rid, timeout=10.0, finished_req_ids=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sent, recv = w.get_finished(set(finished_req_ids))
        if rid in ((sent if side == "send" else recv) or ()):
            return
        time.sleep(0.001)
    raise AssertionError("%s of %s not finished in %.0f s" % (side, rid, timeout))


@pytest.mark.parametrize("layer_parts", [False, True])
def test_connector_prefill_to_decode(layer_parts):
    """Whole chunks from wait_for_save, or (layer_parts) each layer's part
    from save_kv_layer, handed before the next layer's KV is written."""
    with pd_pair(prefill=dict(layer_parts=layer_parts)) as (sp, sd, wp, p_layers, wd, d_layers):
        prompt = 200
        req = prefill_request("cmpl-1", prompt)
        nb = -(-prompt // TPB)
        p_blocks = [list(range(NBLOCKS - 1, NBLOCKS - 1 - 3 * nb, -3))]  # vLLM's block table, not contiguous
        assert sp.get_num_new_matched_tokens(req, 0) == (0, False)
        sp.update_state_after_alloc(req, p_blocks, 0)
        torch.manual_seed(11)
        truth = torch.randn((LAYERS, 2, prompt, HEADS, HEAD)).to(torch.bfloat16)
        done = 0
        while done < prompt:  # chunked prefill, 64 tokens a step
            step = min(64, prompt - done)
            wp.bind_connector_metadata(sp.build_connector_meta(SimpleNamespace(num_scheduled_tokens={"cmpl-1": step})))
            wp.start_load_kv(None)
            for i, (name, layer) in enumerate(p_layers.items()):  # the forward pass, layer by layer
                for t in range(done, done + step):
                    layer[p_blocks[0][t // TPB], :, t % TPB] = truth[i, :, t]
                wp.save_kv_layer(name, layer, None)
            wp.wait_for_save()
            wp.clear_connector_metadata()
            done += step
        keep, params = sp.request_finished(req, p_blocks)
        assert keep and params["remote_instance"] == sp.instance

        dreq = SimpleNamespace(request_id="cmpl-1-decode", prompt_token_ids=list(range(prompt)),
                               kv_transfer_params=params)
        assert sd.get_num_new_matched_tokens(dreq, 0) == (prompt, True)
        d_blocks = [list(range(1, 1 + 2 * nb, 2))]
        sd.update_state_after_alloc(dreq, d_blocks, prompt)
        wd.bind_connector_metadata(sd.build_connector_meta(SimpleNamespace(num_scheduled_tokens={})))
        wd.start_load_kv(None)
        for name in d_layers:
            wd.wait_for_layer_load(name)
        wd.clear_connector_metadata()
        finished(wd, "recv", "cmpl-1-decode")
        # The send is DONE, but vLLM has not said the request finished
        # generating: get_finished holds it back until it does.
        deadline = time.monotonic() + 10
        while "cmpl-1" not in wp._sent_done:
            sent, _ = wp.get_finished(set())
            assert "cmpl-1" not in (sent or ()), "a send reported before its request finished generating"
            assert time.monotonic() < deadline, "the send never completed"
            time.sleep(0.001)
        finished(wp, "send", "cmpl-1", finished_req_ids={"cmpl-1"})
        assert wp.get_finished(set()) == (None, None)
        assert wp.failed == {} and wd.failed == {}
        for i, layer in enumerate(d_layers.values()):
            for t in range(prompt):
                assert torch.equal(layer[d_blocks[0][t // TPB], :, t % TPB], truth[i, :, t]), (i, t)


def test_connector_layer_parts_misuse_is_named():
    """A layer saved out of order fails its request naming the layers, a
    step whose layers were not all saved fails it at wait_for_save naming
    the chunk: neither raises out of vLLM's execute_model (that would end
    every request of the worker); each send is cancelled, kept in failed
    with the error, and reported sent once its request finished. A name
    without the layer's index is refused at registration."""
    before = kvxfer.handle_count()
    p_name = unique("vllm-parts")
    sp = KvxferSchedulerConnector(p_name, "producer", TPB)
    wp, p_layers = worker(p_name, layer_parts=True, transfer_timeout_ms=60000)
    try:
        names = list(p_layers)
        for rid, blocks in (("cmpl-2", [0, 1, 2, 3]), ("cmpl-3", [4, 5, 6, 7])):
            sp.update_state_after_alloc(prefill_request(rid, 64), [blocks], 0)
        wp.bind_connector_metadata(sp.build_connector_meta(SimpleNamespace(num_scheduled_tokens={"cmpl-2": 32})))
        wp.save_kv_layer(names[0], p_layers[names[0]])
        wp.save_kv_layer(names[2], p_layers[names[2]])  # layer 1 skipped
        e = wp.failed["cmpl-2"]
        assert isinstance(e, kvxfer.KvxferError), e
        assert e.status == kvxfer.Status.BAD_CHUNK and "starts at layer 1" in e.message, e
        wp.save_kv_layer(names[3], p_layers[names[3]])  # the failed send's later layers go nowhere
        wp.wait_for_save()
        wp.clear_connector_metadata()
        assert str(wp.failed["cmpl-2"]) == str(e)
        wp.bind_connector_metadata(sp.build_connector_meta(SimpleNamespace(num_scheduled_tokens={"cmpl-3": 32})))
        wp.save_kv_layer(names[0], p_layers[names[0]])  # the other layers never saved
        wp.wait_for_save()
        wp.clear_connector_metadata()
        e = wp.failed["cmpl-3"]
        assert isinstance(e, RuntimeError) and "chunk [0, 32): save_kv_layer handed its layers up to 1 of 4" in str(e)
        for rid in ("cmpl-2", "cmpl-3"):
            assert sp.request_finished(prefill_request(rid, 64, ABORTED), []) == (True, None)
            finished(wp, "send", rid, timeout=5.0, finished_req_ids={rid})
    finally:
        wp.shutdown()
    assert kvxfer.handle_count() == before
    w = KvxferWorkerConnector({"instance": unique("x"), "layer_parts": True})
    with pytest.raises(ValueError, match="'model.attn': want exactly one integer part"):
        w.register_kv_caches({"model.attn": torch.zeros(1)})


def step(sp, wp, layers, rid, p_blocks, truth, done, n, **scheduler_output):
    """One prefill step of n tokens of request rid from token done: the
    forward pass writes them, wait_for_save hands them over.
    scheduler_output: more attributes of vLLM's SchedulerOutput."""
    wp.bind_connector_metadata(sp.build_connector_meta(
        SimpleNamespace(num_scheduled_tokens={rid: n}, **scheduler_output)))
    wp.start_load_kv(None)
    for i, (name, layer) in enumerate(layers.items()):
        for t in range(done, done + n):
            layer[p_blocks[0][t // TPB], :, t % TPB] = truth[i, :, t]
        wp.save_kv_layer(name, layer, None)
    wp.wait_for_save()
    wp.clear_connector_metadata()
    return done + n


def test_connector_abort():
    """vLLM aborts requests mid-flight. A decode request aborted while its
    KV loads is cancelled by the worker and reported in finished_recving
    (vLLM keeps its blocks until then), not left to the transfer timeout;
    its blocks then take the next request's KV. A prefill aborted halfway
    is cancelled, reported sent (the blocks go back) with no params for a
    decode side; one aborted before any step keeps nothing. Neither is a
    failure. The transfer timeout (60 s) is far beyond the test's waits,
    so only the cancels can end these requests in time."""
    prompt = 100
    nb = -(-prompt // TPB)
    torch.manual_seed(12)
    truth = torch.randn((LAYERS, 2, prompt, HEADS, HEAD)).to(torch.bfloat16)
    with pd_pair(prefill=dict(transfer_timeout_ms=60000), decode=dict(transfer_timeout_ms=60000)) as (sp, sd, wp, p_layers, wd, d_layers):
        # Aborted before its first step: no worker ever heard of it.
        early = prefill_request("early", prompt, ABORTED)
        sp.update_state_after_alloc(early, [list(range(nb))], 0)
        assert sp.request_finished(early, [list(range(nb))]) == (False, None)

        # A prefill aborted after one of its two steps.
        p_blocks = [list(range(nb))]
        half = prefill_request("half", prompt, ABORTED)
        sp.update_state_after_alloc(half, p_blocks, 0)
        step(sp, wp, p_layers, "half", p_blocks, truth, 0, 64)
        assert sp.request_finished(half, p_blocks) == (True, None)
        finished(wp, "send", "half", timeout=5.0, finished_req_ids={"half"})

        # A decode request aborted while it waits for a prefill that never
        # hands its KV over.
        d_blocks = [list(range(3, 3 + nb))]
        params = {"do_remote_prefill": True, "remote_instance": sp.instance, "remote_request_id": "never"}
        gone = SimpleNamespace(request_id="gone", prompt_token_ids=list(range(prompt)), kv_transfer_params=params)
        assert sd.get_num_new_matched_tokens(gone, 0) == (prompt, True)
        sd.update_state_after_alloc(gone, d_blocks, prompt)
        wd.bind_connector_metadata(sd.build_connector_meta(SimpleNamespace(num_scheduled_tokens={})))
        wd.start_load_kv(None)
        wd.clear_connector_metadata()
        assert wd.get_finished(set()) == (None, None)
        assert sd.request_finished(gone, d_blocks) == (False, None)
        finished(wd, "recv", "gone", timeout=5.0, finished_req_ids={"gone"})
        assert wp.failed == {} and wd.failed == {}
        assert not wd._gen_finished, "a decode request's id kept for a send that never comes"

        # The same destination blocks take the next request's KV.
        p_blocks = [list(range(20, 20 + nb))]
        full = prefill_request("full", prompt)
        sp.update_state_after_alloc(full, p_blocks, 0)
        done = 0
        while done < prompt:
            done = step(sp, wp, p_layers, "full", p_blocks, truth, done, min(64, prompt - done))
        keep, params = sp.request_finished(full, p_blocks)
        assert keep and params["remote_request_id"] == "full"
        load_and_check(sd, wd, d_layers, params, truth, prompt, d_blocks, "full-d")
        finished(wp, "send", "full", finished_req_ids={"full"})
        assert wp.failed == {}


def test_connector_failed_load_names_its_blocks():
    """A receive that fails (here: its prefill is aborted halfway, so the
    context side cancels) is reported finished, kept in failed, and its
    destination blocks come back from get_block_ids_with_load_errors once,
    so that vLLM recomputes them instead of decoding from KV that never
    landed."""
    prompt = 100
    nb = -(-prompt // TPB)
    truth = torch.randn((LAYERS, 2, prompt, HEADS, HEAD)).to(torch.bfloat16)
    with pd_pair(prefill=dict(transfer_timeout_ms=60000), decode=dict(transfer_timeout_ms=60000)) as (sp, sd, wp, p_layers, wd, _):
        p_blocks, d_blocks = [list(range(nb))], [list(range(40, 40 + nb))]
        req = prefill_request("x", prompt, ABORTED)
        sp.update_state_after_alloc(req, p_blocks, 0)
        step(sp, wp, p_layers, "x", p_blocks, truth, 0, 64)
        params = {"do_remote_prefill": True, "remote_instance": sp.instance, "remote_request_id": "x"}
        dreq = SimpleNamespace(request_id="x-d", prompt_token_ids=list(range(prompt)), kv_transfer_params=params)
        sd.update_state_after_alloc(dreq, d_blocks, prompt)
        wd.bind_connector_metadata(sd.build_connector_meta(SimpleNamespace(num_scheduled_tokens={})))
        wd.start_load_kv(None)
        wd.clear_connector_metadata()
        assert wd.get_block_ids_with_load_errors() == set()
        sp.request_finished(req, p_blocks)
        finished(wp, "send", "x", timeout=5.0, finished_req_ids={"x"})
        finished(wd, "recv", "x-d", timeout=5.0)
        assert "x-d" in wd.failed and wp.failed == {}
        assert wd.get_block_ids_with_load_errors() == set(d_blocks[0])
        assert wd.get_block_ids_with_load_errors() == set()


def load_and_check(sd, wd, d_layers, params, truth, prompt, d_blocks, rid):
    """The decode side loads request rid's prompt into d_blocks from the
    prefill instance params name; every token of every layer equals truth."""
    dreq = SimpleNamespace(request_id=rid, prompt_token_ids=list(range(prompt)), kv_transfer_params=params)
    assert sd.get_num_new_matched_tokens(dreq, 0) == (prompt, True)
    sd.update_state_after_alloc(dreq, d_blocks, prompt)
    wd.bind_connector_metadata(sd.build_connector_meta(SimpleNamespace(num_scheduled_tokens={})))
    wd.start_load_kv(None)
    wd.clear_connector_metadata()
    finished(wd, "recv", rid)
    assert wd.failed == {}, wd.failed
    check_tokens(d_layers, d_blocks, truth, prompt)


def check_tokens(d_layers, d_blocks, truth, prompt):
    """Every token of every layer in blocks d_blocks (group 0's table) equals truth."""
    for i, layer in enumerate(d_layers.values()):
        for t in range(prompt):
            assert torch.equal(layer[d_blocks[0][t // TPB], :, t % TPB], truth[i, :, t]), (i, t)


@pytest.mark.parametrize("layer_parts", [False, True])
def test_connector_steps_not_aligned_to_blocks(layer_parts):
    """vLLM's token budget need not be a multiple of the block size: a
    prompt of 40 tokens in steps of 20 (16 tokens a block) is handed over
    in chunks ending on block boundaries ([0, 16), then [16, 40)), and
    arrives intact. A request aborted after less than a block was computed
    handed nothing over: its blocks go back at once."""
    prompt = 40
    torch.manual_seed(13)
    truth = torch.randn((LAYERS, 2, prompt, HEADS, HEAD)).to(torch.bfloat16)
    with pd_pair(prefill=dict(layer_parts=layer_parts)) as (sp, sd, wp, p_layers, wd, d_layers):
        p_blocks, d_blocks = [[9, 4, 7]], [[30, 2, 17]]
        req = prefill_request("odd", prompt)
        sp.update_state_after_alloc(req, p_blocks, 0)
        done = step(sp, wp, p_layers, "odd", p_blocks, truth, 0, 20)
        step(sp, wp, p_layers, "odd", p_blocks, truth, done, 20)
        keep, params = sp.request_finished(req, p_blocks)
        assert keep and params and params["remote_request_id"] == "odd", params
        load_and_check(sd, wd, d_layers, params, truth, prompt, d_blocks, "odd-d")
        finished(wp, "send", "odd", finished_req_ids={"odd"})
        assert wp.failed == {}

        short = prefill_request("short", prompt, ABORTED)
        sp.update_state_after_alloc(short, [[20, 21, 22]], 0)
        meta = sp.build_connector_meta(SimpleNamespace(num_scheduled_tokens={"short": 10}))
        assert meta.reqs_to_send == {}, meta.reqs_to_send  # under a block: nothing to hand yet
        assert sp.request_finished(short, [[20, 21, 22]]) == (False, None)


def test_connector_local_prefix_cache_hit_is_handed_over():
    """A new request whose first 32 tokens vLLM found in its local prefix
    cache (num_computed_tokens, their KV already in the request's blocks)
    is scheduled from token 32: the handed-over KV still starts at token 0,
    the whole prompt reaches the decode side, and request_finished gives
    the params once the last token was handed."""
    prompt, cached = 100, 32
    nb = -(-prompt // TPB)
    torch.manual_seed(14)
    truth = torch.randn((LAYERS, 2, prompt, HEADS, HEAD)).to(torch.bfloat16)
    with pd_pair() as (sp, sd, wp, p_layers, wd, d_layers):
        p_blocks, d_blocks = [list(range(10, 10 + nb))], [list(range(40, 40 + nb))]
        for i, layer in enumerate(p_layers.values()):  # an earlier request's KV, in the prefix cache
            for t in range(cached):
                layer[p_blocks[0][t // TPB], :, t % TPB] = truth[i, :, t]
        req = prefill_request("hit", prompt)
        sp.update_state_after_alloc(req, p_blocks, 0)
        new = [SimpleNamespace(req_id="hit", num_computed_tokens=cached)]
        done = step(sp, wp, p_layers, "hit", p_blocks, truth, cached, 40, scheduled_new_reqs=new)
        step(sp, wp, p_layers, "hit", p_blocks, truth, done, prompt - done, scheduled_new_reqs=[])
        keep, params = sp.request_finished(req, p_blocks)
        assert keep and params and params["remote_request_id"] == "hit", params
        load_and_check(sd, wd, d_layers, params, truth, prompt, d_blocks, "hit-d")
        finished(wp, "send", "hit", finished_req_ids={"hit"})
        assert wp.failed == {}


def test_connector_refused_receive_is_a_failed_load():
    """A receive the engine refuses (here: a second decode request with the
    same remote_request_id as one still loading) does not end the step:
    the requests after it are received, and it is kept in failed with its
    error, its blocks reported as load errors and its id in
    finished_recving, so vLLM does not wait for it forever."""
    before = kvxfer.handle_count()
    d_name = unique("vllm-decode")
    sd = KvxferSchedulerConnector(d_name, "consumer", TPB)
    wd, _ = worker(d_name, transfer_timeout_ms=60000)
    prefill = unique("vllm-prefill")  # never opened: nothing reaches these receives

    def params(remote):
        return {"do_remote_prefill": True, "remote_instance": prefill, "remote_request_id": remote}

    def load(*reqs):
        for rid, remote, blocks in reqs:
            req = SimpleNamespace(request_id=rid, prompt_token_ids=list(range(32)), kv_transfer_params=params(remote))
            sd.update_state_after_alloc(req, [blocks], 32)
        wd.bind_connector_metadata(sd.build_connector_meta(SimpleNamespace(num_scheduled_tokens={})))
        wd.start_load_kv(None)
        wd.clear_connector_metadata()

    try:
        load(("a", "same", [1, 2]))
        load(("c", "same", [3, 4]), ("b", "other", [5, 6]))
        assert sorted(wd._recvs) == ["a", "b"]
        assert isinstance(wd.failed.get("c"), kvxfer.KvxferError), wd.failed
        assert wd.failed["c"].status == kvxfer.Status.BAD_REQUEST and "same" in wd.failed["c"].message
        assert wd.get_finished(set()) == (None, {"c"})
        assert wd.get_block_ids_with_load_errors() == {3, 4}
        assert wd.failed.pop("c") is not None and wd.failed == {}
        got, aborted = set(), {"a", "b"}  # vLLM aborts the others

        def reported():
            got.update(wd.get_finished(aborted)[1] or ())
            aborted.clear()
            return got == {"a", "b"}

        wait_until(reported, what="the aborted receives in finished_recving")
        assert wd.failed == {} and wd.get_block_ids_with_load_errors() == set()
    finally:
        wd.shutdown()
    assert kvxfer.handle_count() == before


@pytest.mark.parametrize("layer_parts", [False, True])
def test_connector_passes_the_decode_parallelism(layer_parts):
    """A producer worker told the decode instances' parallelism
    ("generation_tp", "generation_pp") passes it to each send. On MLA
    context rank 1 of TP2 with decode TP1, which writes to no decode rank,
    the send ends DONE at its first step and is reported as sent, not failed
    at its deadline (2 s here); the prompt's later steps hand nothing more
    (before, the next step opened a second send of the request, refused
    for starting past block 0)."""
    before = kvxfer.handle_count()
    name = unique("vllm-mla")
    sp = KvxferSchedulerConnector(name, "producer", TPB)
    cache = torch.zeros((NBLOCKS, LAYERS, 1, 1, TPB, HEAD), dtype=torch.bfloat16)  # MLA: one latent per token
    wp = KvxferWorkerConnector({"instance": name, "workers": 2, "transfer_timeout_ms": 2000, "tp": 2, "rank_tp": 1,
                                "layout": {"layers": LAYERS, "kv_heads": 1, "head_dim": HEAD, "dtype_bytes": 2,
                                           "tokens_per_block": TPB, "mla": True},
                                "layer_parts": layer_parts, "generation_tp": 1, "generation_pp": 1})
    wp.register_cross_layers_kv_cache(cache)
    try:
        prompt, rid = 40, "cmpl-mla"
        req = prefill_request(rid, prompt)
        blocks = [[5, 9, 2]]
        sp.update_state_after_alloc(req, blocks, 0)
        for n in (16, 16, 8):  # three prefill steps, get_finished between them as vLLM calls it
            wp.bind_connector_metadata(sp.build_connector_meta(SimpleNamespace(num_scheduled_tokens={rid: n})))
            wp.start_load_kv(None)
            for i in range(LAYERS):
                wp.save_kv_layer("model.layers.%d.self_attn" % i, cache[:, i])
            wp.wait_for_save()
            wp.clear_connector_metadata()
            assert wp.get_finished(set()) == (None, None)
        keep, params = sp.request_finished(req, blocks)
        assert keep and params is not None
        finished(wp, "send", rid, finished_req_ids={rid})
        assert wp.failed == {}, wp.failed
        assert wp._nothing_to_send == set() and wp._handed_all == set()
    finally:
        wp.shutdown()
    assert kvxfer.handle_count() == before


class FakeStream:
    """The current CUDA stream of a pretend GPU: the model's KV writes and
    the events recorded behind them queue here and run, in order, only
    when the test says the GPU ran them (run())."""

    def __init__(self):
        self.queue = []

    def run(self):
        queue, self.queue = self.queue, []
        for work in queue:
            work()


class FakeEvent:
    """The part of torch.cuda.Event the connector uses: record(stream)
    completes it behind the work queued on stream so far."""

    made = []

    def __init__(self):
        self.done, self.waiters = False, []
        self.cuda_event, self.device = 0xE000 + len(FakeEvent.made), torch.device("cuda", 0)
        FakeEvent.made.append(self)

    def record(self, stream):
        stream.queue.append(self._complete)

    def _complete(self):
        self.done = True
        for w in self.waiters:
            w()


@pytest.mark.parametrize("layer_parts", [False, True])
def test_connector_gpu_cache_hands_chunks_behind_cuda_events(monkeypatch, layer_parts):
    """A KV cache on a GPU: the model's kernels are queued, not done, when
    vLLM calls save_kv_layer or wait_for_save, so each chunk must leave
    behind a CUDA event recorded then on the cache's device's current
    stream, never behind a fence made ready at once (which would send the
    blocks before the KV is in them). The GPU is pretended: the prefill
    cache is host memory marked as on cuda:0, torch.cuda's Event and
    current_stream are stand-ins whose stream runs the model's writes and
    the events when the test says, and an event handed to Request.chunk
    makes the chunk's fence ready once it completes. Every element is
    checked on the decode side, and the events are kept until the send
    ended. (Checked to fail: with the fence made ready at once, as before,
    "handed behind a host fence"; with the events dropped only at close,
    "events kept after their send ended".)"""
    stream = FakeStream()
    FakeEvent.made = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)

    def current_stream(device=None):
        assert device == 0, device
        return stream

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    host_fenced = []
    real_chunk = kvxfer.core.Request.chunk

    def chunk(self, start, end, runs, last=None, fenced=True, cuda_event=None, device=None, layers=None):
        if cuda_event is None:
            if fenced:
                host_fenced.append((start, end, layers))
            return real_chunk(self, start, end, runs, last=last, fenced=fenced, layers=layers)
        assert device == 0 and isinstance(cuda_event, FakeEvent) and not cuda_event.done, (device, cuda_event)
        cuda_event.waiters.append(real_chunk(self, start, end, runs, last=last, layers=layers).ready)
        return None

    monkeypatch.setattr(kvxfer.core.Request, "chunk", chunk)
    with pd_pair(prefill=dict(layer_parts=layer_parts)) as (sp, sd, wp, p_layers, wd, d_layers):
        wp._device = 0  # the pretend GPU's (register_cross_layers_kv_cache reads it from a CUDA tensor)
        prompt = 150
        req = prefill_request("cmpl-g", prompt)
        nb = -(-prompt // TPB)
        p_blocks = [list(range(NBLOCKS - 1, NBLOCKS - 1 - 2 * nb, -2))]
        sp.get_num_new_matched_tokens(req, 0)
        sp.update_state_after_alloc(req, p_blocks, 0)
        torch.manual_seed(5)
        truth = torch.randn((LAYERS, 2, prompt, HEADS, HEAD)).to(torch.bfloat16)

        def write(layer, i, t):
            def run():
                layer[p_blocks[0][t // TPB], :, t % TPB] = truth[i, :, t]
            return run

        done = 0
        while done < prompt:
            n = min(64, prompt - done)
            wp.bind_connector_metadata(sp.build_connector_meta(SimpleNamespace(num_scheduled_tokens={"cmpl-g": n})))
            wp.start_load_kv(None)
            for i, (name, layer) in enumerate(p_layers.items()):  # the forward pass: kernels queued
                stream.queue.extend(write(layer, i, t) for t in range(done, done + n))
                wp.save_kv_layer(name, layer, None)
            wp.wait_for_save()
            wp.clear_connector_metadata()
            stream.run()  # the GPU runs the step: the KV lands, then the events complete
            done += n
        assert not host_fenced, "handed behind a host fence: %s" % host_fenced
        assert FakeEvent.made and all(e.done for e in FakeEvent.made)
        # Held by the engine, which the module keeps open even if the
        # worker is dropped without shutdown().
        held = [e for evs in wp.engine.cuda_fences.values() for e in evs]
        _, params = sp.request_finished(req, p_blocks)
        dreq = SimpleNamespace(request_id="cmpl-g-decode", prompt_token_ids=list(range(prompt)),
                               kv_transfer_params=params)
        sd.get_num_new_matched_tokens(dreq, 0)
        d_blocks = [list(range(1, 1 + nb))]
        sd.update_state_after_alloc(dreq, d_blocks, prompt)
        wd.bind_connector_metadata(sd.build_connector_meta(SimpleNamespace(num_scheduled_tokens={})))
        wd.start_load_kv(None)
        wd.clear_connector_metadata()
        finished(wd, "recv", "cmpl-g-decode")
        finished(wp, "send", "cmpl-g", finished_req_ids={"cmpl-g"})
        assert wp.failed == {} and wd.failed == {}
        check_tokens(d_layers, d_blocks, truth, prompt)
        assert sorted(map(id, held)) == sorted(map(id, FakeEvent.made)), "an event not kept until its send ended"
        assert wp.engine.cuda_fences == {}, "events kept after their send ended"


def test_one_config_serves_every_rank_bind_names_the_rank():
    """vLLM hands every worker of an instance the same kv_transfer_config:
    "bind" names the rank ({tp}, {pp}, {rank} = pp * tp_size + tp, format
    specs allowed), so that each rank's node binds its own endpoint. Two
    tensor-parallel ranks of one prefill instance open their nodes side by
    side; a placeholder kvxfer does not know is a ValueError naming bind.
    (Checked to fail: without the substitution both ranks bind the same
    path, and the second is refused.)"""
    import tempfile

    from kvxfer.connector import node_config

    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        cfg = {"instance": unique("tp2-prefill"), "workers": 2, "backend": "shm", "insecure": True,
               "bind": "ipc://%s/prefill-{rank}.sock" % d, "tp": 2, "pp": 1,
               "layout": {"layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD, "dtype_bytes": 2,
                          "tokens_per_block": TPB}}
        workers = []
        try:
            for rank in (0, 1):
                w = KvxferWorkerConnector(dict(cfg, rank_tp=rank), role="producer")
                workers.append(w)
                w.register_cross_layers_kv_cache(
                    torch.zeros((NBLOCKS, LAYERS, 2, HEADS // 2, TPB, HEAD), dtype=torch.bfloat16))  # a rank's heads
            assert [w.engine.endpoint() for w in workers] == ["ipc://%s/prefill-%d.sock" % (d, r) for r in (0, 1)]
        finally:
            for w in workers:
                w.shutdown()
    assert node_config(dict(cfg, bind="tcp://10.0.0.1:56{rank:02d}", rank_tp=1, rank_pp=1, pp=2),
                       "producer")["bind"] == "tcp://10.0.0.1:5603"
    assert node_config(dict(cfg, bind="ipc:///x/p{pp}-t{tp}.sock", rank_tp=1), "producer")["bind"] == "ipc:///x/p0-t1.sock"
    # Not str.format: no attribute access, no unbounded width, nothing but the three names.
    for bad in ("ipc:///x/{node}.sock", "ipc:///x/{rank.__class__}.sock", "ipc:///x/{rank.nope}.sock",
                "tcp://h:{rank:999999999}", "ipc:///x/{rank:x}.sock", "ipc:///x/{}.sock", "ipc:///x/{rank.sock"):
        with pytest.raises(ValueError, match=r"bind = .*: a rank's endpoint may name \{tp\}, \{pp\} and \{rank\}"):
            node_config(dict(cfg, bind=bad), "producer")


def test_node_config_carries_the_pipeline_split():
    """A worker's pp_stages (vLLM's split of the layers over its pipeline
    stages) goes into the node's parallel as its stages; a worker without
    one leaves the node on kvxfer's default split."""
    from kvxfer.connector import node_config

    cfg = {"instance": "p", "insecure": True, "bind": "ipc:///x/p{rank}.sock", "tp": 1, "pp": 4, "rank_pp": 1}
    assert node_config(dict(cfg, pp_stages="7,8,8,7"), "producer")["parallel"] == {"tp": 1, "pp": 4, "stages": "7,8,8,7"}
    assert node_config(cfg, "producer")["parallel"] == {"tp": 1, "pp": 4}


def test_connector_config_of_the_wrong_type_named():
    """KvxferWorkerConnector(config) took dict(config): JSON text was
    \"dictionary update sequence element #0 has length 1; 2 is required\",
    None \"'NoneType' object is not iterable\" (checked to fail). JSON text
    of an object is taken; anything else names the connector and value."""
    w = KvxferWorkerConnector('{"instance": "json-text", "layer_parts": true}')
    assert w.config == {"instance": "json-text"} and w.layer_parts
    with pytest.raises(TypeError, match=r"KvxferWorkerConnector: config must be a dict .*not NoneType"):
        KvxferWorkerConnector(None)
    with pytest.raises(ValueError, match=r"KvxferWorkerConnector: config '\{' is no valid JSON"):
        KvxferWorkerConnector("{")


def test_connector_register_kv_caches_of_the_wrong_type_named():
    """register_kv_caches given a list of tensors (not vLLM's dict by layer
    name) was a torch TypeError from split_with_sizes, an empty dict an
    IndexError, None "'NoneType' object is not iterable", a non-tensor
    entry an AttributeError (checked to fail: none named kv_caches). Each
    names kv_caches; the worker opened nothing and registers afterwards."""
    before = kvxfer.handle_count()
    w = KvxferWorkerConnector({"instance": unique("reg"), "workers": 2,
                               "layout": {"layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD,
                                          "dtype_bytes": 2, "tokens_per_block": TPB}})
    layers = kv_caches()
    for bad, exc, want in [(list(layers.values()), TypeError, "kv_caches is a list"),
                           ({}, ValueError, "kv_caches is empty"),
                           (None, TypeError, "kv_caches is a NoneType"),
                           (dict(layers, **{"model.layers.0.self_attn": 5}), TypeError,
                            "kv_caches['model.layers.0.self_attn'] is a int")]:
        with pytest.raises(exc) as e:
            w.register_kv_caches(bad)
        assert "register_kv_caches: " + want in str(e.value), e.value
    assert w.engine is None and kvxfer.handle_count() == before
    w.register_kv_caches(layers)
    w.shutdown()
    assert kvxfer.handle_count() == before
