"""kvxfer.sglang driven as SGLang's DecodePreallocQueue drives a backend
(python/sglang/srt/disaggregation/decode.py of SGLang's repository, commit
0035ca4, the one kvxfer/sglang.py cites), lines copied as they read there:

  add():                      prefill_info = mgr.prefill_info_table.get(addr)
                              (_resolve_prefill_dp_rank), for every request
                              that is not a warmup (fake) one
  _ensure_prefill_info():     mgr.try_ensure_parallel_info(addr)
  _update_handshake_waiters(): once every queued request is waiting for
                              memory, polls only if one receiver's
                              conclude_state is KVPoll.Failed; a poll other
                              than Bootstrapping, WaitingForInput or Failed
                              is a ValueError there.
  pop_preallocated():         receiver.send_metadata(...), then, for a
                              request pause_generation(mode="retract")
                              retracted (is_rebootstrap),
                              mgr.submit_prefill_recompute(receiver,
                              req.build_rebootstrap_payload())

And SGLang's runtime role switch (python/sglang/srt/disaggregation/
role_switch.py, commit d68ee24): _reject_reason reads the current KV
manager's supports_role_switch, with no default, once
--enable-pd-role-switch is set.

SGLang is not installed here: the scheduler lines are stand-ins that read
the adapter's attributes the way decode.py reads them."""

import tempfile
import time

import pytest

import kvxfer
from kvxfer.sglang import KVManager, KVPoll, KVReceiver

from conftest import unique
from sglang_helpers import Pool, node_cfg

ADDR = "10.0.0.1:8998"


def _resolve_prefill_dp_rank(mgr, addr, disagg_prefill_dp_rank=None, room=0):
    """decode.py DecodePreallocQueue._resolve_prefill_dp_rank."""
    prefill_info = mgr.prefill_info_table.get(addr)
    if prefill_info is None:
        return None
    if disagg_prefill_dp_rank is not None:
        return disagg_prefill_dp_rank
    if prefill_info.dp_size == 1:
        return 0
    return None


def _add(mgr, addr, room):
    """decode.py DecodePreallocQueue.add (a request that is not fake)."""
    receiver = KVReceiver(mgr=mgr, bootstrap_addr=addr, bootstrap_room=room)
    rank = _resolve_prefill_dp_rank(mgr, addr, room=room)
    if rank is not None:
        receiver.init(rank)
        return receiver, False
    # pending: _resolve_pending_reqs -> _ensure_prefill_info
    assert mgr.try_ensure_parallel_info(addr) is True
    rank = _resolve_prefill_dp_rank(mgr, addr, room=room)
    assert rank == 0, "would query the prefill's bootstrap server over HTTP (kvxfer runs none)"
    receiver.init(rank)
    return receiver, True


def _update_handshake_waiters(queue):
    """decode.py DecodePreallocQueue._update_handshake_waiters (one rank)."""
    if all(w for _, w in queue) and not any(r.conclude_state == KVPoll.Failed for r, _ in queue):
        return queue
    out = []
    for r, w in queue:
        poll = r.poll()
        if poll == KVPoll.Bootstrapping:
            out.append((r, w))
        elif poll == KVPoll.WaitingForInput:
            out.append((r, True))
        elif poll == KVPoll.Failed:
            out.append((r, "failed"))
        else:
            raise ValueError("Unexpected poll case: %s" % poll)
    return out


def test_decode_prealloc_queue_reads_what_sglang_reads():
    pub, sec = kvxfer.keygen()
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        cfg = node_cfg(unique("sgq-decode"), "ipc://%s/d.sock" % tmp, sec, [], prefill_instances={ADDR: "p"})
        before = kvxfer.handle_count()
        mgr = KVManager(Pool().args, "decode", None, False, config=cfg)
        try:
            a, _ = _add(mgr, ADDR, 41)
            b, _ = _add(mgr, ADDR, 42)
            queue = [(a, False), (b, False)]
            queue = _update_handshake_waiters(queue)
            queue = _update_handshake_waiters(queue)  # the adapter says Bootstrapping once
            assert [w for _, w in queue] == [True, True]
            # Both wait for memory (no page free yet); the router aborts a.
            a.abort()
            queue = _update_handshake_waiters(queue)
            assert [w for _, w in queue] == ["failed", True], "the aborted receiver is never polled again"
        finally:
            mgr.close()
        assert kvxfer.handle_count() == before



def test_retract_rebootstrap_fails_the_request_alone():
    """SGLang's decode re-requests a retracted request's prefill through the
    manager (CommonKVManager.submit_prefill_recompute: a /generate to the
    prefill's HTTP port, which kvxfer's backend does not know). The call
    must not raise into pop_preallocated (an AttributeError there ends the
    decode scheduler, every request with it): the request fails alone,
    Failed once its cancelled receive ended, failure_exception naming
    the rebootstrap and what to do. (Checked to fail: without the method,
    AttributeError.)"""
    (_, sec), (p_pub, _) = kvxfer.keygen(), kvxfer.keygen()
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        # The prefill is a peer (its process not started): the receive opens.
        peers = [{"instance": "p", "endpoint": "ipc://%s/p.sock" % tmp, "public_key": p_pub}]
        cfg = node_cfg(unique("sgq-decode"), "ipc://%s/d.sock" % tmp, sec, peers, prefill_instances={ADDR: "p"})
        before = kvxfer.handle_count()
        mgr = KVManager(Pool().args, "decode", None, False, config=cfg)
        try:
            receiver, _ = _add(mgr, ADDR, 43)
            queue = _update_handshake_waiters(_update_handshake_waiters([(receiver, False)]))
            assert queue == [(receiver, True)]
            # pop_preallocated, for a request with is_rebootstrap:
            receiver.send_metadata([5, 6], 1, [], decode_prefix_len=0)
            assert receiver.poll() == KVPoll.Transferring, receiver.reason
            mgr.submit_prefill_recompute(receiver, {"rid": "r-43", "bootstrap_room": 43})
            deadline = time.monotonic() + 10
            while receiver.poll() != KVPoll.Failed:
                assert time.monotonic() < deadline, receiver.reason
                time.sleep(0.002)
            with pytest.raises(RuntimeError, match="rebootstrap") as exc:
                receiver.failure_exception()
            assert "r-43" in str(exc.value) and "retract" in str(exc.value)
            receiver.clear()
        finally:
            mgr.close()
        assert kvxfer.handle_count() == before


def _reject_reason(km, backend="nixl"):
    """role_switch.py _reject_reason's backend check (the checks before it,
    --enable-pd-role-switch set, pass)."""
    if km is not None and not km.supports_role_switch:
        return "transfer backend %r does not support runtime role switch" % backend
    return None


def test_role_switch_is_refused_by_name():
    """A PD role switch asked of a kvxfer instance is refused with SGLang's
    own message (kvxfer's manager cannot be torn down and rebuilt for the
    other role), not an AttributeError in the scheduler. (Checked to fail:
    without supports_role_switch, AttributeError.)"""
    pub, sec = kvxfer.keygen()
    with tempfile.TemporaryDirectory(prefix="kvx") as tmp:
        cfg = node_cfg(unique("sgq-decode"), "ipc://%s/d.sock" % tmp, sec, [], prefill_instances={ADDR: "p"})
        mgr = KVManager(Pool().args, "decode", None, False, config=cfg)
        try:
            assert _reject_reason(mgr) == "transfer backend 'nixl' does not support runtime role switch"
        finally:
            mgr.close()
