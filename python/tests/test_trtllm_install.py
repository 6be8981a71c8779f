"""kvxfer.trtllm.install() and the TensorRT-LLM types the transceiver
takes, against a stand-in of TensorRT-LLM's modules (it is not installed
here): tensorrt_llm/_torch/disaggregation/kv_cache_transceiver.py as
commit 0b42cea has it (the KvCacheTransceiver ABC with its abstract
methods, CtxTransferStatus, GenTransferStatus, create_kv_cache_transceiver
(mapping, dist, kv_cache_manager, attention_type, cache_transceiver_config,
mamba_cache_manager=None)), the older tensorrt_llm/_torch/pyexecutor/
kv_cache_transceiver.py path re-exporting them, a module that bound
create_kv_cache_transceiver by name (as the executor's creator imports
it), and tensorrt_llm.bindings' LlmRequestState and
executor.ContextPhaseParams. The ABC also has the newer trees'
requires_physical_drain_before_request_release (False by default) and
shutdown() -> Optional[bool]."""

import abc
import enum
import sys
import tempfile
import types
import typing

import pytest

from kvxfer import trtllm as kt

from conftest import unique
from trtllm_helpers import CacheTransceiverConfig, DisaggregatedParams, KVCacheManager, LlmRequest, Mapping, keypair

NEW = "tensorrt_llm._torch.disaggregation.kv_cache_transceiver"
OLD = "tensorrt_llm._torch.pyexecutor.kv_cache_transceiver"
CREATOR = "tensorrt_llm._torch.pyexecutor.py_executor_creator"


class KvCacheTransceiver(abc.ABC):
    """The ABC's abstract methods (0b42cea)."""

    kv_transfer_timeout_ms: typing.Optional[int]

    @property
    def pipeline_transfer_enabled(self):
        return False

    @property
    def requires_physical_drain_before_request_release(self):
        """Whether request resources must remain owned until cancel drains."""
        return False

    @abc.abstractmethod
    def respond_and_send_async(self, req): ...

    @abc.abstractmethod
    def request_and_receive_sync(self, req): ...

    @abc.abstractmethod
    def request_and_receive_async(self, req): ...

    @abc.abstractmethod
    def check_context_transfer_status(self, at_least_request_num, mark_complete=False): ...

    @abc.abstractmethod
    def check_gen_transfer_status(self, at_least_request_num): ...

    @abc.abstractmethod
    def check_gen_transfer_complete(self): ...

    @abc.abstractmethod
    def cancel_request(self, req): ...

    @abc.abstractmethod
    def prepare_context_requests(self, requests): ...

    @abc.abstractmethod
    def get_disaggregated_params(self): ...

    def commit_blocks_for_reuse(self, req):
        pass

    def shutdown(self):
        pass


class CtxTransferStatus(typing.NamedTuple):
    completed_request_ids: list
    error_request_ids: list


class GenTransferStatus(typing.NamedTuple):
    completed_request_ids: list
    error_request_ids: list
    cancelled_requests: list


class LlmRequestState(enum.Enum):  # the bindings' own enum: other values than kvxfer's stand-in
    CONTEXT_INIT = "ci"
    DISAGG_CONTEXT_TRANS_IN_PROGRESS = "ctip"
    DISAGG_CONTEXT_COMPLETE = "cc"
    DISAGG_GENERATION_TRANS_IN_PROGRESS = "gtip"
    DISAGG_GENERATION_TRANS_COMPLETE = "gtc"
    DISAGG_TRANS_ERROR = "err"


class ContextPhaseParams:
    def __init__(self, first_gen_tokens, req_id, opaque_state, draft_tokens, ctx_dp_rank, disagg_info_endpoint):
        self.req_id, self.disagg_info_endpoint = req_id, disagg_info_endpoint


def trtllm_create(mapping, dist, kv_cache_manager, attention_type, cache_transceiver_config,
                  mamba_cache_manager=None):
    return ("trtllm's", cache_transceiver_config.backend)


@pytest.fixture
def trtllm_stub():
    names = ["tensorrt_llm", "tensorrt_llm.bindings", "tensorrt_llm.bindings.executor", "tensorrt_llm._torch",
             "tensorrt_llm._torch.disaggregation", NEW, "tensorrt_llm._torch.pyexecutor", OLD, CREATOR]
    saved = {n: sys.modules.get(n) for n in names}
    mods = {n: types.ModuleType(n) for n in names}
    new, old, creator = mods[NEW], mods[OLD], mods[CREATOR]
    for m in (new, old):  # the old path re-exports the new module's names
        m.KvCacheTransceiver, m.CtxTransferStatus, m.GenTransferStatus = (KvCacheTransceiver, CtxTransferStatus,
                                                                          GenTransferStatus)
        m.create_kv_cache_transceiver = trtllm_create
    creator.create_kv_cache_transceiver = trtllm_create  # from ..kv_cache_transceiver import create_...
    mods["tensorrt_llm.bindings"].LlmRequestState = LlmRequestState
    mods["tensorrt_llm.bindings"].executor = mods["tensorrt_llm.bindings.executor"]
    mods["tensorrt_llm.bindings.executor"].ContextPhaseParams = ContextPhaseParams
    sys.modules.update(mods)
    yield new, old, creator
    for n, m in saved.items():
        if m is None:
            sys.modules.pop(n, None)
        else:
            sys.modules[n] = m
    kt._installed_config = None


def _config(tmp):
    return {"instance": unique("trt-i"), "backend": "ucx", "bind": "ipc://%s/i.sock" % tmp,
            "secret_key": keypair()[1], "peers": []}


def test_install_builds_kvxfers_where_the_transceiver_is_enabled(trtllm_stub):
    """Every bound name answers kvxfer's transceiver (a subclass of
    TensorRT-LLM's KvCacheTransceiver) for an enabled transceiver; a
    disabled one (backend None) goes to TensorRT-LLM's; install(backend=)
    picks one backend value; installed twice, the wrapper wraps
    TensorRT-LLM's function, not its own. (Checked to fail: without the
    loop over sys.modules, the creator's bound name still answers
    TensorRT-LLM's.)"""
    new, old, creator = trtllm_stub
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        kt.install(config=_config(tmp))
        for m in (new, old, creator):
            assert m.create_kv_cache_transceiver._kvxfer_original is trtllm_create
        mapping = Mapping()
        x = creator.create_kv_cache_transceiver(mapping, None, KVCacheManager(mapping), None,
                                                CacheTransceiverConfig(backend="NIXL"))
        try:
            assert isinstance(x, kt.KvxferCacheTransceiver) and isinstance(x, KvCacheTransceiver)
            assert x.kv_transfer_timeout_ms is None and x.pipeline_transfer_enabled is False
        finally:
            x.shutdown()
        assert creator.create_kv_cache_transceiver(mapping, None, None, None,
                                                   CacheTransceiverConfig(backend=None)) == ("trtllm's", None)
        kt.install(backend="MOONCAKE")
        assert creator.create_kv_cache_transceiver(mapping, None, None, None,
                                                   CacheTransceiverConfig(backend="NIXL")) == ("trtllm's", "NIXL")
        assert new.create_kv_cache_transceiver._kvxfer_original is trtllm_create
        assert old.create_kv_cache_transceiver is new.create_kv_cache_transceiver
        x = old.create_kv_cache_transceiver(mapping=mapping, dist=None, kv_cache_manager=KVCacheManager(mapping),
                                            attention_type=None,
                                            cache_transceiver_config=CacheTransceiverConfig(backend="MOONCAKE"))
        try:
            assert isinstance(x, KvCacheTransceiver)
        finally:
            x.shutdown()


def test_the_transceiver_takes_trtllms_types(trtllm_stub):
    """With TensorRT-LLM importable, states are its LlmRequestState,
    context_phase_params its ContextPhaseParams, results its
    CtxTransferStatus and GenTransferStatus."""
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        mapping = Mapping()
        mgr = KVCacheManager(mapping)
        x = kt.KvxferCacheTransceiver(mapping, None, mgr, None, CacheTransceiverConfig(), config=_config(tmp))
        try:
            req = LlmRequest(1, 5, DisaggregatedParams(request_type="context_only"))  # no blocks: fails alone
            x.respond_and_send_async(req)
            assert req.state is LlmRequestState.DISAGG_CONTEXT_TRANS_IN_PROGRESS
            assert isinstance(req.context_phase_params, ContextPhaseParams)
            assert req.context_phase_params.req_id == 1
            assert kt.parse_endpoint(req.context_phase_params.disagg_info_endpoint) == (x.instance, 1, 1)
            st = x.check_context_transfer_status(0)
            assert type(st) is CtxTransferStatus and tuple(st) == ([], [1])
            assert req.state is LlmRequestState.DISAGG_TRANS_ERROR and "KeyError" in x.failures[1]
            assert type(x.check_gen_transfer_status(0)) is GenTransferStatus
        finally:
            x.shutdown()


def transfer_window_bypass_eligible(transceiver, dist, is_kv_manager_v2, async_gen_transfer=True):
    """orchestration/coordinator.py's (and py_executor.py's
    _is_disagg_transfer_window_bypass_eligible at 0004396, read in
    PyExecutor.__init__ on rank 0 and at each admission when
    max_tokens_in_buffer is set): the attribute read with no default."""
    return (transceiver is not None and transceiver.consumes_transfer_buffer is False and async_gen_transfer
            and dist.pp_size == 1 and is_kv_manager_v2)


def test_what_the_executor_reads_without_a_default(trtllm_stub):
    """consumes_transfer_buffer is False (kvxfer never uses the C++
    transfer buffer; the executor reads it with no default), and
    requires_physical_drain_before_request_release is True over the ABC's
    False (cancel_request answers True only once the transfer settled),
    on the subclass of TensorRT-LLM's ABC. (Checked to fail without the
    two properties: AttributeError, and the ABC's False.)"""
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        mapping = Mapping()
        x = kt.KvxferCacheTransceiver(mapping, None, KVCacheManager(mapping), None, CacheTransceiverConfig(),
                                      config=_config(tmp))
        try:
            assert isinstance(x, KvCacheTransceiver)
            dist = types.SimpleNamespace(pp_size=1)
            assert transfer_window_bypass_eligible(x, dist, is_kv_manager_v2=False) is False
            assert transfer_window_bypass_eligible(x, dist, is_kv_manager_v2=True) is True
            assert x.consumes_transfer_buffer is False
            assert x.requires_physical_drain_before_request_release is True
        finally:
            assert x.shutdown() is True


def test_without_trtllm_a_plain_class():
    assert "tensorrt_llm" not in sys.modules
    assert kt._trtllm_base() is None
    assert kt.KvxferCacheTransceiver.__bases__ == (object,)


def test_install_names_what_this_trtllm_lacks(trtllm_stub):
    new, old, _ = trtllm_stub
    del new.create_kv_cache_transceiver
    del old.create_kv_cache_transceiver
    with pytest.raises(RuntimeError, match="create_kv_cache_transceiver"):
        kt.install(config={"bind": "ipc://x"})


def test_config_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setattr(kt, "_installed_config", None)
    monkeypatch.delenv("KVXFER_TRTLLM_CONFIG", raising=False)
    with pytest.raises(ValueError, match="KVXFER_TRTLLM_CONFIG"):
        kt._config()
    monkeypatch.setenv("KVXFER_TRTLLM_CONFIG", '{"bind": "ipc://a"}')
    assert kt._config() == {"bind": "ipc://a"}
    f = tmp_path / "kvxfer.json"
    f.write_text('{"bind": "ipc://b"}')
    monkeypatch.setenv("KVXFER_TRTLLM_CONFIG", str(f))
    assert kt._config() == {"bind": "ipc://b"}
    monkeypatch.setenv("KVXFER_TRTLLM_CONFIG", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="neither JSON nor a readable file"):
        kt._config()
    monkeypatch.setenv("KVXFER_TRTLLM_CONFIG", "[1]")
    with pytest.raises(ValueError, match="want a JSON object"):
        kt._config()


def test_install_config_as_json_text_or_refused_naming_it(trtllm_stub):
    """install(config='{...}') was dict() of a str: \"dictionary update
    sequence element #0 has length 1; 2 is required\"; config=5 \"'int'
    object is not iterable\" (checked to fail). JSON text of an object is
    taken, as Engine takes it; anything else names install and the value."""
    kt.install(config='{"bind": "ipc://j"}')
    assert kt._config() == {"bind": "ipc://j"}
    with pytest.raises(TypeError, match=r"kvxfer.trtllm.install: config must be a dict .*not int \(5\)"):
        kt.install(config=5)
    with pytest.raises(ValueError, match=r"kvxfer.trtllm.install: config '\[1\]': want a JSON object"):
        kt.install(config="[1]")
