"""The vLLM worker connector's KV cache registration against caches laid
out as vLLM lays them out (allocate_uniform_kv_caches, per-layer views,
MLA): the bytes land where the decode side's backend reads them, across
FlashAttention and FlashInfer HND orders, TP head slices and prefix hits;
what kvxfer cannot tell apart or that disagrees with the layout is refused
at registration. (From a review of the registration: each failed before
its fix.)"""

from types import SimpleNamespace

import pytest
import torch

from kvxfer.connector import KvxferSchedulerConnector, KvxferWorkerConnector

from conftest import unique
from test_connector import finished

LAYERS, HEAD, TPB = 4, 8, 16
FA_ORDER = (2, 4, 0, 1, 3, 5)   # FlashAttention HND, with layers
FI_ORDER = (1, 2, 4, 0, 3, 5)   # FlashInfer HND, with layers


def shape_of(backend, nb, heads):
    return (2, nb, TPB, heads, HEAD) if backend == "FA" else (nb, 2, TPB, heads, HEAD)


def vllm_cross(backend, nb, heads, root_6d=False):
    """(cross tensor, per-layer views) as allocate_uniform_kv_caches builds
    them; root_6d: the cross tensor allocated as itself (its views' _base
    is the 6-d tensor) rather than as a view of an int8 buffer."""
    order = FA_ORDER if backend == "FA" else FI_ORDER
    logical = (LAYERS,) + shape_of(backend, nb, heads)
    physical = tuple(logical[i] for i in order)
    if root_6d:
        cross = torch.zeros(physical, dtype=torch.bfloat16)
    else:
        n = 1
        for d in physical:
            n *= d
        cross = torch.zeros(n * 2, dtype=torch.int8).view(torch.bfloat16).view(physical)
    inv = [order.index(i) for i in range(6)]
    per = cross.permute(*inv)
    return cross, order, {"model.layers.%d.self_attn.attn" % i: per[i] for i in range(LAYERS)}


def connector(instance, heads, **extra):
    return KvxferWorkerConnector(dict({"instance": instance, "workers": 2, "transfer_timeout_ms": 10000,
                                       "layout": {"layers": LAYERS, "kv_heads": heads, "head_dim": HEAD,
                                                  "dtype_bytes": 2, "tokens_per_block": TPB}}, **extra))


def register(w, backend, nb, heads, how):
    cross, order, layers = vllm_cross(backend, nb, heads, root_6d=(how == "per-layer-6d-root"))
    if how == "cross":
        w.register_cross_layers_kv_cache(cross, SimpleNamespace(
            get_name=lambda: backend, get_kv_cache_stride_order=lambda include_num_layers_dimension=False: order))
    else:
        w.register_kv_caches(layers)
    return layers


def write(backend, layer, block, slot, kv):
    if backend == "FA":
        layer[:, block, slot] = kv
    else:
        layer[block, :, slot] = kv


def read(backend, layer, block, slot):
    return layer[:, block, slot] if backend == "FA" else layer[block, :, slot]


def transfer(p, d, prompt, p_blocks, d_blocks, heads=2, d_tp=1, hit=0):
    """p, d: (backend, nb, how). Sends a prompt from a TP=1 prefill to a
    decode instance of d_tp ranks (each a head slice); returns the mismatches."""
    p_name, d_name = unique("rv-p"), unique("rv-d")
    sp = KvxferSchedulerConnector(p_name, "producer", TPB)
    sd = KvxferSchedulerConnector(d_name, "consumer", TPB)
    wp = connector(p_name, heads)
    p_layers = register(wp, p[0], p[1], heads, p[2])
    wds, d_layers = [], []
    try:
        for r in range(d_tp):
            extra = {"tp": d_tp, "rank_tp": r} if d_tp > 1 else {}
            w = connector(d_name, heads, **extra)
            wds.append(w)
            d_layers.append(register(w, d[0], d[1], heads // d_tp, d[2]))
        rid = "rv-1"
        req = SimpleNamespace(request_id=rid, prompt_token_ids=list(range(prompt)),
                              kv_transfer_params={"do_remote_decode": True}, status="FINISHED_LENGTH_CAPPED")
        sp.update_state_after_alloc(req, [p_blocks], 0)
        torch.manual_seed(5)
        truth = torch.randn((LAYERS, 2, prompt, heads, HEAD)).to(torch.bfloat16)
        for i, layer in enumerate(p_layers.values()):
            for t in range(prompt):
                write(p[0], layer, p_blocks[t // TPB], t % TPB, truth[i, :, t])
        wp.bind_connector_metadata(sp.build_connector_meta(SimpleNamespace(num_scheduled_tokens={rid: prompt})))
        wp.start_load_kv(None)
        wp.wait_for_save()
        wp.clear_connector_metadata()
        assert wp.failed == {}, wp.failed
        keep, params = sp.request_finished(req, p_blocks)
        assert keep and params is not None
        dreq = SimpleNamespace(request_id=rid + "-d", prompt_token_ids=list(range(prompt)), kv_transfer_params=params)
        assert sd.get_num_new_matched_tokens(dreq, hit * TPB)[0] == prompt - hit * TPB
        sd.update_state_after_alloc(dreq, [d_blocks], prompt - hit * TPB)
        meta = sd.build_connector_meta(SimpleNamespace(num_scheduled_tokens={}))
        for w in wds:
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            w.clear_connector_metadata()
        for w in wds:
            finished(w, "recv", rid + "-d")
            assert w.failed == {}, w.failed
        finished(wp, "send", rid, finished_req_ids={rid})
        bad = []
        hl = heads // d_tp
        for r in range(d_tp):
            for i, layer in enumerate(d_layers[r].values()):
                for t in range(prompt):
                    got = read(d[0], layer, d_blocks[t // TPB], t % TPB)
                    want = truth[i, :, t, r * hl:(r + 1) * hl]
                    if t < hit * TPB:
                        want = torch.zeros_like(want)  # a local prefix hit: never written
                    if not torch.equal(got, want):
                        bad.append((r, i, t))
        return bad
    finally:
        wp.shutdown()
        for w in wds:
            w.shutdown()


def test_flashinfer_two_blocks_is_refused():
    """FlashInfer's (num_blocks, 2, ...) with num_blocks == 2 cannot be
    told from FlashAttention's (2, num_blocks, ...): refused, naming it
    (before, its K/V and block strides were swapped: every value of the
    decode side differed)."""
    w = connector(unique("rv-two"), 8)
    try:
        with pytest.raises(ValueError, match="cannot be told apart"):
            register(w, "FI", 2, 8, "cross")
    finally:
        w.shutdown()


def test_views_of_a_6d_tensor_in_flashattention_order():
    """Per-layer views whose _base is a 6-d tensor in FlashAttention's HND
    order (not kvxfer's): register_kv_caches takes the base as kvxfer's
    pool without looking at its strides."""
    bad = transfer(("FA", 8, "per-layer-6d-root"), ("FA", 8, "cross"), 40, [5, 1, 6], [2, 7, 0])
    assert bad == [], "decode KV differs at (rank, layer, token) %s" % bad[:4]


@pytest.mark.parametrize("p,d", [(("FA", 8, "cross"), ("FI", 8, "cross")),
                                 (("FI", 8, "per-layer"), ("FA", 8, "cross"))])
def test_decode_tp2_head_slices(p, d):
    bad = transfer(p, d, 40, [5, 1, 6], [2, 7, 0], heads=4, d_tp=2)
    assert bad == [], "decode KV differs at (rank, layer, token) %s" % bad[:4]


def test_decode_prefix_hit():
    bad = transfer(("FA", 8, "cross"), ("FI", 8, "cross"), 40, [5, 1, 6], [2, 7, 0], hit=1)
    assert bad == [], "decode KV differs at (rank, layer, token) %s" % bad[:4]


@pytest.mark.parametrize("field,value", [("kv_heads", 1), ("head_dim", 4)])
def test_strided_registration_checks_the_tensors_against_the_layout(field, value):
    """Caches holding more heads (or a longer head) than the layout says:
    the pool path refused them (block bytes differ); the strided path opens
    over them and moves a part of each block."""
    layout = {"layers": LAYERS, "kv_heads": 2, "head_dim": HEAD, "dtype_bytes": 2, "tokens_per_block": TPB}
    layout[field] = value
    w = KvxferWorkerConnector({"instance": unique("rv-geo"), "workers": 2, "layout": layout})
    try:
        with pytest.raises(ValueError, match="kvxfer's layout for this rank has"):
            register(w, "FA", 8, 2, "cross")
    finally:
        w.shutdown()


@pytest.mark.parametrize("nb", [3, 8])
def test_control_flashinfer_more_blocks(nb):
    bad = transfer(("FI", nb, "cross"), ("FA", 8, "cross"), 16, [0], [3])
    assert bad == []


def test_control_views_of_an_int8_root():
    bad = transfer(("FA", 8, "per-layer"), ("FA", 8, "cross"), 40, [5, 1, 6], [2, 7, 0])
    assert bad == []


def test_mla_views_of_a_layer_major_4d_tensor():
    """MLA per-layer caches, views of one (num_layers, num_blocks,
    block_size, latent) tensor: register_kv_caches takes the 4-d base as
    kvxfer's (num_blocks, num_layers, block_size, latent) pool."""
    nb, lat, prompt = LAYERS, 16, 40  # num_blocks == num_layers: the geometry check cannot tell
    layout = {"layers": LAYERS, "kv_heads": 1, "head_dim": lat, "dtype_bytes": 2, "tokens_per_block": TPB, "mla": True}
    p_name, d_name = unique("rv-mp"), unique("rv-md")
    sp = KvxferSchedulerConnector(p_name, "producer", TPB)
    sd = KvxferSchedulerConnector(d_name, "consumer", TPB)
    wp = KvxferWorkerConnector({"instance": p_name, "workers": 2, "transfer_timeout_ms": 10000, "layout": layout})
    wd = KvxferWorkerConnector({"instance": d_name, "workers": 2, "transfer_timeout_ms": 10000, "layout": layout})
    try:
        pbase = torch.zeros((LAYERS, nb, TPB, lat), dtype=torch.bfloat16)
        p_layers = {"model.layers.%d.self_attn.attn" % i: pbase[i] for i in range(LAYERS)}
        wp.register_kv_caches(p_layers)
        dcache = torch.zeros((nb, LAYERS, TPB, lat), dtype=torch.bfloat16)
        wd.register_cross_layers_kv_cache(dcache)
        p_blocks, d_blocks, rid = [3, 1, 2], [2, 0, 3], "rv-mla"
        truth = torch.randn((LAYERS, prompt, lat)).to(torch.bfloat16)
        for i in range(LAYERS):
            for t in range(prompt):
                pbase[i, p_blocks[t // TPB], t % TPB] = truth[i, t]
        req = SimpleNamespace(request_id=rid, prompt_token_ids=list(range(prompt)),
                              kv_transfer_params={"do_remote_decode": True}, status="FINISHED_LENGTH_CAPPED")
        sp.update_state_after_alloc(req, [p_blocks], 0)
        wp.bind_connector_metadata(sp.build_connector_meta(SimpleNamespace(num_scheduled_tokens={rid: prompt})))
        wp.start_load_kv(None)
        wp.wait_for_save()
        wp.clear_connector_metadata()
        _, params = sp.request_finished(req, p_blocks)
        dreq = SimpleNamespace(request_id=rid + "-d", prompt_token_ids=list(range(prompt)), kv_transfer_params=params)
        sd.get_num_new_matched_tokens(dreq, 0)
        sd.update_state_after_alloc(dreq, [d_blocks], prompt)
        wd.bind_connector_metadata(sd.build_connector_meta(SimpleNamespace(num_scheduled_tokens={})))
        wd.start_load_kv(None)
        wd.clear_connector_metadata()
        finished(wd, "recv", rid + "-d")
        bad = [(i, t) for i in range(LAYERS) for t in range(prompt)
               if not torch.equal(dcache[d_blocks[t // TPB], i, t % TPB], truth[i, t])]
        assert bad == [], "decode latent differs at (layer, token) %s" % bad[:4]
    finally:
        wp.shutdown()
        wd.shutdown()
