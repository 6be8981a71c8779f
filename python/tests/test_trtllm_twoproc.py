"""A TensorRT-LLM context rank and a generation rank in two processes, each
a kvxfer.trtllm.KvxferCacheTransceiver over its own KV cache manager
stand-in (host memory; nodes over ucx with CURVE, ipc endpoints): two
requests (13 and 6 tokens) move into other block ids on the generation
side, which learns the id and the context instance from the context's
context_phase_params, as the disaggregated server hands them on; every
byte compared. (Checked to fail: with the generation's blocks reversed in
request_and_receive_async, equal is false.)"""

import os
import tempfile

import kvxfer

from conftest import run_children, unique
from trtllm_helpers import DIM, HEADS, LAYERS, instance_configs

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trtllm_child.py")


def test_two_requests_between_two_processes():
    (c_pub, c_sec), (g_pub, g_sec) = kvxfer.keygen(), kvxfer.keygen()
    cname, gname = unique("trt2-ctx"), unique("trt2-gen")
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        c_cfg = instance_configs(tmp, cname, (1, 1), gname, (1, 1), c_sec, g_pub)[0]
        g_cfg = instance_configs(tmp, gname, (1, 1), cname, (1, 1), g_sec, c_pub)[0]
        reqs = [{"ctx_id": 1001, "gen_id": 7, "prompt": 13, "seed": 3, "src": [2, 9, 4, 11], "dst": [30, 5, 17, 21]},
                {"ctx_id": 1002, "gen_id": 8, "prompt": 6, "seed": 4, "src": [12, 13], "dst": [1, 28]}]
        common = {"requests": reqs, "handoff": os.path.join(tmp, "ctx-params.json")}
        jobs = {"context": dict(common, role="context", config=c_cfg),
                "generation": dict(common, role="generation", config=g_cfg)}
        out = run_children(CHILD, jobs)
    for k, (rc, res, err) in out.items():
        assert rc == 0 and res is not None, (k, res, err)
    ctx, gen = out["context"][1], out["generation"][1]
    assert ctx["seen"] == {"1001": "done", "1002": "done"}, out
    assert ctx["states"] == ["DISAGG_CONTEXT_TRANS_IN_PROGRESS"] * 2
    assert gen["seen"] == {"7": "done", "8": "done"} and gen["failures"] == {}, gen
    assert gen["states"] == ["DISAGG_GENERATION_TRANS_COMPLETE"] * 2
    assert gen["equal"] and gen["untouched_zero"], gen
    assert gen["verified"] == 2 * LAYERS * HEADS * (13 + 6) * DIM * 2
