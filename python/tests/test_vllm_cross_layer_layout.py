"""vLLM's KV caches as vLLM allocates them and hands them to the worker
connector. The cross-layer KV cache as vLLM allocates it and hands it to
register_cross_layers_kv_cache (kv_connector_model_runner_mixin.py,
allocate_uniform_kv_caches): one contiguous tensor whose dimensions are the
attention backend's logical (num_layers, *get_kv_cache_shape(...)) permuted
by get_kv_cache_stride_order(include_num_layers_dimension=True), and the
per-layer caches the attention kernels write are permute(inverse)[i].

Under the HND layout the connector asks for (get_required_kvcache_layout),
FlashAttention's order is (2, 4, 0, 1, 3, 5): physically (num_blocks,
num_kv_heads, num_layers, 2, block_size, head_size); FlashInfer's is
(1, 2, 4, 0, 3, 5): (num_blocks, 2, num_kv_heads, num_layers, block_size,
head_size). Neither is the (num_blocks, num_layers, 2, num_kv_heads,
block_size, head_size) the worker connector assumes."""

from types import SimpleNamespace

import pytest
import torch

import kvxfer
from kvxfer.connector import KvxferSchedulerConnector, KvxferWorkerConnector

from conftest import unique
from test_connector import finished

LAYERS, HEADS, HEAD, TPB, NBLOCKS = 4, 2, 8, 16, 64

# backend -> (get_kv_cache_shape(num_blocks, block_size, heads, head), HND stride order with layers)
BACKENDS = {
    "FLASH_ATTN": ((2, NBLOCKS, TPB, HEADS, HEAD), (2, 4, 0, 1, 3, 5)),
    "FLASHINFER": ((NBLOCKS, 2, TPB, HEADS, HEAD), (1, 2, 4, 0, 3, 5)),
}


def vllm_uniform_kv_caches(backend):
    """(cross_layers_kv_cache, {layer name: per-layer cache}) as vLLM's
    allocate_uniform_kv_caches builds them."""
    shape, order = BACKENDS[backend]
    logical = (LAYERS,) + shape
    physical = tuple(logical[i] for i in order)
    nbytes = LAYERS * NBLOCKS * 2 * TPB * HEADS * HEAD * 2
    cross = torch.zeros(nbytes, dtype=torch.int8).view(torch.bfloat16).view(physical)
    inv = [order.index(i) for i in range(len(order))]
    per_layer = cross.permute(*inv)
    return cross, {"model.layers.%d.self_attn.attn" % i: per_layer[i] for i in range(LAYERS)}


def write(backend, layer, block, slot, kv):
    """What the backend's reshape_and_cache writes for one token (kv: (2, heads, head))."""
    if backend.startswith("FLASH_ATTN"):
        layer[:, block, slot] = kv
    else:
        layer[block, :, slot] = kv


def read(backend, layer, block, slot):
    return layer[:, block, slot] if backend.startswith("FLASH_ATTN") else layer[block, :, slot]


def worker(instance, backend, **extra):
    """A worker connector over backend's caches: "-per-layer" after the
    backend's name registers one allocation per layer (register_kv_caches,
    as Model Runner V2 or a backend without a cross-layer order gives them),
    else vLLM's cross-layer tensor with the backend's stride order."""
    per_layer = backend.endswith("-per-layer")
    backend = backend.removesuffix("-per-layer")
    w = KvxferWorkerConnector(dict({"instance": instance, "workers": 2, "transfer_timeout_ms": 10000,
                                    "layout": {"layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD,
                                               "dtype_bytes": 2, "tokens_per_block": TPB}}, **extra))
    if per_layer:
        shape = BACKENDS[backend][0]
        layers = {"model.layers.%d.self_attn.attn" % i: torch.zeros(shape, dtype=torch.bfloat16) for i in range(LAYERS)}
        w.register_kv_caches(layers)
        return w, layers
    cross, layers = vllm_uniform_kv_caches(backend)
    order = BACKENDS[backend][1]
    w.register_cross_layers_kv_cache(cross, SimpleNamespace(
        get_name=lambda: backend,
        get_kv_cache_stride_order=lambda include_num_layers_dimension=False: order))
    return w, layers


@pytest.mark.parametrize("p_backend,d_backend,layer_parts", [
    ("FLASH_ATTN", "FLASH_ATTN", True),    # layer parts over a head-major block
    ("FLASHINFER", "FLASHINFER", True),
    ("FLASH_ATTN", "FLASHINFER", False),   # the two instances on different backends
    ("FLASH_ATTN-per-layer", "FLASHINFER", True),  # one allocation per layer to a cross-layer tensor
    ("FLASHINFER", "FLASHINFER-per-layer", False),
])
def test_prefill_to_decode_over_vllms_cross_layer_tensor(p_backend, d_backend, layer_parts):
    before = kvxfer.handle_count()
    p_name, d_name = unique("xl-prefill"), unique("xl-decode")
    sp = KvxferSchedulerConnector(p_name, "producer", TPB)
    sd = KvxferSchedulerConnector(d_name, "consumer", TPB)
    wp, p_layers = worker(p_name, p_backend, layer_parts=layer_parts)
    wd, d_layers = worker(d_name, d_backend)
    try:
        prompt, rid = 100, "xl-1"
        nb = -(-prompt // TPB)
        p_blocks = [list(range(NBLOCKS - 1, NBLOCKS - 1 - 3 * nb, -3))]
        req = SimpleNamespace(request_id=rid, prompt_token_ids=list(range(prompt)),
                              kv_transfer_params={"do_remote_decode": True}, status="FINISHED_LENGTH_CAPPED")
        sp.update_state_after_alloc(req, p_blocks, 0)
        torch.manual_seed(5)
        truth = torch.randn((LAYERS, 2, prompt, HEADS, HEAD)).to(torch.bfloat16)
        wp.bind_connector_metadata(sp.build_connector_meta(SimpleNamespace(num_scheduled_tokens={rid: prompt})))
        wp.start_load_kv(None)
        for i, (name, layer) in enumerate(p_layers.items()):  # the forward pass, layer by layer
            for t in range(prompt):
                write(p_backend, layer, p_blocks[0][t // TPB], t % TPB, truth[i, :, t])
            wp.save_kv_layer(name, layer, None)
        wp.wait_for_save()
        wp.clear_connector_metadata()
        assert wp.failed == {}, wp.failed
        keep, params = sp.request_finished(req, p_blocks[0])
        assert keep and params is not None

        dreq = SimpleNamespace(request_id=rid + "-d", prompt_token_ids=list(range(prompt)),
                               kv_transfer_params=params)
        assert sd.get_num_new_matched_tokens(dreq, 0) == (prompt, True)
        d_blocks = [list(range(1, 1 + 2 * nb, 2))]
        sd.update_state_after_alloc(dreq, d_blocks, prompt)
        wd.bind_connector_metadata(sd.build_connector_meta(SimpleNamespace(num_scheduled_tokens={})))
        wd.start_load_kv(None)
        wd.clear_connector_metadata()
        finished(wd, "recv", rid + "-d")
        assert wd.failed == {}, wd.failed
        finished(wp, "send", rid, finished_req_ids={rid})
        for i, layer in enumerate(d_layers.values()):
            for t in range(prompt):
                assert torch.equal(read(d_backend, layer, d_blocks[0][t // TPB], t % TPB), truth[i, :, t]), \
                    "layer %d token %d differs on the decode side" % (i, t)
    finally:
        wp.shutdown()
        wd.shutdown()
    assert kvxfer.handle_count() == before


def test_held_blocks_keep_vllms_engine_stepping():
    """vLLM's Scheduler.has_requests() is `unfinished or finished_req_ids or
    connector.has_pending_push_work()`: once a prefill instance's last
    request finished, only that hook makes EngineCore step again, and only a
    step polls get_finished (whose finished_sending frees the blocks
    request_finished kept). While a kept request is unreported, the
    scheduler half must say there is pending work; once vLLM's aggregated
    connector output reports it sent, not."""
    sp = KvxferSchedulerConnector(unique("xl-idle"), "producer", TPB)
    req = SimpleNamespace(request_id="idle-1", prompt_token_ids=list(range(40)),
                          kv_transfer_params={"do_remote_decode": True}, status="FINISHED_LENGTH_CAPPED")
    sp.update_state_after_alloc(req, [[5, 6, 7]], 0)
    sp.build_connector_meta(SimpleNamespace(num_scheduled_tokens={"idle-1": 40}))
    keep, _ = sp.request_finished(req, [5, 6, 7])
    assert keep
    assert sp.has_pending_push_work() is True
    sp.update_connector_output(SimpleNamespace(finished_sending={"idle-1"}, finished_recving=None))
    assert sp.has_pending_push_work() is False
