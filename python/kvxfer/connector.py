"""A connector shaped like vLLM's KV connector (KVConnectorBase_V1 in
vllm/distributed/kv_transfer/kv_connector/v1/base.py), so a framework
engineer sees where each kvxfer call goes. It does not import vLLM: the
method names and arguments mirror the base class, and the objects vLLM
passes are read by duck typing (request.request_id,
request.prompt_token_ids, request.kv_transfer_params, request.status,
scheduler_output.num_scheduled_tokens, scheduled_new_reqs' req_id,
block_ids and num_computed_tokens, scheduled_cached_reqs' req_ids,
new_block_ids and resumed_req_ids, preempted_req_ids,
blocks.get_block_ids()). kvxfer.vllm.KvxferConnector is the class vLLM
loads (--kv-transfer-config), handing each call to one of these halves.

Roles, as in vLLM:

  Scheduler side (KvxferSchedulerConnector), in the scheduler process:
    get_num_new_matched_tokens  generation side: the prompt past the local
                                prefix-cache hit is external and loads
                                asynchronously, once per request
    update_state_after_alloc    records the block ids vLLM allocated
    build_connector_meta        per step: what each worker receives
                                (kvxfer_receive), which prefill chunks
                                it hands over (kvxfer_chunk), which
                                sends it cancels
    request_finished            context side: keep the blocks until the
                                send is DONE, tell the generation side
                                where the KV comes from

  Worker side (KvxferWorkerConnector), in each worker:
    register_kv_caches /        opens the engine over vLLM's KV memory
    register_cross_layers_kv_cache
    start_load_kv               kvxfer_receive into vLLM's block ids;
                                kvxfer_cancel of aborted sends
    wait_for_layer_load         nothing: kvxfer moves whole blocks
    save_kv_layer               with "layer_parts": the step's chunks,
                                this layer's part of each
                                (kvxfer_chunk_layers); else nothing
    wait_for_save               the step's chunks: kvxfer_send on the
                                first, then kvxfer_chunk with a fence made
                                ready once the step's KV is written (with
                                "layer_parts": checks every part was handed)
    handle_preemptions          cancels the sends of preempted requests
                                and waits until they no longer read
    get_finished                polled events: (sent, received) ids;
                                cancels what vLLM aborted
    get_block_ids_with_load_errors
                                the blocks of failed receives
    shutdown                    kvxfer_engine_close

No call vLLM makes from its engine loop raises for one request's trouble
(kv_transfer_params a client got wrong, a chunk the engine refuses): vLLM
would end the engine core or the worker, and with it every request. The
request fails alone instead: its send is cancelled, its load reported as
failed (vLLM recomputes it under "kv_load_failure_policy": "recompute",
else fails that request: its default), and a warning is logged.

Memory: vLLM's KV cache as it is laid out. A cross-layer tensor
(prefer_cross_layer_blocks: every layer of a block in one block) is read
through its attention backend's stride order, per-layer caches through
their strides; when they are kvxfer's own block layout (block, layer, K/V,
head, token, dim) the engine takes the tensor as one pool, else it
addresses each layer, K/V and head where vLLM put it (kv_memory). The
framework owns every block id: the worker marks the whole pool allocated to
it, so kvxfer's allocator is never used.
"""

import collections.abc
import logging
import re
from dataclasses import dataclass, field

from .core import Engine, KvxferError, Node, Outcome, _cuda_index, config_object, kv_memory

logger = logging.getLogger(__name__)

# How long handle_preemptions waits for a cancelled send's event: a cancel
# ends the send as soon as the writes already under way completed.
PREEMPT_WAIT_S = 30.0

# What the engine's calls raise for a value or a state they refuse (a
# KvxferError naming it; ValueError or TypeError from the argument checks).
_REFUSED = (KvxferError, ValueError, TypeError)


@dataclass
class RecvSpec:
    prompt_len: int
    block_ids: list  # vLLM's block table per group, the local prefix hits first
    context: str
    remote_request_id: str  # the context instance's id of the request
    prefix_hit_blocks: int = 0  # its first blocks, in vLLM's local prefix cache: not received


@dataclass
class SendSpec:
    prompt_len: int
    block_ids: list
    chunks: list = field(default_factory=list)  # [(start, end)] handed over this step
    xfer_id: str = ""  # the send's id (the request id, or a new one after a preemption)


@dataclass
class KvxferConnectorMetadata:
    """Scheduler -> worker, once per step (vLLM's KVConnectorMetadata)."""

    reqs_to_recv: dict = field(default_factory=dict)  # request id -> RecvSpec
    reqs_to_send: dict = field(default_factory=dict)  # request id -> SendSpec
    # request id -> RecvSpec without blocks: a receive that takes nothing, so
    # that the context instance frees the prompt's blocks now (a decode
    # request that will not load: aborted before it was scheduled, or all
    # of it in the local prefix cache).
    reqs_to_release: dict = field(default_factory=dict)
    reqs_to_cancel: set = field(default_factory=set)  # request ids whose send no decode side will read
    # ids of P/D prefills preempted this step (scheduler_output.preempted_req_ids, and
    # those resumed with no preempted_req_ids naming them: build_connector_meta):
    # vLLM's newer model runners pass this metadata to handle_preemptions, not the ids
    preempted_req_ids: set = field(default_factory=set)


def _backend_name(backend):
    get = getattr(backend, "get_name", None)
    return get() if callable(get) else type(backend).__name__


def _native_shape(t):
    """Whether t has the rank of kvxfer's block layout over every layer:
    (num_blocks, num_layers, 2, kv_heads, block_size, head_dim) (MLA: a
    part and a head of 1), or (num_blocks, num_layers, block_size, latent);
    the engine checks its sizes."""
    shape = getattr(t, "shape", None)
    return shape is not None and len(shape) in (4, 6)


def _nhd_views(tensors):
    """("nhd", views of (2, num_blocks, block_size, kv_heads, head_dim)) of
    per-layer caches in FlashAttention's logical shape (as they are) or
    FlashInfer's, (num_blocks, 2, ...) (K/V first), or ("mla", the
    tensors) of (num_blocks, block_size, latent); ValueError naming a shape
    it cannot read."""
    shape = tuple(tensors[0].shape)
    if len(shape) == 3:
        return "mla", list(tensors)
    if len(shape) != 5:
        raise ValueError("a per-layer KV cache of shape %s: want (2, num_blocks, block_size, kv_heads, head_dim), "
                         "(num_blocks, 2, block_size, kv_heads, head_dim) or MLA's (num_blocks, block_size, latent)"
                         % (shape,))
    if shape[0] == 2 and shape[1] == 2:
        raise ValueError("a per-layer KV cache of shape %s: with 2 blocks its K/V dimension and its block "
                         "dimension cannot be told apart; give the KV cache more blocks" % (shape,))
    if shape[0] == 2:
        return "nhd", list(tensors)
    if shape[1] == 2:
        return "nhd", [t.permute(1, 0, 2, 3, 4) for t in tensors]
    raise ValueError("a per-layer KV cache of shape %s has no K/V dimension of 2 first or second" % (shape,))


def _native_pool(kind, views, whole):
    """The one contiguous tensor the per-layer views (in layer order)
    cover exactly in kvxfer's block layout (block, layer, K/V, head, token,
    dim; MLA: block, layer, token, latent): whole, or the views' common
    base; None when they are laid out otherwise."""
    es, n = views[0].element_size(), len(views)
    if kind == "nhd":
        _, nb, bs, heads, dim = views[0].shape
        layer = 2 * heads * bs * dim
        want = (heads * bs * dim, n * layer, dim, bs * dim, 1)  # kv, block, token, head, elem
    else:
        nb, bs, dim = views[0].shape
        layer = bs * dim
        want = (n * layer, dim, 1)
    base = views[0].data_ptr()
    for i, v in enumerate(views):
        if tuple(v.stride()) != want or v.data_ptr() != base + i * layer * es:
            return None
    for cand in (whole, getattr(views[0], "_base", None)):
        if (cand is not None and cand.data_ptr() == base and cand.is_contiguous()
                and cand.numel() * cand.element_size() == nb * n * layer * es):
            return cand
    return None


def layer_index(name):
    """The model's layer index in a vLLM layer name: its one integer part
    ("model.layers.12.self_attn.attn" is 12), as vLLM's
    extract_layer_index reads it; ValueError naming the name otherwise."""
    ints = [int(p) for p in name.split(".") if re.fullmatch(r"\d+", p)]
    if len(ints) != 1:
        raise ValueError("layer name %r: want exactly one integer part (the model's layer index), found %d"
                         % (name, len(ints)))
    return ints[0]


def _block_ids(blocks):
    if hasattr(blocks, "get_block_ids"):
        blocks = blocks.get_block_ids()
    return [list(g) for g in blocks]


def _params(request):
    params = getattr(request, "kv_transfer_params", None)
    return params if isinstance(params, dict) else {}


def _status_name(request):
    """request.status by name: vLLM's RequestStatus is an enum (an
    IntEnum's str() would be its number), a str is its own name."""
    status = getattr(request, "status", None)
    return getattr(status, "name", None) or str(status)


class KvxferSchedulerConnector:
    """The scheduler side. role: "producer" (context/prefill instance),
    "consumer" (generation/decode instance) or "both" (vLLM's kv_both: each
    request's kv_transfer_params say which side it is on, do_remote_decode
    the context side, do_remote_prefill the generation side)."""

    def __init__(self, instance, role, tokens_per_block):
        if role not in ("producer", "consumer", "both"):
            raise ValueError("role %r: producer, consumer or both" % (role,))
        self.instance = instance
        self.role = role
        self.tpb = tokens_per_block
        self._recv = {}      # consumer: request id -> RecvSpec, until the next meta
        self._release = {}   # consumer: request id -> RecvSpec without blocks, until the next meta
        self._cancel = set()  # producer: ids of sends to cancel, until the next meta
        # producer: ids whose blocks request_finished kept (True), until a
        # worker reports them sent (finished_sending): has_pending_push_work
        self._pushing = set()
        self._blocks = {}    # producer: request id -> block ids per group
        self._computed = {}  # producer: request id -> tokens computed (scheduled) so far
        self._handed = {}    # producer: request id -> tokens handed over so far
        self._prompt = {}    # producer: request id -> prompt length, of P/D requests only
        self._preempted = {}  # producer: request id -> times preempted
        self._warned = set()  # consumer: request ids whose bad params were logged (once each)

    def _remote(self, request, warn=False):
        """(context instance, its request id) of a decode request whose
        kv_transfer_params ask for a remote prefill (do_remote_prefill), or
        None. The params come from the client's JSON body: a value of the
        wrong type, or a missing one, is None too (with warn, a warning
        naming it), as NIXL's 'Got invalid KVTransferParams ... will not
        utilize KVTransfer'. remote_request_id has no default: this
        request's own id is not the prefill's (vLLM makes its internal ids
        unique per engine), and a receive under it would wait for a send
        that never comes until the transfer timeout."""
        params = _params(request)
        if not params.get("do_remote_prefill"):
            return None
        instance = params.get("remote_instance")
        remote_id = params.get("remote_request_id")
        bad = None
        if not isinstance(instance, str) or not instance:
            bad = "remote_instance = %r (want the prefill instance's name)" % (instance,)
        elif not isinstance(remote_id, str) or not remote_id:
            bad = "remote_request_id = %r (want the prefill instance's request id)" % (remote_id,)
        if bad is not None:
            # Once a request: vLLM asks get_num_new_matched_tokens at every
            # step while the request waits for blocks.
            if warn and request.request_id not in self._warned:
                if len(self._warned) >= 4096:
                    self._warned.clear()
                self._warned.add(request.request_id)
                logger.warning("kvxfer: request %s: invalid kv_transfer_params, %s: computing it locally",
                               request.request_id, bad)
            return None
        return instance, remote_id

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens loaded from the context instance, load is asynchronous).

        The prompt past vLLM's local prefix-cache hit (num_computed_tokens),
        once: update_state_after_alloc clears do_remote_prefill, as NIXL
        does, so a request vLLM schedules again after its load (preempted:
        num_computed_tokens is 0 or its local hit, which may exceed the
        prompt) computes locally. Never (n <= 0, True): vLLM asserts a
        positive count whenever the load is asynchronous."""
        if self.role == "producer" or self._remote(request, warn=True) is None:
            return 0, False
        count = len(request.prompt_token_ids or ()) - num_computed_tokens
        if count <= 0:
            return 0, False
        return count, True

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """Consumer: a request to load gets a receive into its blocks past
        the local prefix hit; one with nothing to load (its whole prompt in
        the local prefix cache) a receive that takes nothing, so that the
        context instance frees its blocks. Either way its
        do_remote_prefill is cleared: vLLM loads a request once.

        Producer: a P/D request's (kv_transfer_params with
        do_remote_decode) block table so far. vLLM calls this once per
        scheduling from its waiting queue, with every block the request
        holds (kv_cache_manager.get_blocks); the blocks of its later
        prefill steps come in build_connector_meta's scheduler output."""
        ids = _block_ids(blocks)
        rid = request.request_id
        prompt = len(request.prompt_token_ids or ())
        remote = None if self.role == "producer" else self._remote(request)
        if self.role == "consumer" and remote is None:
            return
        if remote is not None:
            if num_external_tokens > 0:
                # The local hit is whole blocks (vLLM caches full blocks only).
                hit = (prompt - num_external_tokens) // self.tpb
                self._recv[rid] = RecvSpec(prompt, ids, remote[0], remote[1], hit)
            else:
                self._release[rid] = RecvSpec(prompt, [], remote[0], remote[1])
            request.kv_transfer_params["do_remote_prefill"] = False
        elif self.role != "consumer" and _params(request).get("do_remote_decode"):
            self._blocks[rid] = ids
            self._prompt[rid] = prompt

    def build_connector_meta(self, scheduler_output):
        """Producer: each step hands over [handed, end), end the tokens
        computed so far rounded down to a block boundary (all of them once
        the prompt is complete): vLLM's token budget need not be a multiple
        of the block size, but a chunk other than the last must end on a
        block boundary. A new request's tokens from vLLM's local prefix
        cache (num_computed_tokens) count as computed and are handed over
        too: the generation side needs the whole prompt's KV.

        vLLM allocates a prefill's blocks step by step: a new request's
        block_ids and a resumed one's new_block_ids are its whole table, a
        running one's new_block_ids are the blocks added this step (what
        NIXL's build_connector_meta reads too). A request in
        preempted_req_ids lost its blocks (vLLM's _preempt_request frees
        them and sets num_computed_tokens to 0; the worker's
        handle_preemptions cancels its send): resumed, it is computed and
        handed over again from its first token, under a new send id (the
        engine refuses a second send of one id). A request scheduled from
        vLLM's waiting queue again (resumed_req_ids; Model Runner V2: in
        scheduled_new_reqs again) that no preempted_req_ids named lost its
        blocks all the same (vLLM's reset_prefix_cache with
        reset_running_requests preempts outside schedule()): it is
        preempted here, in this step's preempted_req_ids, so that the
        worker cancels its send before this step's forward pass writes the
        old blocks; its chunks handed so far name them."""
        meta = KvxferConnectorMetadata(reqs_to_recv=self._recv, reqs_to_release=self._release,
                                       reqs_to_cancel=self._cancel)
        self._recv, self._release, self._cancel = {}, {}, set()
        if self.role == "consumer":
            return meta
        for rid in getattr(scheduler_output, "preempted_req_ids", None) or ():
            if rid in self._prompt:
                self._preempt(meta, rid)
        for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
            rid = getattr(new, "req_id", None)
            if rid not in self._prompt:
                continue
            if rid in self._computed:  # scheduled before, and back from the waiting queue
                self._preempt(meta, rid)
            if getattr(new, "block_ids", None) is not None:
                self._blocks[rid] = _block_ids(new.block_ids)
            if rid not in self._computed:
                self._computed[rid] = min(getattr(new, "num_computed_tokens", 0) or 0, self._prompt[rid])
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed = set(getattr(cached, "resumed_req_ids", None) or ())
            computed = getattr(cached, "num_computed_tokens", None)
            for i, (rid, ids) in enumerate(zip(cached.req_ids, cached.new_block_ids)):
                if rid not in self._prompt:
                    continue
                if rid in resumed:
                    if rid in self._computed:  # no preempted_req_ids named it
                        self._preempt(meta, rid)
                    if ids is not None:
                        self._blocks[rid] = _block_ids(ids)
                    if computed:  # its local prefix hit, computed before it resumed
                        self._computed[rid] = min(computed[i], self._prompt[rid])
                elif ids is not None:
                    ids = _block_ids(ids)
                    have = self._blocks.setdefault(rid, [])
                    have.extend([] for _ in range(len(ids) - len(have)))
                    for g, added in enumerate(ids):
                        have[g].extend(added)
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            if rid not in self._prompt:
                continue
            prompt = self._prompt[rid]
            computed = min(self._computed.get(rid, 0) + n, prompt)
            self._computed[rid] = computed
            start = self._handed.get(rid, 0)
            end = computed if computed == prompt else computed // self.tpb * self.tpb
            if end <= start:
                continue
            self._handed[rid] = end
            meta.reqs_to_send[rid] = SendSpec(prompt, [list(g) for g in self._blocks.get(rid, [])], [(start, end)],
                                              self._xfer_id(rid))
        return meta

    def _preempt(self, meta, rid):
        """Request rid lost its blocks: the worker cancels its send
        (meta.preempted_req_ids), and it is handed over again from its
        first token under a new send id."""
        meta.preempted_req_ids.add(rid)
        self._blocks[rid] = []
        self._computed.pop(rid, None)
        self._handed.pop(rid, None)
        self._preempted[rid] = self._preempted.get(rid, 0) + 1

    def _xfer_id(self, rid):
        n = self._preempted.get(rid, 0)
        return rid if n == 0 else "%s/preempted-%d" % (rid, n)

    def request_finished(self, request, block_ids):
        """(keep the blocks until get_finished reports the send, params for
        the generation side).

        Producer: as NIXL's request_finished, only a P/D request
        (kv_transfer_params with do_remote_decode) that completed
        (FINISHED_LENGTH_CAPPED: the proxy asks the prefill instance for
        one token) keeps its blocks for a decode side, with the params
        naming the send. Any other end (an abort, a stop) means no decode
        side will ask: a send opened for it is cancelled (reqs_to_cancel,
        even when its last chunk was handed) and the blocks kept, without
        params, until the worker reports it once no write can touch them.
        A request that opened no send (not P/D, or aborted before any of
        it was handed over) gets its blocks back at once: kept, they would
        wait for a report no worker ever makes.

        Consumer: (False, None). vLLM itself keeps an aborted request's
        blocks while it waits for remote KV (WAITING_FOR_REMOTE_KVS), until
        get_finished reports the id in finished_recving; the worker cancels
        such a receive when the id comes in finished_req_ids. A request
        whose do_remote_prefill is still set was never allocated (aborted
        while waiting): as NIXL does, a receive that takes nothing tells
        the context instance to free its blocks now rather than at its
        transfer timeout."""
        rid = request.request_id
        self._warned.discard(rid)
        if self.role != "producer":
            remote = self._remote(request)
            if remote is not None:
                self._release[rid] = RecvSpec(len(request.prompt_token_ids or ()), [], remote[0], remote[1])
                request.kv_transfer_params["do_remote_prefill"] = False
            if self.role == "consumer" or rid not in self._prompt:
                return False, None
        self._blocks.pop(rid, None)
        self._computed.pop(rid, None)
        handed = self._handed.pop(rid, 0)
        prompt = self._prompt.pop(rid, None)
        xfer_id = self._xfer_id(rid)
        self._preempted.pop(rid, None)
        if prompt is None or handed == 0:
            return False, None
        self._pushing.add(rid)  # kept until a worker reports it sent
        if handed == prompt and _status_name(request) == "FINISHED_LENGTH_CAPPED":
            return True, {"do_remote_prefill": True, "remote_instance": self.instance, "remote_request_id": xfer_id}
        self._cancel.add(rid)
        return True, None

    def update_connector_output(self, connector_output):
        """vLLM's aggregated worker output: the sends reported finished
        (finished_sending) no longer hold blocks here."""
        for rid in getattr(connector_output, "finished_sending", None) or ():
            self._pushing.discard(rid)
        return None

    def has_pending_push_work(self):
        """Whether a request's blocks are kept for a send not reported
        finished yet: vLLM's scheduler keeps stepping (and so polling the
        workers' get_finished) while it is; without it an idle prefill
        instance stops after its last request and holds those blocks until
        the next one."""
        return bool(self._pushing)


# kvxfer_node_open's keys: with any of them the worker opens a node (other
# processes, other hosts) instead of an in-process engine.
NODE_KEYS = {"bind", "peers", "key_file", "secret_key", "insecure", "identities", "send_only", "heartbeat_interval",
             "heartbeat_misses", "transfer_timeout", "drain_grace", "writer_lease", "revoke_spare_bytes", "trace_path",
             "trace_max_bytes", "trace_keep",
             "discovery", "cluster", "discovery_ttl", "discovery_ca", "discovery_cert", "discovery_key",
             "discovery_user", "discovery_password_file"}


# A placeholder of a rank's bind: {tp}, {pp} or {rank}, optionally
# zero-padded to a width of at most 9 ({rank:02d}).
_BIND_FIELD = re.compile(r"\{(tp|pp|rank)(?::(0?)([1-9]?)d)?\}")


def _rank_bind(bind, rank, tp):
    """bind with its placeholders replaced by this rank's numbers ({rank}
    = pp * tp_size + tp); anything else in braces is a ValueError naming
    bind (no attribute access, no unbounded widths: it is not str.format)."""
    values = {"tp": rank["tp"], "pp": rank["pp"], "rank": rank["pp"] * tp + rank["tp"]}

    def field(m):
        v = values[m.group(1)]
        width = m.group(3) or ""
        return ("%" + (m.group(2) or "") + width + "d") % v if width else str(v)

    out = _BIND_FIELD.sub(field, bind)
    if "{" in _BIND_FIELD.sub("", bind) or "}" in _BIND_FIELD.sub("", bind):
        raise ValueError("bind = %r: a rank's endpoint may name {tp}, {pp} and {rank} (pp * tp_size + tp), each "
                         "optionally zero-padded ({rank:02d}, width 1 to 9), nothing else in braces" % (bind,))
    return out


def node_config(config, role=None):
    """A node's config (kvxfer_node_open) from the worker's, whose keys are
    kvxfer_engine_open's (tp, pp, pp_stages, rank_tp, rank_pp, transfer_timeout_ms,
    drain_grace_ms) plus the node's: the parallelism becomes parallel and
    rank, "bind" may name the rank ({tp}, {pp}, {rank} = pp * tp_size + tp:
    every rank of an instance shares the config and binds its own
    endpoint), the millisecond timeouts durations (ValueError when the node's
    own key is given too), and a producer's rank (role "producer") is
    send_only unless the config says. A receiving rank on backend "shm" is
    a ValueError naming it: peers must write into vLLM's own KV cache,
    which only ucx registers."""
    cfg = dict(config)
    tp, pp = cfg.pop("tp", 1) or 1, cfg.pop("pp", 1) or 1
    cfg["parallel"] = {"tp": tp, "pp": pp}
    stages = cfg.pop("pp_stages", None)
    if stages:
        cfg["parallel"]["stages"] = stages
    cfg["rank"] = {"tp": cfg.pop("rank_tp", 0), "pp": cfg.pop("rank_pp", 0)}
    bind = cfg.get("bind")
    if isinstance(bind, str) and ("{" in bind or "}" in bind):
        # One config serves every rank of the instance: each binds its own
        # endpoint ("ipc:///run/kvxfer/prefill-{rank}.sock",
        # "tcp://10.0.0.1:56{rank:02d}").
        cfg["bind"] = _rank_bind(bind, cfg["rank"], tp)
    for ms, key in (("transfer_timeout_ms", "transfer_timeout"), ("drain_grace_ms", "drain_grace")):
        if ms in cfg:
            if key in cfg:
                raise ValueError("%s and %s: give one (the node's %s is a duration, \"30s\")" % (ms, key, key))
            cfg[key] = "%dms" % cfg.pop(ms)
    cfg.pop("pool_bytes", None)
    if role == "producer":
        cfg.setdefault("send_only", True)
    if not cfg.get("send_only") and cfg.get("backend") == "shm":
        raise ValueError("backend = 'shm' for a rank that receives (role %s): peers must write into vLLM's own KV "
                         "cache, which the shm backend cannot register (its pool must live in its /dev/shm file): "
                         "use backend 'ucx', or send_only for a prefill rank" % (role,))
    return cfg


class KvxferWorkerConnector:
    """The worker side: one engine rank over the worker's KV memory.

    self.failed maps the id of each request that did not succeed to its
    Event, or to the error that failed it (a KvxferError of a receive or
    chunk the engine refused, a RuntimeError naming a chunk whose layers
    were not all saved). An entry stays from the failure until the
    get_finished call after the one that reported the id (so the caller
    can look right after the report), then is dropped: vLLM never pops
    it, and a long-running worker would keep every failure."""

    def __init__(self, config, role=None):
        """config: the engine's (kvxfer_engine_open), plus keys of the
        connector's own. With any of a node's keys (NODE_KEYS: bind, peers,
        discovery, secret_key, ...) the worker opens a node over vLLM's KV
        cache (node_config: the config as kvxfer_node_open takes it) and
        reaches peers in other processes; role ("producer", "consumer",
        "both") makes a producer's node send_only. "layer_parts": true hands each step's chunks from
        save_kv_layer, one layer part per layer as the forward pass writes
        it (all but the last layer's transfer then hides behind the
        pass); "num_layers": the model's layer count, when this worker
        holds only some layers (a pipeline stage; default: the highest
        registered layer index + 1). "generation_tp" and "generation_pp"
        (a producer, both or neither): the decode instances' parallelism,
        when every one has the same, passed to each send
        (Engine.send's): with MLA and a decode TP smaller than this
        instance's, a rank that writes to no decode rank then reports its
        sends at once instead of failing each at its deadline."""
        self.config = config_object("KvxferWorkerConnector", config)
        self.node = any(k in self.config for k in NODE_KEYS)
        self.role = role
        if self.node:  # a receiving rank on shm: refused now, naming it
            node_config(self.config, role)
        self.layer_parts = bool(self.config.pop("layer_parts", False))
        self.num_layers = self.config.pop("num_layers", None)
        self.generation = (self.config.pop("generation_tp", 0), self.config.pop("generation_pp", 0))
        self._stage = None   # (first, end) of the model's layers this worker holds
        self._parts = {}     # (request id, start, end) -> the next layer to hand
        self.engine = None
        self._meta = None
        self._sends = {}    # request id -> Request (context side)
        self._recvs = {}    # request id -> Request (generation side)
        self._by_handle = {}
        self._sent_done = set()
        self._recv_done = set()
        self._gen_finished = set()  # finished_req_ids of sends, not yet reported as sent
        self._handed_all = set()    # sends whose last chunk was handed over
        self._nothing_to_send = set()  # sends DONE before their last chunk: a rank that writes to nobody
        self._aborted = set()       # live requests cancelled because vLLM finished them
        self._broken = set()        # sends failed by a chunk: their later chunks go nowhere
        self._silent = {}           # handle -> Request whose event is reported to nobody
        self._recv_blocks = {}      # request id -> its destination block ids per group
        self._load_errors = set()   # blocks of failed receives, until vLLM asks
        self.failed = {}    # request id -> Event (or error) of a request that did not succeed
        self._reported_failed = set()  # ids of failed, reported by the last get_finished
        self._device = None         # CUDA ordinal of the KV cache; None: host memory
        self._fences = {}           # send handle -> the CUDA events its chunks wait on (kept alive until it ends)

    # Registration -----------------------------------------------------------

    def register_kv_caches(self, kv_caches):
        """vLLM's per-layer caches, by layer name: each in its attention
        backend's logical shape — FlashAttention's (2, num_blocks,
        block_size, kv_heads, head_dim), FlashInfer's (num_blocks, 2, ...),
        MLA's (num_blocks, block_size, latent) — with whatever strides the
        KV cache layout gave them (HND), views of one cross-layer tensor or
        one allocation each (Model Runner V2, backends without a cross-layer
        order)."""
        if not isinstance(kv_caches, collections.abc.Mapping):  # a list's entries would be taken as names
            raise TypeError("register_kv_caches: kv_caches is a %s: want vLLM's dict of each layer's KV cache "
                            "tensor by layer name" % type(kv_caches).__name__)
        if not kv_caches:
            raise ValueError("register_kv_caches: kv_caches is empty: no layer's KV cache to register")
        for n, t in kv_caches.items():
            if not hasattr(t, "shape"):
                raise TypeError("register_kv_caches: kv_caches[%r] is a %s, not a tensor" % (n, type(t).__name__))
        names = list(kv_caches)
        if self.layer_parts:
            idx = sorted(layer_index(n) for n in names)
            if idx != list(range(idx[0], idx[0] + len(idx))):
                raise ValueError("layer_parts: the registered layers %s are not one run of the model's layers" % idx)
            self._stage = (idx[0], idx[-1] + 1)
        try:
            names.sort(key=layer_index)  # the model's layer order
        except ValueError:
            pass  # names without a layer index: vLLM's order
        self._register([kv_caches[n] for n in names], None)

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend=None):
        """vLLM's cross-layer KV cache (prefer_cross_layer_blocks): one
        tensor whose dimensions are the backend's (num_layers, *per-layer
        logical shape) permuted by its get_kv_cache_stride_order(
        include_num_layers_dimension=True). Without a backend that says
        its order, kvxfer's own block layout: (num_blocks, num_layers, 2,
        kv_heads, block_size, head_dim), or (num_blocks, num_layers,
        block_size, latent) for MLA."""
        if attn_backend is None or not hasattr(attn_backend, "get_kv_cache_stride_order"):
            if not _native_shape(kv_cache):
                raise ValueError("a cross-layer KV cache of shape %s without its attention backend's stride order: "
                                 "want kvxfer's block layout (num_blocks, num_layers, 2, num_kv_heads, block_size, "
                                 "head_size)" % (tuple(kv_cache.shape),))
            if self.layer_parts and self._stage is None:  # no names: the model's first layers
                self._stage = (0, kv_cache.shape[1])
            self._register_pool(kv_cache, kv_cache.shape[0])
            return
        try:
            order = tuple(attn_backend.get_kv_cache_stride_order(include_num_layers_dimension=True))
        except TypeError:  # a backend without the layers dimension in its order
            order = None
        if order is None or sorted(order) != list(range(kv_cache.dim())):
            raise ValueError("attention backend %s: stride order %s does not order the %d dimensions of the "
                             "cross-layer KV cache (shape %s)" % (_backend_name(attn_backend), order, kv_cache.dim(),
                                                                  tuple(kv_cache.shape)))
        logical = kv_cache.permute(*[order.index(d) for d in range(len(order))])
        if self.layer_parts and self._stage is None:
            self._stage = (0, logical.shape[0])
        self._register([logical[i] for i in range(logical.shape[0])], kv_cache)

    def _register(self, tensors, whole):
        """Opens the engine over per-layer caches (tensors, in layer order;
        whole: the tensor they are views of, or None): as one pool when
        they are kvxfer's own block layout over one contiguous tensor (whole
        blocks copied as they are), else through their strides (kv_memory:
        each layer, K/V and head where the backend put it)."""
        kind, views = _nhd_views(tensors)
        nblocks = views[0].shape[1] if kind == "nhd" else views[0].shape[0]
        pool = _native_pool(kind, views, whole)
        if pool is not None:
            self._register_pool(pool, nblocks)
            return
        mem = kv_memory(kind, views)
        if self.node:
            cfg = node_config(self.config, self.role)
            cfg["memory"] = mem
            self.engine = Node(cfg)
        else:
            cfg = dict(self.config)
            cfg.pop("pool_bytes", None)
            cfg["memory"] = mem
            self.engine = Engine(cfg)
        info = self.engine.info
        # What the tensors hold against what the engine's layout and rank
        # expect: the descriptor carries only addresses and strides.
        if kind == "nhd":
            got = {"tokens per block": views[0].shape[2], "kv heads": views[0].shape[3], "head dim": views[0].shape[4]}
            want = {"tokens per block": info.tokens_per_block, "kv heads": info.kv_heads, "head dim": info.head_dim}
        else:
            got = {"tokens per block": views[0].shape[1], "latent width": views[0].shape[2]}
            want = {"tokens per block": info.tokens_per_block, "latent width": info.head_dim}
        bad = [k for k in got if got[k] != want[k]]
        if bad:
            self.engine.close()
            raise ValueError("vLLM's KV caches hold %s; kvxfer's layout for this rank has %s"
                             % (", ".join("%s %d" % (k, got[k]) for k in bad), ", ".join("%s %d" % (k, want[k]) for k in bad)))
        self._opened(views[0])

    def _register_pool(self, kv_cache, nblocks):
        """Opens the engine over kv_cache as its pool: kvxfer's own block
        layout, block b at b × the block's bytes."""
        nbytes = kv_cache.numel() * kv_cache.element_size()
        if self.node:
            # A node over vLLM's own KV cache, on the CPU or a GPU
            # (pool_device: Node reads it from the tensor): peers of other
            # processes write into it.
            self.engine = Node(node_config(self.config, self.role), memory=kv_cache)
        else:
            # An in-process engine: host memory only (Engine refuses a CUDA
            # tensor, saying to give the node's keys).
            cfg = dict(self.config)
            cfg["pool_bytes"] = nbytes
            self.engine = Engine(cfg, memory=kv_cache)
        g = self.engine.groups[0]
        stride = nbytes // nblocks
        if g.offset != 0 or g.block_bytes != stride or g.blocks != nblocks:
            self.engine.close()
            raise ValueError("kvxfer block geometry (offset %d, %d bytes, %d blocks) differs from the tensor's "
                             "(%d bytes per block, %d blocks)" % (g.offset, g.block_bytes, g.blocks, stride, nblocks))
        self._opened(kv_cache)

    def _opened(self, tensor):
        # The framework owns every block id: kvxfer's allocator is unused.
        for grp, gi in enumerate(self.engine.groups):
            self.engine.alloc(grp, gi.blocks)
        self._device = _cuda_index(tensor)
        # The events kvxfer queries live as long as the engine, which the
        # module keeps open until it is closed, even when this worker is
        # dropped without shutdown().
        self.engine.cuda_fences = self._fences

    def _written(self):
        """What says that the KV the model wrote so far is in the cache:
        None on the host (the CPU wrote it before vLLM called us: a fence
        made ready at once), or, for a KV cache on a GPU, a CUDA event
        recorded now on the cache's device's current stream, behind the
        kernels that write the KV (they are queued, not done, when vLLM
        calls wait_for_save or save_kv_layer). A fresh event each call:
        kvxfer borrows it until each request it fences has ended."""
        if self._device is None:
            return None
        import torch

        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self._device))
        return ev

    def _hand(self, r, start, end, runs, written, last=None, layers=None):
        """Hands a chunk (or a layer part of it) of send r over behind
        written (_written's): a fence made ready at once on the host, the
        CUDA event on a GPU, kept alive until r ends."""
        if written is None:
            r.chunk(start, end, runs, last=last, layers=layers).ready()
            return
        r.chunk(start, end, runs, last=last, cuda_event=written, device=self._device, layers=layers)
        self._fences.setdefault(r.handle, []).append(written)

    # Per step ---------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata):
        self._meta = connector_metadata

    def clear_connector_metadata(self):
        self._meta = None

    def start_load_kv(self, forward_context=None, **kwargs):
        """Opens each receive of the step, into the request's blocks past
        its local prefix hit: vLLM's prefix-cache blocks are shared with
        the running requests of the same prefix and are never written (NIXL
        too pulls into the unhashed blocks only). Group g's ids are the
        table's needed_range(prompt_len, g, hit) slice. One the engine
        refuses (a remote_request_id already receiving, a bad value) is a
        failed load, not the step's end: it goes to self.failed with its
        error, its blocks to get_block_ids_with_load_errors, its id to the
        next get_finished's finished_recving (vLLM would wait for it forever
        otherwise), and the other receives go on.

        Then the receives that take nothing (reqs_to_release: every block a
        prefix hit), which end the context side's send at once so that the
        prefill instance frees its blocks; their end is reported to nobody
        (vLLM no longer knows the request). And the sends the scheduler
        aborted (reqs_to_cancel) are cancelled, even after their last chunk:
        no decode side will read them."""
        for rid, spec in self._meta.reqs_to_recv.items():
            hits = [spec.prefix_hit_blocks] * len(spec.block_ids)
            blocks = [ids[slice(*self.engine.needed_range(spec.prompt_len, g, spec.prefix_hit_blocks))]
                      if g < len(self.engine.groups) else ids for g, ids in enumerate(spec.block_ids)]
            try:
                r = self.engine.receive(spec.remote_request_id, spec.prompt_len, spec.context, blocks=blocks,
                                        prefix_hit_blocks=hits)
            except _REFUSED as exc:
                logger.warning("kvxfer: request %s: receive refused: %s", rid, exc)
                self.failed[rid] = exc
                self._load_errors.update(b for group in blocks for b in group)
                self._recv_done.add(rid)
                continue
            self._recvs[rid] = r
            self._recv_blocks[rid] = blocks
            self._by_handle[r.handle] = (rid, "recv")
        for rid, spec in self._meta.reqs_to_release.items():
            ends = [self.engine.needed_range(spec.prompt_len, g)[1] for g in range(len(self.engine.groups))]
            try:
                r = self.engine.receive(spec.remote_request_id, spec.prompt_len, spec.context,
                                        blocks=[[] for _ in ends], prefix_hit_blocks=ends)
            except _REFUSED as exc:
                logger.warning("kvxfer: request %s: could not tell %s to free the blocks of %s: %s",
                               rid, spec.context, spec.remote_request_id, exc)
                continue
            self._silent[r.handle] = r
            self._by_handle[r.handle] = (rid, "silent")
        for rid in self._meta.reqs_to_cancel:
            r = self._sends.get(rid)
            if r is not None and rid not in self._aborted:
                r.cancel()  # a no-op if it finished meanwhile: its event still comes
                self._aborted.add(rid)

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata=None, **kwargs):
        """Without "layer_parts": nothing (wait_for_save hands whole chunks).

        With it, layer L's KV of the step is written (vLLM calls this after
        each attention layer, in order): each request's chunk of the step
        leaves its part (L, L + 1, num_layers) (kvxfer_chunk_layers), its
        fence made ready at once on the host; for a KV cache on a GPU,
        behind a CUDA event recorded now on the cache's device's current
        stream, after layer L's attention kernels (_written). A
        chunk's parts run from layer 0 to num_layers on every rank, so a
        pipeline stage holding layers [a, b) also hands (0, a) before its
        first layer's part and (b, num_layers) after its last, unfenced:
        it writes none of them. A layer out of order is a KvxferError
        naming the layers."""
        if not self.layer_parts or self._meta is None:
            return None
        layer = layer_index(layer_name)
        first, end = self._stage
        of = self.num_layers or end
        written = self._written() if self._meta.reqs_to_send else None
        for rid, spec in self._meta.reqs_to_send.items():
            r = self._send(rid, spec)
            for start, stop in spec.chunks:
                runs, last, key = self._chunk_runs(spec, start, stop), stop == spec.prompt_len, (rid, start, stop)
                if r is None:
                    self._parts[key] = of
                    continue
                try:
                    if layer == first and first > 0:
                        r.chunk(start, stop, runs, last=last, fenced=False, layers=(0, first, of))
                    self._hand(r, start, stop, runs, written, last=last, layers=(layer, layer + 1, of))
                    if layer == end - 1 and end < of:
                        r.chunk(start, stop, runs, last=last, fenced=False, layers=(end, of, of))
                except _REFUSED as exc:
                    self._fail_send(rid, exc)
                    self._parts[key] = of
                    continue
                self._parts[key] = of if layer == end - 1 else layer + 1
        return None

    def _send(self, rid, spec):
        """The context side of request rid (the engine's id: spec.xfer_id),
        opened on its first chunk; None once it ended DONE before its last
        chunk (told the decode parallelism, a rank that writes to no decode
        rank ends at once) or failed: its later chunks go nowhere."""
        if rid in self._nothing_to_send or rid in self._broken:
            return None
        r = self._sends.get(rid)
        if r is None:
            try:
                r = self.engine.send(spec.xfer_id or rid, spec.prompt_len, generation_tp=self.generation[0],
                                     generation_pp=self.generation[1])
            except _REFUSED as exc:
                self._fail_send(rid, exc)
                return None
            self._sends[rid] = r
            self._by_handle[r.handle] = (rid, "send")
        return r

    def _fail_send(self, rid, exc):
        """A send the engine refused, or a chunk of it: that request fails
        alone (raised, it would end vLLM's execute_model and every request
        of the worker). Its send is cancelled (the decode side's receive
        fails, and vLLM recomputes there), exc kept in self.failed, its
        later chunks go nowhere, and it is reported sent once its event
        came (at once when none was opened) and its request finished."""
        logger.warning("kvxfer: request %s: send failed: %s", rid, exc)
        self.failed.setdefault(rid, exc)
        self._broken.add(rid)
        r = self._sends.get(rid)
        if r is None:
            self._sent_done.add(rid)
        else:
            r.cancel()  # a no-op if it finished meanwhile: its event still comes

    def _chunk_runs(self, spec, start, end):
        tpb = self.engine.tokens_per_block
        b0, b1 = start // tpb, -(-end // tpb)
        return [(b0, ids[b0:b1]) for ids in spec.block_ids]

    def wait_for_save(self):
        """The step's KV is written: each request's chunk of the step is
        handed over, its fence made ready at once on the host; for a KV
        cache on a GPU, behind a CUDA event recorded now on the cache's
        device's current stream (the model's kernels are queued there, not
        done), a fresh one per step, kept alive until each request it
        fences has ended (_written, _hand).

        With "layer_parts" the chunks left from save_kv_layer: a chunk of
        the step whose parts did not reach the model's last layer (a layer
        never saved) is a RuntimeError naming it, not a request left to
        time out.

        A chunk the engine refuses (save_kv_layer's too) fails its request
        alone (_fail_send), kept in self.failed with the error; nothing is
        raised out of vLLM's execute_model."""
        if self.layer_parts:
            parts, self._parts = self._parts, {}
            of = self.num_layers or self._stage[1]
            for rid, spec in self._meta.reqs_to_send.items():
                for start, end in spec.chunks:
                    got = parts.get((rid, start, end), 0)
                    if got < of and rid not in self._broken:
                        self._fail_send(rid, RuntimeError("request %s chunk [%d, %d): save_kv_layer handed its "
                                                          "layers up to %d of %s" % (rid, start, end, got, of)))
            self._note_handed_all()
            return
        written = self._written() if self._meta.reqs_to_send else None
        for rid, spec in self._meta.reqs_to_send.items():
            for start, end in spec.chunks:
                r = self._send(rid, spec)
                if r is None:
                    continue
                try:
                    self._hand(r, start, end, self._chunk_runs(spec, start, end), written)
                except _REFUSED as exc:
                    self._fail_send(rid, exc)
        self._note_handed_all()

    def handle_preemptions(self, preempted_req_ids):
        """vLLM preempted these requests (KVConnectorBase_V1's hook, called
        before their blocks are overwritten: _preempt_request has freed
        them). A send of one is cancelled and waited for until its event
        came, the engine's word that its pages are no longer read; it is
        reported to nobody (the request lives on: the scheduler side hands
        it over again, under a new id, once it resumes), and a decode side
        already receiving it fails its load and recomputes. Should the
        event not come within PREEMPT_WAIT_S, an error is logged and the
        send is released when it comes."""
        for rid in preempted_req_ids or ():
            r = self._sends.pop(rid, None)
            for done in (self._sent_done, self._gen_finished, self._handed_all, self._nothing_to_send,
                         self._aborted, self._broken):
                done.discard(rid)
            self.failed.pop(rid, None)
            if r is None:
                continue
            self._by_handle[r.handle] = (rid, "silent")
            self._silent[r.handle] = r
            r.cancel()  # a no-op if it finished meanwhile: its event still comes
            try:
                self.engine.wait(r, PREEMPT_WAIT_S)
            except TimeoutError:
                logger.error("kvxfer: request %s preempted, but its cancelled send did not end in %.0f s: "
                             "its freed blocks may still be read", rid, PREEMPT_WAIT_S)
                continue
            except KvxferError as exc:  # the engine closed under the wait: nothing to raise into vLLM
                logger.error("kvxfer: request %s preempted while the engine closed (%s): its freed blocks may "
                             "still be read until the close ended", rid, exc)
                continue
            del self._by_handle[r.handle], self._silent[r.handle]
            self._fences.pop(r.handle, None)
            r.release()

    def _note_handed_all(self):
        for rid, spec in self._meta.reqs_to_send.items():
            if rid in self._sends and any(end == spec.prompt_len for _, end in spec.chunks):
                self._handed_all.add(rid)

    def get_finished(self, finished_req_ids):
        """(ids whose send is DONE, ids whose receive finished): vLLM frees
        or schedules them. A send is reported only once its request also
        finished generating (its id came in finished_req_ids, now or in an
        earlier call), as vLLM's contract asks: until then the scheduler
        still owns its blocks. A request that failed is reported as
        finished too, and is in self.failed with its event or error until
        the next call.

        An id in finished_req_ids whose request is still live here was
        aborted: a receive (vLLM keeps its blocks until it is reported) and
        a send whose last chunk was never handed over (it would wait for it
        until its timeout) are cancelled, and reported once their event
        arrived: the engine's proof that no write touches the blocks any
        more. (A send aborted after its last chunk is cancelled by
        start_load_kv: only the scheduler side knows no decode side will
        read it.) An aborted request is not in self.failed."""
        for rid in self._reported_failed:
            self.failed.pop(rid, None)
        finished = set(finished_req_ids or ())
        self._gen_finished.update(r for r in finished if r in self._sends or r in self._sent_done)
        if self.engine is not None:
            self._reap()
            for rid in finished:
                if rid in self._aborted:
                    continue
                live = [self._recvs[rid]] if rid in self._recvs else []
                if rid in self._sends and rid not in self._handed_all:
                    live.append(self._sends[rid])
                for req in live:
                    req.cancel()  # a no-op if it finished meanwhile: its event still comes
                if live:
                    self._aborted.add(rid)
        sent = self._sent_done & self._gen_finished
        self._sent_done -= sent
        self._nothing_to_send -= sent
        self._broken -= sent
        self._gen_finished -= sent
        recv, self._recv_done = self._recv_done, set()
        self._reported_failed = {rid for rid in sent | recv if rid in self.failed}
        return (sent or None), (recv or None)

    def _reap(self):
        for ev in self.engine.poll():
            rid, side = self._by_handle.pop(ev.request)
            self._fences.pop(ev.request, None)  # the request ended: kvxfer waits on its events no more
            if side == "silent":
                self._silent.pop(ev.request).release()
                continue
            req = (self._sends if side == "send" else self._recvs).pop(rid)
            failed = ev.outcome not in (Outcome.DONE, Outcome.READY) and rid not in self._aborted
            if failed:
                self.failed.setdefault(rid, ev)  # a chunk's error, when one failed it, says more
            self._aborted.discard(rid)
            req.release()
            if side == "send":
                if ev.outcome == Outcome.DONE and rid not in self._handed_all:
                    self._nothing_to_send.add(rid)
                self._handed_all.discard(rid)
                self._sent_done.add(rid)
            else:
                blocks = self._recv_blocks.pop(rid, ())
                if failed:
                    self._load_errors.update(b for group in blocks for b in group)
                self._recv_done.add(rid)

    def get_block_ids_with_load_errors(self):
        """The destination blocks of receives that failed since the last
        call (vLLM asks after get_finished): none of a failed receive's KV
        is trusted, so vLLM recomputes or fails the request
        (kv_load_failure_policy) instead of decoding from them. An aborted
        request's blocks are not reported: vLLM frees them."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self, timeout_ms=5000):
        """Closes the engine. A close that times out raises KvxferError
        (Status.TIMEOUT) and warns: the engine is closed all the same, and
        vLLM's KV cache it was registered over stays referenced by kvxfer
        for the rest of the process (Engine.close), since peers may still
        write into it. A refused close leaves the engine open."""
        if self.engine is None:
            return
        try:
            self.engine.close(timeout_ms)
        finally:
            if not self.engine.handle:
                self.engine = None
