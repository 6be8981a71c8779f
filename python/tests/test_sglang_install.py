"""kvxfer.sglang.install() against a stand-in of SGLang's
disaggregation/utils.py (SGLang is not installed here): TransferBackend and
KVClassType as SGLang's enums, get_kv_class as its factory, and a module
that bound get_kv_class by name as prefill.py and decode.py do."""

import enum
import sys
import types

import pytest

from kvxfer import sglang as ks


class TransferBackend(enum.Enum):
    MOONCAKE = "mooncake"
    NIXL = "nixl"
    FAKE = "fake"


class KVClassType(enum.Enum):
    KVARGS = "kvargs"
    MANAGER = "manager"
    SENDER = "sender"
    RECEIVER = "receiver"
    BOOTSTRAP_SERVER = "bootstrap_server"


def original_get_kv_class(transfer_backend, class_type):
    return ("sglang's", transfer_backend, class_type)


@pytest.fixture
def sglang_stub():
    names = ["sglang", "sglang.srt", "sglang.srt.disaggregation", "sglang.srt.disaggregation.utils",
             "sglang.srt.disaggregation.prefill"]
    saved = {n: sys.modules.get(n) for n in names}
    mods = {n: types.ModuleType(n) for n in names}
    utils, prefill = mods["sglang.srt.disaggregation.utils"], mods["sglang.srt.disaggregation.prefill"]
    utils.TransferBackend, utils.KVClassType, utils.get_kv_class = TransferBackend, KVClassType, original_get_kv_class
    prefill.get_kv_class = original_get_kv_class  # from ...utils import get_kv_class
    sys.modules.update(mods)
    yield utils, prefill
    for n, m in saved.items():
        if m is None:
            sys.modules.pop(n, None)
        else:
            sys.modules[n] = m
    ks._installed_config = None


def test_install_answers_the_backend_and_leaves_the_others(sglang_stub):
    """(Checked to fail: without the loop over sys.modules, prefill's
    bound name still answers SGLang's class.)"""
    utils, prefill = sglang_stub
    ks.install("mooncake", config={"bind": "ipc://x"})
    for fn in (utils.get_kv_class, prefill.get_kv_class):
        assert fn(TransferBackend.MOONCAKE, KVClassType.SENDER) is ks.KVSender
        assert fn(TransferBackend.MOONCAKE, KVClassType.RECEIVER) is ks.KVReceiver
        assert fn(TransferBackend.MOONCAKE, KVClassType.MANAGER) is ks.KVManager
        assert fn(TransferBackend.MOONCAKE, KVClassType.BOOTSTRAP_SERVER) is ks.KVBootstrapServer
        assert fn(TransferBackend.MOONCAKE, KVClassType.KVARGS) is ks.KVArgs  # the stub has no base/conn.py
        assert fn(TransferBackend.NIXL, KVClassType.SENDER) == ("sglang's", TransferBackend.NIXL, KVClassType.SENDER)
    assert ks._config() == {"bind": "ipc://x"}
    # Installed twice (another backend name): wraps SGLang's, not its own wrapper.
    ks.install("nixl")
    assert utils.get_kv_class(TransferBackend.NIXL, KVClassType.SENDER) is ks.KVSender
    assert utils.get_kv_class(TransferBackend.MOONCAKE, KVClassType.SENDER)[0] == "sglang's"
    assert prefill.get_kv_class(TransferBackend.NIXL, KVClassType.SENDER) is ks.KVSender


def test_install_names_what_this_sglang_lacks(sglang_stub):
    utils, _ = sglang_stub
    with pytest.raises(RuntimeError, match="'kvxfer' is not one of this SGLang's TransferBackend values "
                                           r"\(mooncake, nixl, fake\)"):
        ks.install("kvxfer")
    del utils.get_kv_class
    with pytest.raises(RuntimeError, match="lacks get_kv_class"):
        ks.install("mooncake")


def test_config_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setattr(ks, "_installed_config", None)
    monkeypatch.delenv("KVXFER_SGLANG_CONFIG", raising=False)
    with pytest.raises(ValueError, match="KVXFER_SGLANG_CONFIG"):
        ks._config()
    monkeypatch.setenv("KVXFER_SGLANG_CONFIG", '{"bind": "ipc://a"}')
    assert ks._config() == {"bind": "ipc://a"}
    f = tmp_path / "kvxfer.json"
    f.write_text('{"bind": "ipc://b"}')
    monkeypatch.setenv("KVXFER_SGLANG_CONFIG", str(f))
    assert ks._config() == {"bind": "ipc://b"}
    monkeypatch.setenv("KVXFER_SGLANG_CONFIG", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="neither JSON nor a readable file"):
        ks._config()


def test_install_config_as_json_text_or_refused_naming_it(sglang_stub):
    """install("nixl", '{...}') was dict() of a str: \"dictionary update
    sequence element #0 has length 1; 2 is required\" (checked to fail).
    JSON text of an object is taken, as Engine takes it; anything else
    names install and the value."""
    ks.install("nixl", config='{"bind": "ipc://j"}')
    assert ks._config() == {"bind": "ipc://j"}
    with pytest.raises(TypeError, match=r"kvxfer.sglang.install: config must be a dict .*not list"):
        ks.install("nixl", config=[("bind", "ipc://x")])
    with pytest.raises(ValueError, match=r"kvxfer.sglang.install: config '\{bad' is no valid JSON"):
        ks.install("nixl", config="{bad")
