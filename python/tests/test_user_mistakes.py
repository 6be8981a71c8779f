"""Mistakes a new user makes with the package: each is refused at once,
naming the value, instead of being accepted, or answered after a timeout."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kvxfer  # noqa: E402
from conftest import small_config, unique, wait_until  # noqa: E402

torch = pytest.importorskip("torch")

LAYOUT = {"layers": 4, "kv_heads": 2, "head_dim": 8, "dtype_bytes": 2, "tokens_per_block": 16}


@pytest.mark.parametrize("kind,shape,what", [
    ("nhd", (2, 64, 16, 3, 8), "kv_heads 2"),
    ("nhd", (2, 64, 16, 2, 16), "head_dim 8"),
    ("nhd", (2, 64, 32, 2, 8), "tokens_per_block 16"),
    ("hnd", (2, 64, 4, 16, 8), "kv_heads 2"),
    ("split_kv", (64, 16, 2, 16), "head_dim 8"),
])
def test_user_mistakes_kv_memory_of_another_layout_refused(kind, shape, what):
    """Tensors whose block size, heads or head dim are not the layout's:
    the library gets addresses and strides only and opened over them,
    moving a part of each block (checked to fail: no error)."""
    before = kvxfer.handle_count()
    layers = [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(4)]
    v = [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(4)] if kind == "split_kv" else None
    mem = kvxfer.kv_memory(kind, layers, v)
    with pytest.raises(ValueError) as e:
        kvxfer.Engine({"instance": unique("shape"), "layout": LAYOUT, "memory": mem}).close()
    assert str(tuple(shape)) in str(e.value) and what in str(e.value), e.value
    assert kvxfer.handle_count() == before  # the engine it opened is closed
    ok = [torch.zeros((2, 64, 16, 2, 8), dtype=torch.bfloat16) for _ in range(4)]
    kvxfer.Engine({"instance": unique("shape"), "layout": LAYOUT, "memory": kvxfer.kv_memory("nhd", ok)}).close()


def test_user_mistakes_block_address_of_a_closed_engine_refused():
    """block_address after close() gave an address in a pool the close
    may have freed (checked to fail: an int came back)."""
    e = kvxfer.Engine(small_config(unique("addr")))
    e.block_address(0, 0)
    e.close()
    with pytest.raises(kvxfer.KvxferError) as err:
        e.block_address(0, 0)
    assert err.value.status == kvxfer.Status.CLOSED


def test_user_mistakes_wait_with_no_timeout(pair):
    """wait(timeout=None) waits with no timeout (it was a TypeError of
    float + None; checked to fail)."""
    ctx, _ = pair
    tx = ctx.send(unique("r"), 32)
    tx.cancel()
    assert tx.wait(timeout=None).outcome == kvxfer.Outcome.CANCELLED
    tx.release()


def test_user_mistakes_wait_again(pair):
    """A second wait() of a request, before or after its release, returns
    its event again: it waited out its timeout, then raised a TimeoutError
    naming a handle (checked to fail)."""
    ctx, _ = pair
    tx = ctx.send(unique("r"), 32)
    tx.cancel()
    ev = tx.wait()
    assert ev.outcome == kvxfer.Outcome.CANCELLED
    assert tx.wait(timeout=5) is ev
    tx.release()
    assert tx.wait(timeout=5) is ev


def test_user_mistakes_wait_after_release(pair):
    """A wait() of a request released after poll() took its event is
    refused at once (BAD_HANDLE, saying it was released): it waited out
    its timeout, then raised a TimeoutError naming a handle (checked to
    fail)."""
    ctx, _ = pair
    tx = ctx.send(unique("r"), 32)
    tx.cancel()
    got = []
    wait_until(lambda: got.extend(ctx.poll(10)) or got, what="the cancelled request's event")
    tx.release()
    with pytest.raises(kvxfer.KvxferError) as err:
        tx.wait(timeout=5)
    assert err.value.status == kvxfer.Status.BAD_HANDLE and "released" in str(err.value)


_INTERRUPTED_POLL = r"""
import os, signal, sys, threading
sys.path.insert(0, sys.argv[1])
import kvxfer
e = kvxfer.Engine({"instance": "ctrl-c", "layout": %r, "pool_bytes": 1 << 20, "workers": 2})
threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    e.poll(600000)
except KeyboardInterrupt:
    print("interrupted")
e.close()
""" % (LAYOUT,)


def test_user_mistakes_ctrl_c_ends_a_long_poll():
    """Ctrl-C during poll(timeout_ms) raised KeyboardInterrupt only once
    the library's wait of the whole timeout_ms returned (10 minutes here;
    checked to fail: the child was still in poll at the 60 s deadline)."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(kvxfer.__file__)))
    try:
        out = subprocess.run([sys.executable, "-c", _INTERRUPTED_POLL, pkg], capture_output=True, text=True,
                             timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("poll(600000) was still running 60 s after SIGINT")
    assert out.returncode == 0 and "interrupted" in out.stdout, (out.returncode, out.stdout, out.stderr)


_INTERRUPTED_WAIT_PEERS = r"""
import os, signal, sys, tempfile, threading
sys.path.insert(0, sys.argv[1])
import kvxfer
d = tempfile.mkdtemp(prefix="kvx")
n = kvxfer.Node({"model": "Llama-3.1-8B", "tokens_per_block": 16, "pool_bytes": 16 << 20, "backend": "shm",
                 "workers": 2, "insecure": True, "instance": "gen", "bind": "ipc://%s/g.sock" % d,
                 "peers": [{"instance": "ctx", "endpoint": "ipc://%s/c.sock" % d}]})
threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    n.wait_peers(600000)
except KeyboardInterrupt:
    print("interrupted")
n.close()
"""


def test_user_mistakes_ctrl_c_ends_wait_peers():
    """Ctrl-C during wait_peers(timeout_ms) on a peer that is not started
    raised KeyboardInterrupt only at timeout_ms (10 minutes here; checked
    to fail: the child was still waiting at the 60 s deadline)."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(kvxfer.__file__)))
    try:
        out = subprocess.run([sys.executable, "-c", _INTERRUPTED_WAIT_PEERS, pkg], capture_output=True, text=True,
                             timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("wait_peers(600000) was still running 60 s after SIGINT")
    assert out.returncode == 0 and "interrupted" in out.stdout, (out.returncode, out.stdout, out.stderr)


def test_user_mistakes_flat_blocks_and_non_tensors_named(pair):
    """receive(blocks=[1, 2]) (one group's ids, not a list per group) and
    kv_memory of a list were a TypeError or AttributeError naming neither
    the argument nor what to pass (checked to fail)."""
    ctx, gen = pair
    with pytest.raises(TypeError, match=r"blocks\[0\] = 1: want one list of block ids per layer group"):
        gen.receive(unique("r"), 32, ctx.instance, blocks=[1, 2])
    with pytest.raises(TypeError, match=r"layers\[0\] is a list, neither a tensor nor an array"):
        kvxfer.kv_memory("nhd", [[1, 2]])


def test_user_mistakes_non_callable_callback_and_str_payload_refused(pair):
    """set_callback(5) was taken: every later event went to a TypeError
    on a library thread, printed and lost, and its wait() timed out; a str
    payload was "TypeError: string argument without an encoding", naming
    neither (checked to fail)."""
    ctx, _ = pair
    with pytest.raises(TypeError, match="fn = 5 is not callable"):
        ctx.set_callback(5)
    tx = ctx.send(unique("r"), 32)
    tx.cancel()
    assert tx.wait().outcome == kvxfer.Outcome.CANCELLED  # still polled: no callback was set
    tx.release()
    with pytest.raises(TypeError, match="payload must be bytes-like, not str"):
        ctx.send(unique("r"), 32, payload="first token")
    tx = ctx.send(unique("r"), 32)
    with pytest.raises(TypeError, match="payload must be bytes-like, not str"):
        tx.set_payload("first token")
    tx.cancel()
    tx.wait()
    tx.release()


@pytest.mark.parametrize("dtype_bytes", [3, 16])
def test_user_mistakes_dtype_bytes_of_no_element_size_refused(dtype_bytes):
    """A layout's dtype_bytes of 3 (or 16) is no KV element size, yet an
    engine or a node opened with it (blocks laid out at 3 bytes an
    element); both now raise CONFIG at once naming the value and
    the accepted sizes (checked to fail without the fix: both opened)."""
    layout = dict(LAYOUT, dtype_bytes=dtype_bytes)
    with pytest.raises(kvxfer.KvxferError) as e:
        kvxfer.Engine(small_config(unique("dtype"), layout=layout)).close()
    assert e.value.status == kvxfer.Status.CONFIG, e.value
    assert "DTypeBytes = %d" % dtype_bytes in e.value.message and "[1 2 4 8]" in e.value.message, e.value.message
    with pytest.raises(kvxfer.KvxferError) as e:
        kvxfer.Node({"instance": unique("dtype-node"), "layout": layout, "pool_bytes": 1 << 20, "workers": 2,
                     "insecure": True, "bind": "tcp://127.0.0.1:0"}).close()
    assert e.value.status == kvxfer.Status.CONFIG, e.value
    assert "DTypeBytes = %d" % dtype_bytes in e.value.message and "[1 2 4 8]" in e.value.message, e.value.message


def test_user_mistakes_receive_from_itself_refused():
    """receive() naming the engine's own instance as its context waited
    out the whole transfer timeout: no engine sends to its own instance.
    An engine and a node now raise BAD_REQUEST at once naming the request,
    the instance and "this engine itself" (checked to fail without the
    fix: the engine's receive was taken, the node's named an unknown
    peer)."""
    name = unique("self")
    with kvxfer.Engine(small_config(name)) as e:
        with pytest.raises(kvxfer.KvxferError) as err:
            e.receive("self-rx", 16, name)
        assert err.value.status == kvxfer.Status.BAD_REQUEST, err.value
        assert "self-rx" in err.value.message and name in err.value.message, err.value.message
        assert "this engine itself" in err.value.message, err.value.message
        assert e.used(0) == 0
    node = unique("self-node")
    with kvxfer.Node({"instance": node, "layout": LAYOUT, "pool_bytes": 1 << 20, "workers": 2, "insecure": True,
                      "bind": "tcp://127.0.0.1:0"}) as n:
        with pytest.raises(kvxfer.KvxferError) as err:
            n.receive("self-node-rx", 16, node)
        assert err.value.status == kvxfer.Status.BAD_REQUEST, err.value
        assert "self-node-rx" in err.value.message and node in err.value.message, err.value.message
        assert "this engine itself" in err.value.message, err.value.message


_INTERRUPTED_CLOSE = r"""
import _thread, sys, threading, time
sys.path.insert(0, sys.argv[1])
import kvxfer
e = kvxfer.Engine(%r)
entered, release, interrupted = threading.Event(), threading.Event(), threading.Event()


def held(ev):
    # A callback under way holds close() until it returns.
    entered.set()
    release.wait(120)


e.set_callback(held)
e.receive("held", 16, "nobody")  # its event (unsent, or close's CLOSED) goes to held
main = threading.main_thread().ident


def in_close():
    f = sys._current_frames().get(main)
    while f is not None:
        if f.f_code is kvxfer.Engine.close.__code__:
            return True
        f = f.f_back
    return False


fallback = []


def interrupt():
    deadline = time.monotonic() + 60
    while not (entered.is_set() and in_close()) and time.monotonic() < deadline:
        time.sleep(0.001)
    _thread.interrupt_main()
    if not interrupted.wait(30):  # close() did not give way: let it end
        fallback.append(True)
    release.set()


threading.Thread(target=interrupt).start()
try:
    e.close(600000)
    print("returned")
except KeyboardInterrupt:
    interrupted.set()
    print("interrupted")
release.set()
deadline = time.monotonic() + 60
while e.handle and time.monotonic() < deadline:
    time.sleep(0.001)
print("closed" if not e.handle else "still open", "only-after-release" if fallback else "")
"""


def test_user_mistakes_ctrl_c_ends_a_long_close():
    """Ctrl-C during close(timeout_ms) raised KeyboardInterrupt only once
    the library's close returned: here never, as a callback under way
    holds the close (the child lets it go 30 s after SIGINT; checked to
    fail: KeyboardInterrupt came only after that). It now comes at once,
    and the close, going on in the background, still finishes."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(kvxfer.__file__)))
    cfg = small_config(unique("ctrl-c-close"))
    try:
        out = subprocess.run([sys.executable, "-c", _INTERRUPTED_CLOSE % (cfg,), pkg], capture_output=True, text=True,
                             timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("close(600000) was still running 180 s after SIGINT")
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    assert out.stdout.split() == ["interrupted", "closed"], (out.stdout, out.stderr)


@pytest.mark.parametrize("bad", [1.7, "1", None])
def test_user_mistakes_block_id_of_no_int_refused(pair, bad):
    """A float or str block id was cut by int() to another block: free(0,
    [1.7]) freed block 1, chunk() and receive() named block 1 (checked to
    fail: block 1 was freed). Each is a TypeError naming the value; no
    block is freed or pinned."""
    ctx, gen = pair
    ids = ctx.alloc(0, 4)
    assert ids[1] == 1
    used = ctx.used(0)
    with pytest.raises(TypeError) as e:
        ctx.free(0, [ids[0], bad])
    assert "free ids[1] = %r" % (bad,) in str(e.value), e.value
    assert ctx.used(0) == used  # block 0 not freed either
    tx = ctx.send(unique("r"), 32)
    with pytest.raises(TypeError) as e:
        tx.chunk(0, 32, [(0, [0, bad])])
    assert "runs[0] ids[1] = %r" % (bad,) in str(e.value), e.value
    with pytest.raises(TypeError) as e:
        gen.receive(unique("r"), 32, ctx.instance, blocks=[[5, bad]])
    assert "blocks[0] ids[1] = %r" % (bad,) in str(e.value), e.value
    with pytest.raises(TypeError) as e:
        tx.chunk(0, 32, [0, 1])
    assert "runs[0] = 0" in str(e.value), e.value
    tx.cancel()
    assert tx.wait().outcome == kvxfer.Outcome.CANCELLED
    tx.release()
    ctx.free(0, ids)
    assert ctx.used(0) == used - 4


@pytest.mark.parametrize("blocks", [[], ()])
def test_user_mistakes_empty_block_table_refused(pair, blocks):
    """receive(blocks=[]) reached the library as groups 0, which means
    "the engine allocates": the caller's (empty) table was ignored and
    the request took blocks from the pool (checked to fail: a Request came
    back). It is a ValueError naming it; nothing is taken."""
    ctx, gen = pair
    used = gen.used(0)
    with pytest.raises(ValueError) as e:
        gen.receive(unique("r"), 32, ctx.instance, blocks=blocks)
    assert "blocks = %r" % (blocks,) in str(e.value) and "None lets the engine" in str(e.value), e.value
    assert gen.used(0) == used


@pytest.mark.parametrize("bad", [5, None, [1, 2]])
def test_user_mistakes_payload_of_no_bytes_refused(pair, bad):
    """send(payload=5) sent bytes(5), five zero bytes, as the request's
    payload (checked to fail: no error); None was an unnamed \"cannot
    convert\" TypeError. Each is a TypeError naming the type, in send()
    and set_payload(); bytes-like objects still do."""
    ctx, _ = pair
    with pytest.raises(TypeError) as e:
        ctx.send(unique("r"), 32, payload=bad)
    assert "payload must be bytes-like" in str(e.value) and type(bad).__name__ in str(e.value), e.value
    tx = ctx.send(unique("r"), 32, payload=bytearray(b"ab"))
    with pytest.raises(TypeError) as e:
        tx.set_payload(bad)
    assert "payload must be bytes-like" in str(e.value), e.value
    tx.set_payload(memoryview(b"xyz"))
    tx.cancel()
    tx.wait()
    tx.release()


def test_user_mistakes_argument_of_the_wrong_type_named(pair):
    """A float or str where an int goes was an unnamed "'float' object
    cannot be interpreted as an integer" (poll, alloc, close, send), a str
    timeout an "unsupported operand" of float + str, a list as memory a
    memoryview TypeError (checked to fail: none named the argument)."""
    ctx, _ = pair
    cases = [
        (lambda: ctx.poll(1.5), "timeout_ms = 1.5 is a float"),
        (lambda: ctx.alloc(0, 2.0), "n = 2.0 is a float"),
        (lambda: ctx.send(unique("r"), 10.5), "prompt_len = 10.5 is a float"),
        (lambda: ctx.close("1"), "timeout_ms = '1' is a str"),
        (lambda: ctx.block_address(0.0, 0), "group = 0.0 is a float"),
        (lambda: kvxfer.Engine(small_config(unique("m"), pool_bytes=64), memory=[0] * 64),
         "memory is a list"),
    ]
    for call, want in cases:
        with pytest.raises(TypeError) as e:
            call()
        assert want in str(e.value), (want, e.value)
    tx = ctx.send(unique("r"), 32)
    tx.cancel()
    with pytest.raises(TypeError) as e:
        tx.wait("1")
    assert "timeout = '1'" in str(e.value), e.value
    assert tx.wait(1).outcome == kvxfer.Outcome.CANCELLED
    tx.release()


def test_user_mistakes_config_and_layers_of_the_wrong_type_named():
    """A config json cannot write (a set, a tensor) was json's "Object of
    type set is not JSON serializable", kv_memory(kind, None) "'NoneType'
    object is not iterable", neither naming the argument (checked to
    fail). Each TypeError names it."""
    with pytest.raises(TypeError) as e:
        kvxfer.Engine(small_config(unique("set"), workers={2}))
    assert str(e.value).startswith("config {") and "not JSON" in str(e.value) and "set" in str(e.value), e.value
    with pytest.raises(TypeError) as e:
        kvxfer.kv_memory("nhd", None)
    assert "kv_memory: layers = None" in str(e.value), e.value


@pytest.mark.parametrize("make", [lambda: torch.zeros(0, dtype=torch.bfloat16), lambda: torch.zeros(64)[:0],
                                  lambda: bytearray(0)])
def test_user_mistakes_empty_memory_refused(make):
    """An empty tensor as memory has data_ptr() 0, which reached
    kvxfer_engine_open as a NULL pool: the engine opened over a pool of its
    own (1 GiB without pool_bytes) and the caller's memory was ignored
    (checked to fail: the engine opened); an empty bytearray was ctypes'
    unnamed "Buffer size too small". Each is a ValueError naming memory."""
    before = kvxfer.handle_count()
    for cfg in (small_config(unique("empty")), {"instance": unique("empty"), "layout": LAYOUT}):
        with pytest.raises(ValueError) as e:
            kvxfer.Engine(cfg, memory=make())
        assert "memory is empty (0 bytes" in str(e.value), e.value
    with pytest.raises(ValueError, match="memory is empty"):
        kvxfer.Node({"instance": unique("empty"), "layout": LAYOUT, "backend": "shm", "insecure": True,
                     "bind": "ipc://unused.sock", "send_only": True}, memory=make())
    assert kvxfer.handle_count() == before


def test_user_mistakes_hits_and_wait_arguments_named(pair):
    """receive(blocks=..., prefix_hit_blocks=5) was an unnamed "'int'
    object is not iterable" (without blocks it was named); wait("id"), the
    request's id instead of the Request, was "%d format: a real number is
    required, not str" (checked to fail). Each TypeError names the
    argument; nothing is taken."""
    ctx, gen = pair
    used = gen.used(0)
    with pytest.raises(TypeError) as e:
        gen.receive(unique("r"), 32, ctx.instance, blocks=[[1, 2]], prefix_hit_blocks=5)
    assert "prefix_hit_blocks = 5" in str(e.value), e.value
    assert gen.used(0) == used
    rid = unique("r")
    tx = ctx.send(rid, 32)
    with pytest.raises(TypeError) as e:
        ctx.wait(rid, 0.1)
    assert "wait: request = %r is a str" % rid in str(e.value) and "not its id" in str(e.value), e.value
    tx.cancel()
    assert ctx.wait(tx.handle, 10).outcome == kvxfer.Outcome.CANCELLED  # a handle still does
    tx.release()


@pytest.mark.parametrize("fn", [lambda: None, lambda ev, extra: None])
def test_user_mistakes_callback_of_another_arity_refused(pair, fn):
    """set_callback(fn) with an fn that takes no event (or two) was taken:
    each event then went to a TypeError on a library thread, printed and
    appended to callback_errors, and the request's event was lost
    (checked to fail: no error). It is a TypeError at once; the engine
    keeps polling, and its events still come."""
    ctx, _ = pair
    with pytest.raises(TypeError) as e:
        ctx.set_callback(fn)
    assert "cannot be called with one Event" in str(e.value), e.value
    ctx.set_callback(lambda ev, *rest, **kw: None)  # one that takes an event does
    ctx.set_callback(None)
    tx = ctx.send(unique("r"), 32)
    tx.cancel()
    assert tx.wait(10).outcome == kvxfer.Outcome.CANCELLED and not ctx.callback_errors
    tx.release()


class _AsyncCall:
    async def __call__(self, ev):
        pass


async def _async_callback(ev):
    pass


@pytest.mark.parametrize("fn", [_async_callback, _AsyncCall()])
def test_user_mistakes_async_callback_refused_or_named(pair, fn):
    """set_callback(fn) with an async fn (an asyncio serving loop's
    handler) was taken: each call only made a coroutine that nothing
    awaited, so fn's body never ran, callback_errors stayed empty and the
    only trace was Python's "never awaited" warning (checked to fail: no
    error). An async def is a TypeError at once saying how to hand events
    to a loop; a callable that returns an awaitable anyway (an async
    __call__) puts a TypeError naming it in callback_errors for each
    event."""
    ctx, _ = pair
    if isinstance(fn, _AsyncCall):
        ctx.set_callback(fn)
    else:
        with pytest.raises(TypeError) as e:
            ctx.set_callback(fn)
        assert "async" in str(e.value) and "call_soon_threadsafe" in str(e.value), e.value
        ctx.set_callback(lambda ev: None)  # the loop is then told from a plain function
    tx = ctx.send(unique("r"), 32)
    tx.cancel()
    assert tx.wait(10).outcome == kvxfer.Outcome.CANCELLED
    if isinstance(fn, _AsyncCall):
        wait_until(lambda: ctx.callback_errors, what="the awaitable named in callback_errors")
        err = ctx.callback_errors[0]
        assert isinstance(err, TypeError) and "awaitable" in str(err) and "never awaits" in str(err), err
    else:
        assert not ctx.callback_errors
    ctx.set_callback(None)
    tx.release()
