"""kvxfer.vllm.KvxferConnector as vLLM loads it: by module path and class
name through KVConnectorFactory, once per role, each call handed to the
right half; a config error named at construction; a transfer between two
instances over the real engine.

vLLM is not installed here, so the test puts a minimal `vllm` into
sys.modules: only what kvxfer/vllm.py imports, copied in shape from vLLM's
main branch on GitHub (vllm-project/vllm):
vllm/distributed/kv_transfer/kv_connector/v1/base.py at commit
003df2961dd8830c317a61f9745ccd557da9fa06 (KVConnectorBase_V1's
__init__(vllm_config, role, kv_cache_config), its abstract and optional
methods, KVConnectorRole, SupportsHMA) and
vllm/distributed/kv_transfer/kv_connector/factory.py at commit
a4cd9d0d28bdb41db8dfe0acdafac2bf2f608630 (create_connector: import by
kv_connector_module_path, getattr by kv_connector, the HMA check, then
cls(config, role, kv_cache_config), or cls(config, role) for a class whose
__init__ lacks kv_cache_config; releases before that always did the
latter)."""

import enum
import importlib
import inspect
import sys
import types
from abc import ABC, abstractmethod
from types import SimpleNamespace

import pytest
import torch

import kvxfer
from kvxfer.connector import KvxferConnectorMetadata, KvxferSchedulerConnector, KvxferWorkerConnector

from conftest import unique
from test_connector import HEAD, HEADS, LAYERS, TPB, check_tokens, finished, kv_caches, prefill_request
from test_connector_vllm_semantics import Blocks, forward, full_prefill, sched_out


# The fake vllm ------------------------------------------------------------

class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024
    pass


class SupportsHMA(ABC):
    @abstractmethod
    def request_finished_all_groups(self, request, block_ids):
        raise NotImplementedError


def supports_hma(connector):
    return issubclass(connector, SupportsHMA) if isinstance(connector, type) else isinstance(connector, SupportsHMA)


class KVConnectorBase_V1(ABC):
    """The real base's constructor, its seven abstract methods and its
    optional hooks (defaults as there: nothing, None, empty)."""

    @property
    def prefer_cross_layer_blocks(self):
        return False

    def __init__(self, vllm_config, role, kv_cache_config):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self):
        return self._role

    # Worker side
    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def has_connector_metadata(self):
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches):
        return

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        return

    def set_host_xfer_buffer_ops(self, copy_operation):
        return

    def handle_preemptions(self, kv_connector_metadata):
        return

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs):
        pass

    @abstractmethod
    def wait_for_layer_load(self, layer_name):
        pass

    @abstractmethod
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    @abstractmethod
    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self):
        return set()

    def shutdown(self):
        return None

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def get_handshake_metadata(self):
        return None

    def build_connector_worker_meta(self):
        return None

    # Scheduler side
    def bind_gpu_block_pool(self, gpu_block_pool):
        return

    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        pass

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    @abstractmethod
    def build_connector_meta(self, scheduler_output):
        pass

    def on_new_request(self, request):
        return

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request, block_ids):
        return False, None

    def take_events(self):
        return ()

    def has_pending_push_work(self):
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract base class")
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return False

    def get_finished_count(self):
        return None

    def reset_cache(self):
        return None


RANKS = {"tp": 0, "pp": 0}  # what the fake parallel state answers


def install_fake_vllm():
    """The fake vllm in sys.modules; returns what it replaced."""
    mods = {}
    for name in ("vllm", "vllm.distributed", "vllm.distributed.kv_transfer",
                 "vllm.distributed.kv_transfer.kv_connector", "vllm.distributed.kv_transfer.kv_connector.v1",
                 "vllm.distributed.kv_transfer.kv_connector.v1.base", "vllm.distributed.parallel_state"):
        mods[name] = types.ModuleType(name)
    base = mods["vllm.distributed.kv_transfer.kv_connector.v1.base"]
    for obj in (KVConnectorBase_V1, KVConnectorRole, KVConnectorMetadata, SupportsHMA, supports_hma):
        setattr(base, obj.__name__, obj)
    ps = mods["vllm.distributed.parallel_state"]
    ps.get_tensor_model_parallel_rank = lambda: RANKS["tp"]
    ps.get_pp_group = lambda: SimpleNamespace(rank_in_group=RANKS["pp"])
    saved = {name: sys.modules.get(name) for name in list(mods) + ["kvxfer.vllm"]}
    sys.modules.update(mods)
    sys.modules.pop("kvxfer.vllm", None)
    return saved


@pytest.fixture(scope="module", autouse=True)
def fake_vllm():
    saved = install_fake_vllm()
    yield
    for name, mod in saved.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod


def supports_kw(fn, name):
    """vllm.utils.func_utils.supports_kw, for a named parameter."""
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def create_connector(config, role, kv_cache_config=None, old_factory=False):
    """KVConnectorFactory.create_connector for a connector given by module
    path; old_factory: a release that always constructed cls(config, role)."""
    ktc = config.kv_transfer_config
    module = importlib.import_module(ktc.kv_connector_module_path)
    try:
        cls = getattr(module, ktc.kv_connector)
    except AttributeError as e:
        raise AttributeError("Class %s not found in %s" % (ktc.kv_connector, ktc.kv_connector_module_path)) from e
    if old_factory:
        return cls(config, role)
    if not config.scheduler_config.disable_hybrid_kv_cache_manager and not supports_hma(cls):
        raise ValueError("Connector %s does not support HMA but HMA is enabled. Please set "
                         "`--disable-hybrid-kv-cache-manager`." % cls.__name__)
    if not supports_kw(cls, "kv_cache_config"):
        return cls(config, role)
    return cls(config, role, kv_cache_config)


# Helpers --------------------------------------------------------------------

def layout():
    return {"layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD, "dtype_bytes": 2}


def vllm_config(kv_role, engine_id=None, extra=None, tp=1, pp=1, hma_off=True):
    """The parts of vLLM's VllmConfig the connector and the factory read."""
    if extra is None:
        extra = {"layout": layout(), "workers": 2, "transfer_timeout_ms": 10000}
    ktc = SimpleNamespace(kv_connector="KvxferConnector", kv_connector_module_path="kvxfer.vllm", kv_role=kv_role,
                          engine_id=engine_id or unique("vllm-engine"), kv_connector_extra_config=extra)
    return SimpleNamespace(kv_transfer_config=ktc, cache_config=SimpleNamespace(block_size=TPB),
                           parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp),
                           scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=hma_off),
                           model_config=SimpleNamespace(use_mla=False))


def instance(kv_role):
    """One vLLM instance's two connectors, as the factory builds them, and
    its worker's registered caches: (scheduler, worker, layers)."""
    cfg = vllm_config(kv_role)
    sched = create_connector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config=object())
    work = create_connector(cfg, KVConnectorRole.WORKER, kv_cache_config=object())
    layers = kv_caches()
    work.register_kv_caches(layers)
    return sched, work, layers


# Tests ----------------------------------------------------------------------

@pytest.mark.parametrize("old_factory", [False, True])
@pytest.mark.parametrize("kv_role, side", [("kv_producer", "producer"), ("kv_consumer", "consumer"),
                                           ("kv_both", "both")])
def test_factory_builds_each_role(kv_role, side, old_factory):
    """The factory's path, both constructor signatures: role SCHEDULER
    gets the scheduler half (instance = engine_id, tokens per block =
    block_size, kv_role's side), role WORKER the worker half with the
    extra config plus vLLM's block size, parallel sizes and the worker's
    ranks. No abstract method of the base is left (instantiation would
    raise TypeError)."""
    from kvxfer.vllm import KvxferConnector

    assert not KvxferConnector.__abstractmethods__
    cfg = vllm_config(kv_role, tp=2, pp=1)
    kcc = object()
    s = create_connector(cfg, KVConnectorRole.SCHEDULER, kcc, old_factory=old_factory)
    assert type(s) is KvxferConnector and s.role is KVConnectorRole.SCHEDULER
    assert s._kv_cache_config is (None if old_factory else kcc)
    assert s.connector_worker is None and isinstance(s.connector_scheduler, KvxferSchedulerConnector)
    sch = s.connector_scheduler
    assert (sch.instance, sch.role, sch.tpb) == (cfg.kv_transfer_config.engine_id, side, TPB)
    RANKS["tp"] = 1
    try:
        w = create_connector(cfg, KVConnectorRole.WORKER, kcc, old_factory=old_factory)
    finally:
        RANKS["tp"] = 0
    assert w.connector_scheduler is None and isinstance(w.connector_worker, KvxferWorkerConnector)
    assert w.connector_worker.config == {"instance": cfg.kv_transfer_config.engine_id, "layout": layout(),
                                         "workers": 2, "transfer_timeout_ms": 10000, "tokens_per_block": TPB,
                                         "tp": 2, "pp": 1, "rank_tp": 1, "rank_pp": 0}
    s.shutdown()  # both roles: vLLM shuts the scheduler's connector down too
    w.shutdown()


def test_worker_says_vllms_pipeline_split():
    """A worker of a pipeline-parallel instance says vLLM's split of the
    model's layers over its stages (get_pp_indices) as pp_stages when it is
    not kvxfer's default: 30 layers over 4 stages are 7,8,8,7 in vLLM
    (8,8,7,7 by default), 32 over 4 are 8 each in both (no pp_stages);
    VLLM_PP_LAYER_PARTITION's split is said as it is. (Checked to fail:
    without it the worker's config had no pp_stages and stage 0's 7 layers
    were refused for the 8 kvxfer's split gives it.)"""
    from kvxfer.vllm import pp_stages

    def get_pp_indices(n, rank, size):  # vLLM's, without VLLM_PP_LAYER_PARTITION
        counts = [n // size] * size
        for i in range(2, n % size + 2):
            counts[-i] += 1
        return sum(counts[:rank]), sum(counts[:rank + 1])

    utils = types.ModuleType("vllm.distributed.utils")
    utils.get_pp_indices = get_pp_indices
    saved = sys.modules.get("vllm.distributed.utils")
    sys.modules["vllm.distributed.utils"] = utils
    try:
        def cfg(layers, pp):
            c = vllm_config("kv_producer", pp=pp)
            c.model_config.get_total_num_hidden_layers = lambda: layers
            return c

        assert pp_stages(cfg(30, 4), 4) == "7,8,8,7"
        assert pp_stages(cfg(61, 4), 4) == "15,15,16,15"
        assert pp_stages(cfg(32, 4), 4) is None
        assert pp_stages(cfg(80, 3), 3) is None  # 27,27,26 either way
        assert pp_stages(cfg(30, 1), 1) is None
        RANKS["pp"] = 1
        try:
            w = create_connector(cfg(30, 4), KVConnectorRole.WORKER, object())
        finally:
            RANKS["pp"] = 0
        assert w.connector_worker.config["pp_stages"] == "7,8,8,7"
        w.shutdown()
        utils.get_pp_indices = lambda n, rank, size: [(0, 5), (5, 30)][rank]  # VLLM_PP_LAYER_PARTITION="5,25"
        assert pp_stages(cfg(30, 2), 2) == "5,25"
    finally:
        if saved is None:
            sys.modules.pop("vllm.distributed.utils", None)
        else:
            sys.modules["vllm.distributed.utils"] = saved


def test_hybrid_kv_cache_manager_needs_disabling():
    """KvxferConnector does not declare SupportsHMA (its worker registers
    one cross-layer tensor: one KV cache group), so vLLM's factory refuses
    it while the hybrid KV cache manager is on."""
    with pytest.raises(ValueError, match="KvxferConnector does not support HMA"):
        create_connector(vllm_config("kv_producer", hma_off=False), KVConnectorRole.SCHEDULER)


class Recorder:
    """A connector half that records each call and returns a token."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return ("returned", name)
        return call


SCHEDULER_CALLS = [("get_num_new_matched_tokens", ("req", 3)), ("update_state_after_alloc", ("req", "blocks", 5)),
                   ("build_connector_meta", ("sched_out",)), ("request_finished", ("req", [1, 2])),
                   ("update_connector_output", ("out",)), ("has_pending_push_work", ())]
WORKER_CALLS = [("bind_connector_metadata", ("meta",)), ("clear_connector_metadata", ()),
                ("register_kv_caches", ("caches",)), ("register_cross_layers_kv_cache", ("tensor", "backend")),
                ("handle_preemptions", ({"p"},)), ("start_load_kv", ("forward_context",)),
                ("wait_for_layer_load", ("layer",)), ("save_kv_layer", ("layer", "kv", "attn_md")),
                ("wait_for_save", ()), ("get_finished", ({"f"},)), ("get_block_ids_with_load_errors", ()),
                ("shutdown", ())]


def test_every_call_reaches_its_half():
    """Each KVConnectorBase_V1 method a half implements is KvxferConnector's
    own, and hands its arguments to that half and its result back; on the
    other role's instance it is a RuntimeError naming the call and the
    role (NixlConnector asserts its half is there), shutdown excepted."""
    from kvxfer.vllm import KvxferConnector

    for name in dir(KVConnectorBase_V1):
        if not name.startswith("_") and (hasattr(KvxferSchedulerConnector, name)
                                         or hasattr(KvxferWorkerConnector, name)):
            assert name in KvxferConnector.__dict__, "%s falls through to the base's default" % name
    covered = {n for n, _ in SCHEDULER_CALLS + WORKER_CALLS}
    assert {n for n in KvxferConnector.__dict__ if not n.startswith("_")} - covered == {
        "prefer_cross_layer_blocks", "get_required_kvcache_layout", "requires_piecewise_for_cudagraph"}
    cfg = vllm_config("kv_both")
    for role, calls, other in ((KVConnectorRole.SCHEDULER, SCHEDULER_CALLS, WORKER_CALLS),
                               (KVConnectorRole.WORKER, WORKER_CALLS, SCHEDULER_CALLS)):
        c = create_connector(cfg, role)
        half = Recorder()
        attr = "connector_scheduler" if role is KVConnectorRole.SCHEDULER else "connector_worker"
        setattr(c, attr, half)
        for name, args in calls:
            got = getattr(c, name)(*args)
            assert half.calls[-1][:2] == (name, args), (name, half.calls[-1:])
            if name not in ("bind_connector_metadata", "clear_connector_metadata", "shutdown"):
                assert got == ("returned", name), name
        assert len(half.calls) == len(calls)
        for name, args in other:
            if name == "shutdown":
                continue
            side = "worker" if role is KVConnectorRole.SCHEDULER else "scheduler"
            with pytest.raises(RuntimeError, match=r"KvxferConnector\.%s is a %s-side call; this connector has "
                                                   r"role %s" % (name, side, role.name)):
                getattr(c, name)(*args)
        assert len(half.calls) == len(calls), "a call of the other role reached the half"


def test_preemptions_reach_the_worker_from_either_vllm():
    """vLLM's newer model runners call handle_preemptions(metadata) (after
    binding it), older ones handle_preemptions(preempted_req_ids): either
    way the worker half gets the ids of the preempted P/D prefills, which
    the scheduler half puts in the step's metadata."""
    cfg = vllm_config("kv_producer")
    s = create_connector(cfg, KVConnectorRole.SCHEDULER)
    req = prefill_request("pre", 64)
    s.update_state_after_alloc(req, Blocks([1, 2, 3, 4]), 0)
    s.build_connector_meta(sched_out({"pre": 32}, new=[("pre", [1, 2, 3, 4], 0)]))
    meta = s.build_connector_meta(sched_out({}, preempted=["pre", "not-pd"]))
    assert isinstance(meta, KvxferConnectorMetadata) and meta.preempted_req_ids == {"pre"}
    w = create_connector(cfg, KVConnectorRole.WORKER)
    w.connector_worker = half = Recorder()
    w.handle_preemptions(meta)
    w.handle_preemptions({"pre"})
    assert [c[:2] for c in half.calls] == [("handle_preemptions", ({"pre"},))] * 2


@pytest.mark.parametrize("ktc, extra, key", [
    ({"kv_role": None}, None, "kv_role"),
    ({"kv_role": "producer"}, None, "kv_role"),
    ({}, {"workers": 2}, "'model'"),
    ({}, {"layout": [4, 2]}, "'layout'"),
    ({}, {"model": "Llama-3.1-8B", "parallel": {"tp": 2}}, "'parallel'"),
    ({}, {"model": "Llama-3.1-8B", "bind": "ipc://x.sock", "pool_address": 4096}, "'pool_address'"),
    # A decode rank's node must let peers write into vLLM's KV cache: not shm.
    ({"kv_role": "kv_consumer"}, {"model": "Llama-3.1-8B", "bind": "ipc://x.sock", "backend": "shm"}, "backend = 'shm'"),
    ({"kv_role": "kv_both"}, {"model": "Llama-3.1-8B", "peers": [], "backend": "shm"}, "use backend 'ucx'"),
    ({}, {"model": "Llama-3.1-8B", "tp": 2}, "'tp'"),
    ({}, {"model": "Llama-3.1-8B", "pool_bytes": 1 << 20}, "'pool_bytes'"),
    ({}, {"model": "Llama-3.1-8B", "layot": {}}, "'layot'"),
    ({}, {"model": "Llama-3.1-8B", "tokens_per_block": 32}, "'tokens_per_block'"),
    ({}, {"layout": dict(layout(), tokens_per_block=32)}, "'layout.tokens_per_block'"),
    ({}, {"model": "Llama-3.1-8B", "workers": "2"}, "'workers'"),
    ({}, {"model": "Llama-3.1-8B", "generation_tp": 1}, "'generation_pp'"),
    ({}, {"model": "Llama-3.1-8B", "layer_parts": "yes"}, "'layer_parts'"),
    ({"engine_id": ""}, {"model": "Llama-3.1-8B"}, "engine_id"),
    ({"kv_connector_extra_config": "model=x"}, None, "kv_connector_extra_config"),
])
@pytest.mark.parametrize("role", [KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER])
def test_config_error_names_the_key(ktc, extra, key, role):
    """A missing or wrong setting is a ValueError naming it when vLLM
    constructs the connector, in either role: never a first request's
    failure."""
    cfg = vllm_config("kv_producer", extra=extra)
    for k, v in ktc.items():
        setattr(cfg.kv_transfer_config, k, v)
    with pytest.raises(ValueError) as e:
        create_connector(cfg, role)
    assert key in str(e.value), e.value


@pytest.mark.parametrize("roles", [("kv_producer", "kv_consumer"), ("kv_both", "kv_both")])
def test_transfer_between_two_instances(roles):
    """A prefill and a decode instance, each a KvxferConnector per role
    built by the factory: the prefill's scheduler role builds the step's
    metadata and request_finished's params, its worker role hands the
    prompt over; the decode's scheduler role turns the params into a
    load, its worker role receives it into its own block table. Every
    token of every layer arrives."""
    before = kvxfer.handle_count()
    prompt, rid = 100, "adapted"
    torch.manual_seed(31)
    truth = torch.randn((LAYERS, 2, prompt, HEADS, HEAD)).to(torch.bfloat16)
    sp, wp, p_layers = instance(roles[0])
    try:
        sd, wd, d_layers = instance(roles[1])
        try:
            p_table, d_table = [9, 3, 40, 7, 22, 5, 60], [11, 2, 33, 8, 50, 17, 4]
            req = full_prefill(sp, wp, p_layers, rid, p_table, truth, prompt, params={"do_remote_decode": True})
            keep, params = sp.request_finished(req, p_table)
            assert keep and params == {"do_remote_prefill": True, "remote_instance": sp.instance,
                                       "remote_request_id": rid}, params
            dreq = SimpleNamespace(request_id="adapted-d", prompt_token_ids=list(range(prompt)),
                                   kv_transfer_params=params)
            assert sd.get_num_new_matched_tokens(dreq, 0) == (prompt, True)
            sd.update_state_after_alloc(dreq, Blocks(d_table), prompt)
            forward(wd, d_layers, sd.build_connector_meta(sched_out({})), lambda i, layer: None)
            finished(wd, "recv", "adapted-d")
            assert wd.get_block_ids_with_load_errors() == set()
            check_tokens(d_layers, [d_table], truth, prompt)
            finished(wp, "send", rid, finished_req_ids={rid})
        finally:
            wd.shutdown()
    finally:
        wp.shutdown()
    assert kvxfer.handle_count() == before
