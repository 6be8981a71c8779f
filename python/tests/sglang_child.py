"""One side of test_sglang_twoproc.py, in its own process: an SGLang
scheduler's calls on kvxfer.sglang's classes (prefill: KVSender; decode:
KVReceiver), over an SGLang-shaped pool in host memory. argv[1] is the
job's JSON; the last stdout line is the result's."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kvxfer.sglang import KVManager, KVPoll, KVReceiver, KVSender  # noqa: E402

from sglang_helpers import Pool, poll_until  # noqa: E402


def main():
    job = json.loads(sys.argv[1])
    pool = Pool()
    src = job["src_pages"]
    pool.fill(src, seed=job["seed"])  # the prefill's bytes; the decode side rebuilds them to compare
    pool.fill_aux(job["src_slot"], seed=job["seed"] + 1)
    want_pages, want_aux = pool.pages(src), pool.aux_slot(job["src_slot"])
    if job["role"] == "decode":
        pool = Pool()
    mgr = KVManager(pool.args, job["role"], None, False, config=job["config"])
    out = {}
    try:
        mgr.node.wait_peers(30000)
        if job["role"] == "prefill":
            s = KVSender(mgr, job["addr"], job["room"], [0], 0)
            poll_until([s], lambda st: st[0] != KVPoll.Bootstrapping)
            s.init(len(src), job["src_slot"])
            for a in range(0, len(src), job["chunk"]):
                s.send(src[a:a + job["chunk"]])
            st = poll_until([s], lambda st: st[0] in (KVPoll.Success, KVPoll.Failed), timeout=60)
            out = {"state": st[0], "reason": s.reason}
        else:
            r = KVReceiver(mgr, job["addr"], job["room"])
            r.init(0)
            poll_until([r], lambda st: st[0] != KVPoll.Bootstrapping)
            r.send_metadata(job["dst_pages"], job["dst_slot"], None, decode_prefix_len=0)
            st = poll_until([r], lambda st: st[0] in (KVPoll.Success, KVPoll.Failed), timeout=60)
            got = pool.pages(job["dst_pages"])
            out = {"state": st[0], "reason": r.reason, "pages_equal": bool((got == want_pages).all()),
                   "verified": int(got.size), "aux_equal": pool.aux_slot(job["dst_slot"]) == want_aux,
                   "untouched_zero": not pool.pages([0, 1]).any()}
    finally:
        mgr.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
