"""Stand-ins of the TensorRT-LLM objects kvxfer.trtllm reads, and an
executor-like driver; TensorRT-LLM is not installed here (no package
registry), so each stand-in is built from TensorRT-LLM's source, at the
commits kvxfer/trtllm.py cites, and says which lines it mirrors.

  Mapping            tensorrt_llm/mapping.py (05ebebb): tp_rank = rank %
                     tp_size, pp_rank = rank // (tp_size * cp_size),
                     pp_layers(n) = torch.tensor_split(torch.arange(n),
                     pp_size)[pp_rank] (the first n % pp stages one layer
                     longer); pp_partition (newer mapping.py) splits by it.
  KVCacheManager     _torch/pyexecutor/resource_manager.py (001541b):
                     get_pp_layers (pp_layers, num_layers), layer_offsets,
                     num_kv_heads_per_layer = ceil(num_kv_heads / tp_size)
                     (tp_size 1 under attention DP), blocks_in_primary_pool,
                     blocks_in_secondary_pool (0: no host_cache_size),
                     kv_factor (1 for
                     CacheType SELFKONLY), max_attention_window_vec
                     ([max_seq_len] by default), the C++ primary pool
                     [blocks, local layers, kv_factor, tokens x heads x
                     head_dim] (get_unique_primary_pool; kv_extractor.py's
                     build_page_table reads a block as every layer's K then
                     V), impl.get_primary_pool_data(layer offset) its
                     [blocks, kv_factor, ...] slice, kv_cache_pool_pointers
                     [[pool base, 0]] per pool, get_buffers(layer,
                     kv_layout) the reshape of that slice ("NHD" [blocks, kv,
                     tokens, heads, dim], "HND" [blocks, kv, heads, tokens,
                     dim]), get_batch_cache_indices([py_request_id]) the
                     sequence's blocks, store_blocks_for_reuse, shutdown
                     (impl.release_pools).
  LlmRequest         the attributes KvCacheTransceiverV2 and the coordinator
                     read (request_id, py_request_id, prompt_len, state,
                     py_disaggregated_params, context_phase_params,
                     py_beam_width, prepopulated_prompt_len).
  DisaggregatedParams tensorrt_llm/disaggregated_params.py (01009a3).
  CacheTransceiverConfig llmapi/llm_args.py: backend,
                     kv_transfer_timeout_ms, kv_transfer_sender_future_
                     timeout_ms (1000 by default), kv_transfer_poll_
                     interval_ms.
  DataType, CacheType, AttentionType
                     the names of TensorRT-LLM's bindings enums.

gen_params(ctx_request) is what TensorRT-LLM's disaggregated server hands
the generation request from the context response, as its transceiver test
builds it for the Python runtime (ctx_request_id = the context's
context_phase_params.req_id, ctx_info_endpoint = its disagg_info_endpoint).
"""

import dataclasses
import enum
import tempfile
import threading
import time
import types

import numpy as np
import pytest
import torch

import kvxfer
from kvxfer.trtllm import KvxferCacheTransceiver, LlmRequestState

from conftest import unique

S = LlmRequestState

# The tiny model: 4 layers, 4 KV heads, head_dim 8, fp16, blocks of 4 tokens.
LAYERS, HEADS, DIM, TPB = 4, 4, 8, 4


class DataType(enum.Enum):
    HALF = 1
    BF16 = 2
    FP8 = 3
    FLOAT = 4
    NVFP4 = 5


class CacheType(enum.Enum):
    SELF = 0
    CROSS = 1
    SELFKONLY = 2


class AttentionType(enum.Enum):
    """tensorrt_llm.bindings.internal.batch_manager.AttentionType."""

    DEFAULT = 0
    MLA = 1


class DisaggScheduleStyle(enum.IntEnum):
    CONTEXT_FIRST = 0
    GENERATION_FIRST = 1


@dataclasses.dataclass
class DisaggregatedParams:
    request_type: str = None
    first_gen_tokens: list = None
    ctx_request_id: int = None
    opaque_state: bytes = None
    draft_tokens: list = None
    disagg_request_id: int = None
    ctx_dp_rank: int = None
    ctx_info_endpoint: str = None
    schedule_style: DisaggScheduleStyle = None


@dataclasses.dataclass
class CacheTransceiverConfig:
    backend: str = "UCX"
    transceiver_runtime: str = None
    kv_transfer_timeout_ms: int = None
    kv_transfer_sender_future_timeout_ms: int = 200
    kv_transfer_poll_interval_ms: int = 200


class Mapping:
    def __init__(self, tp_size=1, pp_size=1, rank=0, cp_size=1, enable_attention_dp=False, pp_partition=None):
        self.tp_size, self.pp_size, self.cp_size, self.rank = tp_size, pp_size, cp_size, rank
        self.world_size = tp_size * pp_size * cp_size
        self.enable_attention_dp = enable_attention_dp
        self.pp_partition = pp_partition

    @property
    def tp_rank(self):
        return self.rank % self.tp_size

    @property
    def pp_rank(self):
        return self.rank // (self.tp_size * self.cp_size)

    def pp_layers(self, num_layers):
        if self.pp_partition is not None:
            return torch.arange(num_layers).split(self.pp_partition)[self.pp_rank].tolist()
        return torch.tensor_split(torch.arange(num_layers), self.pp_size)[self.pp_rank].tolist()


class _Impl:
    """KVCacheManagerCpp's calls the manager and kvxfer make."""

    def __init__(self, pool):
        self.pool = pool
        self.released = False

    def get_primary_pool_data(self, layer_offset):
        return self.pool[:, layer_offset]

    def get_unique_primary_pool(self):
        return self.pool

    def release_pools(self):
        self.released = True


class KVCacheManager:
    def __init__(self, mapping, num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM, tokens_per_block=TPB,
                 num_blocks=32, dtype=DataType.HALF, kv_cache_type=CacheType.SELF, max_seq_len=4096,
                 enable_block_reuse=False, layer_mask=None):
        self.mapping, self.dtype, self.kv_cache_type = mapping, dtype, kv_cache_type
        # get_pp_layers
        total = num_layers if layer_mask is None else len(layer_mask)
        pp_layers = mapping.pp_layers(total)
        if layer_mask is not None:
            pp_layers = [i for i in pp_layers if layer_mask[i]]
        self.pp_layers, self.num_layers = pp_layers, total
        self.num_local_layers = len(self.pp_layers)
        self.layer_offsets = {idx: off for off, idx in enumerate(self.pp_layers)}
        tp = 1 if mapping.enable_attention_dp else mapping.tp_size
        self.num_kv_heads = num_kv_heads
        self.num_kv_heads_per_layer = [(num_kv_heads + tp - 1) // tp] * self.num_local_layers
        self.total_num_kv_heads_per_layer = [(num_kv_heads + tp - 1) // tp] * self.num_layers
        self.head_dim, self.tokens_per_block, self.max_seq_len = head_dim, tokens_per_block, max_seq_len
        self.kv_factor = 1 if kv_cache_type == CacheType.SELFKONLY else 2
        self.max_attention_window_vec = [max_seq_len]
        self.is_vswa = False
        self.enable_block_reuse = enable_block_reuse
        self.blocks_in_primary_pool = num_blocks
        self.blocks_in_secondary_pool = 0  # host_cache_size unset
        heads = self.num_kv_heads_per_layer[0]
        elem = {DataType.HALF: torch.float16, DataType.BF16: torch.bfloat16, DataType.FLOAT: torch.float32,
                DataType.FP8: torch.uint8, DataType.NVFP4: torch.uint8}[dtype]
        pool = torch.zeros(num_blocks, self.num_local_layers, self.kv_factor, tokens_per_block * heads * head_dim,
                           dtype=elem)
        self.impl = _Impl(pool)
        self.num_pools = 1
        self.kv_cache_pool_pointers = torch.tensor([[pool.data_ptr(), 0]], dtype=torch.int64)
        self.kv_cache_pool_mapping = torch.tensor([[0, i] for i in range(self.num_local_layers)], dtype=torch.int32)
        self._tables = {}
        self.stored = []

    # The test's own: a sequence's blocks, as add_sequence allocates them.
    def add_sequence(self, request_id, block_ids):
        self._tables[request_id] = list(block_ids)

    def get_batch_cache_indices(self, request_ids, layer_idx=None):
        return [list(self._tables[r]) for r in request_ids]

    def get_unique_primary_pool(self):
        return self.impl.get_unique_primary_pool()

    def get_buffers(self, layer_idx, kv_layout="NHD"):
        off = self.layer_offsets[layer_idx]
        r = self.impl.get_primary_pool_data(off)
        h = self.num_kv_heads_per_layer[off]
        if kv_layout == "NHD":
            return r.reshape(r.shape[0], self.kv_factor, self.tokens_per_block, h, self.head_dim)
        return r.reshape(r.shape[0], self.kv_factor, h, self.tokens_per_block, self.head_dim)

    def store_blocks_for_reuse(self, request, pin_blocks=False):
        self.stored.append((request.py_request_id, pin_blocks))

    def shutdown(self):
        self.impl.release_pools()

    # Bytes, for the tests.
    def bytes_view(self, kv_layout="HND"):
        """The pool as uint8 [blocks, local layers, kv, heads, tokens,
        head_dim bytes] (HND; an NHD pool is transposed to it)."""
        p = self.impl.pool
        h, es = self.num_kv_heads_per_layer[0], p.element_size()
        u = p.view(torch.uint8).numpy()
        if kv_layout == "HND":
            return u.reshape(p.shape[0], p.shape[1], self.kv_factor, h, self.tokens_per_block, self.head_dim * es)
        u = u.reshape(p.shape[0], p.shape[1], self.kv_factor, self.tokens_per_block, h, self.head_dim * es)
        return u.transpose(0, 1, 2, 4, 3, 5)

    def fill(self, blocks, seed):
        rng = np.random.default_rng(seed)
        u = self.impl.pool.view(torch.uint8)
        for b in blocks:
            u[b] = torch.from_numpy(rng.integers(0, 256, tuple(u[b].shape), dtype=np.uint8))


class LlmRequest:
    def __init__(self, request_id, prompt_len, params=None, beam_width=1):
        self.request_id = self.py_request_id = request_id
        self.prompt_len = prompt_len
        self.py_disaggregated_params = params
        self.context_phase_params = None
        self.state = S.CONTEXT_INIT
        self.py_beam_width = beam_width
        self.prepopulated_prompt_len = 0


def gen_params(ctx_req, **kw):
    cpp = ctx_req.context_phase_params
    return DisaggregatedParams(request_type="generation_only", ctx_request_id=cpp.req_id, ctx_dp_rank=cpp.ctx_dp_rank,
                               ctx_info_endpoint=cpp.disagg_info_endpoint, **kw)


class Group:
    """A Distributed's allgather over threads, one per rank (what
    MPIDist.allgather does over processes): every rank's object, in rank
    order, once every rank called it. A rank that never comes breaks the
    barrier after 60 s (BrokenBarrierError): no hang."""

    def __init__(self, n):
        self.n = n
        self.barrier = threading.Barrier(n, timeout=60)
        self.slots = [None] * n

    def dist(self, rank):
        group = self

        class _Dist:
            world_size = group.n

            def allgather(self, obj):
                group.barrier.wait()
                group.slots[rank] = obj
                group.barrier.wait()
                out = list(group.slots)
                group.barrier.wait()
                return out

        d = _Dist()
        d.rank = rank
        return d


def instance_configs(tmp, name, parallel, peer_name, peer_parallel, secret, peer_pub, peer_stages=None, **kw):
    """A kvxfer config per rank of instance `name` (TP-fastest ranks): a
    node bound at ipc://<tmp>/<name>-<rank>.sock, every rank of the peer
    instance a static peer (peer_stages: its pipeline split, "1,3")."""
    tp, pp = parallel
    ptp, ppp = peer_parallel
    ppar = {"tp": ptp, "pp": ppp}
    if peer_stages:
        ppar["stages"] = peer_stages
    peers = [{"instance": peer_name, "parallel": ppar, "rank": {"tp": r % ptp, "pp": r // ptp},
              "endpoint": "ipc://%s/%s-%d.sock" % (tmp, peer_name, r), "public_key": peer_pub}
             for r in range(ptp * ppp)]
    out = []
    for r in range(tp * pp):
        cfg = {"instance": name, "backend": "ucx", "workers": 2, "bind": "ipc://%s/%s-%d.sock" % (tmp, name, r),
               "secret_key": secret, "peers": peers, "transfer_timeout": "20s", "heartbeat_interval": "200ms",
               "heartbeat_misses": 8}
        cfg.update(kw)
        out.append({k: v for k, v in cfg.items() if v is not None})  # None: the key left out
    return out


def make_instance(tmp, name, parallel, peer_name, peer_parallel, keys, peer_pub, mgr_kw=None, ctc=None,
                  partition=None, peer_partition=None, **kw):
    """(transceivers, managers) of every rank of an instance (partition:
    its Mapping's pp_partition; peer_partition: the peer instance's)."""
    tp, pp = parallel
    group = Group(tp * pp) if tp * pp > 1 else None
    cfgs = instance_configs(tmp, name, parallel, peer_name, peer_parallel, keys[1], peer_pub,
                            peer_stages=",".join(map(str, peer_partition)) if peer_partition else None, **kw)
    xs, ms = [], []
    try:
        for r, cfg in enumerate(cfgs):
            mapping = Mapping(tp, pp, rank=r, pp_partition=partition)
            mgr = KVCacheManager(mapping, **(mgr_kw or {}))
            dist = group.dist(r) if group else None
            xs.append(KvxferCacheTransceiver(mapping, dist, mgr, None, ctc or CacheTransceiverConfig(), config=cfg))
            ms.append(mgr)
    except BaseException:
        for x in xs:
            x.shutdown()
        raise
    return xs, ms


def on_ranks(fns, timeout=90):
    """Runs fns (one per rank) in threads, returns their results; an
    exception in one is raised here."""
    out, errs = [None] * len(fns), []

    def run(i):
        try:
            out[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errs.append(exc)

    if len(fns) == 1:
        return [fns[0]()]
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a rank did not return within %d s" % timeout
    if errs:
        raise errs[0]
    return out


def reap_ctx(x, ids, timeout=60):
    """The executor's reap_context_sends loop for requests ids: calls
    check_context_transfer_status(1) (it waits for a send to settle) until
    each id was reported; {id: "done" | "error"}. Every rank of an
    instance ends in the same call (the reports agree)."""
    seen = {}
    deadline = time.monotonic() + timeout
    while set(ids) - set(seen):
        st = x.check_context_transfer_status(1)
        for i in st.completed_request_ids:
            seen[i] = "done"
        for i in st.error_request_ids:
            seen[i] = "error"
        assert time.monotonic() < deadline, "sends %s not reported in %d s: %s" % (ids, timeout, x.get_status_dump())
    return seen


def reap_gen(x, ids, timeout=60):
    """reap_gen_receives' loop: check_gen_transfer_status(1) until each id
    was reported; {id: "done" | "error"}."""
    seen = {}
    deadline = time.monotonic() + timeout
    while set(ids) - set(seen):
        st = x.check_gen_transfer_status(1)
        assert st.cancelled_requests == []
        for i in st.completed_request_ids:
            seen[i] = "done"
        for i in st.error_request_ids:
            seen[i] = "error"
        assert time.monotonic() < deadline, "receives %s not reported in %d s: %s" % (ids, timeout,
                                                                                    x.get_status_dump())
    return seen


@pytest.fixture
def cluster():
    """make(ctx_parallel, gen_parallel, ...) -> (ctx transceivers, ctx
    managers, gen transceivers, gen managers), every node connected;
    closed after the test, the handle table back where it was."""
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        made = []
        before = kvxfer.handle_count()

        def make(cpar, gpar, ctx_mgr=None, gen_mgr=None, ctx_kw=None, gen_kw=None, start_ctx=True, ctc=None,
                 ctx_partition=None, gen_partition=None):
            ck, gk = keypair(), keypair()
            cname, gname = unique("trt-ctx"), unique("trt-gen")
            cx, cm = ([], [])
            if start_ctx:
                cx, cm = make_instance(tmp, cname, cpar, gname, gpar, ck, gk[0], ctx_mgr, ctc, ctx_partition,
                                       gen_partition, **(ctx_kw or {}))
                made.extend(cx)
            gx, gm = make_instance(tmp, gname, gpar, cname, cpar, gk, ck[0], gen_mgr, ctc, gen_partition,
                                   ctx_partition, **(gen_kw or {}))
            made.extend(gx)
            if start_ctx:
                for x in cx + gx:
                    x.node.wait_peers(20000)
            return cx, cm, gx, gm

        yield make
        for x in made:
            x.shutdown()
        assert kvxfer.handle_count() == before


def send(cx, cm, rid, prompt, seed, replicated=False):
    """Each context rank's request rid over its own blocks, filled with
    random bytes (replicated: the same bytes on every TP rank, as MLA's
    latent is), then respond_and_send_async; the rank's requests and blocks."""
    reqs, blocks = [], []
    n = -(-prompt // TPB)
    for r, (x, m) in enumerate(zip(cx, cm)):
        ids = [5 + 7 * i + r for i in range(n)]
        m.add_sequence(rid, ids)
        m.fill(ids, seed=seed if replicated else seed + r)
        req = LlmRequest(rid, prompt, DisaggregatedParams(request_type="context_only"))
        x.respond_and_send_async(req)
        assert req.state == S.DISAGG_CONTEXT_TRANS_IN_PROGRESS
        reqs.append(req)
        blocks.append(ids)
    return reqs, blocks


def receive(gx, gm, rid, prompt, ctx_req, dst=None):
    reqs, blocks = [], []
    n = -(-prompt // TPB)
    for r, (x, m) in enumerate(zip(gx, gm)):
        ids = dst[r] if dst else [30 - 3 * i - r for i in range(n)]
        m.add_sequence(rid, ids)
        req = LlmRequest(rid, prompt, gen_params(ctx_req))
        x.request_and_receive_async(req)
        assert req.state == S.DISAGG_GENERATION_TRANS_IN_PROGRESS, (req.state, x.failures)
        reqs.append(req)
        blocks.append(ids)
    return reqs, blocks


def keypair():
    return kvxfer.keygen()


def ns(**kw):
    return types.SimpleNamespace(**kw)
