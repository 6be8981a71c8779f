"""One side of test_twoproc.py, run as its own process: takes its role and
node config as JSON in argv[1], prints one JSON line with what it saw, exits 0
only when its side succeeded."""

import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import kvxfer  # noqa: E402


def pattern(global_block, n):
    return ((np.arange(n, dtype=np.uint64) * 7 + global_block * 13 + 1) % 251).astype(np.uint8)


def view(node, block):
    n = node.groups[0].block_bytes
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(node.block_address(0, block)))


def connector_side(args):
    """One vLLM instance through the worker connector over its own KV cache
    (a torch tensor the "framework" allocated): "producer" hands a prompt
    over in chunks, "consumer" loads it into its block table and checks
    every element against the truth both sides compute from one seed."""
    from types import SimpleNamespace

    import torch

    from kvxfer.connector import KvxferSchedulerConnector, KvxferWorkerConnector

    layers, heads, head, tpb, nblocks = 4, 2, 8, 16, 64
    side, prompt, name = args["side"], args["prompt"], args["config"]["instance"]
    cache = torch.zeros((nblocks, layers, 2, heads, tpb, head), dtype=torch.bfloat16)
    kv = {"model.layers.%d.self_attn" % i: cache[:, i].transpose(2, 3) for i in range(layers)}
    cfg = dict(args["config"], layout={"layers": layers, "kv_heads": heads, "head_dim": head, "dtype_bytes": 2,
                                       "tokens_per_block": tpb})
    w = KvxferWorkerConnector(cfg, role=side)
    s = KvxferSchedulerConnector(name, side, tpb)
    w.register_kv_caches(kv)
    out = {"side": side, "node": isinstance(w.engine, kvxfer.Node)}
    torch.manual_seed(11)
    truth = torch.randn((layers, 2, prompt, heads, head)).to(torch.bfloat16)
    nb = -(-prompt // tpb)
    ok = False
    try:
        w.engine.wait_peers(20000)
        deadline = time.monotonic() + 30
        if side == "producer":
            req = SimpleNamespace(request_id="cmpl-1", prompt_token_ids=list(range(prompt)),
                                  kv_transfer_params={"do_remote_decode": True}, status="FINISHED_LENGTH_CAPPED")
            blocks = [list(range(nblocks - 1, nblocks - 1 - 3 * nb, -3))]  # not contiguous, as vLLM's
            s.update_state_after_alloc(req, blocks, 0)
            done = 0
            while done < prompt:  # chunked prefill, 64 tokens a step
                step = min(64, prompt - done)
                w.bind_connector_metadata(s.build_connector_meta(SimpleNamespace(num_scheduled_tokens={"cmpl-1": step})))
                w.start_load_kv(None)
                for i, layer in enumerate(kv.values()):
                    for t in range(done, done + step):
                        layer[blocks[0][t // tpb], :, t % tpb] = truth[i, :, t]
                w.wait_for_save()
                w.clear_connector_metadata()
                done += step
            keep, params = s.request_finished(req, blocks)
            out["params"] = params
            while not ok and time.monotonic() < deadline:
                sent, _ = w.get_finished({"cmpl-1"})
                ok = "cmpl-1" in (sent or ())
                time.sleep(0.001)  # poll with the deadline above
        else:
            params = {"do_remote_prefill": True, "remote_instance": args["context"], "remote_request_id": "cmpl-1"}
            req = SimpleNamespace(request_id="cmpl-1-decode", prompt_token_ids=list(range(prompt)),
                                  kv_transfer_params=params)
            s.get_num_new_matched_tokens(req, 0)
            blocks = [list(range(1, 1 + 2 * nb, 2))]
            s.update_state_after_alloc(req, blocks, prompt)
            w.bind_connector_metadata(s.build_connector_meta(SimpleNamespace(num_scheduled_tokens={})))
            w.start_load_kv(None)
            w.clear_connector_metadata()
            loaded = False
            while not loaded and time.monotonic() < deadline:
                _, recv = w.get_finished(set())
                loaded = "cmpl-1-decode" in (recv or ())
                time.sleep(0.001)  # poll with the deadline above
            verified = 0
            if loaded and not w.failed:
                ok = True
                for i, layer in enumerate(kv.values()):
                    for t in range(prompt):
                        got = layer[blocks[0][t // tpb], :, t % tpb]
                        if not torch.equal(got, truth[i, :, t]):
                            ok = False
                            out["mismatch"] = "layer %d token %d" % (i, t)
                            break
                        verified += got.numel() * got.element_size()
                    if not ok:
                        break
            out.update(loaded=loaded, verified=verified)
        out["failed"] = {k: str(v) for k, v in w.failed.items()}
    finally:
        w.shutdown(10000)
    out["handles_left"] = kvxfer.handle_count()
    print(json.dumps(out), flush=True)
    sys.exit(0 if ok and out["handles_left"] == 0 else 1)


def gpu_side(args):
    """One side over "GPU" memory of the fake CUDA driver (args["cuda"]:
    the library, which KVXFER_LIBCUDA also names): the framework's per-layer
    NHD tensors, each its own allocation on GPU args["device"] (default 0), given
    to the node as kv_memory (the node's GPU is the tensors': the config
    names none). The
    context fills its tensors' blocks with the pattern (host to device) and
    hands the prompt over in chunks; the generation side receives into
    blocks of its own choosing and checks every byte of them (device to
    host)."""
    from fakecuda import DeviceTensor, Driver

    layers, heads, head, tpb, nblocks = 4, 2, 8, 16, 32
    dev = args.get("device", 0)
    drv = Driver(args["cuda"], dev)
    shape = (2, nblocks, tpb, heads, head)
    half = nblocks * tpb * heads * head * 2  # the K (or V) half of a layer's tensor
    # A tensor per layer, each its own allocation, as vLLM's per-layer
    # caches (cudaipc registers the region by the allocations they lie in).
    tensors = [DeviceTensor(shape, drv.alloc(2 * half), dev) for i in range(layers)]
    cfg = dict(args["config"], layout={"layers": layers, "kv_heads": heads, "head_dim": head, "dtype_bytes": 2,
                                       "tokens_per_block": tpb},
               memory=kvxfer.kv_memory("nhd", tensors))
    node = kvxfer.Node(cfg)
    node.alloc(0, node.groups[0].blocks)  # the framework owns every block id, as the connector's
    prompt, rid, role = args["prompt"], args["request"], args["role"]
    nb = -(-prompt // tpb)
    part = tpb * heads * head * 2  # one block of one layer's K (or V)
    out = {"role": role, "backend": cfg.get("backend")}
    ok = False
    try:
        node.wait_peers(20000)
        if role == "ctx":
            src = list(range(nblocks - 1, nblocks - 1 - 2 * nb, -2))  # not contiguous, as a framework's
            for b, blk in enumerate(src):
                for i, t in enumerate(tensors):
                    for kv in range(2):
                        drv.htod(t.data_ptr() + kv * half + blk * part, pattern(b * 8 + i * 2 + kv, part).tobytes())
            tx = node.send(rid, prompt, payload=b"tok-42")
            for start in range(0, prompt, args["chunk"]):
                end = min(start + args["chunk"], prompt)
                b0, b1 = start // tpb, -(-end // tpb)
                tx.chunk(start, end, [(b0, src[b0:b1])]).ready()
            ev = tx.wait(30)
            out.update(outcome=ev.outcome.name, error=ev.error.name, message=tx.error_message())
            ok = ev.outcome.name == "DONE"
            tx.release()
        else:
            dst = list(range(1, 1 + 2 * nb, 2))
            rx = node.receive(rid, prompt, args["context"], blocks=[dst])
            ev = rx.wait(30)
            out.update(outcome=ev.outcome.name, error=ev.error.name, message=rx.error_message())
            ok = ev.outcome == kvxfer.Outcome.READY
            verified = 0
            if ok:
                for b, blk in enumerate(dst):
                    for i, t in enumerate(tensors):
                        for kv in range(2):
                            got = drv.dtoh(t.data_ptr() + kv * half + blk * part, part)
                            if got != pattern(b * 8 + i * 2 + kv, part).tobytes():
                                ok = False
                                out["mismatch"] = "block %d (framework block %d) layer %d part %d" % (b, blk, i, kv)
                                break
                            verified += part
                out.update(verified=verified, payload=rx.payload().decode())
            rx.release()
    finally:
        node.close(10000)
    out["handles_left"] = kvxfer.handle_count()
    print(json.dumps(out), flush=True)
    sys.exit(0 if ok and out["handles_left"] == 0 else 1)


def main():
    args = json.loads(sys.argv[1])
    if "side" in args:
        return connector_side(args)
    if "cuda" in args:
        return gpu_side(args)
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
                elif args.get("hold") and start > 0:
                    # Only the first chunk is written: say so and wait to be
                    # stopped (SIGSTOP) and killed by the test.
                    print(json.dumps({"held": True}), flush=True)
                    time.sleep(600)
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
