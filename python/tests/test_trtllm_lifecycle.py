"""kvxfer.trtllm across an executor's life, as TensorRT-LLM builds and
tears executors down (tensorrt_llm/_torch/pyexecutor/_util.py and
py_executor.py, commit 0004396):

  - create_py_executor builds the executor twice by default: a KV-cache
    estimation pass, torn down with PyExecutor.shutdown() and
    kv_cache_creator.teardown_managers(resources) (each manager's
    shutdown(), which releases the pool), then the real one, each with a
    transceiver from create_kv_cache_transceiver on the same config.
    Nothing calls the first transceiver's shutdown(): the manager's
    shutdown must close its node (and before the pool goes), or the second
    transceiver cannot bind the same endpoint;
  - newer trees call the transceiver's shutdown() first, then the
    managers': either order, and shutdown twice, must work."""

import gc
import socket
import tempfile

import pytest

import kvxfer
from kvxfer import trtllm as kt

from conftest import unique
from trtllm_helpers import CacheTransceiverConfig, KVCacheManager, Mapping, keypair


def _config(name, bind):
    return {"instance": name, "backend": "ucx", "bind": bind, "secret_key": keypair()[1], "peers": [],
            "transfer_timeout": "20s"}


def _free_tcp_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _watch_release(mgr, x):
    """Records, at each release_pools of mgr's pool, whether x's node was
    closed then."""
    seen = []
    release = mgr.impl.release_pools

    def release_pools():
        seen.append(x.closed and x.node.handle == 0)
        release()

    mgr.impl.release_pools = release_pools
    return seen


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_estimation_pass_then_the_real_transceiver(transport):
    """The estimation pass's manager shutdown (teardown_managers) closes
    the first transceiver's node before the pool is released, so the real
    executor's transceiver binds the same endpoint; the handle table ends
    where it began. (Checked to fail without the manager's shutdown
    closing the node: ipc "endpoint in use", tcp "address already in
    use".)"""
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        bind = "ipc://%s/n.sock" % tmp if transport == "ipc" else "tcp://127.0.0.1:%d" % _free_tcp_port()
        cfg = _config(unique("est"), bind)
        before = kvxfer.handle_count()
        m1 = KVCacheManager(Mapping())
        x1 = kt.KvxferCacheTransceiver(Mapping(), None, m1, None, CacheTransceiverConfig(), config=dict(cfg))
        released = _watch_release(m1, x1)
        m1.shutdown()  # teardown_managers; x1.shutdown() is never called
        assert released == [True] and m1.impl.released
        del x1
        gc.collect()
        m2 = KVCacheManager(Mapping())
        x2 = kt.KvxferCacheTransceiver(Mapping(), None, m2, None, CacheTransceiverConfig(), config=dict(cfg))
        try:
            assert x2.endpoint == kt.context_endpoint(cfg["instance"], 1, 1)
        finally:
            m2.shutdown()
        assert x2.closed and m2.impl.released
        assert kvxfer.handle_count() == before


@pytest.mark.parametrize("first", ["transceiver", "manager"])
def test_either_shutdown_order_closes_then_releases(first):
    """Transceiver then manager (newer trees), or the manager alone
    (0004396), then the other: the node is closed before the pool is
    released, once; shutdown() answers True (the close finished), again
    when called twice. (Checked to fail without the manager's shutdown
    closing the node: the pool is released while it is open.)"""
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        before = kvxfer.handle_count()
        m = KVCacheManager(Mapping())
        x = kt.KvxferCacheTransceiver(Mapping(), None, m, None, CacheTransceiverConfig(),
                                      config=_config(unique("order"), "ipc://%s/o.sock" % tmp))
        released = _watch_release(m, x)
        if first == "transceiver":
            assert x.shutdown() is True
            assert released == []  # the transceiver's shutdown never releases the pool
            m.shutdown()
        else:
            m.shutdown()
            assert x.shutdown() is True
        assert released == [True]
        assert x.shutdown() is True
        assert kvxfer.handle_count() == before
