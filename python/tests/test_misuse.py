"""Misuse of the Python package and the C ABI an embedder can make: a
buffer resized under the engine, freeing the caller's own blocks, a fork
after import, config keys one of which would be ignored, bad timeouts and
groups. Each is refused with an error naming it, never a crash, a hang or
pages handed out twice."""

import os
import subprocess
import sys
import textwrap

import pytest

import kvxfer
from kvxfer import KvxferError, Outcome, Status

from conftest import small_config, unique

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)


def _child(code, timeout=60):
    """Runs code in a fresh interpreter with this package and the tests'
    helpers importable; (returncode, output)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PKG, HERE]))
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def test_bytearray_pool_cannot_be_resized_under_the_engine():
    """Engine(memory=bytearray) documents the buffer as kept alive by the
    engine, but _buffer drops its buffer export at once: the bytearray can
    then grow, moving its bytes, and the engine keeps the old address."""
    pool = bytearray(1 << 20)
    e = kvxfer.Engine(small_config(unique("ba")), memory=pool)
    try:
        with pytest.raises(BufferError):
            pool.extend(b"\0" * (64 << 20))  # must be refused while the engine uses the buffer
    finally:
        e.close()


def test_transfer_into_resized_bytearray_does_not_kill_the_process():
    """The consequence: a transfer into the moved bytearray's old address
    is a SIGSEGV in the loopback copier (a Go panic, SIGABRT, the whole
    process gone)."""
    rc, out = _child("""
        import kvxfer
        from conftest import small_config, unique
        ctx = kvxfer.Engine(small_config(unique("ctx")))
        pool = bytearray(1 << 20)
        gen = kvxfer.Engine(small_config(unique("gen")), memory=pool)
        try:
            pool.extend(b"\\0" * (64 << 20))
        except BufferError:
            print("refused"); raise SystemExit(0)
        ids = ctx.alloc(0, 2)
        rx = gen.receive("r", 32, ctx.instance)
        tx = ctx.send("r", 32)
        tx.chunk(0, 32, [(0, ids)], fenced=False)
        rx.wait(10)
    """)
    assert rc == 0, "child died (rc %d):\n%s" % (rc, out[-1500:])


def test_request_free_blocks_leaves_the_callers_own_blocks():
    """kvxfer_request_free_blocks frees 'those the engine allocated; not
    blocks the caller passed in' (kvxfer.h), and Request.free_blocks says
    'engine-allocated': a READY receive into the caller's blocks must not
    put them back into the pool, where the next alloc hands them out while
    the caller still reads them."""
    ctx = kvxfer.Engine(small_config(unique("ctx")))
    gen = kvxfer.Engine(small_config(unique("gen")))
    try:
        src = ctx.alloc(0, 2)
        mine = gen.alloc(0, 2)  # the caller's own destination blocks
        rx = gen.receive("own", 32, ctx.instance, blocks=[mine])
        tx = ctx.send("own", 32)
        tx.chunk(0, 32, [(0, src)], fenced=False)
        assert tx.wait(10).outcome == Outcome.DONE
        assert rx.wait(10).outcome == Outcome.READY
        with pytest.raises(KvxferError) as ei:
            rx.free_blocks()
        assert ei.value.status == Status.INVALID_ARGUMENT and "caller's own blocks" in ei.value.message
        assert gen.used(0) == 2, "the caller's blocks %s were freed into the pool" % mine
        again = gen.alloc(0, 2)
        assert not set(again) & set(mine), "alloc handed out %s, the caller still holds %s" % (again, mine)
    finally:
        ctx.close()
        gen.close()


@pytest.mark.parametrize("loaded", [False, True])
def test_engine_in_a_forked_child_does_not_hang(loaded):
    """libkvxfer's Go runtime does not survive a fork (multiprocessing's
    default on Linux, vLLM's VLLM_WORKER_MULTIPROC_METHOD=fork): a child
    forked after the library was loaded hung in its first call, with no
    error. Now the library is loaded at the first call, not at import: a
    parent that only imported kvxfer leaves its child free to load its own
    (not loaded); in a child of a parent that used it, every call raises,
    naming the fork and the way out (loaded)."""
    rc, out = _child("""
        import os, sys, time
        import kvxfer
        from conftest import reap_within, small_config, unique
        if %r:
            kvxfer.Engine(small_config(unique("parent"))).close()
        pid = os.fork()
        if pid == 0:
            try:
                kvxfer.Engine(small_config(unique("child"))).close()
            except RuntimeError as exc:
                ok = %r and "forked" in str(exc) and "spawn" in str(exc)
                print("child refused:", exc, flush=True)
                os._exit(0 if ok else 4)
            os._exit(5 if %r else 0)  # after a load: it must be refused
        status = reap_within(pid)
        if status is None:
            print("child hung in kvxfer_engine_open for 20 s")
            sys.exit(2)
        sys.exit(0 if status == 0 else 3)
    """ % (loaded, loaded, loaded))
    assert rc == 0, out[-1500:]


@pytest.mark.parametrize("extra", [
    {"model": "Llama-3.1-8B"},          # with "layout": silently ignored (kvxfer_node_open refuses both)
    {"model": "no-such-model"},         # not even checked
    {"tokens_per_block": -16},          # a negative value silently means "the layout's"
])
def test_engine_config_refuses_ignored_or_bad_keys(extra):
    cfg = small_config(unique("cfg"))
    cfg.update(extra)
    with pytest.raises(KvxferError) as ei:
        kvxfer.Engine(cfg).close()
    assert ei.value.status == Status.CONFIG
    assert list(extra)[0] in ei.value.message


@pytest.mark.parametrize("instance", ["a\u0000b", "a\nb"])
def test_instance_with_a_control_character_refused(instance):
    """No C string (a receive's context) or log line carries such a name."""
    cfg = small_config(unique("cfg"))
    cfg["instance"] = instance
    with pytest.raises(KvxferError) as ei:
        kvxfer.Engine(cfg).close()
    assert ei.value.status == Status.CONFIG and "control character" in ei.value.message


def test_negative_poll_timeout_refused():
    e = kvxfer.Engine(small_config(unique("poll")))
    try:
        with pytest.raises(KvxferError) as ei:
            e.poll(timeout_ms=-1)
        assert ei.value.status == Status.INVALID_ARGUMENT and "timeout_ms = -1" in ei.value.message
    finally:
        e.close()


def test_alloc_of_an_unknown_group_refused_before_building_ids(monkeypatch):
    """The group is checked before an array of n ids is built for the
    library (n up to 2**32 - 1: 16 GiB): the library is not called."""
    e = kvxfer.Engine(small_config(unique("grp")))
    try:
        def called(*_args):
            raise AssertionError("kvxfer_blocks_alloc called for an unknown group")
        monkeypatch.setattr(kvxfer.core.lib, "kvxfer_blocks_alloc", called)
        with pytest.raises(KvxferError) as ei:
            e.alloc(len(e.groups), 2**32 - 1)
        assert ei.value.status == Status.INVALID_ARGUMENT and "layer group %d" % len(e.groups) in ei.value.message
    finally:
        monkeypatch.undo()
        e.close()


def test_bytearray_pool_usable_again_after_close():
    """The engine holds the buffer unresizable until its close finished,
    not longer."""
    pool = bytearray(1 << 20)
    kvxfer.Engine(small_config(unique("ba2")), memory=pool).close()
    pool.extend(b"\0" * 4096)
    assert len(pool) == (1 << 20) + 4096


def test_fork_while_another_thread_loads_the_library():
    """A fork while another thread of the parent loads libkvxfer (holding
    the load lock) must not leave the child's first call blocked on that
    lock for ever: the child gets a fresh one and loads its own library."""
    rc, out = _child("""
        import os, sys, threading, time
        import kvxfer
        from kvxfer import _lib
        from conftest import reap_within, small_config, unique
        entered, release = threading.Event(), threading.Event()
        real_load = _lib.load
        def slow_load():
            entered.set()
            release.wait()
            return real_load()
        _lib.load = slow_load
        t = threading.Thread(target=_lib.library)
        t.start()
        entered.wait()
        _lib.load = real_load
        pid = os.fork()
        if pid == 0:
            try:
                kvxfer.Engine(small_config(unique("child"))).close()
            except Exception as exc:
                print("child:", exc, flush=True)
                os._exit(4)
            os._exit(0)
        release.set()
        t.join()
        status = reap_within(pid)
        if status is None:
            print("child hung on the load lock for 20 s")
            sys.exit(2)
        sys.exit(0 if status == 0 else 3)
    """)
    assert rc == 0, out[-1500:]


def test_event_of_an_unknown_status_code():
    """A newer library of the same ABI may return a status code this
    package does not know: the Event keeps it as the number instead of
    raising in poll() (which would lose the events taken with it)."""
    raw = kvxfer._lib.Event(request=7, outcome=int(Outcome.FAILED), error=99)
    ev = kvxfer.core.Event(raw)
    assert ev.error == 99 and ev.outcome == Outcome.FAILED and not ev.ok
    # Its repr (a log line, a connector's failed entry printed) names the
    # number instead of raising AttributeError (an int has no .name).
    assert "error=99" in repr(ev), repr(ev)


def test_kvxfer_lib_that_cannot_be_loaded_named(tmp_path):
    """$KVXFER_LIB naming a directory, or a file that is no library, was
    dlopen's words alone ("cannot read file data: Is a directory",
    "invalid ELF header"), naming neither $KVXFER_LIB nor what to do
    (checked to fail). The OSError names the path, where it came from and
    what the library must be."""
    bad = tmp_path / "notalib.so"
    bad.write_text("not a library")
    for path in (str(tmp_path), str(bad)):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([PKG, HERE]), KVXFER_LIB=path)
        p = subprocess.run([sys.executable, "-c", "import kvxfer; kvxfer.handle_count()"], env=env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith("OSError: libkvxfer.so at %s (from $KVXFER_LIB) cannot be loaded" % path), last
        assert "make lib" in last, last


def test_tensor_pool_cannot_be_resized_under_the_engine():
    """A CPU tensor given as memory could be resize_()d larger: its storage
    moved, the old bytes were freed, and the transfer into the engine's
    address killed the process (SIGSEGV in the copier, a Go panic; checked
    to fail: rc -6, SIGABRT). The storage is made unresizable: resize_ raises
    RuntimeError and the transfer lands."""
    rc, out = _child("""
        import torch
        import kvxfer
        from conftest import small_config, unique
        ctx = kvxfer.Engine(small_config(unique("ctx")))
        pool = torch.zeros(1 << 19, dtype=torch.bfloat16)
        gen = kvxfer.Engine(small_config(unique("gen")), memory=pool)
        try:
            pool.resize_(64 << 20)
        except RuntimeError as exc:
            print("refused:", exc)
        ids = ctx.alloc(0, 2)
        rx = gen.receive("r", 32, ctx.instance)
        tx = ctx.send("r", 32)
        tx.chunk(0, 32, [(0, ids)], fenced=False)
        print(rx.wait(10).outcome.name)
        rx.release(); tx.release(); ctx.close(); gen.close()
    """)
    assert rc == 0, "child died (rc %d):\n%s" % (rc, out[-1500:])
    assert "refused:" in out and "READY" in out, out


def test_kv_memory_tensors_cannot_be_resized():
    """kv_memory's CPU tensors, which the engine addresses as the memory of
    each layer, could be resize_()d as well (checked to fail: the resize
    went through and moved the storage). Each storage, a strided view's
    too, is made unresizable when kv_memory reads it."""
    torch = pytest.importorskip("torch")
    layers = [torch.zeros((2, 64, 16, 2, 8), dtype=torch.bfloat16) for _ in range(4)]
    views = [t[:, ::2] for t in layers]
    kvxfer.kv_memory("nhd", views)
    for t in layers + views:
        with pytest.raises(RuntimeError, match="not resizable"):
            t.resize_(64 << 20)
    free = torch.zeros(8)
    free.resize_(64)  # others are not touched


def test_buffer_address_leaves_a_tensor_resizable():
    """buffer_address only reports where a CPU tensor's bytes are: it gives
    them to no engine, so it must not make the tensor's storage
    unresizable for good as Engine(memory=) does (it did: resize_ raised
    "Trying to resize storage that is not resizable" after merely asking
    for the address)."""
    torch = pytest.importorskip("torch")
    t = torch.zeros(64, dtype=torch.uint8)
    addr, nbytes = kvxfer.buffer_address(t)
    assert (addr, nbytes) == (t.data_ptr(), 64)
    t.resize_(64 << 10)
    assert t.numel() == 64 << 10


def test_kv_memory_of_read_only_arrays_refused():
    """Engine(memory=) refuses a read-only NumPy array ("array is
    read-only"), but kv_memory took one (a memmap opened "r", an array of
    bytes) as the layers' memory, which a receive writes: the copier's
    first write into it killed the process (checked to fail: rc -6, a Go
    SIGSEGV panic in copySegments). It is a ValueError naming the layer."""
    rc, out = _child("""
        import mmap
        import tempfile
        import numpy as np
        import kvxfer
        from conftest import small_config, unique
        shape = (2, 8, 2, 16, 8)  # the tiny layout's "hnd" layer: [2, num_blocks, kv_heads, block_size, head_dim]
        size = 2 * int(np.prod(shape))
        f = tempfile.TemporaryFile()
        f.truncate(4 * size)
        ro = mmap.mmap(f.fileno(), 4 * size, access=mmap.ACCESS_READ)  # its pages are mapped read-only
        layers = [np.frombuffer(ro, np.uint16, size // 2, i * size).reshape(shape) for i in range(4)]
        try:
            mem = kvxfer.kv_memory("hnd", layers)
        except ValueError as exc:
            print("refused:", exc)
            raise SystemExit(0)
        cfg = small_config(unique("gen"), memory=mem)
        del cfg["pool_bytes"]
        gen = kvxfer.Engine(cfg)
        gen.alloc(0, 8)
        ctx = kvxfer.Engine(small_config(unique("ctx")))
        ids = ctx.alloc(0, 2)
        rx = gen.receive("r", 32, ctx.instance, blocks=[[0, 1]])
        tx = ctx.send("r", 32)
        tx.chunk(0, 32, [(0, ids)], fenced=False)
        print(rx.wait(10).outcome.name)
    """)
    assert rc == 0, "child died (rc %d):\n%s" % (rc, out[-1500:])
    assert "refused: layers[0] is a read-only array" in out, out
