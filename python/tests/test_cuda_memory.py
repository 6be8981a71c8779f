"""CUDA tensors through the C ABI: kv_memory and Node put the tensors'
device in the JSON ("device", "pool_device"); the in-process Engine
refuses them, saying to use a Node; a Node over a backend that cannot
reach GPU memory is refused by the library, naming what it lacks.

The tensors are stand-ins (no GPU needed): torch-like objects whose
data_ptr() is an address no host mapping has, which nothing may touch;
the library's refusals prove it never did."""

import ctypes
import json
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import pytest
import torch

import kvxfer
import kvxfer.core
from kvxfer import KvxferError, Status
from kvxfer.connector import KvxferWorkerConnector

from conftest import small_config, unique
from fakecuda import DeviceTensor

# The tiny layout of conftest: 4 layers, 2 KV heads, head size 8, bf16,
# 16 tokens per block.
LAYERS, HEADS, HEAD, TPB, NBLOCKS = 4, 2, 8, 16, 8
FAKE_BASE = 1 << 40  # a device address: never mapped in this process


def FakeCudaTensor(shape, index, addr=FAKE_BASE):
    """A contiguous bf16 torch.Tensor on cuda:index as kvxfer reads it (a
    stand-in: data_ptr is addr, which no host mapping has)."""
    return DeviceTensor(shape, addr, index)


def cuda_layers(index, n=LAYERS, shape=(2, NBLOCKS, TPB, HEADS, HEAD)):
    """n per-layer NHD tensors on cuda:index, 1 MiB apart."""
    return [FakeCudaTensor(shape, index, FAKE_BASE + i * (1 << 20)) for i in range(n)]


@pytest.fixture
def opened(monkeypatch):
    """The JSON configs passed to kvxfer_engine_open and kvxfer_node_open
    (each call still goes to the library), as dicts by function name."""
    seen = {"kvxfer_engine_open": [], "kvxfer_node_open": []}
    real = kvxfer.core.lib

    class Recorder:
        def __getattr__(self, name):
            fn = getattr(real, name)
            if name not in seen:
                return fn

            def call(js, *args):
                seen[name].append(json.loads(js.decode()))
                return fn(js, *args)
            return call

    monkeypatch.setattr(kvxfer.core, "lib", Recorder())
    return seen


def node_config(d, backend, **kw):
    cfg = small_config(unique("gpu"), backend=backend, insecure=True, bind="ipc://%s/n.sock" % d,
                       peers=[{"instance": "peer", "endpoint": "ipc://%s/p.sock" % d}])
    for k in ("pool_bytes", "transfer_timeout_ms"):
        del cfg[k]
    cfg["parallel"], cfg["rank"] = {"tp": 1, "pp": 1}, {"tp": 0, "pp": 0}
    cfg.update(kw)
    return cfg


def test_kv_memory_of_cuda_tensors_carries_the_device():
    """The "memory" object of CUDA tensors is the CPU form's (addresses,
    strides, dtype_bytes, num_blocks) plus "device", their ordinal; CPU
    tensors give none. (Checked to fail: with kv_memory leaving the device
    out, "device" is missing.)"""
    cpu = kvxfer.kv_memory("nhd", [torch.zeros((2, NBLOCKS, TPB, HEADS, HEAD), dtype=torch.bfloat16)
                                   for _ in range(LAYERS)])
    assert "device" not in cpu
    gpu = kvxfer.kv_memory("nhd", cuda_layers(3))
    assert gpu["device"] == 3
    assert gpu["layers"] == [FAKE_BASE + i * (1 << 20) for i in range(LAYERS)]
    assert {k: v for k, v in gpu.items() if k not in ("device", "layers")} == \
        {k: v for k, v in cpu.items() if k != "layers"}
    assert kvxfer.kv_memory("split_kv", cuda_layers(0, shape=(NBLOCKS, TPB, HEADS, HEAD)),
                            cuda_layers(0, shape=(NBLOCKS, TPB, HEADS, HEAD)))["device"] == 0


def test_tensors_on_different_devices_are_refused():
    """Every tensor must be on layers[0]'s device: another GPU, or a CPU
    tensor among CUDA ones (or the other way round), is a ValueError naming
    both. (Checked to fail: without kv_memory's device check, the mix
    passes with layers[0]'s device.)"""
    cpu = torch.zeros((2, NBLOCKS, TPB, HEADS, HEAD), dtype=torch.bfloat16)
    for layers, v_layers, needle in [
        (cuda_layers(0)[:2] + cuda_layers(1)[2:], None, r"layers\[2\] is on cuda:1, layers\[0\] on cuda:0"),
        (cuda_layers(2)[:3] + [cpu], None, r"layers\[3\] is on cpu, layers\[0\] on cuda:2"),
        ([cpu] + cuda_layers(0)[1:], None, r"layers\[1\] is on cuda:0, layers\[0\] on cpu"),
    ]:
        with pytest.raises(ValueError, match=needle):
            kvxfer.kv_memory("nhd", layers, v_layers)
    k = cuda_layers(0, shape=(NBLOCKS, TPB, HEADS, HEAD))
    with pytest.raises(ValueError, match=r"v_layers\[1\] is on cuda:1, layers\[0\] on cuda:0"):
        kvxfer.kv_memory("split_kv", k, k[:1] + cuda_layers(1, 3, shape=(NBLOCKS, TPB, HEADS, HEAD)))
    # Not CUDA, not the CPU: named.
    other = FakeCudaTensor((2, NBLOCKS, TPB, HEADS, HEAD), 0)
    other.device = torch.device("meta")
    with pytest.raises(ValueError, match="tensor on meta: kvxfer registers host memory and CUDA memory only"):
        kvxfer.kv_memory("nhd", [other])


def test_engine_refuses_cuda_tensors(opened):
    """The in-process Engine copies with the CPU: CUDA tensors, as its pool
    or as kv_memory, are a ValueError saying to use a Node, before the
    library opens anything; the same JSON given to the library itself is
    refused there, naming the key. buffer_address stays host-only.
    (Checked to fail: without Engine's check, the CUDA pool opens an engine
    over the device pointer as if it were host memory, the C ABI's pool
    argument carrying no device; the kv_memory engine reaches the library,
    whose refusal is a KvxferError.)"""
    before = kvxfer.handle_count()
    pool = FakeCudaTensor((NBLOCKS, 4096), 1)
    with pytest.raises(ValueError, match="memory on cuda:1: the in-process Engine .* use a Node"):
        kvxfer.Engine(small_config(unique("e"), pool_bytes=NBLOCKS * 4096 * 2), memory=pool)
    cfg = small_config(unique("e"), memory=kvxfer.kv_memory("nhd", cuda_layers(0)))
    del cfg["pool_bytes"]
    with pytest.raises(ValueError, match="memory on cuda:0: .*'ucx' with a UCX built with CUDA, or 'cudaipc'"):
        kvxfer.Engine(cfg, kv_caches=cfg["memory"].tensors)
    assert opened["kvxfer_engine_open"] == []
    # The same JSON straight to the library (a C caller).
    h = kvxfer._lib.engine_t()
    with pytest.raises(KvxferError) as e:
        kvxfer.core._check(kvxfer._lib.lib.kvxfer_engine_open(json.dumps(cfg).encode(), None, 0, ctypes.byref(h)))
    assert e.value.status == Status.CONFIG
    assert "memory.device = 0: the in-process engine" in e.value.message and "kvxfer_node_open" in e.value.message, \
        e.value.message
    with pytest.raises(ValueError, match="buffer_address is for host memory"):
        kvxfer.buffer_address(pool)
    assert kvxfer.handle_count() == before


@pytest.mark.parametrize("send_only", [False, True])
def test_node_over_cuda_tensors_is_refused_by_this_library(opened, send_only):
    """A Node over CUDA tensors passes their device to the library
    ("device" in memory, "pool_device" beside pool_address); over this
    machine's UCX (no CUDA) the library refuses it at open, naming the
    device, the address and the memory types UCX registers; over shm it is
    refused naming the backend. Nothing stays open. (Checked to fail:
    with Node dropping pool_device, the pool opens as host memory.)"""
    before = kvxfer.handle_count()
    layers = cuda_layers(1)
    pool = FakeCudaTensor((NBLOCKS, 4096), 2)
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        cfg = node_config(d, "ucx", send_only=send_only, memory=kvxfer.kv_memory("nhd", layers))
        with pytest.raises(KvxferError) as e:
            kvxfer.Node(cfg, kv_caches=layers)
        assert opened["kvxfer_node_open"][-1]["memory"]["device"] == 1
        assert e.value.status == Status.CONFIG
        assert "GPU memory (device 1 at %#x" % FAKE_BASE in e.value.message, e.value.message
        assert "this UCX has no CUDA support (it registers: [host])" in e.value.message, e.value.message

        with pytest.raises(KvxferError) as e:
            kvxfer.Node(node_config(d, "ucx", send_only=send_only), memory=pool)
        sent = opened["kvxfer_node_open"][-1]
        assert (sent["pool_address"], sent["pool_bytes"], sent["pool_device"]) == (FAKE_BASE, NBLOCKS * 4096 * 2, 2)
        assert "GPU memory (device 2 at %#x, %d bytes)" % (FAKE_BASE, NBLOCKS * 4096 * 2) in e.value.message, \
            e.value.message

        with pytest.raises(KvxferError) as e:
            kvxfer.Node(node_config(d, "shm", send_only=send_only), memory=pool)
        assert 'backend = "shm": the framework\'s memory is GPU memory (device 2)' in e.value.message, e.value.message
    with pytest.raises(ValueError, match="pool_device = 0 in the config but memory is on cuda:2"):
        kvxfer.Node(dict({k: v for k, v in cfg.items() if k != "memory"}, pool_device=0), memory=pool)
    assert kvxfer.handle_count() == before


def test_vllm_worker_passes_a_gpu_kv_cache_to_its_node(opened):
    """The worker connector hands a CUDA cross-layer KV cache to its node as
    GPU memory (pool_device: the tensor's device), which this library's
    UCX (no CUDA) refuses at registration naming it; without a node's keys
    its in-process engine refuses the tensor, saying to use a node.
    (Checked to fail: with the connector refusing every CUDA tensor, as
    before, no node is opened.)"""
    before = kvxfer.handle_count()
    cache = FakeCudaTensor((64, LAYERS, 2, HEADS, TPB, HEAD), 5)
    layout = {"layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD, "dtype_bytes": 2, "tokens_per_block": TPB}
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        for role in ("producer", "consumer"):
            w = KvxferWorkerConnector({"instance": unique("cn"), "workers": 2, "layout": layout, "backend": "ucx",
                                       "bind": "ipc://%s/w.sock" % d, "insecure": True}, role=role)
            with pytest.raises(KvxferError, match=r"GPU memory \(device 5 at %#x" % FAKE_BASE):
                w.register_cross_layers_kv_cache(cache)  # in kvxfer's block layout: one pool
            sent = opened["kvxfer_node_open"][-1]
            assert (sent["pool_address"], sent["pool_device"], sent.get("send_only")) == \
                (FAKE_BASE, 5, True if role == "producer" else None), sent
    w = KvxferWorkerConnector({"instance": unique("cn"), "workers": 2, "layout": layout})
    with pytest.raises(ValueError, match="memory on cuda:5: the in-process Engine .* a node's keys"):
        w.register_cross_layers_kv_cache(cache)
    assert kvxfer.handle_count() == before


# A child process: a Node on backend cudaipc with its own pool (device
# memory of the fake driver's GPU 1), printing what pool_device and
# block_bytes say.
_DEVICE_POOL_CHILD = r"""
import json, sys
sys.path.insert(0, %(py)r)
sys.path.insert(0, %(tests)r)
import kvxfer
from conftest import small_config, unique
cfg = small_config(unique("dp"), backend="cudaipc", device=1, insecure=True, bind="ipc://%(dir)s/n.sock",
                   transfer_timeout="10s")
del cfg["transfer_timeout_ms"]
n = kvxfer.Node(cfg)
out = {"pool_device": n.pool_device}
try:
    n.block_bytes(0, 0)
    out["read"] = True
except ValueError as e:
    out["refused"] = str(e)
finally:
    n.close()
print(json.dumps(out))
"""


def test_device_pool_is_named_and_never_read_by_the_cpu():
    """A node's pool on a GPU (backend cudaipc, device 1 of the fake CUDA
    driver): pool_device names the GPU, and block_bytes, which reads host
    memory, refuses its device pointer instead of dereferencing it (a
    SIGSEGV on a real GPU; the fake driver's device memory is a host
    mapping, so only the refusal shows the read did not happen). A host
    engine's pool_device is None. (Checked to fail: with block_bytes not
    asking pool_device, the child reads the block.)"""
    import fakecuda

    e = kvxfer.Engine(small_config(unique("dp-host")))
    try:
        assert e.pool_device is None
        assert len(e.block_bytes(0, 0)) == e.groups[0].block_bytes
    finally:
        e.close()
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        lib, why = fakecuda.build(d)
        if lib is None:
            pytest.skip(why)
        src = _DEVICE_POOL_CHILD % {"py": os.path.dirname(here), "tests": here, "dir": d}
        env = dict(os.environ, KVXFER_LIBCUDA=lib, FAKECUDA_DEVICES="2")
        p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["pool_device"] == 1, out
    assert "GPU memory (cuda:1" in out.get("refused", ""), "block_bytes read a device pool with the CPU: %s" % out
