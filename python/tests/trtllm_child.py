"""One side of test_trtllm_twoproc.py, in its own process: a TensorRT-LLM
rank's executor calls on kvxfer.trtllm.KvxferCacheTransceiver, over a KV
cache manager stand-in in host memory (trtllm_helpers). argv[1] is the
job's JSON; the last stdout line is the result's.

The context side writes each request's context_phase_params (req_id,
disagg_info_endpoint) to a file once respond_and_send_async set them: the
disaggregated server's hand-off of the context response's params to the
generation request, which the generation side waits for."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kvxfer.trtllm import KvxferCacheTransceiver  # noqa: E402

from trtllm_helpers import (CacheTransceiverConfig, DisaggregatedParams, KVCacheManager, LlmRequest,  # noqa: E402
                            Mapping, reap_ctx, reap_gen)


def _handoff(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError("no context params at %s in %d s" % (path, timeout))
        time.sleep(0.01)
    with open(path) as f:
        return json.load(f)


def main():
    job = json.loads(sys.argv[1])
    mapping = Mapping()
    mgr = KVCacheManager(mapping)
    x = KvxferCacheTransceiver(mapping, None, mgr, None, CacheTransceiverConfig(), config=job["config"])
    out = {}
    try:
        x.node.wait_peers(30000)
        reqs = job["requests"]
        if job["role"] == "context":
            sent = []
            for r in reqs:
                mgr.add_sequence(r["ctx_id"], r["src"])
                mgr.fill(r["src"], seed=r["seed"])
                req = LlmRequest(r["ctx_id"], r["prompt"], DisaggregatedParams(request_type="context_only"))
                x.respond_and_send_async(req)
                sent.append(req)
            params = {str(q.request_id): {"req_id": q.context_phase_params.req_id,
                                          "endpoint": q.context_phase_params.disagg_info_endpoint} for q in sent}
            tmp = job["handoff"] + ".tmp"
            with open(tmp, "w") as f:
                json.dump(params, f)
            os.rename(tmp, job["handoff"])
            seen = reap_ctx(x, [q.request_id for q in sent], timeout=60)
            out = {"seen": {str(k): v for k, v in seen.items()}, "states": [q.state.name for q in sent]}
        else:
            params = _handoff(job["handoff"])
            got = []
            for r in reqs:
                p = params[str(r["ctx_id"])]
                mgr.add_sequence(r["gen_id"], r["dst"])
                req = LlmRequest(r["gen_id"], r["prompt"], DisaggregatedParams(
                    request_type="generation_only", ctx_request_id=p["req_id"], ctx_info_endpoint=p["endpoint"]))
                x.request_and_receive_async(req)
                got.append(req)
            seen = reap_gen(x, [q.request_id for q in got], timeout=60)
            # The context's bytes, rebuilt from its seeds in a manager of its shape.
            want = KVCacheManager(Mapping())
            equal, verified = True, 0
            for r in reqs:
                want.fill(r["src"], seed=r["seed"])
                n = r["prompt"]
                for i, (s, d) in enumerate(zip(r["src"], r["dst"])):
                    tokens = min(want.tokens_per_block, n - i * want.tokens_per_block)
                    a = want.bytes_view()[s, :, :, :, :tokens]
                    b = mgr.bytes_view()[d, :, :, :, :tokens]
                    equal = equal and bool((a == b).all()) and bool(a.any())
                    verified += int(a.size)
            dst = {b for r in reqs for b in r["dst"]}
            untouched = [b for b in range(want.blocks_in_primary_pool) if b not in dst]
            out = {"seen": {str(k): v for k, v in seen.items()}, "states": [q.state.name for q in got],
                   "equal": equal, "verified": verified,
                   "untouched_zero": not mgr.bytes_view()[untouched].any(), "failures": x.failures}
    finally:
        x.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
