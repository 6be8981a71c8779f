"""Two Python processes move KV through kvxfer nodes (kvxfer_node_open):
ZeroMQ control with CURVE, over shm and over ucx; every byte is verified on
the generation side. A failed fence in the context process fails the
request in both."""

import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import weakref

import numpy as np
import pytest

import kvxfer
from kvxfer import KvxferError, Status

from conftest import run_children, unique, wait_until

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "twoproc_child.py")


def run_pair_children(jobs, env=None):
    """run_children of twoproc_child.py (90 s each)."""
    return run_children(CHILD, jobs, env, timeout=90)


def run_pair(backend, prompt=300, chunk=128, fail_fence=False):
    (ctx_pub, ctx_sec), (gen_pub, gen_sec) = kvxfer.keygen(), kvxfer.keygen()
    ctx_name, gen_name = unique("tp-ctx"), unique("tp-gen")
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        ctx_ep, gen_ep = "ipc://%s/c.sock" % d, "ipc://%s/g.sock" % d
        common = {"model": "Llama-3.1-8B", "tokens_per_block": 16, "pool_bytes": 64 << 20, "backend": backend, "workers": 2,
                  "transfer_timeout": "20s", "heartbeat_interval": "200ms",
                  "heartbeat_misses": 8}
        ctx_cfg = dict(common, instance=ctx_name, bind=ctx_ep, secret_key=ctx_sec, send_only=True,
                       peers=[{"instance": gen_name, "endpoint": gen_ep, "public_key": gen_pub}])
        gen_cfg = dict(common, instance=gen_name, bind=gen_ep, secret_key=gen_sec,
                       peers=[{"instance": ctx_name, "endpoint": ctx_ep, "public_key": ctx_pub}])
        want = "FAILED" if fail_fence else None
        jobs = {
            "ctx": {"role": "ctx", "config": ctx_cfg, "prompt": prompt, "chunk": chunk, "request": "tp-1",
                    "fail_fence": fail_fence, "want": want or "DONE"},
            "gen": {"role": "gen", "config": gen_cfg, "prompt": prompt, "request": "tp-1", "context": ctx_name,
                    "want": want or "READY"},
        }
        return run_pair_children(jobs)


@pytest.mark.parametrize("backend", ["shm", "ucx"])
def test_two_processes_verify_every_byte(backend):
    out = run_pair(backend)
    for k, (rc, res, err) in out.items():
        assert rc == 0, (k, res, err)
    ctx, gen = out["ctx"][1], out["gen"][1]
    assert ctx["outcome"] == "DONE" and gen["outcome"] == "READY", out
    assert gen["verified"] == 19 * 16 * 128 * 1024  # 300 tokens: 19 blocks of 16 tokens × 128 KiB
    assert gen["payload"] == "tok-42"


def test_two_processes_failed_fence():
    out = run_pair("shm", fail_fence=True)
    for k, (rc, res, err) in out.items():
        assert rc == 0, (k, res, err)
    ctx, gen = out["ctx"][1], out["gen"][1]
    assert ctx["error"] == "FENCE" and "kernel failed" in ctx["message"], ctx
    assert gen["outcome"] == "FAILED", gen


def test_two_vllm_instances_through_the_worker_connector():
    """A prefill and a decode instance in two processes, each a worker
    connector over its own KV cache (a tensor it allocated, as vLLM's) with
    a node's keys (bind, peers, CURVE keys, backend ucx): the prefill hands
    a chunked prompt over from wait_for_save, the decode side loads it into
    its own block table, every element equal. (Checked to fail: with
    kvxfer_node_open ignoring pool_address, each node writes into a pool of
    its own and the decode side's tensor stays zero: "mismatch".)"""
    (p_pub, p_sec), (d_pub, d_sec) = kvxfer.keygen(), kvxfer.keygen()
    p_name, d_name = unique("cn-prefill"), unique("cn-decode")
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        p_ep, d_ep = "ipc://%s/p.sock" % d, "ipc://%s/d.sock" % d
        common = {"backend": "ucx", "workers": 2, "transfer_timeout_ms": 20000, "heartbeat_interval": "200ms",
                  "heartbeat_misses": 8}
        p_cfg = dict(common, instance=p_name, bind=p_ep, secret_key=p_sec,
                     peers=[{"instance": d_name, "endpoint": d_ep, "public_key": d_pub}])
        d_cfg = dict(common, instance=d_name, bind=d_ep, secret_key=d_sec,
                     peers=[{"instance": p_name, "endpoint": p_ep, "public_key": p_pub}])
        out = run_pair_children({
            "prefill": {"side": "producer", "config": p_cfg, "prompt": 200},
            "decode": {"side": "consumer", "config": d_cfg, "prompt": 200, "context": p_name},
        })
    for k, (rc, res, err) in out.items():
        assert rc == 0, (k, res, err)
    pre, dec = out["prefill"][1], out["decode"][1]
    assert pre["node"] and dec["node"], out
    assert pre["params"]["remote_instance"] == p_name, pre
    assert dec["loaded"] and dec["failed"] == {}, dec
    assert dec["verified"] == 4 * 2 * 200 * 2 * 8 * 2, dec  # layers × K,V × tokens × heads × head_dim × bf16


def test_two_processes_gpu_memory_over_cudaipc():
    """Two processes, each a node over the framework's own per-layer KV
    tensors in GPU memory (kv_memory of device allocations of the fake
    CUDA driver, which KVXFER_LIBCUDA points kvxfer at: the context's on
    GPU 0, the generation's on GPU 1, neither config naming its node's
    GPU), backend cudaipc: the context hands a chunked prompt over from scattered
    blocks, the generation side receives into blocks of its choosing, and
    every byte of them is read back from the device and checked. (Checked
    to fail: with kvxfer_node_open dropping memory.device the nodes are
    refused, cudaipc taking only GPU memory; without the node's GPU taken
    from its memory's, the generation node is refused (memory on GPU 1, the
    node on 0); with the gen side's tensors read at other blocks:
    "mismatch".)"""
    import fakecuda

    (ctx_pub, ctx_sec), (gen_pub, gen_sec) = kvxfer.keygen(), kvxfer.keygen()
    ctx_name, gen_name = unique("gpu-ctx"), unique("gpu-gen")
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        lib, why = fakecuda.build(d)
        if lib is None:
            pytest.skip(why)
        ctx_ep, gen_ep = "ipc://%s/c.sock" % d, "ipc://%s/g.sock" % d
        common = {"backend": "cudaipc", "workers": 2, "transfer_timeout": "20s", "heartbeat_interval": "200ms",
                  "heartbeat_misses": 8}
        ctx_cfg = dict(common, instance=ctx_name, bind=ctx_ep, secret_key=ctx_sec, send_only=True,
                       peers=[{"instance": gen_name, "endpoint": gen_ep, "public_key": gen_pub}])
        gen_cfg = dict(common, instance=gen_name, bind=gen_ep, secret_key=gen_sec,
                       peers=[{"instance": ctx_name, "endpoint": ctx_ep, "public_key": ctx_pub}])
        out = run_pair_children({
            "ctx": {"role": "ctx", "cuda": lib, "config": ctx_cfg, "prompt": 200, "chunk": 64, "request": "gpu-1"},
            "gen": {"role": "gen", "cuda": lib, "device": 1, "config": gen_cfg, "prompt": 200, "request": "gpu-1",
                    "context": ctx_name},
        }, env={"KVXFER_LIBCUDA": lib, "FAKECUDA_DEVICES": "2"})
    for k, (rc, res, err) in out.items():
        assert rc == 0, (k, res, err)
    ctx, gen = out["ctx"][1], out["gen"][1]
    assert ctx["outcome"] == "DONE" and gen["outcome"] == "READY", out
    assert gen["verified"] == 13 * 4 * 2 * 16 * 2 * 8 * 2, gen  # blocks × layers × K,V × tokens × heads × head × bf16
    assert gen["payload"] == "tok-42"


def test_connector_receiving_on_shm_is_refused():
    """A decode worker whose node config says backend shm is refused at
    construction, naming the backend and ucx; a prefill worker (send_only)
    is not."""
    from kvxfer.connector import KvxferWorkerConnector

    cfg = {"instance": unique("cn"), "backend": "shm", "bind": "ipc:///nonexistent/x.sock", "insecure": True,
           "model": "Llama-3.1-8B"}
    for role in ("consumer", "both"):
        with pytest.raises(ValueError, match="backend = 'shm' for a rank that receives.*use backend 'ucx'"):
            KvxferWorkerConnector(cfg, role=role)
    w = KvxferWorkerConnector(cfg, role="producer")
    assert w.node


def test_close_that_times_out_keeps_the_memory_alive():
    """The generation node closes while a transfer into its memory is half
    done and its writer cannot answer (the context process stopped, SIGSTOP,
    after its first chunk landed): the close times out (the writer's Cancel
    is never acked, and nothing proves its writes over), and the array the
    node was given stays referenced by the module after the caller dropped
    every reference (the writer may still write into it), with a warning
    naming the node and the bytes. The close raises KvxferTimeoutError, a
    KvxferError with Status.TIMEOUT and a TimeoutError (checked to fail
    when it was a KvxferError alone). (A writer whose op only waits for its
    fence no longer holds a close: it answers the Cancel at once.)"""
    (ctx_pub, ctx_sec), (gen_pub, gen_sec) = kvxfer.keygen(), kvxfer.keygen()
    ctx_name, gen_name = unique("hold-ctx"), unique("hold-gen")
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        ctx_ep, gen_ep = "ipc://%s/c.sock" % d, "ipc://%s/g.sock" % d
        common = {"model": "Llama-3.1-8B", "tokens_per_block": 16, "pool_bytes": 64 << 20, "backend": "ucx", "workers": 2,
                  "transfer_timeout": "20s", "heartbeat_interval": "200ms",
                  "heartbeat_misses": 8}
        ctx_cfg = dict(common, instance=ctx_name, bind=ctx_ep, secret_key=ctx_sec, send_only=True,
                       peers=[{"instance": gen_name, "endpoint": gen_ep, "public_key": gen_pub}])
        gen_cfg = dict(common, instance=gen_name, bind=gen_ep, secret_key=gen_sec,
                       peers=[{"instance": ctx_name, "endpoint": ctx_ep, "public_key": ctx_pub}])
        job = {"role": "ctx", "config": ctx_cfg, "prompt": 64, "chunk": 32, "request": "held", "hold": True, "want": "DONE"}
        child = subprocess.Popen([sys.executable, CHILD, json.dumps(job)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            arr = np.zeros(64 << 20, np.uint8)
            ref = weakref.ref(arr)
            gen = kvxfer.Node(gen_cfg, memory=arr)
            gen.wait_peers(20000)
            rx = gen.receive("held", 64, ctx_name)
            assert json.loads(child.stdout.readline()) == {"held": True}
            wait_until(lambda: arr.any(), what="the first chunk's bytes in the generation node's memory")
            child.send_signal(signal.SIGSTOP)
            status, timeout = None, False
            with pytest.warns(RuntimeWarning, match=r"engine '%s' \(handle \d+\) did not finish closing \(TIMEOUT\): "
                                                    r"its memory, 67108864 bytes, is kept alive" % gen_name):
                try:
                    gen.close(timeout_ms=50)
                except KvxferError as e:
                    status = e.status
                    timeout = isinstance(e, TimeoutError) and isinstance(e, kvxfer.KvxferTimeoutError)
            assert status == Status.TIMEOUT
            assert timeout, "a close that timed out raised no TimeoutError (KvxferTimeoutError)"
            assert gen.handle == 0
            gen.close()  # closed: a no-op
            del arr, gen, rx
            gc.collect()
            assert ref() is not None, "the memory of a node whose close timed out was freed"
        finally:
            child.kill()
            child.wait()
