"""Closing an engine: a close that times out keeps the caller's memory
alive for good, a refused close keeps the handle, blocked polls and waits
wake with CLOSED, requests the close cancels say CLOSED."""

import ctypes
import gc
import inspect
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref

import numpy as np
import pytest

import kvxfer
from kvxfer import KvxferError, Outcome, Status
from kvxfer.connector import KvxferWorkerConnector

from conftest import small_config, unique, wait_until


def in_library_call(thread, method, call):
    """Waits (10 s deadline) until thread's innermost Python frame is
    method at the line that calls call: the thread is in the library (or
    about to enter it)."""
    lines, first = inspect.getsourcelines(method)
    line = first + next(i for i, text in enumerate(lines) if call + "(" in text)
    code = method.__code__

    def there():
        f = sys._current_frames().get(thread.ident)
        return f is not None and f.f_code is code and f.f_lineno == line

    wait_until(there, what="%s in %s" % (thread.name, call))


def test_refused_close_keeps_the_handle():
    before = kvxfer.handle_count()
    e = kvxfer.Engine(small_config(unique("refused")))
    h = e.handle
    with pytest.raises(KvxferError) as err:
        e.close(timeout_ms=-1)
    assert err.value.status == Status.INVALID_ARGUMENT and "-1" in err.value.message
    with pytest.raises(ValueError, match="timeout_ms = 4294967296"):
        e.close(timeout_ms=1 << 32)
    assert e.handle == h and kvxfer.handle_count() == before + 1
    assert e.used(0) == 0  # still open
    e.close()
    assert e.handle == 0 and kvxfer.handle_count() == before
    with pytest.raises(KvxferError) as err:
        e.alloc(0, 1)
    assert err.value.status == Status.CLOSED and "closed" in err.value.message


def blocked_across_close(engine, name, fn, method, call):
    """Runs fn in a thread until it is in the library (method's call of
    it), closes engine, and returns (fn's result or KvxferError status,
    seconds it took)."""
    res = {}

    def run():
        t = time.monotonic()
        try:
            res["got"] = fn()
        except KvxferError as e:
            res["got"] = e.status
        res["s"] = time.monotonic() - t

    th = threading.Thread(target=run, name=name)
    th.start()
    in_library_call(th, method, call)
    engine.close()
    th.join(20)
    assert "s" in res, "%s still blocked 20 s after the close" % name
    return res["got"], res["s"]


def test_close_wakes_a_blocked_poll():
    """poll(30 s) blocked in another thread on an idle engine (no event
    will come to wake it) returns CLOSED at once when the engine closes."""
    gen = kvxfer.Engine(small_config(unique("gen")))
    got, secs = blocked_across_close(gen, "poller", lambda: gen.poll(30000), kvxfer.Engine._poll_raw, "kvxfer_poll")
    assert got == Status.CLOSED and secs < 10, (got, secs)


def test_close_ends_a_wait():
    """wait(30 s) for a request the close cancels ends at once: with the
    request's event (CANCELLED, CLOSED) when it came first, else CLOSED."""
    ctx = kvxfer.Engine(small_config(unique("ctx")))
    gen = kvxfer.Engine(small_config(unique("gen")))
    rx = gen.receive("blocked", 32, ctx.instance)
    got, secs = blocked_across_close(gen, "waiter", lambda: rx.wait(30), kvxfer.Engine._poll_raw, "kvxfer_poll")
    assert secs < 10, secs
    if isinstance(got, kvxfer.Event):
        assert (got.outcome, got.error) == (Outcome.CANCELLED, Status.CLOSED), got
    else:
        assert got == Status.CLOSED, got
    ctx.close()


def test_close_wakes_wait_peers():
    """A node's wait_peers(60 s) for a peer that never comes returns CLOSED
    at once when the node closes."""
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        node = kvxfer.Node({"instance": unique("n"), "model": "Llama-3.1-8B", "tokens_per_block": 16,
                            "pool_bytes": 4 << 20, "backend": "shm", "workers": 2, "insecure": True,
                            "bind": "ipc://%s/a.sock" % d,
                            "peers": [{"instance": "ghost", "endpoint": "ipc://%s/g.sock" % d}]})
        got, secs = blocked_across_close(node, "wait_peers", lambda: node.wait_peers(60000), kvxfer.Node.wait_peers,
                                         "kvxfer_node_wait_peers")
    assert got == Status.CLOSED and secs < 10, (got, secs)


def test_requests_cancelled_by_close_say_closed():
    ctx = kvxfer.Engine(small_config(unique("ctx")))
    gen = kvxfer.Engine(small_config(unique("gen")))
    seen = []
    gen.set_callback(seen.append)
    rx = gen.receive("cancelled-by-close", 32, ctx.instance)
    gen.close()
    assert [(e.request, e.outcome, e.error) for e in seen] == [(rx.handle, Outcome.CANCELLED, Status.CLOSED)]
    ctx.close()


def test_poll_leaves_a_waited_event_to_its_wait(pair):
    """A thread poll()ing the engine does not take the event another
    thread's wait() is waiting for."""
    ctx, gen = pair
    src = ctx.alloc(0, 2)
    stop, polled = threading.Event(), []

    def poller():
        while not stop.is_set():
            polled.extend(gen.poll(20))

    th = threading.Thread(target=poller)
    th.start()
    try:
        for i in range(5):
            rx = gen.receive("waited-%d" % i, 32, ctx.instance)
            # The wait begins before the event can exist: an event poll()
            # took before a wait() began is poll()'s (as documented), so a
            # wait() started after the chunk would race the poller.
            got = []
            waiter = threading.Thread(target=lambda: got.append(rx.wait(5)))
            waiter.start()
            deadline = time.monotonic() + 5
            while rx.handle not in gen._waiting:
                assert time.monotonic() < deadline, "wait() never began"
                time.sleep(0.001)
            tx = ctx.send("waited-%d" % i, 32)
            tx.chunk(0, 32, [(0, src)], fenced=False)
            waiter.join(10)
            assert got and got[0].outcome == Outcome.READY
            assert tx.wait(5).outcome == Outcome.DONE
            gen.free(0, rx.blocks(0)[1])
            rx.release()
            tx.release()
    finally:
        stop.set()
        th.join()
    assert polled == []
    ctx.free(0, src)


def test_connector_shutdown_keeps_a_refused_engine():
    import torch

    cache = torch.zeros((8, 4, 2, 2, 16, 8), dtype=torch.bfloat16)
    w = KvxferWorkerConnector({"instance": unique("w"), "workers": 2,
                               "layout": {"layers": 4, "kv_heads": 2, "head_dim": 8, "dtype_bytes": 2,
                                          "tokens_per_block": 16}})
    w.register_cross_layers_kv_cache(cache)
    with pytest.raises(KvxferError) as e:
        w.shutdown(timeout_ms=-1)
    assert e.value.status == Status.INVALID_ARGUMENT and w.engine is not None and w.engine.handle
    w.shutdown()
    assert w.engine is None


def test_engine_dropped_without_close_keeps_its_memory():
    """An engine dropped without close() is still open in the library,
    which still writes into its memory: the array stays referenced (here
    a transfer lands in it after the caller dropped both), until close()."""
    before = kvxfer.handle_count()
    ctx = kvxfer.Engine(small_config(unique("ctx")))
    arr = np.zeros(1 << 20, np.uint8)
    gen = kvxfer.Engine(small_config(unique("gen")), memory=arr)
    ref, gen_ref = weakref.ref(arr), weakref.ref(gen)
    rx = gen.receive("dropped", 32, ctx.instance)
    rx_handle = rx.handle
    del arr, gen, rx
    gc.collect()
    assert ref() is not None, "the memory of an engine dropped without close() was freed"
    src = ctx.alloc(0, 2)
    for b in src:
        ctypes.memset(ctx.block_address(0, b), 0x5A, ctx.groups[0].block_bytes)
    tx = ctx.send("dropped", 32)
    tx.chunk(0, 32, [(0, src)], fenced=False)
    assert tx.wait().outcome == Outcome.DONE
    assert int((ref() == 0x5A).sum()) == 2 * ctx.groups[0].block_bytes
    gen = gen_ref()
    assert gen.wait(rx_handle).outcome == Outcome.READY
    gen.close()
    del gen
    gc.collect()
    assert ref() is None, "the memory of a closed engine still referenced"
    tx.release()
    ctx.free(0, src)
    ctx.close()
    assert kvxfer.handle_count() == before


def test_kv_memory_tensors_outlive_an_engine_dropped_without_close():
    """config["memory"] = kv_memory(...) without kv_caches=: the tensors
    behind its addresses are kept alive by the engine, until close()."""
    import torch

    tensors = [torch.zeros((2, 8, 2, 16, 8), dtype=torch.bfloat16) for _ in range(4)]
    refs = [weakref.ref(t) for t in tensors]
    cfg = small_config(unique("gen"), memory=kvxfer.kv_memory("hnd", tensors))
    del cfg["pool_bytes"]
    gen = kvxfer.Engine(cfg)
    gen_ref = weakref.ref(gen)
    del tensors, cfg, gen
    gc.collect()
    assert all(r() is not None for r in refs), "kv_memory tensors of an open engine were freed"
    gen_ref().close()
    gc.collect()
    assert all(r() is None for r in refs), "kv_memory tensors of a closed engine still referenced"


def test_close_from_its_own_callback_is_refused(pair):
    """close() from the engine's own callback would wait for that callback
    forever: it is refused (INVALID_ARGUMENT, naming the misuse) and the
    engine stays open."""
    ctx, gen = pair
    got, done = [], threading.Event()

    def cb(ev):
        try:
            ctx.close(1000)
        except KvxferError as e:
            got.append(e)
        done.set()

    ctx.set_callback(cb)
    src = ctx.alloc(0, 2)
    rx = gen.receive("cb-close", 32, ctx.instance)
    tx = ctx.send("cb-close", 32)
    tx.chunk(0, 32, [(0, src)], fenced=False)
    wait_until(done.is_set, what="the callback's close() to return")
    assert len(got) == 1 and got[0].status == Status.INVALID_ARGUMENT, got
    assert "called from its own callback" in got[0].message, got[0].message
    assert ctx.handle and ctx.used(0) == 2  # still open
    assert rx.wait().outcome == Outcome.READY
    gen.free(0, rx.blocks(0)[1])
    rx.release()
    tx.release()
    ctx.free(0, src)


EXIT_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exit_child.py")


def test_exit_with_callbacks_and_open_engines_is_clean():
    """A process that exits with engines open and their callbacks running
    exits cleanly: the module's exit hook unsets each callback and closes
    each engine before the interpreter goes away (a callback into a
    finalizing interpreter crashed it most runs)."""
    for run in range(6):
        p = subprocess.run([sys.executable, EXIT_CHILD], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stdout.startswith("exiting"), (run, p.returncode, p.stdout, p.stderr[-2000:])
        for bad in ("Segmentation", "signal", "fatal", "Traceback"):
            assert bad not in p.stderr, (run, p.stderr[-2000:])


EXIT_NOTHREAD_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exit_nothread_child.py")


def test_exit_closes_open_engines_where_no_thread_can_start():
    """Python 3.12 refuses to start a thread in an atexit handler; close()
    of the main thread runs the library's close in a thread of its own.
    The module's exit hook must close every engine still open (an Engine
    and a Node) all the same, without a warning, not leave them open with
    "closing engine ... failed: can't create new thread" (the child makes
    thread starts fail at exit on any version)."""
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        p = subprocess.run([sys.executable, EXIT_NOTHREAD_CHILD, d], capture_output=True, text=True, timeout=60)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and len(lines) == 2 and lines[0].startswith("open "), (p.returncode, p.stdout,
                                                                                    p.stderr[-2000:])
    assert int(lines[0].split()[1]) >= 2, lines
    assert lines[1] == "after exit: handles 0 engine 0 node 0", (lines[1], p.stderr[-2000:])
    for bad in ("Warning", "Traceback", "Segmentation", "fatal"):
        assert bad not in p.stderr, p.stderr[-2000:]


def test_close_runs_in_the_calling_thread_where_no_thread_can_start(monkeypatch):
    """close() in the main thread where threading refuses to start a thread
    (RuntimeError, as at interpreter exit on Python 3.12): the library's
    close runs in the main thread instead, and the engine is closed, its
    handle released, not left half-closed with its handle open."""
    before = kvxfer.handle_count()
    e = kvxfer.Engine(small_config(unique("nothread")))
    h = e.handle

    def start(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", start)
    e.close()
    monkeypatch.undo()
    assert e.handle == 0 and kvxfer.handle_count() == before
    assert h not in kvxfer.core._open
    e.close()  # idempotent


def test_concurrent_close_does_not_hold_memory_a_finished_close_released(monkeypatch):
    """Two threads close() one engine: the first's close finishes (the
    library releases the handle) before it sets engine.handle = 0; the
    second's kvxfer_engine_close then answers BAD_HANDLE. That is no close
    that failed to finish: the memory must not be kept for the rest of the
    process with a warning that peers may still write into it, and the
    second caller hears CLOSED (another close), not BAD_HANDLE."""
    arr = np.zeros(1 << 20, np.uint8)
    e = kvxfer.Engine(small_config(unique("twice")), memory=arr)
    ref = weakref.ref(arr)
    del arr
    real = kvxfer.core.lib.kvxfer_engine_close
    first_done, second_done = threading.Event(), threading.Event()

    def close(h, ms):
        st = real(h, ms)
        if not first_done.is_set():  # the first caller: let the second in before it returns
            first_done.set()
            assert second_done.wait(20)
        return st

    monkeypatch.setattr(kvxfer.core.lib, "kvxfer_engine_close", close)
    held = len(kvxfer.core._held)
    res = {}

    def first():
        res["first"] = e.close()

    th = threading.Thread(target=first)
    th.start()
    assert first_done.wait(20)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # "did not finish closing" would raise here
            with pytest.raises(KvxferError) as err:
                e.close()
    finally:
        second_done.set()
        th.join(20)
    assert err.value.status == Status.CLOSED, err.value
    assert res == {"first": None} and e.handle == 0
    assert len(kvxfer.core._held) == held, "a close that finished left the engine's memory held for good"
    del e, err  # (the exception's traceback holds close()'s frame, and so the engine)
    gc.collect()
    assert ref() is None, "the memory of a closed engine is still referenced"
