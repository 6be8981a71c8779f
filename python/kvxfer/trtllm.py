"""kvxfer as TensorRT-LLM's cache transceiver (disaggregated serving).

TensorRT-LLM's PyTorch executor moves a request's KV cache between a
context (prefill) instance and a generation (decode) instance through one
object, a KvCacheTransceiver, that create_kv_cache_transceiver builds per
rank. KvxferCacheTransceiver is that object over a kvxfer Node opened on
TensorRT-LLM's own KV pool; install() makes create_kv_cache_transceiver
return it. TensorRT-LLM is imported lazily (install(), and the first
KvxferCacheTransceiver built): this module loads where it is not installed.

What it follows, in TensorRT-LLM's GitHub repository (NVIDIA/TensorRT-LLM):

  - tensorrt_llm/_torch/pyexecutor/kv_cache_transceiver.py, commit
    00620eb: create_kv_cache_transceiver(mapping, dist, kv_cache_manager,
    attention_type, cache_transceiver_config, mamba_cache_manager), the
    KvCacheTransceiver ABC, BindKvCacheTransceiver (the C++ one). Newer
    trees moved both to tensorrt_llm/_torch/disaggregation/
    kv_cache_transceiver.py (commit 0b42cea), whose docstrings state each
    call's postconditions (quoted below) and type the check_* results
    (CtxTransferStatus, GenTransferStatus).
  - tensorrt_llm/_torch/disaggregation/transceiver.py, commit 00620eb:
    KvCacheTransceiverV2, TensorRT-LLM's own Python transceiver: request
    states it sets, ids it reports, ContextPhaseParams it stamps on a
    context request; resource/kv_extractor.py (00620eb, build_page_table)
    and resource/cache_reuse.py (17071ee, _CacheReuseAdapterV1): where a V1
    KVCacheManager's pool and a request's blocks are;
    base/transfer.py (006dd5e, resolve_transfer_rid): the id both sides
    agree on.
  - tensorrt_llm/_torch/pyexecutor/resource_manager.py, commit 001541b:
    KVCacheManager (get_pp_layers, num_kv_heads_per_layer, kv_factor,
    kv_cache_pool_pointers / kv_cache_pool_mapping, get_unique_primary_pool,
    get_batch_cache_indices, max_attention_window_vec, store_blocks_for_reuse,
    shutdown -> release_pools); tensorrt_llm/mapping.py, commit 05ebebb
    (pp_layers: torch.tensor_split, the first layers % pp stages one layer
    longer); tensorrt_llm/disaggregated_params.py, commit 01009a3.
  - how the executor calls it: tensorrt_llm/_torch/disaggregation/
    orchestration/coordinator.py, commit 0513247 (reap_context_sends,
    reap_gen_receives, receive_gen_init, send_completed_context,
    try_finish_gen_receive, request_cancellation), and py_executor.py
    (commit 0004396, read in part: _try_cancel_request,
    _handle_canceled_requests, _handle_responses' transfer-timeout path,
    _forward_step's execution stream).

The calls, as the executor makes them, and what this class does:

  respond_and_send_async(req)    context side, once the request's context
      phase is computed: state DISAGG_CONTEXT_TRANS_IN_PROGRESS (the ABC's
      postcondition); kvxfer send "trtllm-<id>" of req.prompt_len tokens,
      one chunk of the first ceil(prompt_len / tokens_per_block) blocks the
      KV cache manager holds for it, fenced by a CUDA event recorded on the
      manager's execution stream (host memory: ready at once);
      req.context_phase_params set as KvCacheTransceiverV2 sets it (req_id,
      disagg_info_endpoint "kvxfer://<instance>?tp=..&pp=..[&stages=..]", which
      TensorRT-LLM hands the generation request as ctx_info_endpoint).
  check_context_transfer_status(at_least, mark_complete=False)
      returns (completed_request_ids, error_request_ids): sends whose
      kvxfer event came on every rank of the instance (DONE: completed,
      set DISAGG_CONTEXT_COMPLETE only with mark_complete; else failed, set
      DISAGG_TRANS_ERROR). The executor frees the blocks of both.
  request_and_receive_async(req)  generation side, the blocks allocated:
      state DISAGG_GENERATION_TRANS_IN_PROGRESS; kvxfer receive of the
      same id into the request's blocks (the prefix the manager already
      holds, prepopulated_prompt_len, is not written), from the context
      instance named by ctx_info_endpoint (or the config).
  check_gen_transfer_status(at_least)
      returns (completed_request_ids, error_request_ids, []): receives
      whose kvxfer event came on every rank (READY:
      DISAGG_GENERATION_TRANS_COMPLETE; else DISAGG_TRANS_ERROR).
  request_and_receive_sync(req)  the receive, waited for (bounded; at the
      deadline cancelled and its event waited for), its outcome agreed
      across the ranks: DISAGG_GENERATION_TRANS_COMPLETE or
      DISAGG_TRANS_ERROR when it returns (TRTLLM_DISABLE_KV_CACHE_
      TRANSFER_OVERLAP=1: nothing reports it later).
  check_gen_transfer_complete()  True when no receive is in flight.
  cancel_request(req)  cancels the request's kvxfer send or receive; True
      (the executor then frees its blocks) only once kvxfer's event for it
      came: no write can land in them, no transfer reads them any more.
      False until then (the executor asks again on a later iteration). A
      cancelled transfer is reported here only, never by check_*. (The
      executor cancels a send only when its kv_transfer_timeout_ms passed;
      a user's cancel of a context request waits for its send to settle.)
  requires_physical_drain_before_request_release (True: cancel_request
      answers True only once the transfer settled), consumes_transfer_buffer
      (False: the C++ transfer buffer is not used).
  prepare_context_requests, get_disaggregated_params ({}),
      commit_blocks_for_reuse (store_blocks_for_reuse, as V2's V1
      adapter), shutdown (closes the node: True once the close finished).
  The KV cache manager's shutdown: closes the node first, and releases the
      pool only when that close finished (TensorRT-LLM tears executors
      down through it; see _guard_manager_shutdown).

No call the executor makes from its loop raises for one request's trouble
(a send or receive kvxfer refuses, no id, no route, a peer that never
comes, a closed node): the request ends DISAGG_TRANS_ERROR, reported by
check_* only once kvxfer's event for it came on this rank, and the reason
is logged naming the request and kept in failures. Everything kvxfer cannot
do exactly is a ValueError at construction, naming the value (see
KvxferCacheTransceiver).

Ranks: every rank of an instance has its own node ("bind" with {tp},
{pp}, {rank}); kvxfer maps the context ranks' heads (TP) and layers (PP)
onto the generation ranks' itself. The check_* calls agree across the
instance's ranks (dist.allgather, as KvCacheTransceiverV2): a request is
reported on every rank in the same call, completed only when it completed
on every rank; one rank's failure cancels the others' and is reported once
their events came. request_and_receive_sync agrees too (one allgather per
call, once this rank's receive ended; KvCacheTransceiverV2's synchronous
receive does not), without cutting the other ranks' receives short.

Configuration: install(config) or $KVXFER_TRTLLM_CONFIG (JSON text, or a
JSON file's path): kvxfer_node_open's keys (bind, peers or discovery,
key_file / secret_key / insecure, backend, transfer_timeout, ...), and this
module's own: "context_instance" and "context_parallel" (the generation
side's route when a request carries no kvxfer ctx_info_endpoint),
"generation_tp" / "generation_pp" (a context instance's, for MLA with a
context TP larger than the generation TP), "role" ("context": the node is
send_only; "generation" or "both", the default), "kv_layout" ("HND", the
default: TensorRT-LLM's pool as its TRTLLM attention kernels and its own
transceivers lay it out; "NHD": as get_buffers(kv_layout="NHD") reads it).
The layout (layers, heads, head_dim, dtype, tokens_per_block) is read from
the KV cache manager; a "model" or "layout" in the config must agree. So is
the pipeline split: a Mapping.pp_partition other than kvxfer's default
split becomes the node's pp_stages ("context_parallel"'s "stages" says a
context instance's for the generation side's route).
"""

import enum
import logging
import threading
import time
import typing
import urllib.parse

from .connector import NODE_KEYS, node_config
from .core import KvxferError, Node, Status, _cuda_index, config_from_env, config_object, kv_memory

logger = logging.getLogger(__name__)

# The keys this module reads from the config (the rest go to the node).
OWN_KEYS = ("context_instance", "context_parallel", "generation_tp", "generation_pp", "role", "kv_layout")

# Where TensorRT-LLM defines KvCacheTransceiver and create_kv_cache_transceiver:
# its newer home first.
TRTLLM_MODULES = ("tensorrt_llm._torch.disaggregation.kv_cache_transceiver",
                  "tensorrt_llm._torch.pyexecutor.kv_cache_transceiver")

# The ctx_info_endpoint a context rank stamps (disagg_info_endpoint).
ENDPOINT_SCHEME = "kvxfer://"

# How many failures failures keeps (the newest).
FAILURES_KEPT = 1024

_REFUSED = (KvxferError, ValueError, TypeError)

# KV-cache data types by TensorRT-LLM's DataType name: bytes per element.
_DTYPE_BYTES = {"HALF": 2, "BF16": 2, "FLOAT": 4, "FP8": 1, "INT8": 1}


class LlmRequestState(enum.IntEnum):
    """TensorRT-LLM's LlmRequestState (cpp/include/tensorrt_llm/
    batch_manager/llmRequest.h), used where TensorRT-LLM is not installed;
    with it, its own enum (tensorrt_llm.bindings.LlmRequestState) is."""

    UNKNOWN = 0
    ENCODER_INIT = 1
    DISAGG_GENERATION_INIT = 8
    DISAGG_GENERATION_TRANS_IN_PROGRESS = 9
    CONTEXT_INIT = 10
    DISAGG_CONTEXT_INIT_AND_TRANS = 11
    DISAGG_GENERATION_TRANS_COMPLETE = 12
    GENERATION_IN_PROGRESS = 13
    GENERATION_TO_COMPLETE = 14
    GENERATION_COMPLETE = 20
    DISAGG_CONTEXT_TRANS_IN_PROGRESS = 21
    DISAGG_CONTEXT_COMPLETE = 22
    DISAGG_TRANS_ERROR = -1


class CtxTransferStatus(typing.NamedTuple):
    """check_context_transfer_status's result, as TensorRT-LLM's
    CtxTransferStatus (which is returned where it exists)."""

    completed_request_ids: list
    error_request_ids: list


class GenTransferStatus(typing.NamedTuple):
    """check_gen_transfer_status's result, as TensorRT-LLM's
    GenTransferStatus (which is returned where it exists)."""

    completed_request_ids: list
    error_request_ids: list
    cancelled_requests: list


class ContextPhaseParams:
    """tensorrt_llm.bindings.executor.ContextPhaseParams's fields, used
    where TensorRT-LLM is not installed."""

    def __init__(self, first_gen_tokens=None, req_id=None, opaque_state=None, draft_tokens=None, ctx_dp_rank=None,
                 disagg_info_endpoint=None):
        self.first_gen_tokens = first_gen_tokens
        self.req_id = req_id
        self.opaque_state = opaque_state
        self.draft_tokens = draft_tokens
        self.ctx_dp_rank = ctx_dp_rank
        self.disagg_info_endpoint = disagg_info_endpoint


_installed_config = None


def _import(name):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _trtllm_types():
    """TensorRT-LLM's (LlmRequestState, ContextPhaseParams,
    CtxTransferStatus, GenTransferStatus), each this module's own where
    TensorRT-LLM (or that name in it) is missing."""
    states, cpp = LlmRequestState, ContextPhaseParams
    ctx_status, gen_status = CtxTransferStatus, GenTransferStatus
    bindings = _import("tensorrt_llm.bindings")
    if bindings is not None:
        states = getattr(bindings, "LlmRequestState", states)
        executor = getattr(bindings, "executor", None)
        cpp = getattr(executor, "ContextPhaseParams", cpp)
    for name in TRTLLM_MODULES:
        mod = _import(name)
        if mod is not None:
            ctx_status = getattr(mod, "CtxTransferStatus", ctx_status)
            gen_status = getattr(mod, "GenTransferStatus", gen_status)
            break
    return states, cpp, ctx_status, gen_status


def _trtllm_base():
    """TensorRT-LLM's KvCacheTransceiver class, or None."""
    for name in TRTLLM_MODULES:
        mod = _import(name)
        base = getattr(mod, "KvCacheTransceiver", None)
        if isinstance(base, type):
            return base
    return None


_subclasses = {}


def _config():
    """The kvxfer config: install()'s, else $KVXFER_TRTLLM_CONFIG (JSON
    text or a file's path). A ValueError names what is missing or wrong."""
    if _installed_config is not None:
        return dict(_installed_config)
    return config_from_env("KVXFER_TRTLLM_CONFIG",
                           "kvxfer's TensorRT-LLM transceiver has no config: call kvxfer.trtllm.install(config) in "
                           "each TensorRT-LLM worker process, or set KVXFER_TRTLLM_CONFIG to its JSON (or a JSON "
                           "file's path)")


def stage_layers(layers, pp, stage):
    """[lo, hi): the global layers kvxfer gives pipeline stage `stage` of
    pp (Go's kvcache.Parallel.StageLayers: contiguous, the first layers %
    pp stages one layer longer)."""
    base, rem = divmod(layers, pp)
    lo = stage * base + min(stage, rem)
    return lo, lo + base + (1 if stage < rem else 0)


def context_endpoint(instance, tp, pp, stages=None):
    """The disagg_info_endpoint a context rank of kvxfer instance `instance`
    (parallelism tp x pp; stages, when its pipeline splits the layers
    otherwise than kvxfer's default, each stage's layer count "1,3")
    stamps on its requests."""
    out = "%s%s?tp=%d&pp=%d" % (ENDPOINT_SCHEME, urllib.parse.quote(instance, safe=""), tp, pp)
    if stages:
        out += "&stages=" + urllib.parse.quote(stages, safe=",")
    return out


def parse_endpoint(endpoint):
    """(instance, tp, pp) of a context_endpoint string, or None when it is
    not one (another transceiver's endpoint)."""
    got = parse_route(endpoint)
    return got[:3] if got is not None else None


def parse_route(endpoint):
    """(instance, tp, pp, stages) of a context_endpoint string (stages: its
    pipeline split, None for kvxfer's default; the receive checks it), or
    None when it is not one."""
    if isinstance(endpoint, (list, tuple)):  # get_disaggregated_params' form: [endpoint]
        endpoint = endpoint[0] if len(endpoint) == 1 else None
    if not isinstance(endpoint, str) or not endpoint.startswith(ENDPOINT_SCHEME):
        return None
    rest = endpoint[len(ENDPOINT_SCHEME):]
    name, _, query = rest.partition("?")
    q = urllib.parse.parse_qs(query)
    try:
        tp, pp = int(q.get("tp", ["1"])[0]), int(q.get("pp", ["1"])[0])
    except ValueError:
        return None
    name = urllib.parse.unquote(name)
    if not name or tp < 1 or pp < 1:
        return None
    return name, tp, pp, q.get("stages", [None])[0] or None


def _name(v):
    """An enum member's name (a pybind enum's too), else str(v)."""
    n = getattr(v, "name", None)
    if isinstance(n, str):
        return n
    return str(v).rsplit(".", 1)[-1]


def _describe(exc):
    """An exception as a failure reason: kvxfer's and the argument checks'
    as they read (they name the value), anything else with its type."""
    if isinstance(exc, _REFUSED):
        return str(exc)
    return "%s: %s" % (type(exc).__name__, exc)


def _set_id(v):
    """v as a request id its params set: TensorRT-LLM takes a
    disagg_request_id for the request's own id only when it is a non-zero
    int (executor_request_queue's _get_request_id), so 0 sets nothing."""
    return None if v is None or (isinstance(v, int) and v == 0) else v


def _local_id(req):
    """The id this transceiver reports a request by: its disaggregated
    unique id when its params carry one, else request_id (the ABC's
    "ids the transceiver tracks"; TensorRT-LLM frees the blocks of the
    py_request_id reported, which is that id)."""
    params = getattr(req, "py_disaggregated_params", None)
    rid = _set_id(getattr(params, "disagg_request_id", None)) if params is not None else None
    if rid is None:
        rid = getattr(req, "request_id", None)
    if rid is None:
        rid = getattr(req, "py_request_id", None)
    return rid


class _Transfer:
    """One request's kvxfer send or receive on this rank."""

    __slots__ = ("side", "id", "key", "req", "handle", "event", "reason", "cancelled", "fences", "started")

    def __init__(self, side, local_id, key, req):
        self.side = side          # "send" or "receive"
        self.id = local_id        # the id check_* report
        self.key = key            # kvxfer's request id ("trtllm-<transfer id>")
        self.req = req
        self.handle = None        # the kvxfer Request, until its event
        self.event = None         # kvxfer's Event, once it came
        self.reason = None        # why it failed (a refusal here, or the event's status and message)
        self.cancelled = False    # cancel_request was called: reported by cancel_request only
        self.fences = []          # CUDA events kvxfer queries, kept until the event
        self.started = time.monotonic()

    @property
    def settled(self):
        """Whether nothing of kvxfer touches the request's blocks any more:
        its event came, or no kvxfer request was ever opened."""
        return self.event is not None or (self.handle is None and self.reason is not None)

    @property
    def ok(self):
        return self.event is not None and self.event.ok and self.reason is None


class KvxferCacheTransceiver:
    """A KvCacheTransceiver over a kvxfer Node opened on TensorRT-LLM's KV
    pool (one per rank). KvxferCacheTransceiver(mapping, dist,
    kv_cache_manager, attention_type, cache_transceiver_config,
    mamba_cache_manager=None, config=None), as create_kv_cache_transceiver
    is called; config: the kvxfer config (else install()'s or
    $KVXFER_TRTLLM_CONFIG). Where TensorRT-LLM is importable the instance is
    of a subclass of its KvCacheTransceiver as well.

    The node's memory is the manager's primary pool as TensorRT-LLM lays it
    out (build_page_table): block b is b x slot_bytes into it, a slot holding
    this rank's layers in order, each K then V, each
    tokens_per_block x heads x head_dim elements (HND within the buffer:
    kvxfer's own block layout, so the pool is the node's pool as it is;
    "kv_layout": "NHD" describes each layer's K/V through its strides
    instead). TensorRT-LLM owns every block id: all are marked allocated.

    Refused at construction, a ValueError naming the value: no node keys in
    the config; attention data parallelism (each DP rank holds all heads
    and its own requests: no TP rank kvxfer could map); context
    parallelism (cp_size > 1); a Mamba/hybrid cache manager or
    mamba_cache_manager; a manager without a V1 primary pool
    (KVCacheManagerV2); more than one pool (num_pools: variable sliding
    windows, or layers of different head counts); blocks in a secondary
    (host) pool (blocks_in_secondary_pool: KV cache host offload); a
    sliding window smaller
    than max_seq_len; an indexer K cache; cross attention; NVFP4 or another
    data type kvxfer has no size for; KV heads TP does not split evenly
    (TensorRT-LLM replicates ceil(heads / tp), kvxfer splits them); a
    pipeline stage whose layers (kv_cache_manager.pp_layers: Mapping.pp_layers,
    a layer mask, speculative layers) are not one contiguous range, or not
    the range kvxfer's default split (stage_layers) or the mapping's
    pp_partition gives that stage (a pp_partition that does is kvxfer's
    pp_stages, which the node, the endpoint and the generation side's
    receives carry); a pool that is not the layout's blocks; a config
    layout, tokens_per_block, tp, pp or pp_stages other than the
    manager's; a world_size > 1 without dist; a manager whose shutdown
    cannot be wrapped (_guard_manager_shutdown)."""

    def __new__(cls, *args, **kwargs):
        if cls is KvxferCacheTransceiver:
            base = _trtllm_base()
            if base is not None:
                sub = _subclasses.get(base)
                if sub is None:
                    sub = type("KvxferCacheTransceiver", (KvxferCacheTransceiver, base),
                               {"__module__": __name__, "__doc__": KvxferCacheTransceiver.__doc__})
                    _subclasses[base] = sub
                return object.__new__(sub)
        return object.__new__(cls)

    def __init__(self, mapping, dist, kv_cache_manager, attention_type=None, cache_transceiver_config=None,
                 mamba_cache_manager=None, config=None):
        self._S, self._cpp, self._ctx_status, self._gen_status = _trtllm_types()
        self._lock = threading.RLock()
        self._sends = {}      # local id -> _Transfer
        self._recvs = {}      # local id -> _Transfer
        self._by_handle = {}  # kvxfer request handle -> _Transfer
        self._fences = {}     # kvxfer request handle -> CUDA events (kept with the node)
        self.failures = {}    # local id -> reason, the newest FAILURES_KEPT
        self.ended = {}       # local id -> (side, outcome name), the newest FAILURES_KEPT settled transfers
        self.closed = False
        self._closing = False
        self._close_finished = True
        self.node = None

        ctc = cache_transceiver_config
        self.kv_transfer_timeout_ms = getattr(ctc, "kv_transfer_timeout_ms", None)
        self.kv_transfer_sender_future_timeout_ms = getattr(ctc, "kv_transfer_sender_future_timeout_ms", None)
        self.kv_transfer_poll_interval_ms = getattr(ctc, "kv_transfer_poll_interval_ms", None)

        cfg = dict(config) if config is not None else _config()
        own = {k: cfg.pop(k) for k in OWN_KEYS if k in cfg}
        if not any(k in cfg for k in NODE_KEYS):
            raise ValueError("kvxfer's TensorRT-LLM transceiver runs over a node: the config needs a node's keys "
                             "(bind, and peers or discovery; key_file, secret_key or insecure), none of %s given"
                             % sorted(cfg))
        self._mgr = mgr = kv_cache_manager
        self._mapping = mapping
        self._dist = dist
        self._check_parallel(mapping, dist, mamba_cache_manager, mgr)
        geo = self._geometry(mgr, attention_type)
        self.tokens_per_block = geo["tokens_per_block"]
        self.mla = geo["mla"]
        self.role = own.get("role", "both")
        if self.role not in ("context", "generation", "both"):
            raise ValueError("role = %r: want \"context\" (a send-only node), \"generation\" or \"both\""
                             % (self.role,))
        kv_layout = own.get("kv_layout", "HND")
        if kv_layout not in ("HND", "NHD"):
            raise ValueError("kv_layout = %r: want \"HND\" (TensorRT-LLM's pool as its TRTLLM attention backend "
                             "and its transceivers read it) or \"NHD\" (as get_buffers(kv_layout=\"NHD\"), "
                             "FlashInfer's, reads it)" % (kv_layout,))
        self.context_instance = own.get("context_instance")
        self.context_parallel = own.get("context_parallel") or {}
        if not isinstance(self.context_parallel, dict):
            raise ValueError("context_parallel = %r: want {\"tp\": n, \"pp\": m}, and \"stages\": \"1,3\" for a "
                             "pipeline split other than kvxfer's default" % (self.context_parallel,))
        self.generation = (own.get("generation_tp", 0), own.get("generation_pp", 0))
        self._peers = cfg.get("peers") if isinstance(cfg.get("peers"), list) else []

        tp, pp = int(mapping.tp_size), int(mapping.pp_size)
        for key, want in (("tp", tp), ("pp", pp), ("rank_tp", int(mapping.tp_rank)),
                          ("rank_pp", int(mapping.pp_rank))):
            if key in cfg and cfg[key] != want:
                raise ValueError("%s = %r in the config, TensorRT-LLM's mapping has %d: the mapping is the rank's"
                                 % (key, cfg[key], want))
        if "model" not in cfg and "layout" not in cfg:
            cfg["layout"] = geo["layout"]
        tpb = cfg.get("tokens_per_block", (cfg.get("layout") or {}).get("tokens_per_block"))
        if tpb is not None and tpb != self.tokens_per_block:
            raise ValueError("tokens_per_block = %r in the config, TensorRT-LLM's KV cache manager has %d: a kvxfer "
                             "block is a TensorRT-LLM block" % (tpb, self.tokens_per_block))
        cfg["tokens_per_block"] = self.tokens_per_block
        if "transfer_timeout" not in cfg and "transfer_timeout_ms" not in cfg and self.kv_transfer_timeout_ms:
            cfg["transfer_timeout"] = "%dms" % int(self.kv_transfer_timeout_ms)
        stages = geo["pp_stages"]
        given = cfg.get("pp_stages")
        total = geo["layout"]["layers"]
        default = ",".join(str(total // pp + (1 if r < total % pp else 0)) for r in range(pp))
        said = given
        if isinstance(given, str) and given.replace(" ", "") == default:
            said = ""  # kvxfer's default split spelt out: as the node takes it
        if said not in (None, "", stages) or (said == "" and stages):
            raise ValueError("pp_stages = %r in the config, TensorRT-LLM's KV cache manager splits the layers %s: the "
                             "manager's pp_layers are the rank's" % (given, stages or "as kvxfer's default does"))
        cfg.pop("pp_stages", None)
        if stages:
            cfg["pp_stages"] = stages
        cfg.update(tp=tp, pp=pp, rank_tp=int(mapping.tp_rank), rank_pp=int(mapping.pp_rank))
        self.tp, self.pp, self.pp_stages = tp, pp, stages
        ncfg = node_config(cfg, "producer" if self.role == "context" else None)
        pool = geo["pool"]
        self.device = _cuda_index(pool)
        if kv_layout == "NHD" and not self.mla:
            ncfg["memory"] = self._nhd_memory(pool, geo)
            self.node = Node(ncfg, kv_caches=[pool])
        else:
            self.node = Node(ncfg, memory=pool)
        try:
            self._check_node(geo, kv_layout == "NHD" and not self.mla)
            for g, gi in enumerate(self.node.groups):
                self.node.alloc(g, gi.blocks)  # TensorRT-LLM owns every block id
            self._guard_manager_shutdown(mgr)
        except BaseException:
            self.node.close()
            raise
        self.node.cuda_fences = self._fences  # the events kvxfer queries live as long as the node
        self.instance = self.node.instance
        self.endpoint = context_endpoint(self.instance, tp, pp, stages)
        self._stream = getattr(mgr, "_stream", None)

    def _guard_manager_shutdown(self, mgr):
        """Makes the KV cache manager's shutdown (which releases the pool:
        release_pools) close this node first, and release the pool only
        when that close finished. TensorRT-LLM tears an executor down
        through its managers' shutdown, without the transceiver's at commit
        0004396 (PyExecutor.shutdown; the KV-cache estimation pass's
        teardown_managers, after which create_py_executor builds a second
        transceiver on the same endpoint); newer trees call the
        transceiver's shutdown first. Either order closes the node before
        the pool goes."""
        original = getattr(mgr, "shutdown", None)
        if not callable(original):
            return

        def shutdown(*args, **kwargs):
            if not self.shutdown():
                logger.warning("kvxfer: %s.shutdown skipped: node %s did not finish closing, a peer may still write "
                               "into the pool, which is kept for the rest of the process", type(mgr).__name__,
                               self.instance)
                return None
            return original(*args, **kwargs)

        shutdown._kvxfer_original = original
        try:
            mgr.shutdown = shutdown
        except (AttributeError, TypeError) as exc:
            raise ValueError("kv_cache_manager is a %s whose shutdown cannot be wrapped (%s): kvxfer must close its "
                             "node before the manager releases the pool" % (type(mgr).__name__, exc)) from None

    # Construction checks ---------------------------------------------------

    @staticmethod
    def _check_parallel(mapping, dist, mamba, mgr):
        if getattr(mapping, "enable_attention_dp", False):
            raise ValueError("enable_attention_dp: each attention-DP rank holds every KV head and its own requests, "
                             "which no kvxfer TP rank mapping describes; not supported")
        cp = int(getattr(mapping, "cp_size", 1) or 1)
        if cp != 1:
            raise ValueError("cp_size = %d: context parallelism splits a request's tokens over ranks, which kvxfer "
                             "does not map; not supported" % cp)
        if mamba is not None:
            raise ValueError("mamba_cache_manager (%s): a hybrid model's recurrent state is no KV layer kvxfer "
                             "describes; not supported" % type(mamba).__name__)
        kind = type(mgr).__name__
        if "Mamba" in kind or hasattr(mgr, "mamba_layer_offsets"):
            raise ValueError("kv_cache_manager is a %s: a hybrid model's recurrent state is no KV layer kvxfer "
                             "describes; not supported" % kind)
        world = int(getattr(mapping, "world_size", mapping.tp_size * mapping.pp_size))
        if world != mapping.tp_size * mapping.pp_size:
            raise ValueError("world_size = %d, tp_size x pp_size = %d x %d: every rank must be a TP x PP rank"
                             % (world, mapping.tp_size, mapping.pp_size))
        if world > 1 and (dist is None or not hasattr(dist, "allgather")):
            raise ValueError("world_size = %d without a Distributed (dist = %r): the ranks must agree on each "
                             "request's outcome" % (world, dist))

    def _geometry(self, mgr, attention_type):
        """The manager's KV geometry, what kvxfer's layout and pool are
        built from; a ValueError for what kvxfer cannot describe."""
        kind = type(mgr).__name__
        need = ("get_unique_primary_pool", "get_batch_cache_indices", "pp_layers", "num_kv_heads_per_layer",
                "tokens_per_block", "head_dim", "kv_factor", "dtype")
        missing = [n for n in need if not hasattr(mgr, n)]
        if missing:
            raise ValueError("kv_cache_manager is a %s without %s: kvxfer reads a V1 KVCacheManager's primary pool "
                             "(KVCacheManagerV2 is not supported)" % (kind, ", ".join(missing)))
        if getattr(mgr, "enable_indexer_k_cache", False):
            raise ValueError("enable_indexer_k_cache: the indexer K cache is a second pool kvxfer does not "
                             "describe; not supported")
        cache_type = _name(getattr(mgr, "kv_cache_type", "SELF"))
        if cache_type == "CROSS":
            raise ValueError("kv_cache_type = CROSS: cross-attention KV is not supported")
        npools = int(getattr(mgr, "num_pools", 1))
        if npools != 1:
            raise ValueError("num_pools = %d: kvxfer describes one pool (variable sliding windows, or layers of "
                             "different KV head counts, give TensorRT-LLM several)" % npools)
        secondary = int(getattr(mgr, "blocks_in_secondary_pool", 0) or 0)
        if secondary > 0:
            raise ValueError("blocks_in_secondary_pool = %d (KV cache host offload, host_cache_size): a block "
                             "offloaded and onboarded again may come back in another primary-pool slot than its id "
                             "names, which kvxfer reads; not supported (TensorRT-LLM's KV connector refuses it too)"
                             % secondary)
        windows = list(getattr(mgr, "max_attention_window_vec", None) or [])
        if len(set(windows)) > 1:
            raise ValueError("max_attention_window_vec = %s: variable sliding windows are not supported" % windows)
        max_seq = getattr(mgr, "max_seq_len", None)
        if windows and max_seq is not None and windows[0] < max_seq:
            raise ValueError("max_attention_window = %d < max_seq_len = %d: a sliding-window KV cache reuses its "
                             "blocks, which kvxfer does not follow; not supported" % (windows[0], max_seq))
        dtype = _name(mgr.dtype)
        if dtype not in _DTYPE_BYTES:
            raise ValueError("KV cache dtype %s: kvxfer moves %s caches (NVFP4's scale pool is not described)"
                             % (dtype, ", ".join(sorted(_DTYPE_BYTES))))
        kv = int(mgr.kv_factor)
        mla = kv == 1
        if attention_type is not None and _name(attention_type) == "MLA" and not mla:
            raise ValueError("attention_type MLA with kv_factor = %d: an MLA cache has one part (SELFKONLY)" % kv)
        heads_local = list(mgr.num_kv_heads_per_layer)
        if not heads_local or any(h != heads_local[0] for h in heads_local) or heads_local[0] <= 0:
            raise ValueError("num_kv_heads_per_layer = %s: kvxfer wants every layer of the rank with the same, "
                             "nonzero, number of KV heads" % heads_local)
        total = getattr(mgr, "num_kv_heads", heads_local[0])
        if isinstance(total, (list, tuple)):
            if not total or any(h is None or h != total[0] for h in total):
                raise ValueError("num_kv_heads = %s: kvxfer wants every layer with the same number of KV heads"
                                 % list(total))
            total = total[0]
        total = int(total)
        tp = int(self._mapping.tp_size)
        if mla:
            if total != 1 or heads_local[0] != 1:
                raise ValueError("MLA cache with %d KV heads (%d on this rank): want 1 latent head" % (total,
                                                                                                     heads_local[0]))
        elif total % tp or heads_local[0] != total // tp:
            raise ValueError("num_kv_heads = %d over tp_size = %d (%d on this rank): kvxfer splits KV heads evenly "
                             "over TP ranks (TensorRT-LLM replicates ceil(heads / tp)); not supported"
                             % (total, tp, heads_local[0]))
        layers = int(getattr(mgr, "num_layers"))
        pp, stage = int(self._mapping.pp_size), int(self._mapping.pp_rank)
        if pp > layers:
            raise ValueError("pp_size = %d > %d layers" % (pp, layers))
        lo, hi = stage_layers(layers, pp, stage)
        have = [int(x) for x in mgr.pp_layers]
        stages = None
        # A pp_partition is checked on every stage, not only on one whose
        # layers differ from kvxfer's default: a stage it happens to give
        # the default range ([3, 4) of 4 layers over 1,2,1 or 2,1,1) must
        # say the instance's split as its other stages do.
        if have != list(range(lo, hi)) or getattr(self._mapping, "pp_partition", None) is not None:
            stages = self._pp_stages(have, layers, pp, stage, lo, hi)
        tpb, dim = int(mgr.tokens_per_block), int(mgr.head_dim)
        dtype_bytes = _DTYPE_BYTES[dtype]
        buffer = tpb * heads_local[0] * dim * dtype_bytes
        slot = buffer * kv * len(have)
        pool = mgr.get_unique_primary_pool()
        nbytes = pool.numel() * pool.element_size() if hasattr(pool, "element_size") else getattr(pool, "nbytes", 0)
        if not nbytes or nbytes % slot:
            raise ValueError("the primary pool is %d bytes, no whole number of %d-byte blocks (%d layers x %d parts x "
                             "%d tokens x %d heads x head_dim %d x %d bytes)" % (nbytes, slot, len(have), kv, tpb,
                                                                                  heads_local[0], dim, dtype_bytes))
        blocks = nbytes // slot
        impl = getattr(mgr, "impl", None)
        if hasattr(pool, "data_ptr") and hasattr(impl, "get_primary_pool_data"):
            # Block-first, as build_page_table reads it: layer offset l's
            # [blocks, K/V, buffer] view starts l x K/V x buffer into the
            # pool and steps a whole block (slot) per block.
            for off in sorted({0, len(have) - 1}):
                view = impl.get_primary_pool_data(off)
                at, step = view.data_ptr() - pool.data_ptr(), view.stride(0) * view.element_size()
                if at != off * kv * buffer or step != slot or view.shape[0] != blocks:
                    raise ValueError("layer offset %d's pool view starts %d bytes into the pool, %d bytes per block, "
                                     "%d blocks; kvxfer reads it at %d, %d per block, %d blocks (a block of every "
                                     "layer's K then V)" % (off, at, step, view.shape[0], off * kv * buffer, slot,
                                                             blocks))
        ptrs = getattr(mgr, "kv_cache_pool_pointers", None)
        if ptrs is not None and hasattr(pool, "data_ptr"):
            try:
                base = int(ptrs[0][0])
            except (TypeError, IndexError, ValueError):
                base = None
            if base is not None and base != pool.data_ptr():
                raise ValueError("get_unique_primary_pool() is at %#x, kv_cache_pool_pointers[0] at %#x"
                                 % (pool.data_ptr(), base))
        layout = {"name": "trtllm", "layers": layers, "kv_heads": total, "head_dim": dim, "dtype_bytes": dtype_bytes,
                  "tokens_per_block": tpb, "mla": mla}
        return {"layout": layout, "tokens_per_block": tpb, "mla": mla, "pool": pool, "blocks": blocks, "slot": slot,
                "buffer": buffer, "kv": kv, "heads": heads_local[0], "dim": dim, "layers": len(have),
                "dtype_bytes": dtype_bytes, "pp_stages": stages}

    def _pp_stages(self, have, layers, pp, stage, lo, hi):
        """kvxfer's pp_stages (each stage's layer count, "1,3") of a
        pipeline whose stage `stage` holds layers `have` (the manager's
        pp_layers; kvxfer's default gives it [lo, hi)): the mapping's
        pp_partition, when the stages hold contiguous layers as it splits
        them; None when that is kvxfer's default split. A ValueError names
        what no split says: layers that are not one contiguous range (a
        layer mask), or a range no pp_partition gives this stage
        (speculative layers, a mask at a stage's edge)."""
        shown = have if len(have) <= 12 else have[:6] + ["..."] + have[-3:]
        if not have or have != list(range(have[0], have[-1] + 1)):
            raise ValueError("pipeline stage %d of %d holds layers %s of %d (kv_cache_manager.pp_layers): not one "
                             "contiguous range (a layer mask?); kvxfer gives each stage a contiguous range of the "
                             "layers; not supported" % (stage, pp, shown, layers))
        part = getattr(self._mapping, "pp_partition", None)
        if part is None:
            raise ValueError("pipeline stage %d of %d holds layers [%d, %d) of %d (kv_cache_manager.pp_layers), "
                             "kvxfer's default split gives it [%d, %d), and the mapping has no pp_partition to say "
                             "every stage's layer count (a layer mask or speculative layers?); not supported"
                             % (stage, pp, have[0], have[-1] + 1, layers, lo, hi))
        try:
            counts = [int(n) for n in part]
        except (TypeError, ValueError):
            raise ValueError("pp_partition = %r: want each pipeline stage's layer count" % (part,)) from None
        if len(counts) != pp or sum(counts) != layers or min(counts) < 1:
            raise ValueError("pp_partition = %s: want %d stages' layer counts, each >= 1, adding up to the %d layers"
                             % (counts, pp, layers))
        plo = sum(counts[:stage])
        if have != list(range(plo, plo + counts[stage])):
            raise ValueError("pipeline stage %d of %d holds layers [%d, %d) of %d (kv_cache_manager.pp_layers), "
                             "pp_partition %s gives it [%d, %d) (a layer mask or speculative layers?); not supported"
                             % (stage, pp, have[0], have[-1] + 1, layers, counts, plo, plo + counts[stage]))
        if counts == [stage_layers(layers, pp, s)[1] - stage_layers(layers, pp, s)[0] for s in range(pp)]:
            return None  # kvxfer's default split: no pp_stages
        return ",".join(str(n) for n in counts)

    @staticmethod
    def _nhd_memory(pool, geo):
        """kv_memory("nhd") of each of the rank's layers: a view
        [2, num_blocks, tokens, heads, head_dim] of the pool, a block being
        [layer][K/V][token][head][dim]."""
        es = pool.element_size() if hasattr(pool, "element_size") else pool.itemsize
        if es != geo["dtype_bytes"]:
            raise ValueError("kv_layout NHD: the pool's elements are %d bytes, the KV cache dtype's %d: give a pool "
                             "of the cache's dtype" % (es, geo["dtype_bytes"]))
        t = pool.reshape(geo["blocks"], geo["layers"], geo["kv"], geo["tokens_per_block"], geo["heads"], geo["dim"])
        views = []
        for layer in range(geo["layers"]):
            v = t[:, layer]
            views.append(v.permute(1, 0, 2, 3, 4) if hasattr(v, "permute") else v.transpose(1, 0, 2, 3, 4))
        return kv_memory("nhd", views)

    def _check_node(self, geo, described):
        info, groups = self.node.info, self.node.groups
        got = {"tokens per block": info.tokens_per_block, "KV heads on this rank": info.kv_heads,
               "head_dim": info.head_dim, "dtype bytes": info.dtype_bytes,
               "layers on this rank": sum(g.layers for g in groups), "layer groups": len(groups)}
        want = {"tokens per block": geo["tokens_per_block"], "KV heads on this rank": geo["heads"],
                "head_dim": geo["dim"], "dtype bytes": geo["dtype_bytes"], "layers on this rank": geo["layers"],
                "layer groups": 1}
        bad = [k for k in got if got[k] != want[k]]
        if bad:
            raise ValueError("the config's layout has %s; TensorRT-LLM's KV cache manager %s"
                             % (", ".join("%s %d" % (k, got[k]) for k in bad),
                                ", ".join("%s %d" % (k, want[k]) for k in bad)))
        g = groups[0]
        if g.blocks != geo["blocks"] or (not described and (g.offset != 0 or g.block_bytes != geo["slot"])):
            raise ValueError("kvxfer's block geometry (offset %d, %d bytes, %d blocks) differs from TensorRT-LLM's "
                             "pool (%d-byte blocks, %d blocks)" % (g.offset, g.block_bytes, g.blocks, geo["slot"],
                                                                  geo["blocks"]))

    # Events ----------------------------------------------------------------

    def _reap(self, timeout_ms=0):
        """Hands every polled kvxfer event to its transfer. A node whose
        close finished (shutdown) ends what was live: no write lands any
        more. After a close that did not finish they stay in flight: a
        peer may still write into their blocks."""
        with self._lock:
            if self.closed or self.node is None:
                if self._close_finished:
                    self._end_closed()
                return
            if self._closing:
                return
            try:
                events = self.node.poll(timeout_ms)
            except KvxferError as exc:
                logger.warning("kvxfer: polling node %s: %s", self.instance, exc)
                return
            for ev in events:
                t = self._by_handle.pop(ev.request, None)
                if t is None:
                    continue
                t.event = ev
                if not ev.ok and t.reason is None:
                    msg = ""
                    try:
                        msg = t.handle.error_message()
                    except KvxferError:
                        pass
                    t.reason = "kvxfer request %s ended %s (%s)%s" % (t.key, ev.outcome.name, _name(ev.error),
                                                                      ": " + msg if msg else "")
                try:
                    t.handle.release()
                except KvxferError:
                    pass
                t.handle = None
                self._fences.pop(ev.request, None)
                t.fences = []

    def _end_closed(self):
        for t in list(self._by_handle.values()):
            if t.event is None and t.reason is None:
                t.reason = "kvxfer node %s was closed" % getattr(self, "instance", "?")
            t.handle = None
        self._by_handle.clear()

    def _wait(self, table, want, deadline):
        """Polls until `want` transfers of table settled (None: all) or the
        deadline (time.monotonic())."""
        while True:
            with self._lock:
                live = [t for t in table.values() if not t.cancelled]
                settled = sum(1 for t in live if t.settled)
                if (settled >= want if want is not None else settled == len(live)) or self.closed or self._closing:
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._reap(max(1, min(50, int(left * 1000))))

    def _wait_all_s(self):
        """How long a blocking check waits for every transfer: kvxfer's
        transfer timeout ends each by then."""
        ms = self.kv_transfer_timeout_ms or 0
        return max(ms / 1000.0, 30.0) + 5.0

    # Rank agreement --------------------------------------------------------

    def _agree(self, table):
        """(completed, failed) transfers of table that every rank of the
        instance settled, failed when any rank failed, in the same call on
        every rank (dist.allgather; every rank calls check_* alike). A
        transfer that failed on another rank and is live here is cancelled:
        it is reported once its own event came."""
        with self._lock:
            done = [t.id for t in table.values() if t.settled and t.ok and not t.cancelled]
            failed = [t.id for t in table.values() if t.settled and not t.ok and not t.cancelled]
        world = self.tp * self.pp
        if world > 1:
            gathered = list(self._dist.allgather([done, failed]))
        else:
            gathered = [[done, failed]]
        any_failed = set()
        everywhere = None
        for d, f in gathered:
            any_failed.update(f)
            ids = set(d) | set(f)
            everywhere = ids if everywhere is None else everywhere & ids
        everywhere = everywhere or set()
        completed, errors = [], []
        with self._lock:
            for rid in any_failed - everywhere:
                t = table.get(rid)
                if t is not None and not t.settled and not t.cancelled:
                    if t.reason is None:
                        t.reason = "kvxfer request %s failed on another rank of instance %s" % (t.key, self.instance)
                    self._cancel_handle(t)
            for rid in sorted(everywhere, key=repr):  # the same order on every rank
                t = table.pop(rid, None)
                if t is None:
                    continue
                if rid in any_failed:
                    if t.reason is None:
                        t.reason = "kvxfer request %s failed on another rank of instance %s" % (t.key, self.instance)
                    errors.append(t)
                else:
                    completed.append(t)
        return completed, errors

    def _cancel_handle(self, t):
        if t.handle is None:
            return
        try:
            t.handle.cancel()
        except KvxferError:
            pass  # it ended meanwhile: its event still comes

    def _ended(self, t, outcome):
        self.ended[t.id] = (t.side, outcome)
        if len(self.ended) > FAILURES_KEPT:
            self.ended.pop(next(iter(self.ended)))
        if t.reason is not None:
            self.failures[t.id] = t.reason
            if len(self.failures) > FAILURES_KEPT:
                self.failures.pop(next(iter(self.failures)))
            logger.warning("kvxfer: %s of TensorRT-LLM request %s failed: %s", t.side, t.id, t.reason)

    # Context side -----------------------------------------------------------

    def _blocks(self, req, what):
        """The first ceil(prompt_len / tokens_per_block) block ids the
        manager holds for req (as KvCacheTransceiverV2 trims them)."""
        n = -(-int(req.prompt_len) // self.tokens_per_block)
        ids = self._mgr.get_batch_cache_indices([req.py_request_id])[0]
        ids = [int(b) for b in ids]
        if len(ids) < n:
            raise ValueError("%s: the KV cache manager holds %d blocks for request %s, its prompt of %d tokens needs "
                             "%d" % (what, len(ids), req.py_request_id, req.prompt_len, n))
        return ids[:n]

    def _refuse(self, req, what):
        """What kvxfer refuses about req before any kvxfer call, or None."""
        params = getattr(req, "py_disaggregated_params", None)
        style = getattr(params, "schedule_style", None) if params is not None else None
        if style is not None and _name(style) == "GENERATION_FIRST":
            return "%s: schedule_style GENERATION_FIRST: kvxfer's transceiver moves context-first requests only" % what
        beams = getattr(req, "py_beam_width", None)
        if beams is None:
            beams = getattr(getattr(req, "sampling_config", None), "beam_width", 1)
        if beams not in (None, 1):
            return "%s: beam width %s: kvxfer moves one beam's blocks" % (what, beams)
        if not isinstance(getattr(req, "prompt_len", None), int) or req.prompt_len <= 0:
            return "%s: prompt_len = %r" % (what, getattr(req, "prompt_len", None))
        return None

    def _track(self, table, t):
        """Adds t to table; False (t dropped, logged) when the request
        already has a transfer there: the executor opens one per request,
        and the first keeps its blocks until its own end."""
        if t.id in table:
            logger.warning("kvxfer: %s of request %s opened again: ignored, the first goes on", t.side, t.id)
            return False
        table[t.id] = t
        return True

    def respond_and_send_async(self, req):
        """Starts sending req's KV cache (context side). Never raises for
        req's trouble: it ends DISAGG_TRANS_ERROR at a later
        check_context_transfer_status."""
        S = self._S
        req.state = S.DISAGG_CONTEXT_TRANS_IN_PROGRESS
        rid = _local_id(req)
        t = _Transfer("send", rid, "trtllm-%s" % (rid,), req)
        with self._lock:
            if not self._track(self._sends, t):
                return
            t.reason = self._refuse(req, "send")
            if self.closed:
                t.reason = "kvxfer node %s was closed" % self.instance
            if t.reason is not None:
                return
            self._stamp(req, rid)
            try:
                blocks = self._blocks(req, "send")
                written = self._written()
                gen_tp, gen_pp = self.generation
                t.handle = self.node.send(t.key, req.prompt_len, generation_tp=gen_tp, generation_pp=gen_pp)
                self._by_handle[t.handle.handle] = t
                if written is None:
                    t.handle.chunk(0, req.prompt_len, [(0, blocks)], last=True).ready()
                else:
                    t.fences.append(written)
                    self._fences[t.handle.handle] = t.fences
                    t.handle.chunk(0, req.prompt_len, [(0, blocks)], last=True, cuda_event=written,
                                   device=self.device)
            except Exception as exc:  # noqa: BLE001 - one request's trouble: never into the loop
                t.reason = "send of request %s (%s): %s" % (rid, t.key, _describe(exc))
                self._cancel_handle(t)  # opened: its event comes; else settled now

    def _written(self):
        """None for a pool in host memory (the CPU wrote it before the
        executor called), else a CUDA event recorded now on the manager's
        execution stream, behind the kernels that write the KV."""
        if self.device is None:
            return None
        import torch

        ev = torch.cuda.Event()
        stream = self._stream if self._stream is not None else torch.cuda.current_stream(self.device)
        ev.record(stream)
        return ev

    def _stamp(self, req, rid):
        """req.context_phase_params as KvCacheTransceiverV2 sets it: the id
        the generation side receives under (it comes back as
        ctx_request_id) and this instance's endpoint (ctx_info_endpoint)."""
        try:
            req.context_phase_params = self._cpp(first_gen_tokens=[], req_id=rid, opaque_state=None,
                                                 draft_tokens=None, ctx_dp_rank=0,
                                                 disagg_info_endpoint=self.endpoint)
        except Exception as exc:  # noqa: BLE001 - a binding without the field: the route comes from the config
            logger.warning("kvxfer: request %s: context_phase_params not set (%s): the generation side needs "
                           "context_instance in its config", rid, exc)

    def check_context_transfer_status(self, at_least_request_num=0, mark_complete=False):
        """(completed_request_ids, error_request_ids) of the sends that
        settled on every rank. at_least_request_num: None waits for every
        send (bounded by kvxfer's transfer timeout); N > 0 waits until N
        settled here, at most kv_transfer_sender_future_timeout_ms (1 s by
        default); 0 does not wait."""
        S = self._S
        if at_least_request_num is None:
            self._wait(self._sends, None, time.monotonic() + self._wait_all_s())
        elif at_least_request_num > 0:
            ms = self.kv_transfer_sender_future_timeout_ms or 1000
            self._wait(self._sends, at_least_request_num, time.monotonic() + ms / 1000.0)
        else:
            self._reap()
        completed, errors = self._agree(self._sends)
        for t in completed:
            if mark_complete:
                t.req.state = S.DISAGG_CONTEXT_COMPLETE
            self._ended(t, "DONE")
        for t in errors:
            t.req.state = S.DISAGG_TRANS_ERROR
            self._ended(t, "FAILED")
        return self._ctx_status([t.id for t in completed], [t.id for t in errors])

    # Generation side --------------------------------------------------------

    def _transfer_id(self, req):
        """The id the context side sent under: ctx_request_id, else
        disagg_request_id (base/transfer.py's resolve_transfer_rid), else
        the context_phase_params' req_id."""
        params = getattr(req, "py_disaggregated_params", None)
        for name in ("ctx_request_id", "disagg_request_id"):
            v = _set_id(getattr(params, name, None)) if params is not None else None
            if v is not None:
                return v
        cpp = getattr(req, "context_phase_params", None)
        v = getattr(cpp, "req_id", None) if cpp is not None else None
        return v

    def _route(self, req):
        """(context instance, tp, pp, stages) of req: its kvxfer
        ctx_info_endpoint (or context_phase_params' disagg_info_endpoint),
        else the config's context_instance (and context_parallel, or its
        peers' parallel). stages: the context's pipeline split, None for
        kvxfer's default. A ValueError names what is missing."""
        params = getattr(req, "py_disaggregated_params", None)
        seen = []
        for src in (getattr(params, "ctx_info_endpoint", None) if params is not None else None,
                    getattr(getattr(req, "context_phase_params", None), "disagg_info_endpoint", None)):
            if src:
                got = parse_route(src)
                if got is not None:
                    return got
                seen.append(src)
        name = self.context_instance
        if not name:
            raise ValueError("no context instance: ctx_info_endpoint %s is no kvxfer endpoint (%s...) and the config "
                             "has no context_instance" % (seen[0] if seen else None, ENDPOINT_SCHEME))
        par = self.context_parallel
        if not isinstance(par.get("tp"), int):
            par = {}
            for p in self._peers:
                if isinstance(p, dict) and p.get("instance") == name and p.get("parallel"):
                    par = p["parallel"]
                    break
        return name, int(par.get("tp", 1) or 1), int(par.get("pp", 1) or 1), par.get("stages") or None

    def request_and_receive_async(self, req):
        """Starts receiving req's KV cache into its blocks (generation
        side). Never raises for req's trouble: it ends DISAGG_TRANS_ERROR at
        a later check_gen_transfer_status."""
        S = self._S
        req.state = S.DISAGG_GENERATION_TRANS_IN_PROGRESS
        rid = _local_id(req)
        xid = self._transfer_id(req)
        t = _Transfer("receive", rid, "trtllm-%s" % (xid,), req)
        with self._lock:
            if not self._track(self._recvs, t):
                return
            t.reason = self._refuse(req, "receive")
            if t.reason is None and xid is None:
                t.reason = "receive of request %s: no ctx_request_id or disagg_request_id in its disaggregated " \
                           "params: no id the context side sent under" % (rid,)
            if self.closed:
                t.reason = "kvxfer node %s was closed" % self.instance
            if t.reason is not None:
                return
            try:
                context, ctp, cpp, cstages = self._route(req)
                blocks = self._blocks(req, "receive")
                hit = 0
                if getattr(self._mgr, "enable_block_reuse", False):
                    # _CacheReuseAdapterV1: the manager's block-aligned prefix hit.
                    hit = int(getattr(req, "prepopulated_prompt_len", 0) or 0) // self.tokens_per_block
                hit = min(hit, len(blocks))
                t.handle = self.node.receive(t.key, req.prompt_len, context, blocks=[blocks[hit:]],
                                             prefix_hit_blocks=[hit], context_tp=ctp, context_pp=cpp,
                                             context_pp_stages=cstages)
                self._by_handle[t.handle.handle] = t
            except Exception as exc:  # noqa: BLE001 - one request's trouble: never into the loop
                t.reason = "receive of request %s (%s): %s" % (rid, t.key, _describe(exc))
                self._cancel_handle(t)

    def request_and_receive_sync(self, req):
        """request_and_receive_async, then waits for its end and sets the
        final state before returning: DISAGG_GENERATION_TRANS_COMPLETE or
        DISAGG_TRANS_ERROR, as the ABC requires of it. The executor calls it
        with TRTLLM_DISABLE_KV_CACHE_TRANSFER_OVERLAP=1, and then calls no
        check_gen_transfer_status and times nothing out (the coordinator's
        poll_gen_transfers returns, receive_gen_init only checks for
        errors, the timeout sweep needs py_kv_transfer_start_time, set for
        asynchronous receives only): a request left in transfer here would
        never leave it.

        The wait is bounded: kvxfer's transfer timeout ends the receive
        before _wait_all_s(); at that deadline the receive is cancelled and
        its event waited for, as long again. Only once the event came is
        the request DISAGG_TRANS_ERROR (the executor then frees its blocks:
        no write lands in them any more). An event that still does not come
        (kvxfer's cancel promises one) is a RuntimeError naming the
        request: its receive stays tracked and its blocks owned
        (cancel_request answers False).

        Ranks agree as check_* do, in the same call on every rank: once this
        rank's receive ended, one dist.allgather of (id, outcome); COMPLETE
        only when it completed on every rank, and on no rank for another
        request (every rank of the instance receives the same requests in
        the same order: the executor's batches are the same on every rank).
        One rank's failure does not cut the others' receives short (no
        rank polls while it waits): each ends on its own, by its deadline
        at the latest.

        After a node close that did not finish (or one under way) the
        receive stays in flight and the request
        DISAGG_GENERATION_TRANS_IN_PROGRESS, its blocks owned, with no
        agreement (TensorRT-LLM shuts down after its loop ended)."""
        S = self._S
        self.request_and_receive_async(req)
        rid = _local_id(req)
        with self._lock:
            t = self._recvs[rid]  # tracked by the call above (or by an earlier one for the same id)
        limit = self._wait_all_s()
        if not self._wait_settled(t, time.monotonic() + limit):
            with self._lock:
                if not self._close_unfinished():
                    if t.reason is None:
                        t.reason = "receive of request %s (%s): no kvxfer event within %g s: cancelled" % (
                            rid, t.key, limit)
                    self._cancel_handle(t)
            if not self._wait_settled(t, time.monotonic() + limit):
                with self._lock:  # (a close that finished meanwhile ended it: settled)
                    settled, unfinished = t.settled, self._close_unfinished()
                if unfinished and not settled:
                    logger.warning("kvxfer: receive of request %s: node %s did not finish closing, left in flight",
                                   rid, self.instance)
                    return
                if not settled:
                    raise RuntimeError("kvxfer: receive of request %s (%s): no event %g s after its cancel: its "
                                       "blocks may still be written and stay owned (cancel_request answers False)"
                                       % (rid, t.key, limit))
        with self._lock:
            if self._recvs.get(rid) is t:
                del self._recvs[rid]
        ok = t.ok
        elsewhere = None
        if self.tp * self.pp > 1:
            gathered = [tuple(g) for g in self._dist.allgather([rid, ok])]
            if any(g[0] != rid for g in gathered):
                elsewhere = "kvxfer request %s: the ranks of instance %s received requests %s in the same call" % (
                    t.key, self.instance, [g[0] for g in gathered])
            elif not all(g[1] for g in gathered):
                elsewhere = "kvxfer request %s failed on another rank of instance %s" % (t.key, self.instance)
        if ok and elsewhere is None:
            req.state = S.DISAGG_GENERATION_TRANS_COMPLETE
            self._ended(t, "READY")
        else:
            if t.reason is None:
                t.reason = elsewhere or "kvxfer request %s failed" % t.key
            req.state = S.DISAGG_TRANS_ERROR
            self._ended(t, "FAILED")

    def _close_unfinished(self):
        """A node close under way, or one that did not finish."""
        with self._lock:
            return self._closing or (self.closed and not self._close_finished)

    def _wait_settled(self, t, deadline):
        """Polls until t settled (True) or the deadline (time.monotonic()),
        or a close under way or that did not finish (False)."""
        while True:
            with self._lock:
                if t.settled:
                    return True
                if self._close_unfinished():
                    return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._reap(max(1, min(50, int(left * 1000))))

    def check_gen_transfer_status(self, at_least_request_num=0):
        """(completed_request_ids, error_request_ids, []) of the receives
        that settled on every rank. at_least_request_num: None waits for
        every receive (bounded by kvxfer's transfer timeout); N > 0 until N
        settled here, at most kv_transfer_poll_interval_ms (100 ms when
        unset); 0 does not wait."""
        S = self._S
        if at_least_request_num is None:
            self._wait(self._recvs, None, time.monotonic() + self._wait_all_s())
        elif at_least_request_num > 0:
            ms = self.kv_transfer_poll_interval_ms or 100
            self._wait(self._recvs, at_least_request_num, time.monotonic() + ms / 1000.0)
        else:
            self._reap()
        completed, errors = self._agree(self._recvs)
        for t in completed:
            t.req.state = S.DISAGG_GENERATION_TRANS_COMPLETE
            self._ended(t, "READY")
        for t in errors:
            t.req.state = S.DISAGG_TRANS_ERROR
            self._ended(t, "FAILED")
        return self._gen_status([t.id for t in completed], [t.id for t in errors], [])

    def check_gen_transfer_complete(self):
        """True when no receive is in flight on this rank."""
        with self._lock:
            return not self._recvs

    # Both sides -------------------------------------------------------------

    def cancel_request(self, req):
        """Cancels req's kvxfer send or receive. True when the executor may
        free its blocks: kvxfer's event for it came (or none was opened),
        and it is forgotten here (check_* never report it); False while a
        write may still land in them or a transfer still reads them: the
        executor asks again on a later iteration."""
        rid = _local_id(req)
        with self._lock:
            found = [(table, table[rid]) for table in (self._sends, self._recvs) if rid in table]
            for _, t in found:
                if not t.settled:
                    t.cancelled = True
                    if t.reason is None:
                        t.reason = "cancelled (cancel_request)"
                    self._cancel_handle(t)
        if not found:
            return True
        self._reap()
        pending = False
        with self._lock:
            for table, t in found:
                t.cancelled = True
                if t.settled:
                    if table.get(rid) is t:
                        del table[rid]
                    self.ended[t.id] = (t.side, "CANCELLED")
                else:
                    pending = True
        return not pending

    def has_inflight_transfer(self, req):
        """Whether kvxfer may still touch req's blocks on this rank."""
        rid = _local_id(req)
        with self._lock:
            return any(rid in table and not table[rid].settled for table in (self._sends, self._recvs))

    def has_retired_send_session(self, req):
        return False

    @property
    def pipeline_transfer_enabled(self):
        return False

    @property
    def requires_physical_drain_before_request_release(self):
        """True: a request's blocks stay owned until its cancel drained
        (newer trees' KvCacheTransceiver: "Whether request resources must
        remain owned until cancel drains"; KvCacheTransceiverV2 answers
        True). cancel_request answers True only once kvxfer's event for
        the request came, and shutdown() answers True or False, never
        None (those trees refuse None from a transceiver that says True)."""
        return True

    @property
    def consumes_transfer_buffer(self):
        """False: kvxfer writes into the KV pool itself, never through the
        C++ transceiver's transfer buffer that max_tokens_in_buffer sizes
        (the executor reads this with no default: py_executor.py's
        _is_disagg_transfer_window_bypass_eligible at 0004396, the
        coordinator's transfer_window_bypass_eligible;
        KvCacheTransceiverV2 answers False)."""
        return False

    def supports_inflight_request_cancellation(self):
        # The executor's legacy timeout path: a cancel that returns True is
        # final (its in-flight path waits for check_* to report it).
        return False

    def has_poisoned_transfer_buffer(self):
        return False

    def prepare_context_requests(self, requests):
        """Generation-first requests are not supported: they are left as
        they are, and their send fails (respond_and_send_async)."""
        for req in requests or []:
            logger.warning("kvxfer: request %s is generation-first, which kvxfer's transceiver does not do: its "
                           "send will fail", _local_id(req))

    def get_disaggregated_params(self):
        """{}: context-first only (the generation request's route comes with
        the context response, as BindKvCacheTransceiver's)."""
        return {}

    def commit_blocks_for_reuse(self, req):
        """Stores the received blocks for prefix reuse
        (store_blocks_for_reuse, as KvCacheTransceiverV2's V1 adapter)."""
        mgr = self._mgr
        if not getattr(mgr, "enable_block_reuse", False) or not hasattr(mgr, "store_blocks_for_reuse"):
            return
        try:
            mgr.store_blocks_for_reuse(req, pin_blocks=False)
        except Exception as exc:  # noqa: BLE001 - prefix reuse is an optimisation: never into the loop
            logger.warning("kvxfer: store_blocks_for_reuse of request %s: %s", _local_id(req), exc)

    def get_data_transceiver_state(self):
        return b""

    def get_status_dump(self):
        with self._lock:
            rows = ["kvxfer node %s (%s): %d sends, %d receives in flight" % (
                self.instance if self.node else "?", "closed" if self.closed else "open", len(self._sends),
                len(self._recvs))]
            now = time.monotonic()
            for t in list(self._sends.values()) + list(self._recvs.values()):
                rows.append("  %s %s (%s): %.1f s, %s%s" % (t.side, t.id, t.key, now - t.started,
                                                            "settled" if t.settled else "live",
                                                            ", " + t.reason if t.reason else ""))
        return "\n".join(rows)

    def shutdown(self, timeout_ms=5000):
        """Closes the node; what was in flight then ends failed. True once
        the close finished (no write lands in the pool any more), False
        while it did not (under way on another thread, or timed out: a peer
        may still write into the pool). A close that did not finish keeps
        the pool for the rest of the process: the node holds its tensor,
        the KV cache manager's shutdown no longer releases it (see
        _guard_manager_shutdown), and the transfers in flight stay so
        (cancel_request answers False). Idempotent (a later call answers as
        the close ended, and does not close again); raises only for a close
        kvxfer refused (a negative timeout_ms: KvxferError with
        Status.INVALID_ARGUMENT; one that is no int32: ValueError or
        TypeError), which leaves the node open and the transceiver as it
        was."""
        with self._lock:
            if self.node is None:
                return True
            if self.closed:
                return self._close_finished
            if self._closing:
                return False
            self._closing = True
        finished = True
        try:
            self.node.close(timeout_ms)
        except (ValueError, TypeError, KvxferError) as exc:
            if not isinstance(exc, KvxferError) or exc.status == Status.INVALID_ARGUMENT:
                with self._lock:  # refused (the timeout): the node is open, as it was
                    self._closing = False
                raise
            finished = False
            logger.warning("kvxfer: closing node %s did not finish (%s): TensorRT-LLM's KV pool is kept for the "
                           "rest of the process", self.instance, exc)
        with self._lock:
            self.closed, self._closing, self._close_finished = True, False, finished
            if finished:
                self._end_closed()
        return finished

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def install(config=None, backend=None):
    """Makes TensorRT-LLM's create_kv_cache_transceiver return a
    KvxferCacheTransceiver wherever the cache transceiver is enabled
    (cache_transceiver_config.backend set, as for any disaggregated
    instance), or only for backend (one of its values: "DEFAULT", "UCX",
    "NIXL", "MOONCAKE", "MPI") when given; every other call goes to
    TensorRT-LLM's. config: the kvxfer config (else
    $KVXFER_TRTLLM_CONFIG, read when a transceiver is built).

    It replaces create_kv_cache_transceiver in TensorRT-LLM's
    kv_cache_transceiver module (tensorrt_llm/_torch/disaggregation/ or the
    older tensorrt_llm/_torch/pyexecutor/), and the name in every
    TensorRT-LLM module already imported that bound it. Run it in every
    process that builds an executor (each worker rank) before the executor
    is built. A TensorRT-LLM without the module or the function is a
    RuntimeError naming what is missing."""
    global _installed_config
    import importlib
    import inspect
    import sys

    mods = []
    for name in TRTLLM_MODULES:
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            continue
    mods = [m for m in mods if callable(getattr(m, "create_kv_cache_transceiver", None))]
    if not mods:
        raise RuntimeError("kvxfer.trtllm.install: none of TensorRT-LLM's %s can be imported with a "
                           "create_kv_cache_transceiver" % ", ".join(TRTLLM_MODULES))
    if config is not None:
        _installed_config = config_object("kvxfer.trtllm.install", config)

    replaced = {}  # a function TensorRT-LLM had (or an earlier wrapper) -> its wrapper

    def wrap(original):
        original = getattr(original, "_kvxfer_original", original)
        if original in replaced:
            return replaced[original]
        sig = inspect.signature(original)

        def create_kv_cache_transceiver(*args, **kwargs):
            try:
                a = sig.bind(*args, **kwargs).arguments
            except TypeError:
                return original(*args, **kwargs)
            ctc = a.get("cache_transceiver_config")
            chosen = getattr(ctc, "backend", None)
            if chosen is None or (backend is not None and _name(chosen) != backend):
                return original(*args, **kwargs)
            return KvxferCacheTransceiver(a.get("mapping"), a.get("dist"), a.get("kv_cache_manager"),
                                          a.get("attention_type"), ctc, a.get("mamba_cache_manager"),
                                          config=_config())

        create_kv_cache_transceiver._kvxfer_original = original
        create_kv_cache_transceiver.__doc__ = original.__doc__
        replaced[original] = create_kv_cache_transceiver
        return create_kv_cache_transceiver

    for m in mods:
        m.create_kv_cache_transceiver = wrap(m.create_kv_cache_transceiver)
    for name, mod in list(sys.modules.items()):
        if not (name == "tensorrt_llm" or name.startswith("tensorrt_llm.")) or mod is None:
            continue
        fn = getattr(mod, "create_kv_cache_transceiver", None)
        if fn is None:
            continue
        orig = getattr(fn, "_kvxfer_original", fn)
        if orig in replaced:
            mod.create_kv_cache_transceiver = replaced[orig]
    return mods[0].create_kv_cache_transceiver
