"""A prefill and a decode scheduler in two processes, each a
kvxfer.sglang.KVManager over its own SGLang-shaped pool (host memory;
nodes over ucx with CURVE, ipc endpoints): a 13-page prompt in chunks of 5
pages moves into other page ids on the decode side, with its aux slot, every
byte compared. (Checked to fail: with the decode's aux copy removed,
aux_equal is false.)"""

import os
import tempfile

import kvxfer

from conftest import run_children, unique
from sglang_helpers import ITEM, LAYERS, node_cfg

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_child.py")


def test_chunked_prompt_between_two_processes():
    (p_pub, p_sec), (d_pub, d_sec) = kvxfer.keygen(), kvxfer.keygen()
    p_name, d_name = unique("sg2-prefill"), unique("sg2-decode")
    addr = "10.0.0.1:8998"
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        p_ep, d_ep = "ipc://%s/p.sock" % tmp, "ipc://%s/d.sock" % tmp
        p_cfg = node_cfg(p_name, p_ep, p_sec, [{"instance": d_name, "endpoint": d_ep, "public_key": d_pub}])
        d_cfg = node_cfg(d_name, d_ep, d_sec, [{"instance": p_name, "endpoint": p_ep, "public_key": p_pub}],
                         prefill_instances={addr: p_name})
        common = {"addr": addr, "room": 987654321, "seed": 11, "src_pages": list(range(2, 15)), "src_slot": 1,
                  "dst_pages": [31 - i for i in range(13)], "dst_slot": 3, "chunk": 5}
        jobs = {"prefill": dict(common, role="prefill", config=p_cfg),
                "decode": dict(common, role="decode", config=d_cfg)}
        out = run_children(CHILD, jobs)
    for k, (rc, res, err) in out.items():
        assert rc == 0 and res is not None, (k, res, err)
    prefill, decode = out["prefill"][1], out["decode"][1]
    assert prefill["state"] == 4 and decode["state"] == 4, out  # KVPoll.Success
    assert decode["pages_equal"] and decode["aux_equal"] and decode["untouched_zero"], decode
    assert decode["verified"] == 2 * LAYERS * 13 * ITEM
