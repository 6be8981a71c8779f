"""A serving process embedding the package: several of its threads wait
for one request, a wait() beside a callback, the objects of an engine
another thread closed, names that are no UTF-8. Each gets its event or an
error naming what is wrong, never a wait that lasts forever."""

import ctypes
import gc
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import kvxfer
from kvxfer import KvxferError, Outcome, Status

from conftest import small_config, unique, wait_until


def test_two_waits_of_one_request_both_get_its_event(pair):
    """Two threads wait() for one request (a connector's step thread and
    its shutdown path): the first to poll its event kept it, and the other
    waited out its timeout (forever with timeout=None), although wait()
    counts its waiters (checked to fail: TimeoutError after 5 s)."""
    ctx, gen = pair
    rid = unique("r")
    rx = gen.receive(rid, 32, ctx.instance)
    got = {}

    def waiter(k):
        try:
            got[k] = gen.wait(rx, 5)
        except Exception as exc:  # noqa: BLE001 - reported below
            got[k] = exc

    threads = [threading.Thread(target=waiter, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: gen._waiting.get(rx.handle) == 2, what="both waits registered")
    ids = ctx.alloc(0, 2)
    tx = ctx.send(rid, 32)
    tx.chunk(0, 32, [(0, ids)]).ready()
    for t in threads:
        t.join()
    assert [getattr(got[k], "outcome", got[k]) for k in range(2)] == [Outcome.READY] * 2, got
    assert got[0] is got[1]
    assert tx.wait(5).outcome == Outcome.DONE
    for r in (rx, tx):
        r.release()
    assert gen.poll(0) == []  # nothing left behind for a poll
    ctx.free(0, ids)


def test_wait_beside_a_callback_gets_the_event(pair):
    """An engine whose events go to a callback: a wait() of one of its
    requests waited out its timeout (forever with timeout=None), the
    callback having taken the event, whether the wait started before the
    event came or after (checked to fail: TimeoutError after 5 s)."""
    ctx, gen = pair
    seen = []
    gen.set_callback(seen.append)
    rid = unique("r")
    rx = gen.receive(rid, 32, ctx.instance)
    got = {}

    def waiter():
        try:
            got["handle"] = gen.wait(rx.handle, 5)  # started before the event
        except Exception as exc:  # noqa: BLE001 - reported below
            got["handle"] = exc

    th = threading.Thread(target=waiter)
    th.start()
    wait_until(lambda: rx.handle in gen._waiting, what="the wait registered")
    ids = ctx.alloc(0, 2)
    tx = ctx.send(rid, 32)
    tx.chunk(0, 32, [(0, ids)]).ready()
    th.join()
    wait_until(lambda: seen, what="the callback's event")
    assert got["handle"] is seen[0] and seen[0].outcome == Outcome.READY, got
    ev = rx.wait(5)  # started after the callback took it
    assert ev is seen[0]
    gen.set_callback(None)
    assert tx.wait(5).outcome == Outcome.DONE
    for r in (rx, tx):
        r.release()
    ctx.free(0, ids)


@pytest.mark.parametrize("held", [False, True])
def test_wait_of_a_bare_handle_after_the_callback_took_its_event(pair, held):
    """A wait() of a request's handle that starts after the callback took
    its event, the Request itself dropped (a server that keeps handles,
    not Requests) or dropped once the event came: it waited out its whole
    timeout, the event being nowhere but on the dropped Request (checked
    to fail: TimeoutError after 5 s). It returns the callback's event at
    once, as often as asked, until the handle is released (then it is
    forgotten: released through the library, once the engine looks)."""
    ctx, gen = pair
    seen = []
    gen.set_callback(seen.append)
    rid = unique("r")
    rx = gen.receive(rid, 32, ctx.instance)
    h = rx.handle
    if not held:
        del rx
        gc.collect()
    ids = ctx.alloc(0, 2)
    tx = ctx.send(rid, 32)
    tx.chunk(0, 32, [(0, ids)]).ready()
    wait_until(lambda: seen, what="the callback's event")
    if held:
        del rx
        gc.collect()
    t0 = time.monotonic()
    for _ in range(2):
        assert gen.wait(h, 5) is seen[0] and seen[0].outcome == Outcome.READY, seen
    assert time.monotonic() - t0 < 1.0
    gen.set_callback(None)
    assert tx.wait(5).outcome == Outcome.DONE
    tx.release()
    ctx.free(0, ids)
    blocks = (ctypes.c_int32 * 2)()
    n, first = ctypes.c_uint32(), ctypes.c_int32()
    assert kvxfer.core.lib.kvxfer_request_blocks(h, 0, blocks, 2, ctypes.byref(n), ctypes.byref(first)) == 0
    gen.free(0, list(blocks[:n.value]))
    assert kvxfer.core.lib.kvxfer_request_release(h) == 0
    gen._prune_called_back()
    assert h not in gen._called_back, gen._called_back


def test_objects_of_a_closed_engine_say_it_was_closed():
    """A request and a fence whose engine another thread closed (a serving
    process's shutdown beside its step loop): each call raised BAD_HANDLE,
    "no such handle (never issued, released or closed)", naming neither
    the engine nor that it was closed, while the engine's own methods said
    CLOSED (checked to fail: BAD_HANDLE)."""
    ctx = kvxfer.Engine(small_config(unique("ctx")))
    ids = ctx.alloc(0, 2)
    rid = unique("r")
    tx = ctx.send(rid, 32)
    fence = tx.chunk(0, 16, [(0, ids[:1])], last=False)
    th = threading.Thread(target=ctx.close)
    th.start()
    th.join()
    calls = {
        "chunk": lambda: tx.chunk(16, 32, [(1, ids[1:])]),
        "cancel": tx.cancel,
        "blocks": tx.blocks,
        "payload": tx.payload,
        "error_message": tx.error_message,
        "set_payload": lambda: tx.set_payload(b"x"),
        "free_blocks": tx.free_blocks,
        "release": tx.release,
        "fence.ready": fence.ready,
        "fence.fail": lambda: fence.fail("no"),
    }
    for name, call in calls.items():
        with pytest.raises(KvxferError) as err:
            call()
        assert err.value.status == Status.CLOSED and repr(ctx.instance) in err.value.message, (name, err.value)
        if not name.startswith("fence"):
            assert repr(rid) in err.value.message, (name, err.value)


def test_engine_call_racing_a_close_says_closed(monkeypatch):
    """An engine call that passed its closed check as another thread's
    close() released the handle: the library answers BAD_HANDLE, which
    alloc() passed on as it was (poll() and wait_peers() said CLOSED)
    (checked to fail: BAD_HANDLE)."""
    e = kvxfer.Engine(small_config(unique("race")))
    real = kvxfer.core.lib.kvxfer_blocks_used

    def used(h, group, out):
        th = threading.Thread(target=e.close)  # the close lands between _live() and the call
        th.start()
        th.join()
        return real(h, group, out)

    monkeypatch.setattr(kvxfer.core.lib, "kvxfer_blocks_used", used)
    with pytest.raises(KvxferError) as err:
        e.used(0)
    assert err.value.status == Status.CLOSED and repr(e.instance) in err.value.message, err.value


# A child whose block_bytes loses the race with another thread's close():
# the close lands after the read's own checks passed (here inside its
# pool_device call), before the bytes are read.
_BLOCK_BYTES_RACE_CHILD = r"""
import json, sys, threading
sys.path.insert(0, %(py)r)
sys.path.insert(0, %(tests)r)
import kvxfer
from conftest import small_config, unique
e = kvxfer.Engine(small_config(unique("race")))
real = kvxfer.core.lib.kvxfer_engine_pool_device

def pool_device(h, out):
    st = real(h, out)
    th = threading.Thread(target=e.close)
    th.start()
    th.join()
    return st

kvxfer.core.lib.kvxfer_engine_pool_device = pool_device
try:
    print(json.dumps({"read": len(e.block_bytes(0, 0))}))
except kvxfer.KvxferError as err:
    print(json.dumps({"status": err.status.name, "message": err.message}))
"""


def test_block_bytes_racing_a_close_says_closed():
    """block_bytes whose engine another thread closed after its closed
    check: it read the engine's pool after the close had unmapped it, and
    the process died of SIGSEGV (checked to fail: the child's exit status
    -11). It raises KvxferError with Status.CLOSED naming the engine."""
    here = os.path.dirname(os.path.abspath(__file__))
    src = _BLOCK_BYTES_RACE_CHILD % {"py": os.path.dirname(here), "tests": here}
    p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, "the child died (%d): %s" % (p.returncode, p.stderr[-2000:])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out.get("status") == "CLOSED" and "race" in out["message"], out


@pytest.mark.parametrize("call,name", [
    (lambda ctx, gen: ctx.send("r\udc80", 32), "id"),
    (lambda ctx, gen: gen.receive("r", 32, "ctx\udcff"), "context"),
    (lambda ctx, gen: ctx.send("r", 32, generation="\ud800gen"), "generation"),
    (lambda ctx, gen: kvxfer.Engine(small_config("inst\udc80")), "config"),
])
def test_name_of_no_utf8_is_named(pair, call, name):
    """A str holding a lone surrogate (os.fsdecode of a non-UTF-8 byte,
    surrogateescape) as a request id or an instance: UnicodeEncodeError
    naming neither the argument nor what to do; in a config the instance
    opened as another name ("inst\\ufffd", which nobody can address)
    (checked to fail)."""
    ctx, gen = pair
    before = kvxfer.handle_count()
    with pytest.raises(ValueError) as err:
        e = call(ctx, gen)
        e.close()
    assert name in str(err.value) and "UTF-8" in str(err.value), err.value
    assert not isinstance(err.value, UnicodeError), repr(err.value)
    assert kvxfer.handle_count() == before
