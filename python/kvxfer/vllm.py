"""kvxfer as a vLLM KV connector, loaded through vLLM's own configuration:

    --kv-transfer-config '{"kv_connector": "KvxferConnector",
                           "kv_connector_module_path": "kvxfer.vllm",
                           "kv_role": "kv_producer",
                           "kv_connector_extra_config": {"model": "Llama-3.1-8B"}}'

This module imports vLLM (the rest of the package does not): import it only
where vLLM is installed. It follows KVConnectorBase_V1 and
KVConnectorFactory as vLLM's GitHub repository has them
(vllm/distributed/kv_transfer/kv_connector/v1/base.py at commit 003df29,
kv_connector/factory.py at a4cd9d0): the factory constructs the class twice, with role
SCHEDULER in the scheduler process and role WORKER in each worker, as
cls(vllm_config, role, kv_cache_config) (older releases: cls(vllm_config,
role)). KvxferConnector builds kvxfer.connector's scheduler half or worker
half by role and hands every call to it, as NixlConnector does; the halves
carry vLLM's semantics (kvxfer.connector's docstrings). A call meant for the
other role's half is a RuntimeError naming the call and the role.

Configuration (read once, at construction; a missing or wrong key is a
ValueError naming it, in both roles, so vLLM fails at startup):

  kv_role             kv_producer: the context (prefill) side; kv_consumer:
                      the generation (decode) side; kv_both: both, each
                      request's kv_transfer_params saying which
                      (do_remote_decode / do_remote_prefill, as NIXL's)
  engine_id           the kvxfer instance name (request_finished's
                      params name it as remote_instance); the extra
                      config's "instance" overrides it
  cache_config.block_size
                      tokens per block (the extra config may repeat it as
                      "tokens_per_block" or layout.tokens_per_block, not
                      contradict it)
  parallel_config     tp and pp; the worker's ranks from vLLM's parallel
                      state (the extra config may not set them)
  kv_connector_extra_config
                      the rest of the worker's engine config
                      (kvxfer_engine_open's keys: "model" (a preset) or
                      "layout", "workers", "transfer_timeout_ms",
                      "drain_grace_ms", "backend", "metrics_addr") and the
                      worker connector's own ("layer_parts", "num_layers",
                      "generation_tp", "generation_pp"). "pool_bytes" and
                      "memory" come from vLLM's KV cache, not from here.

With none of a node's keys the worker opens an in-process engine
(kvxfer_engine_open) over vLLM's KV cache: engines reach each other by
instance name within one process only. With a node's keys
(kvxfer.connector.NODE_KEYS: "bind", "peers" or "discovery" and "cluster",
"secret_key" or "key_file" or "insecure", "heartbeat_interval", ...) it opens
a node (kvxfer_node_open) over vLLM's KV cache, which reaches the other
instance's processes (another `vllm serve`, another host); a kv_producer's
node is send_only. Every worker gets the same config: "bind" names the rank
({tp}, {pp}, {rank} = pp * tp_size + tp, e.g.
"ipc:///run/kvxfer/prefill-{rank}.sock") so that each binds its own endpoint. A KV cache on a GPU goes to the node as GPU memory
(kvxfer_node_open's pool_device, the tensor's device), which needs a data
plane that reaches it: backend "ucx" with a UCX built with CUDA, or
"cudaipc" between processes of one host; the library refuses others at
register time, naming the backend or the memory types UCX registers. What
still does not work, named at startup: a receiving rank (kv_consumer,
kv_both) on backend "shm" (peers must write into vLLM's own memory, which
only ucx registers: a ValueError naming the backend), and a KV cache on a
GPU without a node's keys (the in-process engine copies with the CPU: a
ValueError at register time saying to use a node). "parallel", "rank",
"pool_bytes", "pool_address", "pool_device" and "memory" come from vLLM,
never from the extra config.

Not declared: SupportsHMA. kvxfer's worker registers one cross-layer tensor,
one block table for every layer: one KV cache group. vLLM turns its hybrid
KV cache manager off for such a connector (or asks for
--disable-hybrid-kv-cache-manager).
"""

import inspect

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole

from .connector import NODE_KEYS, KvxferConnectorMetadata, KvxferSchedulerConnector, KvxferWorkerConnector, node_config

__all__ = ["KvxferConnector", "worker_config"]

ROLES = {"kv_producer": "producer", "kv_consumer": "consumer", "kv_both": "both"}

# kvxfer_engine_open's keys (include/kvxfer.h) the extra config may give.
ENGINE_KEYS = {"instance", "model", "layout", "tokens_per_block", "workers", "transfer_timeout_ms",
               "drain_grace_ms", "backend", "metrics_addr"}
# KvxferWorkerConnector's own keys.
WORKER_KEYS = {"layer_parts", "num_layers", "generation_tp", "generation_pp"}
# Set from vLLM's config or its KV cache, never from the extra config.
FROM_VLLM = {"tp": "parallel_config.tensor_parallel_size", "pp": "parallel_config.pipeline_parallel_size",
             "rank_tp": "the worker's tensor-parallel rank", "rank_pp": "the worker's pipeline-parallel rank",
             "pool_bytes": "the size of vLLM's KV cache", "memory": "vLLM's KV cache tensor",
             "pp_stages": "vLLM's split of the model's layers over its pipeline stages (get_pp_indices)"}
# kvxfer_node_open's keys that come from vLLM, never from the extra config.
FROM_VLLM.update({"parallel": "parallel_config (tensor and pipeline parallel sizes)",
                  "rank": "the worker's tensor- and pipeline-parallel ranks",
                  "pool_address": "vLLM's KV cache tensor",
                  "pool_device": "the device of vLLM's KV cache tensor"})


def _int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError("%s = %r: want an integer >= %d" % (name, value, minimum))


def worker_config(kv_transfer_config, block_size, tp=1, pp=1):
    """(instance, scheduler role, the worker connector's config) from vLLM's
    KVTransferConfig, cache_config.block_size and parallel sizes; ValueError
    naming the key that is missing or wrong. The config lacks the worker's
    ranks (rank_tp, rank_pp), which only a worker knows."""
    kv_role = getattr(kv_transfer_config, "kv_role", None)
    if kv_role not in ROLES:
        raise ValueError("kv_transfer_config.kv_role = %r: want one of %s (kv_producer: prefill instance, "
                         "kv_consumer: decode instance)" % (kv_role, ", ".join(sorted(ROLES))))
    extra = getattr(kv_transfer_config, "kv_connector_extra_config", None)
    extra = {} if extra is None else extra
    if not isinstance(extra, dict):
        raise ValueError("kv_transfer_config.kv_connector_extra_config = %r: want a JSON object" % (extra,))
    for key in extra:
        if key in FROM_VLLM:
            raise ValueError("kv_connector_extra_config[%r]: set from %s, not from the extra config"
                             % (key, FROM_VLLM[key]))
        if key not in ENGINE_KEYS and key not in WORKER_KEYS and key not in NODE_KEYS:
            raise ValueError("kv_connector_extra_config[%r]: unknown key (want %s)"
                             % (key, ", ".join(sorted(ENGINE_KEYS | WORKER_KEYS | NODE_KEYS))))
    _int("cache_config.block_size", block_size, 1)
    instance = extra.get("instance", getattr(kv_transfer_config, "engine_id", None))
    if not isinstance(instance, str) or not instance:
        raise ValueError("kv_connector_extra_config['instance'] = %r and kv_transfer_config.engine_id: want the "
                         "instance's name, a non-empty string" % (instance,))
    if "model" not in extra and "layout" not in extra:
        raise ValueError("kv_connector_extra_config: neither 'model' (a kvxfer layout preset) nor 'layout' "
                         "({layers, kv_heads, head_dim, dtype_bytes, mla, groups}) is set")
    layout = extra.get("layout")
    if "layout" in extra and not isinstance(layout, dict):
        raise ValueError("kv_connector_extra_config['layout'] = %r: want a JSON object" % (layout,))
    for key, value in (("tokens_per_block", extra.get("tokens_per_block")),
                       ("layout.tokens_per_block", (layout or {}).get("tokens_per_block"))):
        if value is not None and value != block_size:
            raise ValueError("kv_connector_extra_config[%r] = %r: vLLM's block_size is %d (leave it out)"
                             % (key, value, block_size))
    for key in ("workers", "transfer_timeout_ms", "drain_grace_ms", "num_layers"):
        if key in extra:
            _int("kv_connector_extra_config[%r]" % key, extra[key], 1 if key in ("workers", "num_layers") else 0)
    for key in ("generation_tp", "generation_pp"):
        if key in extra:
            _int("kv_connector_extra_config[%r]" % key, extra[key], 1)
    if ("generation_tp" in extra) != ("generation_pp" in extra):
        raise ValueError("kv_connector_extra_config: 'generation_tp' and 'generation_pp' go together (the decode "
                         "instances' parallelism), one is missing")
    if "layer_parts" in extra and not isinstance(extra["layer_parts"], bool):
        raise ValueError("kv_connector_extra_config['layer_parts'] = %r: want true or false" % (extra["layer_parts"],))
    cfg = dict(extra, instance=instance, tokens_per_block=block_size, tp=tp, pp=pp)
    if any(k in extra for k in NODE_KEYS):
        node_config(cfg, ROLES[kv_role])  # a receiving rank on shm: named now, in both roles
    return instance, ROLES[kv_role], cfg


def pp_stages(vllm_config, pp):
    """vLLM's split of the model's layers over its pp pipeline stages as
    kvxfer's pp_stages (each stage's layer count, "7,8,8,7"), or None when
    it is kvxfer's default split too (pp 1, or an even count): vLLM's
    get_pp_indices, which follows VLLM_PP_LAYER_PARTITION and else puts the
    extra layers of an uneven count on the stages before the last (kvxfer's
    default puts them on the first stages, as TensorRT-LLM does)."""
    if pp <= 1:
        return None
    mc = vllm_config.model_config
    if hasattr(mc, "get_total_num_hidden_layers"):
        layers = mc.get_total_num_hidden_layers()
    else:
        layers = mc.hf_text_config.num_hidden_layers
    try:
        from vllm.distributed.utils import get_pp_indices
    except ImportError:  # vLLM's default split, as get_pp_indices computes it
        def get_pp_indices(n, rank, size):
            counts = [n // size] * size
            for i in range(2, n % size + 2):
                counts[-i] += 1
            return sum(counts[:rank]), sum(counts[:rank + 1])
    counts = [hi - lo for lo, hi in (get_pp_indices(layers, r, pp) for r in range(pp))]
    default = [layers // pp + (1 if r < layers % pp else 0) for r in range(pp)]
    return None if counts == default else ",".join(str(c) for c in counts)


def _ranks():
    """This worker's (tensor-parallel, pipeline-parallel) ranks, from vLLM's
    parallel state (initialized before vLLM builds a worker's connector)."""
    from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank(), get_pp_group().rank_in_group


class KvxferConnector(KVConnectorBase_V1):
    """vLLM's KV connector over kvxfer: the scheduler half
    (KvxferSchedulerConnector) in the scheduler process, the worker half
    (KvxferWorkerConnector) in each worker. Module docstring: configuration."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        if _BASE_TAKES_KV_CACHE_CONFIG:
            super().__init__(vllm_config, role, kv_cache_config)
        else:  # releases before kv_cache_config
            super().__init__(vllm_config, role)
        ktc = vllm_config.kv_transfer_config
        parallel = vllm_config.parallel_config
        instance, side, cfg = worker_config(ktc, vllm_config.cache_config.block_size,
                                            parallel.tensor_parallel_size, parallel.pipeline_parallel_size)
        self.instance, self.side = instance, side
        self.connector_scheduler = None
        self.connector_worker = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = KvxferSchedulerConnector(instance, side, cfg["tokens_per_block"])
        elif role == KVConnectorRole.WORKER:
            cfg["rank_tp"], cfg["rank_pp"] = _ranks()
            stages = pp_stages(vllm_config, parallel.pipeline_parallel_size)
            if stages is not None:
                cfg["pp_stages"] = stages
            self.connector_worker = KvxferWorkerConnector(cfg, side)
        else:
            raise ValueError("role %r: want KVConnectorRole.SCHEDULER or KVConnectorRole.WORKER" % (role,))

    def _scheduler(self, call):
        if self.connector_scheduler is None:
            raise RuntimeError("KvxferConnector.%s is a scheduler-side call; this connector has role %s"
                               % (call, getattr(self._role, "name", self._role)))
        return self.connector_scheduler

    def _worker(self, call):
        if self.connector_worker is None:
            raise RuntimeError("KvxferConnector.%s is a worker-side call; this connector has role %s"
                               % (call, getattr(self._role, "name", self._role)))
        return self.connector_worker

    # Class-level answers to vLLM ------------------------------------------

    @property
    def prefer_cross_layer_blocks(self):
        """kvxfer's block holds every layer (kvxfer.connector's Memory)."""
        return True

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """HND within a layer (kvxfer.connector's Memory); MLA has no heads
        to order."""
        model = getattr(vllm_config, "model_config", None)
        return None if model is not None and getattr(model, "use_mla", False) else "HND"

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        """With "layer_parts" save_kv_layer hands each layer's part as the
        forward pass writes it: no whole-graph capture."""
        return bool((extra_config or {}).get("layer_parts", False))

    # Scheduler side ---------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._scheduler("get_num_new_matched_tokens").get_num_new_matched_tokens(request,
                                                                                       num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        return self._scheduler("update_state_after_alloc").update_state_after_alloc(request, blocks,
                                                                                   num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self._scheduler("build_connector_meta").build_connector_meta(scheduler_output)

    def request_finished(self, request, block_ids):
        return self._scheduler("request_finished").request_finished(request, block_ids)

    def update_connector_output(self, connector_output):
        return self._scheduler("update_connector_output").update_connector_output(connector_output)

    def has_pending_push_work(self):
        # vLLM's Scheduler.has_requests asks the scheduler side.
        return self._scheduler("has_pending_push_work").has_pending_push_work()

    # Worker side ------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        self._worker("bind_connector_metadata").bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        self._worker("clear_connector_metadata").clear_connector_metadata()

    def register_kv_caches(self, kv_caches):
        return self._worker("register_kv_caches").register_kv_caches(kv_caches)

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend=None):
        return self._worker("register_cross_layers_kv_cache").register_cross_layers_kv_cache(kv_cache, attn_backend)

    def handle_preemptions(self, kv_connector_metadata):
        """Older vLLM passes the preempted request ids, newer the step's
        metadata (whose preempted_req_ids the scheduler half filled)."""
        ids = kv_connector_metadata
        if isinstance(ids, KvxferConnectorMetadata):
            ids = ids.preempted_req_ids
        return self._worker("handle_preemptions").handle_preemptions(ids)

    def start_load_kv(self, forward_context, **kwargs):
        return self._worker("start_load_kv").start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name):
        return self._worker("wait_for_layer_load").wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return self._worker("save_kv_layer").save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self):
        return self._worker("wait_for_save").wait_for_save()

    def get_finished(self, finished_req_ids):
        return self._worker("get_finished").get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self):
        return self._worker("get_block_ids_with_load_errors").get_block_ids_with_load_errors()

    def shutdown(self):
        """Both roles: vLLM shuts the scheduler's connector down too (its
        half holds nothing to close)."""
        if self.connector_worker is not None:
            self.connector_worker.shutdown()


_BASE_TAKES_KV_CACHE_CONFIG = "kv_cache_config" in inspect.signature(KVConnectorBase_V1.__init__).parameters
