"""vLLM's cross-layer KV caches on GPUs, in FlashAttention's and
FlashInfer's HND orders, moved between two processes' nodes over cudaipc on
the project's fake CUDA driver (ctx on GPU 0, gen on GPU 1): every token of
every layer read back from the decode side's device where its backend
reads it."""

import os
import json
import subprocess
import sys
import tempfile

import pytest

import kvxfer
from conftest import unique

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_gpu_layouts_child.py")


@pytest.mark.parametrize("pb,db", [("FA", "FI"), ("FI", "FA"), ("FA", "FA")])
def test_vllm_cross_layer_orders_over_cudaipc(pb, db):
    import fakecuda
    (cp, cs), (gp, gs) = kvxfer.keygen(), kvxfer.keygen()
    cn, gn = unique("rg-ctx"), unique("rg-gen")
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        lib, why = fakecuda.build(d)
        if lib is None:
            pytest.skip(why)
        ce, ge = "ipc://%s/c.sock" % d, "ipc://%s/g.sock" % d
        common = {"backend": "cudaipc", "workers": 2, "transfer_timeout": "20s", "heartbeat_interval": "200ms"}
        jobs = {
            "ctx": {"role": "ctx", "backend": pb, "cuda": lib, "config": dict(common, instance=cn, bind=ce, secret_key=cs,
                    send_only=True, peers=[{"instance": gn, "endpoint": ge, "public_key": gp}])},
            "gen": {"role": "gen", "backend": db, "cuda": lib, "device": 1, "context": cn,
                    "config": dict(common, instance=gn, bind=ge, secret_key=gs,
                                   peers=[{"instance": cn, "endpoint": ce, "public_key": cp}])},
        }
        env = dict(os.environ, KVXFER_LIBCUDA=lib, FAKECUDA_DEVICES="2")
        procs = {k: subprocess.Popen([sys.executable, CHILD, json.dumps(j)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env) for k, j in jobs.items()}
        out = {k: p.communicate(timeout=90) + (p.returncode,) for k, p in procs.items()}
    for k, (so, se, rc) in out.items():
        assert rc == 0, (k, so, se[-2000:])
