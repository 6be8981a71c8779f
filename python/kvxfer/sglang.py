"""kvxfer as an SGLang PD-disaggregation transfer backend.

SGLang's prefill and decode schedulers drive a backend through four classes
(python/sglang/srt/disaggregation/base/conn.py of SGLang's GitHub
repository): a KVManager per scheduler process (rank), a KVSender per
prefill request, a KVReceiver per decode request and a KVBootstrapServer on
the prefill host. This module gives those four classes over a kvxfer Node
(kvxfer_node_open) opened on SGLang's own KV pool; it does not import SGLang
at module import (install() and the KVPoll values do, lazily), so it loads
where SGLang is not installed.

The call sequence it follows (SGLang's disaggregation/prefill.py and
decode.py, commits 000c2b9 and 0035ca4 of prefill.py / decode.py, and the
older receiver API):

  prefill (PrefillBootstrapQueue, SchedulerDisaggregationPrefillMixin):
    sender = KVSender(mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank)
    sender.poll() until it is not Bootstrapping (Failed: failure_exception())
    sender.init(num_pages, metadata_buffer_index)
    sender.send(page_indices) once per prefill chunk, the pages of that
        chunk; the last chunk is the one that completes num_pages (SGLang
        writes the aux (metadata) buffers before it: set_buf)
    sender.poll() until Success (the pages may be freed) or Failed
        (failure_exception() raises, naming the reason); abort() on an
        abort request; clear() after Success

  decode (DecodePreallocQueue, DecodeTransferQueue):
    receiver = KVReceiver(mgr, bootstrap_addr, bootstrap_room, ...)
    newer SGLang: receiver.init(prefill_dp_rank), poll() until
        WaitingForInput, then send_metadata(page_indices,
        metadata_buffer_index, state_indices, decode_prefix_len=...)
    older SGLang: poll() until WaitingForInput, then
        receiver.init(page_indices, metadata_buffer_index)
    receiver.poll() until Success (the pages and the aux slot hold the
        prefill's bytes) or Failed; abort(), clear()

  KV pool released and restored (release_memory_occupation /
  resume_memory_occupation, an RL weight update with torch_memory_saver):
    the bootstrap (prefill) or prealloc (decode) queue clears itself and
        calls mgr.deregister_buffer_to_engine(): the node closes (what is
        live ends Failed), or a RuntimeError says its close did not finish
    mgr.register_buffer_to_engine() on resume: a new node (incarnation)
        over the same pool; requests made before the release fail

No method SGLang calls from its scheduler loop raises for one request's
trouble (poll, init, send, send_metadata, abort, clear): the request ends
Failed and failure_exception() raises a RuntimeError naming the reason, as
SGLang expects (it catches it and aborts that request alone). Failed is
reported only once kvxfer's event for the request came: on the prefill side
no transfer reads the pages any more, on the decode side no write can land
in them (SGLang frees the pages as soon as it reads Failed). The poll
SGLang acts on is the MIN over its TP ranks' (poll_and_all_reduce): a rank
whose own kvxfer request is still live when another rank's Failed decides
the request ends it in failure_exception() (or clear()), which SGLang
calls before it frees the pages, and which return once its event came.

Mapping (docs/integration.md, "SGLang"):

  - request id: "sglang-<bootstrap_room>" on both sides (the room is the
    one value SGLang gives both sides of a request).
  - a page is a kvxfer block: tokens_per_block = SGLang's page_size, a
    request's kvxfer prompt is num_pages * page_size tokens (whole pages, as
    SGLang moves them); send(page_indices) is one chunk of its pages.
  - KV memory: kv_data_ptrs (one buffer per layer's K, then one per
    layer's V; for MLA one per layer) become the node's "memory" of kind
    "split_kv" (or "mla"), num_blocks = kv_data_lens / kv_item_lens, block
    ids SGLang's page indices. The item length must be the layout's page
    (tokens_per_block * kv_heads * head_dim * dtype_bytes per K or V
    buffer): anything kvxfer cannot describe exactly is a ValueError at
    KVManager construction naming it.
  - aux (metadata) buffers: they travel as the request's payload (at most
    65536 bytes), set just before the last chunk (Request.set_payload:
    SGLang writes the slot, set_buf, before it sends that chunk): every aux
    buffer's item at aux_index, concatenated; the decode side copies it
    into its own aux slot before poll() says Success. Aux buffers must be
    host memory (SGLang's MetadataBuffers are CPU tensors); more than 65536
    bytes of them per request are refused at KVManager construction.
  - routing: the decode side's kvxfer peer for a request is the prefill
    instance named for the request's bootstrap_addr in the config
    ("prefill_instances": {"host:port": "instance"}, or one
    "prefill_instance"); its parallelism from the static peers' "parallel",
    else "prefill_parallel". kvxfer's own rank mapping (TP heads, PP
    layers) replaces SGLang's dest_tp_ranks. SGLang's bootstrap server is
    not needed: KVBootstrapServer starts nothing.

Configuration: install(backend, config) or $KVXFER_SGLANG_CONFIG (JSON
text, or the path of a JSON file): kvxfer_node_open's keys (bind with
{tp}/{pp}/{rank}, peers or discovery, key_file / secret_key / insecure,
backend, ...) and the layout ("model" or "layout"), as the vLLM connector
takes them, plus this module's own keys: "prefill_instance",
"prefill_instances", "prefill_parallel" and "kv_device" ("cuda", the
default: SGLang's KV pool is on the rank's GPU, gpu_id; "cpu" for host
memory).
"""

import ctypes
import logging
import operator
import os
import threading
import time

from .connector import NODE_KEYS, node_config
from .core import KvxferError, Node, Outcome, Status, config_from_env, config_object

logger = logging.getLogger(__name__)

# kvxfer's payload limit (messages.MaxPayload): the bytes one request carries.
PAYLOAD_MAX = 65536

# The keys this module reads from the config (the rest go to the node).
OWN_KEYS = ("prefill_instance", "prefill_instances", "prefill_parallel", "kv_device")

_REFUSED = (KvxferError, ValueError, TypeError)

# How long clear() waits for a live request's event once it cancelled it (a
# cancel ends a request as soon as the writes already under way completed).
CLEAR_WAIT_S = 30.0


class _Poll:
    """SGLang's KVPoll values (base/conn.py, a class of plain ints there
    too, which poll_and_all_reduce turns into a tensor)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


# The values poll() returns: SGLang compares them with its own KVPoll.
KVPoll = _Poll

_installed_config = None


def room_id(room):
    """kvxfer's request id of SGLang's bootstrap_room (an int)."""
    room_arg = room
    if isinstance(room, bool):
        raise ValueError("bootstrap_room = %r: want an int" % (room,))
    try:
        room = operator.index(room)  # ints, NumPy's and torch's too
    except TypeError:
        # Decimal digits as text are taken; a float is not, since int()
        # would cut 1.7 to room 1, another request's id.
        try:
            room = int(room) if isinstance(room, str) else None
        except ValueError:
            room = None
        if room is None:
            raise ValueError("bootstrap_room = %r: want an int" % (room_arg,)) from None
    return "sglang-%d" % room


def _config(server_args=None):
    """The kvxfer config: install()'s, else $KVXFER_SGLANG_CONFIG (JSON
    text or a file's path). A ValueError names what is missing or wrong."""
    if _installed_config is not None:
        return dict(_installed_config)
    return config_from_env("KVXFER_SGLANG_CONFIG",
                           "kvxfer's SGLang backend has no config: call kvxfer.sglang.install(backend, config) in "
                           "each SGLang process, or set KVXFER_SGLANG_CONFIG to its JSON (or a JSON file's path)")


def _mode_name(mode):
    """"prefill" or "decode" of SGLang's DisaggregationMode (an Enum whose
    value is the name), or of a str."""
    name = getattr(mode, "value", mode)
    if name not in ("prefill", "decode"):
        raise ValueError("disaggregation_mode = %r: want prefill or decode" % (mode,))
    return name


def _sglang_split(layers, pp):
    """SGLang's split of layers over pp stages (each stage's layer count):
    its get_pp_indices where SGLang is installed, else the same rule —
    SGLANG_PP_LAYER_PARTITION when set, else layers // pp each, the last
    layers % pp stages one longer."""
    try:
        from sglang.srt.distributed.utils import get_pp_indices
    except ImportError:
        get_pp_indices = None
    if get_pp_indices is not None:
        return [hi - lo for lo, hi in (get_pp_indices(layers, r, pp) for r in range(pp))]
    env = os.environ.get("SGLANG_PP_LAYER_PARTITION")
    if env is not None:
        try:
            counts = [int(c) for c in env.split(",")]
        except ValueError:
            raise ValueError("SGLANG_PP_LAYER_PARTITION = %r: not a list of layer counts" % env)
        if len(counts) != pp or sum(counts) != layers:
            raise ValueError("SGLANG_PP_LAYER_PARTITION = %r: %d stages of %d layers in all, want %d stages of %d"
                             % (env, len(counts), sum(counts), pp, layers))
        return counts
    base, extra = divmod(layers, pp)
    return [base + (1 if r >= pp - extra else 0) for r in range(pp)]


def _model_layers(cfg, server_args):
    """The model's layer count: the config's layout's, else SGLang's model
    config's (from server_args), else None."""
    layout = cfg.get("layout")
    if isinstance(layout, dict) and isinstance(layout.get("layers"), int):
        return layout["layers"]
    if server_args is None:
        return None
    try:
        from sglang.srt.configs.model_config import ModelConfig
        mc = ModelConfig.from_server_args(server_args)
    except Exception:  # not installed, or no model to read: the caller says what to give
        return None
    n = getattr(mc, "num_hidden_layers", None)
    if not isinstance(n, int):
        n = getattr(getattr(mc, "hf_text_config", None), "num_hidden_layers", None)
    return n if isinstance(n, int) else None


def sglang_pp_stages(cfg, server_args, args, pp, rank_pp, nlayers, check_start=True):
    """kvxfer's pp_stages for an SGLang pipeline of pp stages ("3,4"): the
    config's own pp_stages when it says one, else SGLang's split of the
    model's layers (_sglang_split). A ValueError names what disagrees: this
    stage's KV buffers (nlayers layers) or, with check_start (a prefill
    rank), its first layer (KVArgs.prefill_start_layer, where SGLang gives
    it) against the split."""
    if not 0 <= rank_pp < pp:
        raise ValueError("pp_rank = %d of pp_size = %d" % (rank_pp, pp))
    given = cfg.get("pp_stages")
    if given:
        try:
            counts = [int(c) for c in str(given).split(",")]
        except ValueError:
            raise ValueError("pp_stages = %r: not a list of layer counts" % (given,))
        if len(counts) != pp:
            raise ValueError("pp_stages = %r names %d stages, pp_size = %d" % (given, len(counts), pp))
        what = "the config's pp_stages %r" % (given,)
    else:
        layers = _model_layers(cfg, server_args)
        if layers is None:
            raise ValueError("pp_size = %d: kvxfer needs SGLang's split of the model's layers over its stages: give "
                             "the config's \"layout\" (with \"layers\") or \"pp_stages\" (each stage's layer "
                             "count, \"16,16\"), or run where SGLang reads the model's config" % pp)
        counts = _sglang_split(layers, pp)
        what = "SGLang's split of %d layers over %d stages (%s)" % (
            layers, pp, ",".join(map(str, counts)))
    if counts[rank_pp] != nlayers:
        raise ValueError("pipeline stage %d registered %d layers' KV buffers, %s gives it %d"
                         % (rank_pp, nlayers, what, counts[rank_pp]))
    start = getattr(args, "prefill_start_layer", None) if check_start else None
    if isinstance(start, int) and start != sum(counts[:rank_pp]):
        raise ValueError("pipeline stage %d starts at layer %d (KVArgs.prefill_start_layer), %s starts it at %d"
                         % (rank_pp, start, what, sum(counts[:rank_pp])))
    return ",".join(str(c) for c in counts)


class KVManager:
    """One scheduler process's (rank's) kvxfer Node over SGLang's KV pool.

    KVManager(args, disaggregation_mode, server_args, is_mla_backend) as
    SGLang's BaseKVManager. Everything kvxfer cannot do exactly is a
    ValueError here, at startup, naming the value: a layout whose page is
    not SGLang's item length, hybrid state pools (state_data_ptrs),
    attention data parallelism, a pipeline stage whose layers are not
    SGLang's split (sglang_pp_stages), KV buffers of unequal size, no node
    keys."""

    # SGLang's runtime PD role switch (disaggregation/role_switch.py,
    # _reject_reason) reads this of the current manager: kvxfer's node is
    # opened for one role, so a switch is refused with SGLang's own message.
    supports_role_switch = False

    def __init__(self, args, disaggregation_mode, server_args=None, is_mla_backend=False, config=None):
        self.kv_args = args
        self.mode = _mode_name(disaggregation_mode)
        self.is_mla = bool(is_mla_backend)
        cfg = dict(config) if config is not None else _config(server_args)
        own = {k: cfg.pop(k) for k in OWN_KEYS if k in cfg}
        if not any(k in cfg for k in NODE_KEYS):
            raise ValueError("kvxfer's SGLang backend runs over a node: the config needs a node's keys (bind, and "
                             "peers or discovery; key_file, secret_key or insecure), none of %s given"
                             % sorted(cfg))
        if server_args is not None and getattr(server_args, "enable_dp_attention", False):
            raise ValueError("enable_dp_attention: kvxfer's SGLang backend does not map attention data-parallel "
                             "ranks (each DP rank would be its own kvxfer instance); not supported yet")
        states = [p for p in (getattr(args, "state_data_ptrs", None) or []) if p]
        if states:
            raise ValueError("state_data_ptrs (%d state pools: %s): hybrid models' Mamba/SWA/DSA state is no KV "
                             "layer group kvxfer can describe; not supported"
                             % (len(states), getattr(args, "state_types", "?")))
        self.page_size = int(args.page_size)
        self.prefill_instances = own.get("prefill_instances") or {}
        if not isinstance(self.prefill_instances, dict):
            raise ValueError("prefill_instances = %r: want {\"host:port\": \"instance\"}" % (self.prefill_instances,))
        self.prefill_instance = own.get("prefill_instance")
        self.prefill_parallel = own.get("prefill_parallel") or {}
        self._peers = cfg.get("peers") if isinstance(cfg.get("peers"), list) else []
        kv_device = own.get("kv_device", "cuda")
        if kv_device not in ("cuda", "cpu"):
            raise ValueError("kv_device = %r: want \"cuda\" (SGLang's KV pool on the rank's GPU) or \"cpu\""
                             % (kv_device,))
        self.device = int(getattr(args, "gpu_id", 0) or 0) if kv_device == "cuda" else None

        ptrs, lens, items = list(args.kv_data_ptrs), list(args.kv_data_lens), list(args.kv_item_lens)
        if not ptrs or not (len(ptrs) == len(lens) == len(items)):
            raise ValueError("kv_data_ptrs, kv_data_lens, kv_item_lens: %d, %d and %d entries, want equal and > 0"
                             % (len(ptrs), len(lens), len(items)))
        for i in range(len(ptrs)):
            if items[i] != items[0] or lens[i] != lens[0]:
                raise ValueError("KV buffer %d: %d bytes of %d-byte pages, buffer 0: %d of %d: kvxfer describes "
                                 "every layer's buffer with one geometry" % (i, lens[i], items[i], lens[0], items[0]))
        if items[0] <= 0 or lens[0] % items[0]:
            raise ValueError("KV buffer of %d bytes is no whole number of %d-byte pages" % (lens[0], items[0]))
        if self.is_mla:
            layers, v_layers, kind = ptrs, None, "mla"
        else:
            if len(ptrs) % 2:
                raise ValueError("%d KV buffers: an MHA pool has one K and one V buffer per layer (an even count)"
                                 % len(ptrs))
            layers, v_layers, kind = ptrs[: len(ptrs) // 2], ptrs[len(ptrs) // 2:], "split_kv"
        self.num_pages = lens[0] // items[0]
        mem = {"kind": kind, "num_blocks": self.num_pages, "layers": layers}
        if v_layers is not None:
            mem["v_layers"] = v_layers
        if self.device is not None:
            mem["device"] = self.device

        tpb = cfg.get("tokens_per_block", (cfg.get("layout") or {}).get("tokens_per_block"))
        if tpb is not None and tpb != self.page_size:
            raise ValueError("tokens_per_block = %r in the config, SGLang's page_size is %d: a kvxfer block is an "
                             "SGLang page" % (tpb, self.page_size))
        cfg["tokens_per_block"] = self.page_size
        tp = getattr(server_args, "tp_size", None) or cfg.get("tp", 1)
        pp = getattr(server_args, "pp_size", None) or cfg.get("pp", 1)
        rank_pp = int(getattr(args, "pp_rank", 0) or 0)
        if pp != 1:
            # SGLang gives a stage's extra layers to the last stages
            # (get_pp_indices, or SGLANG_PP_LAYER_PARTITION), kvxfer's
            # default to the first: the node is told SGLang's split.
            cfg["pp_stages"] = sglang_pp_stages(cfg, server_args, args, pp, rank_pp,
                                                len(ptrs) if self.is_mla else len(ptrs) // 2,
                                                check_start=self.mode == "prefill")
        if os.environ.get("SGLANG_DISAGG_STAGING_BUFFER"):
            raise ValueError("SGLANG_DISAGG_STAGING_BUFFER is set: SGLang's staging buffers are its own backends' "
                             "path; kvxfer writes SGLang's KV pool directly: unset it")
        if "transfer_timeout" not in cfg and "transfer_timeout_ms" not in cfg:
            # A decode request waits through the prefill's queue and forward
            # pass: SGLang's own wait bound, not kvxfer's 30 s default.
            wait_s = os.environ.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "300")
            try:
                cfg["transfer_timeout"] = "%ds" % int(float(wait_s))
            except ValueError:
                raise ValueError("SGLANG_DISAGGREGATION_WAITING_TIMEOUT = %r: not a number of seconds" % wait_s)
        cfg.update(tp=tp, pp=pp, rank_tp=int(getattr(args, "engine_rank", 0) or 0), rank_pp=rank_pp)
        self.pp_size, self.pp_rank = pp, rank_pp
        ncfg = node_config(cfg, "producer" if self.mode == "prefill" else "consumer")
        ncfg["memory"] = mem
        # Kept to open the node again over the same pool once SGLang
        # restores it (register_buffer_to_engine).
        self._node_config, self._geometry = ncfg, (items[0], len(layers))
        self._open_node()
        self.instance = self.node.instance
        self.aux = list(zip(getattr(args, "aux_data_ptrs", None) or [], getattr(args, "aux_item_lens", None) or []))
        self.aux_bytes = sum(n for _, n in self.aux)
        if self.aux_bytes > PAYLOAD_MAX:
            self.node.close()
            raise ValueError("aux buffers of %d bytes per request (aux_item_lens %s): more than a kvxfer payload "
                             "holds, %d bytes" % (self.aux_bytes, [n for _, n in self.aux], PAYLOAD_MAX))
        # decode.py (0035ca4) reads prefill_info_table.get(bootstrap_addr).dp_size
        # for every request: each prefill is one SGLang DP rank to kvxfer.
        self.prefill_info_table = _PrefillInfoTable()
        self._lock = threading.RLock()
        self._owners = {}  # request handle -> (owner, tag)
        # close()'s state, under its own lock (never held while the node
        # closes, nor while a clear() waits for its events).
        self._close_lock = threading.Lock()
        self._close_done = threading.Event()
        self.closed = False  # a close() returned
        self._closing = False  # a close() under way
        self._close_finished = True
        # SGLang's release_memory_occupation closed the node (its close
        # finished) and no resume_memory_occupation reopened it yet.
        self._released = False
        # The node's incarnation: each reopen counts one; a request made
        # on an earlier one fails (_Transfer._stale).
        self._epoch = 0

    def _open_node(self):
        """Opens the node over SGLang's KV pool (self._node_config) and
        hands every page to SGLang; closed again, raising, when kvxfer's
        geometry is not SGLang's."""
        self.node = Node(self._node_config)
        try:
            self._check_geometry(*self._geometry)
            # SGLang owns every page: kvxfer's allocator is unused.
            for g, gi in enumerate(self.node.groups):
                self.node.alloc(g, gi.blocks)
        except BaseException:
            self.node.close()
            raise

    def _check_geometry(self, item_len, nlayers):
        info = self.node.info
        if info.tokens_per_block != self.page_size:
            raise ValueError("kvxfer opened %d tokens per block, SGLang's page_size is %d"
                             % (info.tokens_per_block, self.page_size))
        page = info.tokens_per_block * info.kv_heads * info.head_dim * info.dtype_bytes
        if page != item_len:
            raise ValueError("SGLang's page is %d bytes per layer buffer (kv_item_lens), kvxfer's layout has %d "
                             "(%d tokens x %d KV heads on this rank x head_dim %d x %d bytes): the config's model "
                             "or layout is not SGLang's" % (item_len, page, info.tokens_per_block, info.kv_heads,
                                                            info.head_dim, info.dtype_bytes))
        have = sum(g.layers for g in self.node.groups)
        if have != nlayers or len(self.node.groups) != 1:
            raise ValueError("SGLang registered %d layers' KV buffers, kvxfer's layout has %d layers on this rank "
                             "in %d layer groups (want one group of the same layers; a draft model's KV pool "
                             "adds its layers)" % (nlayers, have, len(self.node.groups)))

    # SGLang calls ---------------------------------------------------------

    def try_ensure_parallel_info(self, bootstrap_addr):
        """decode.py's _ensure_prefill_info: routing is the config's (an
        unknown address fails its receiver), nothing to fetch."""
        return True

    def register_to_bootstrap(self):
        """Nothing: routing comes from the config (prefill_instances)."""
        return None

    def submit_prefill_recompute(self, kv_receiver, payload):
        """decode.py's pop_preallocated asks this for a request that
        pause_generation(mode="retract") retracted (is_rebootstrap), right
        after its send_metadata: SGLang's own managers POST it to the
        prefill's /generate, whose HTTP port their bootstrap server knows.
        kvxfer runs no bootstrap server, so the request fails alone
        (its receive is cancelled; poll() says Failed once that ended,
        failure_exception naming why), as SGLang's own managers fail one
        whose /generate they cannot send. Never raises into the loop."""
        payload = payload if isinstance(payload, dict) else {}
        reason = ("PD retract rebootstrap of request %s (bootstrap_room %s): it needs the prefill's /generate, "
                  "which kvxfer's SGLang backend cannot send (it runs no bootstrap server); the request fails: "
                  "pause generation without mode=\"retract\", or retract with a transfer backend of SGLang's own"
                  % (payload.get("rid"), payload.get("bootstrap_room", getattr(kv_receiver, "room", None))))
        logger.error("kvxfer: %s", reason)
        fail = getattr(kv_receiver, "_fail", None)
        try:
            if callable(fail):
                fail(reason)
            else:
                kv_receiver.abort()
        except Exception as exc:  # noqa: BLE001 - never into SGLang's loop
            logger.error("kvxfer: failing the rebootstrap of request %s: %s", payload.get("rid"), exc)
        return None

    def close(self, timeout_ms=5000):
        """Closes the node; what was live then ends Failed. True once the
        close finished (no write lands in SGLang's pool any more), False
        while it did not (under way on another thread, or timed out: a peer
        may still write into the pool, which kvxfer then keeps referenced
        for the rest of the process). The requests live at a close that did
        not finish stay Transferring: poll() never says Failed for them, so
        SGLang never frees their pages. Idempotent (a later call answers as
        the close ended, and does not close again); raises only for a close
        kvxfer refused (a negative timeout_ms), which leaves the node open."""
        with self._close_lock:
            if self.closed:
                return self._close_finished
            if self._closing:
                return False
            self._closing = True
        finished = False
        try:
            self.node.close(timeout_ms)
            finished = True
        except (ValueError, KvxferError) as exc:
            if isinstance(exc, ValueError) or exc.status == Status.INVALID_ARGUMENT:
                with self._close_lock:  # refused (the timeout): the node is open, as it was
                    self._closing = False
                raise
            logger.warning("kvxfer: closing node %s did not finish (%s): SGLang's KV pool is kept for the rest of "
                           "the process, the requests live stay Transferring", self.instance, exc)
        finally:
            with self._close_lock:
                if self._closing:  # (not refused)
                    self.closed, self._closing, self._close_finished = True, False, finished
                    self._close_done.set()
        return finished

    def deregister_buffer_to_engine(self):
        """SGLang's release_memory_occupation (prefill.py's
        PrefillBootstrapQueue, decode.py's DecodePreallocQueue: an RL
        weight update frees the KV pool, torch_memory_saver unmapping it
        while keeping its addresses) calls this once it cleared its queues.
        The node is closed: what is live ends (its requests poll Failed,
        naming the release), peers hear its goodbye, and once this returns
        no kvxfer transfer reads or writes the pool any more. (SGLang's
        scheduler pauses the pool just before, having asserted that no
        request is under way: nothing should be live here.)

        A close that does not finish (a peer may still write the pool:
        kvxfer keeps it referenced) is a RuntimeError naming the node:
        SGLang must not reuse that memory, and its scheduler stops on the
        error. Restart the process then. A second call returns at once."""
        try:
            finished = self.close()
        except Exception as exc:  # noqa: BLE001 - named in the error below
            finished, why = False, "kvxfer refused its close (%s)" % exc
        else:
            why = "its close ended unproven (a warning above names why)"
            with self._close_lock:
                under_way = self._closing
            if under_way:  # another thread's close: it answers for the pool
                finished = self._wait_close(time.monotonic() + CLEAR_WAIT_S)
                why = "another thread's close of it did not finish within %g s" % CLEAR_WAIT_S
        if not finished:
            raise RuntimeError("kvxfer: release_memory_occupation: node %s did not finish closing: %s, so a peer "
                               "may still write SGLang's KV pool, which kvxfer keeps referenced; that memory must "
                               "not be freed or reused: restart this SGLang process" % (self.instance, why))
        self._released = True

    def register_buffer_to_engine(self):
        """SGLang's resume_memory_occupation calls this once the KV pool is
        mapped again (at the same addresses): a new node is opened over it
        with the same configuration (a new incarnation of the rank: peers
        take the old one's goodbye and the new one's Hello). The requests
        made before it fail (poll() says Failed, naming the release); those
        made after it run on the new node. Nothing to do while the node is
        open. A RuntimeError names why no node could be opened (the last
        close did not finish: the pool is not kvxfer's to hand out again;
        or kvxfer refused the node)."""
        with self._close_lock:
            if self._closing or (self.closed and not self._close_finished):
                raise RuntimeError("kvxfer: resume_memory_occupation: node %s did not finish closing (%s): a peer "
                                   "may still write SGLang's KV pool, so no node is opened over it; restart this "
                                   "SGLang process" % (self.instance, "still under way" if self._closing else
                                                       "its close ended unproven"))
            if not self.closed:
                return
        with self._lock:
            try:
                self._open_node()
            except Exception as exc:
                raise RuntimeError("kvxfer: resume_memory_occupation: reopening node %s over SGLang's KV pool "
                                   "failed: %s" % (self.instance, exc)) from exc
            self._owners.clear()  # the old node's: their events never come
            self._epoch += 1
            with self._close_lock:
                self.closed, self._close_finished, self._released = False, True, False
                self._close_done.clear()

    def _close_begun(self):
        """A close under way, or one that returned."""
        with self._close_lock:
            return self._closing or self.closed

    def _close_unfinished(self):
        """A close under way, or one that did not finish: kvxfer may still
        read or write the pages of what was live, and their events no
        longer come."""
        with self._close_lock:
            return self._closing or (self.closed and not self._close_finished)

    def _close_ended_finished(self):
        """A close returned and finished: no transfer touches the pool."""
        with self._close_lock:
            return self.closed and self._close_finished

    def _wait_close(self, deadline):
        """Waits until no close is under way or the deadline
        (time.monotonic()): True when a close finished by then."""
        while True:
            with self._close_lock:
                if not self._closing:
                    return self.closed and self._close_finished
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._close_done.wait(min(left, 0.1))

    # Events ----------------------------------------------------------------

    def _track(self, req, owner, tag):
        with self._lock:
            self._owners[req.handle] = (owner, tag)

    def reap(self):
        """Hands every polled kvxfer event to its sender or receiver."""
        with self._lock:
            if self.closed or self._closing:  # (their events no longer come)
                return
            try:
                events = self.node.poll(0)
            except KvxferError as exc:  # closed under us: owners fail on their own
                logger.warning("kvxfer: polling node %s: %s", self.instance, exc)
                return
            for ev in events:
                owner, tag = self._owners.pop(ev.request, (None, None))
                if owner is None:
                    continue
                try:
                    owner._event(tag, ev)
                except Exception as exc:  # noqa: BLE001 - the rest of the batch is handed over already
                    logger.error("kvxfer: the event of request %s: %s", owner.id, exc)
                    owner._fail("kvxfer: the event of request %s: %s" % (owner.id, exc), decided=False)

    def aux_slot(self, index):
        """The aux slot index's bytes: each aux buffer's item, in order."""
        return b"".join(ctypes.string_at(ptr + index * n, n) for ptr, n in self.aux)

    def write_aux_slot(self, index, data):
        off = 0
        for ptr, n in self.aux:
            ctypes.memmove(ptr + index * n, data[off:off + n], n)
            off += n

    def route(self, bootstrap_addr):
        """(prefill instance, tp, pp, stages) for a request of
        bootstrap_addr, or a ValueError naming the address. stages is the
        prefill pipeline's split as the config says it ("stages" or
        "pp_stages" of its parallelism), else None; tp and pp are 0 when
        neither "prefill_parallel" nor the peers' "parallel" says them (the
        node then takes them from the prefill's ranks)."""
        name = self.prefill_instances.get(bootstrap_addr, self.prefill_instance)
        if not name:
            raise ValueError("bootstrap_addr %r names no prefill instance: the config's prefill_instances has %s "
                             "and no prefill_instance" % (bootstrap_addr, sorted(self.prefill_instances)))
        par = self.prefill_parallel.get(name, self.prefill_parallel) if isinstance(self.prefill_parallel, dict) else {}
        if not par or not isinstance(par.get("tp", None), int):
            par = {}
            for p in self._peers:
                if isinstance(p, dict) and p.get("instance") == name and p.get("parallel"):
                    par = p["parallel"]
                    break
        if not par:
            # Nothing says it (peers found through etcd, or listed without
            # "parallel"): 0, 0 lets the node take the instance's
            # parallelism, split included, from what its ranks said.
            return name, 0, 0, None
        stages = par.get("stages") or par.get("pp_stages") or None
        return name, int(par.get("tp", 1) or 1), int(par.get("pp", 1) or 1), stages


class _PrefillInfoTable:
    """SGLang's prefill_info_table as decode.py reads it: dp_size 1 for
    every address (kvxfer refuses attention DP)."""

    _info = type("PrefillInfo", (), {"dp_size": 1, "follow_bootstrap_room": True})()

    def get(self, addr, default=None):
        return self._info

    def __contains__(self, addr):
        return True


class _Transfer:
    """What a sender and a receiver share: the kvxfer requests of one
    SGLang request, their events, and the Failed rule (reported once every
    opened request's event came)."""

    # SGLang's utils.py reads it when SGLANG_DISAGG_STAGING_BUFFER is set
    # (KVManager refuses that): kvxfer writes the pool directly.
    require_staging = False

    def __init__(self, mgr, bootstrap_addr, bootstrap_room):
        self.mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.room = bootstrap_room
        self.reason = None  # why it failed, once decided
        self.decided = False  # the reason is this side's own (abort, a bad call), not a kvxfer event's
        self.live = {}      # tag -> kvxfer Request, until its event
        self.events = {}    # tag -> Event
        self.opened = False
        self.state = KVPoll.Bootstrapping
        self.epoch = mgr._epoch  # the node's incarnation it runs on
        try:
            self.id = room_id(bootstrap_room)
        except ValueError as exc:
            self.id = None
            self.reason, self.decided = str(exc), True

    def _open(self, tag, req):
        self.live[tag] = req
        self.mgr._track(req, self, tag)
        self.opened = True

    def _event(self, tag, ev):
        req = self.live.pop(tag, None)
        self.events[tag] = ev
        # The KV request's end says most: it replaces a reason this side
        # did not decide itself.
        if not ev.ok and (self.reason is None or (tag == "kv" and not self.decided)):
            msg = ""
            if req is not None:
                try:
                    msg = req.error_message()
                except KvxferError:
                    pass
            self.reason = "kvxfer request %s%s ended %s (%s)%s" % (
                self.id, "" if tag == "kv" else "/" + tag, ev.outcome.name,
                getattr(ev.error, "name", ev.error),  # a code of a newer library: its number
                ": " + msg if msg else "")
        self._done(tag, ev, req)
        if req is not None:
            try:
                req.release()
            except KvxferError:
                pass  # a close released it meanwhile
        if not ev.ok:
            self._fail(self.reason, decided=False)  # the request's other kvxfer requests end too

    def _done(self, tag, ev, req):
        pass

    def _fail(self, reason, decided=True):
        """Decides the failure (the first reason wins; decided: this side's
        own cause, not a kvxfer request's end) and cancels what is live:
        Failed is reported once their events came."""
        if self.reason is None:
            self.reason = reason
            self.decided = decided
        for req in list(self.live.values()):
            try:
                req.cancel()
            except KvxferError:
                pass  # it ended meanwhile: its event still comes

    def _stale(self):
        """Fails the request (True) when SGLang released the KV pool since
        it was made (release_memory_occupation): the node it ran on was
        closed, and that close finished (a release raises otherwise), so
        no write of its requests lands any more and their events never
        come. A new request runs on the node the resume opened."""
        mgr = self.mgr
        if self.epoch == mgr._epoch and not mgr._released:
            return False
        self.live.clear()
        if mgr._released:
            why = "SGLang's release_memory_occupation closed it, and no resume_memory_occupation reopened it yet"
        else:
            why = ("SGLang's release_memory_occupation closed it after this request was made (a new node runs "
                   "since resume_memory_occupation): retry the request")
        self._fail("kvxfer node %s was closed: %s" % (mgr.instance, why))
        return True

    def _poll(self):
        try:
            self.mgr.reap()
        except Exception as exc:  # noqa: BLE001 - never into SGLang's loop
            self._fail("kvxfer: polling failed: %s" % exc)
        if self._stale():
            return KVPoll.Failed
        mgr = self.mgr
        if self.live and mgr._close_unfinished():
            # A close under way, or one that did not finish (a peer may
            # still write the memory): kvxfer may still read or write the
            # pages, so never Failed (SGLang would free them).
            return KVPoll.Transferring
        if mgr._close_ended_finished() and (self.live or self.state == KVPoll.Transferring):
            # The close finished: no write touches the memory any more, and
            # the requests' events no longer come.
            self.live.clear()
            self._fail("kvxfer node %s was closed" % mgr.instance)
        if self.reason is not None:
            return KVPoll.Transferring if self.live else KVPoll.Failed
        if self.state == KVPoll.Bootstrapping:
            # kvxfer needs no handshake: a send and its receive may open in
            # either order. One poll says Bootstrapping, the next waits.
            self.state = KVPoll.WaitingForInput
            return KVPoll.Bootstrapping
        return None

    @property
    def conclude_state(self):
        """decode.py's _update_handshake_waiters re-polls a waiting queue
        only when a receiver's conclude_state is Failed (an abort)."""
        return KVPoll.Failed if self.reason is not None else None

    def failure_exception(self):
        """Raises RuntimeError naming the reason. SGLang calls it once the
        poll it acts on said Failed, before it frees the request's pages
        (prefill.py's inflight queue, decode.py's pop_transferred: then
        release_kv_cache). That poll is the MIN over every TP rank's
        (utils.py poll_and_all_reduce): another rank's Failed is this
        rank's too while this rank's kvxfer request may still be live (its
        own poll said Transferring). So a live request is ended first
        (_end_live): the pages are freed only once no transfer reads or
        writes them."""
        self._end_live("another rank's poll failed the request while this rank's kvxfer request was live")
        raise RuntimeError("kvxfer transfer of bootstrap_room %s failed: %s" % (self.room, self.reason or "no failure"))

    def abort(self):
        self._fail("aborted (abort() called)")

    def clear(self):
        """SGLang is done with the request and drops this object (after
        Success; after a Failed poll, right after freeing the pages). A
        request still live, which failure_exception() would have ended
        already, is ended here too (_end_live)."""
        self._end_live("cleared by SGLang while its kvxfer request was live (another rank's poll failed the "
                       "request)")
        return None

    def _end_live(self, reason):
        """Fails the request with reason (unless it failed already) when a
        kvxfer request of it is live, cancels it and returns once every
        event came, kvxfer's word that no transfer reads or writes the
        pages any more; a close of the node under way answers for them
        instead, once it finished. Should an event (or the close's end) not
        come within CLEAR_WAIT_S, or the close not finish, an error is
        logged: SGLang frees the pages all the same, and those stay live
        (poll() says Transferring)."""
        if not self.live or self._stale():
            return
        self._fail(reason)
        mgr = self.mgr
        deadline = time.monotonic() + CLEAR_WAIT_S
        if not mgr._close_begun():
            with mgr._lock:  # no other thread's reap takes these events meanwhile
                for tag, req in list(self.live.items()):
                    try:
                        ev = mgr.node.wait(req, max(deadline - time.monotonic(), 0.001))
                    except (TimeoutError, KvxferError) as exc:
                        if mgr._close_begun():
                            break  # the close answers for what is live (below)
                        logger.error("kvxfer: request %s ended by SGLang while live, and its cancelled %s did not "
                                     "end (%s): the pages SGLang frees may still be read or written", self.id,
                                     req.side, exc)
                        continue
                    mgr._owners.pop(req.handle, None)
                    self._event(tag, ev)
        if self.live and mgr._close_begun():
            if mgr._wait_close(deadline):
                self.live.clear()  # the close finished: their events no longer come, no write lands
            else:
                logger.error("kvxfer: request %s ended by SGLang while live, and node %s did not finish closing "
                             "(%s): the pages SGLang frees may still be read or written", self.id, mgr.instance,
                             "its close ended in an error" if mgr.closed else
                             "still under way after %g s" % CLEAR_WAIT_S if mgr._closing else "its close was refused")

    def get_transfer_metric(self):
        try:
            from sglang.srt.disaggregation.base.conn import KVTransferMetric
        except ImportError:
            return None
        total = sum(ev.bytes for ev in self.events.values())
        return KVTransferMetric(transfer_total_bytes=total or None)


class KVSender(_Transfer):
    """The prefill side of one request: KVSender(mgr, bootstrap_addr,
    bootstrap_room, dest_tp_ranks, pp_rank, ...) as SGLang's BaseKVSender.
    dest_tp_ranks is not used: kvxfer maps ranks itself."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks=None, pp_rank=0, *args, **kwargs):
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.num_pages = None
        self.aux_index = None
        self.sent = 0  # pages handed over
        self.fences = []  # CUDA events kept until the request ends

    def poll(self):
        st = self._poll()
        if st is not None:
            return st
        if self.state == KVPoll.Transferring and not self.live and self.sent == self.num_pages:
            self.state = KVPoll.Success
        return self.state

    def init(self, num_kv_indices, aux_index=None):
        try:
            n = int(num_kv_indices)
        except (TypeError, ValueError):
            self._fail("init: num_kv_indices = %r is no page count" % (num_kv_indices,))
            return
        if n <= 0:
            self._fail("init: num_kv_indices = %d, want at least one page" % n)
            return
        self.num_pages, self.aux_index = n, aux_index
        if self.state == KVPoll.Bootstrapping:
            self.state = KVPoll.WaitingForInput

    def pop_decode_prefix_len(self):
        return 0

    def should_send_kv_chunk(self, num_pages, last_chunk):
        return num_pages > 0

    def _written(self):
        """A CUDA event recorded on the KV device's current stream (the
        forward's kernels are queued there), or None for host memory."""
        if self.mgr.device is None:
            return None
        import torch

        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.mgr.device))
        self.fences.append(ev)
        return ev

    def _hand(self, req, start, end, runs, last, written):
        if written is None:
            req.chunk(start, end, runs, last=last).ready()
        else:
            req.chunk(start, end, runs, last=last, cuda_event=written, device=self.mgr.device)

    def send(self, kv_indices, state_indices=None, *args, **kwargs):
        """One prefill chunk: its page indices. Never raises: a chunk
        kvxfer refuses, or one past the pages init() announced, fails this
        request (poll() says Failed once no transfer reads its pages)."""
        try:
            self.mgr.reap()  # a failure already known stops the chunk
        except Exception as exc:  # noqa: BLE001 - never into SGLang's loop
            self._fail("kvxfer: polling failed: %s" % exc)
        if self._stale() or self.reason is not None:
            return
        try:
            pages = [int(p) for p in kv_indices]
        except (TypeError, ValueError) as exc:
            self._fail("send: kv_indices %r: %s" % (kv_indices, exc))
            return
        if self.num_pages is None:
            self._fail("send before init(num_kv_indices, aux_index)")
            return
        if state_indices and any(s is not None for s in state_indices):
            self._fail("send: state_indices given: hybrid state is not supported by kvxfer's backend")
            return
        start, end = self.sent, self.sent + len(pages)
        if end > self.num_pages:
            self._fail("send: %d pages after %d sent, init announced %d" % (len(pages), start, self.num_pages))
            return
        if not pages:
            return
        ps, last = self.mgr.page_size, end == self.num_pages
        try:
            written = self._written()
            if "kv" not in self.live and "kv" not in self.events:
                self._open("kv", self.mgr.node.send(self.id, self.num_pages * ps))
            if last:
                self._set_aux(self.live["kv"])  # before the last chunk, which carries it
            self._hand(self.live["kv"], start * ps, end * ps, [(start, pages)], last, written)
            self.sent = end
            self.state = KVPoll.Transferring
        except _REFUSED as exc:
            self._fail("send of pages [%d, %d): %s" % (start, end, exc))
        except KeyError:
            self._fail("send of pages [%d, %d): its kvxfer request already ended" % (start, end))

    def _set_aux(self, req):
        """The request's aux slot (every aux buffer's item at aux_index) as
        its payload, read now: SGLang wrote it (set_buf) before the last
        chunk's send(). Only the last pipeline stage's: it alone computes
        the logits, hence the output its aux slot holds, and the decode
        side takes the first writer's payload (the lowest rank index, a
        stage before the last)."""
        mgr = self.mgr
        if not mgr.aux_bytes or self.aux_index is None or mgr.pp_rank != mgr.pp_size - 1:
            return
        req.set_payload(mgr.aux_slot(int(self.aux_index)))


class KVReceiver(_Transfer):
    """The decode side of one request: KVReceiver(mgr, bootstrap_addr,
    bootstrap_room, ...) as SGLang's BaseKVReceiver; the destination pages
    come with init(kv_indices, aux_index) (older SGLang) or
    send_metadata(kv_indices, aux_index, state_indices, decode_prefix_len)
    after init(prefill_dp_rank) (newer)."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None, *args, **kwargs):
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.route = None
        self.aux_index = None
        self.aux_data = None  # the KV request's payload, once READY
        if self.reason is None:
            try:
                self.route = mgr.route(bootstrap_addr)
            except ValueError as exc:
                self.reason, self.decided = str(exc), True

    def poll(self):
        st = self._poll()
        if st is not None:
            return st
        if self.state == KVPoll.Transferring and not self.live and self.opened:
            if not self._finish():
                return KVPoll.Failed
            self.state = KVPoll.Success
        return self.state

    def init(self, kv_indices=None, aux_index=None, *args, **kwargs):
        """Newer SGLang: init(prefill_dp_rank), an int (the pages come with
        send_metadata). Older: init(kv_indices, aux_index)."""
        if kv_indices is None or isinstance(kv_indices, int):
            if kv_indices not in (None, 0):
                self._fail("init: prefill_dp_rank = %r: attention data parallelism is not supported" % (kv_indices,))
            return
        self.send_metadata(kv_indices, aux_index)

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None, **kwargs):
        if self._stale() or self.reason is not None or self.opened:
            if self.opened:
                self._fail("send_metadata called twice")
            return
        try:
            pages = [int(p) for p in kv_indices]
        except (TypeError, ValueError) as exc:
            self._fail("send_metadata: kv_indices %r: %s" % (kv_indices, exc))
            return
        if state_indices and any(s is not None for s in state_indices):
            self._fail("send_metadata: state_indices given: hybrid state is not supported by kvxfer's backend")
            return
        mgr, ps = self.mgr, self.mgr.page_size
        hit = int(decode_prefix_len or 0)
        if hit % ps:
            self._fail("send_metadata: decode_prefix_len = %d is not whole pages of %d" % (hit, ps))
            return
        total = hit // ps + len(pages)
        if total <= 0:
            self._fail("send_metadata: no pages")
            return
        context, tp, pp, stages = self.route
        if pp > 1 and stages is None:
            # SGLang's split of the prefill's layers is the prefill's to
            # say: the node takes the instance's parallelism, split
            # included, from what its ranks told it (their Hello).
            tp = pp = 0
        self.aux_index = aux_index
        try:
            req = mgr.node.receive(self.id, total * ps, context, blocks=[pages], prefix_hit_blocks=[hit // ps],
                                   context_tp=tp, context_pp=pp, context_pp_stages=stages)
            self._open("kv", req)
        except _REFUSED as exc:
            self._fail("receive from %s: %s" % (context, exc))
            return
        self.state = KVPoll.Transferring

    def _done(self, tag, ev, req):
        if tag == "kv" and ev.ok and req is not None:
            self.aux_data = req.payload()

    def _finish(self):
        """Copies the payload into the aux slot; False (with the reason)
        when it is not the bytes this side's aux buffers hold."""
        mgr = self.mgr
        if not mgr.aux_bytes:
            return True
        data = self.aux_data or b""
        if not data and mgr.pp_size > 1 and mgr.pp_rank != mgr.pp_size - 1:
            # A decode stage before the last of a pipelined decode: only
            # the prefill's last stage sends the aux slot, to the decode
            # ranks it writes to, as SGLang's own backends send it (decode
            # stage k pairs with prefill stage k). None came: this stage's
            # aux slot is left as it is.
            return True
        if len(data) != mgr.aux_bytes:
            self.reason = ("aux: the prefill sent %d bytes of metadata, this side's aux buffers hold %d per request "
                           "(another model, or a prefill that had no aux_index)" % (len(data), mgr.aux_bytes))
            return False
        if self.aux_index is None:
            self.reason = "aux: the prefill sent metadata, but no aux_index was given"
            return False
        mgr.write_aux_slot(int(self.aux_index), data)
        return True


class KVBootstrapServer:
    """SGLang's bootstrap server, KVBootstrapServer(host, port): kvxfer
    needs none (routing is in the config, peers are the node's), so it
    starts nothing and keeps the address."""

    def __init__(self, host=None, port=None, *args, **kwargs):
        self.host, self.port = host, port

    def run(self):
        return None

    def close(self):
        return None


class KVArgs:
    """KVArgs for an SGLang without its own class (SGLang's is used when
    it has one)."""


_CLASSES = {"kvargs": KVArgs, "manager": KVManager, "sender": KVSender, "receiver": KVReceiver,
            "bootstrap_server": KVBootstrapServer}


def install(backend="nixl", config=None):
    """Makes SGLang's get_kv_class return kvxfer's classes for the
    transfer backend named backend (a TransferBackend value: "nixl", the
    default and the one to use — with "mooncake" SGLang's model runner
    also starts Mooncake's own transfer engine), so that
    `--disaggregation-transfer-backend <backend>` runs kvxfer. config: the
    kvxfer config (else $KVXFER_SGLANG_CONFIG).

    It replaces sglang.srt.disaggregation.utils.get_kv_class, and the
    name in every SGLang module already imported that bound it (prefill.py
    and decode.py import it by name), with a wrapper that answers
    backend's classes and hands every other backend to SGLang's. Run it in
    every SGLang process (with multiprocessing's spawn, at the top level of
    the launching script, which each child imports again). An SGLang
    without get_kv_class, TransferBackend or KVClassType, or without the
    backend name, is a RuntimeError naming what is missing."""
    global _installed_config
    import importlib
    import sys

    try:
        utils = importlib.import_module("sglang.srt.disaggregation.utils")
    except ImportError as exc:
        raise RuntimeError("kvxfer.sglang.install: SGLang's sglang.srt.disaggregation.utils cannot be imported "
                           "(%s)" % exc) from None
    missing = [n for n in ("get_kv_class", "TransferBackend", "KVClassType") if not hasattr(utils, n)]
    if missing:
        raise RuntimeError("kvxfer.sglang.install: this SGLang's disaggregation/utils.py lacks %s, which install "
                           "patches" % ", ".join(missing))
    try:
        member = utils.TransferBackend(backend)
    except ValueError:
        raise RuntimeError("kvxfer.sglang.install: backend %r is not one of this SGLang's TransferBackend values "
                           "(%s)" % (backend, ", ".join(b.value for b in utils.TransferBackend))) from None
    if config is not None:
        _installed_config = config_object("kvxfer.sglang.install", config)
    original = getattr(utils.get_kv_class, "_kvxfer_original", utils.get_kv_class)

    def get_kv_class(transfer_backend, class_type):
        if transfer_backend != member:
            return original(transfer_backend, class_type)
        key = getattr(class_type, "value", class_type)
        if key == "kvargs":
            try:
                from sglang.srt.disaggregation.base.conn import KVArgs as SGLangKVArgs
                return SGLangKVArgs
            except ImportError:
                return KVArgs
        return _CLASSES.get(key)

    get_kv_class._kvxfer_original = original
    get_kv_class._kvxfer_backend = member
    replaced = (original, utils.get_kv_class)  # SGLang's, and a wrapper an earlier install() left
    for name, mod in list(sys.modules.items()):
        if (name == "sglang" or name.startswith("sglang.")) and mod is not None:
            if getattr(mod, "get_kv_class", None) in replaced:
                mod.get_kv_class = get_kv_class
    utils.get_kv_class = get_kv_class
    return get_kv_class
