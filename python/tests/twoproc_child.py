"""One side of test_twoproc.py, run as its own process: takes its role and
node config as JSON in argv[1], prints one JSON line with what it saw, exits 0
only when its side succeeded."""

import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import kvxfer  # noqa: E402


def pattern(global_block, n):
    return ((np.arange(n, dtype=np.uint64) * 7 + global_block * 13 + 1) % 251).astype(np.uint8)


def view(node, block):
    n = node.groups[0].block_bytes
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(node.block_address(0, block)))


def main():
    args = json.loads(sys.argv[1])
    node = kvxfer.Node(args["config"])
    out = {"role": args["role"], "backend": args["config"].get("backend")}
    try:
        node.wait_peers(20000)
        prompt, rid, tpb = args["prompt"], args["request"], node.tokens_per_block
        if args["role"] == "ctx":
            src = node.alloc(0, -(-prompt // tpb))
            for b, blk in enumerate(src):
                view(node, blk)[:] = pattern(b, node.groups[0].block_bytes)
            tx = node.send(rid, prompt, payload=b"tok-42")
            for start in range(0, prompt, args["chunk"]):
                end = min(start + args["chunk"], prompt)
                b0, b1 = start // tpb, -(-end // tpb)
                f = tx.chunk(start, end, [(b0, src[b0:b1])])
                if args.get("fail_fence") and end == prompt:
                    f.fail("injected: the last chunk's kernel failed")
                else:
                    f.ready()
            ev = tx.wait(30)
            out.update(outcome=ev.outcome.name, error=ev.error.name, message=tx.error_message())
            ok = ev.outcome.name == args["want"]
            tx.release()
            node.free(0, src)
        else:
            rx = node.receive(rid, prompt, args["context"])
            ev = rx.wait(30)
            out.update(outcome=ev.outcome.name, error=ev.error.name, message=rx.error_message())
            ok = ev.outcome.name == args["want"]
            if ev.outcome == kvxfer.Outcome.READY:
                first, ids = rx.blocks(0)
                verified = 0
                for i, blk in enumerate(ids):
                    got = view(node, blk)
                    want = pattern(first + i, got.size)
                    if not np.array_equal(got, want):
                        ok = False
                        out["mismatch"] = "global block %d (pool block %d)" % (first + i, blk)
                        break
                    verified += got.size
                out.update(verified=verified, payload=rx.payload().decode())
                node.free(0, ids)
            rx.release()
    finally:
        node.close(10000)
    out["handles_left"] = kvxfer.handle_count()
    print(json.dumps(out), flush=True)
    sys.exit(0 if ok and out["handles_left"] == 0 else 1)


if __name__ == "__main__":
    main()
