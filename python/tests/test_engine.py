"""Two engines in one Python process over libkvxfer.so."""

import ctypes
import gc
import os
import weakref

import numpy as np
import pytest
import torch

import kvxfer
from kvxfer import KvxferError, Outcome, Status

from conftest import small_config, unique, wait_until

# The tiny layout of conftest: 4 layers, 2 KV heads, head size 8, bf16,
# 16 tokens per block.
LAYERS, HEADS, HEAD, TPB = 4, 2, 8, 16


def cross_layer_cache(num_blocks):
    """vLLM's cross-layer KV cache: one tensor, block-major, every layer of
    a block together, HND within a layer."""
    return torch.zeros((num_blocks, LAYERS, 2, HEADS, TPB, HEAD), dtype=torch.bfloat16)


def per_layer_views(cache):
    """The per-layer caches vLLM's attention reads: kv[:, i] as (num_blocks,
    2, block_size, num_kv_heads, head_size), HND strides."""
    return {"model.layers.%d.self_attn" % i: cache[:, i].transpose(2, 3) for i in range(LAYERS)}


def test_torch_cpu_transfer_in_vllm_layout():
    """The prefill side writes K and V through vLLM-shaped per-layer views
    into its block table; the decode side receives into its own block table
    (other ids); every token of every layer, head and part is equal."""
    nblocks = 32
    src_cache, dst_cache = cross_layer_cache(nblocks), cross_layer_cache(nblocks)
    pool = nblocks * LAYERS * 2 * HEADS * TPB * HEAD * 2
    before = kvxfer.handle_count()
    ctx = kvxfer.Engine(small_config(unique("ctx"), pool_bytes=pool), memory=src_cache)
    gen = kvxfer.Engine(small_config(unique("gen"), pool_bytes=pool), memory=dst_cache)
    try:
        assert ctx.info.pool_base == src_cache.data_ptr()
        assert ctx.groups[0].block_bytes == src_cache.stride(0) * 2 and ctx.groups[0].blocks == nblocks
        prompt = 150  # 10 blocks, the last one partly filled
        n = -(-prompt // TPB)
        src_ids = ctx.alloc(0, n)
        dst_ids = [nblocks - 1 - 2 * i for i in range(n)]  # the framework's own, not kvxfer's
        torch.manual_seed(7)
        truth = torch.randn((LAYERS, 2, prompt, HEADS, HEAD)).to(torch.bfloat16)
        src_layers = per_layer_views(src_cache)
        for i, layer in enumerate(src_layers.values()):
            for t in range(prompt):
                layer[src_ids[t // TPB], :, t % TPB] = truth[i, :, t]

        rx = gen.receive("vllm-1", prompt, ctx.instance, blocks=[dst_ids])
        tx = ctx.send("vllm-1", prompt, payload=b"first-token")
        for start in range(0, prompt, 64):
            end = min(start + 64, prompt)
            b0, b1 = start // TPB, -(-end // TPB)
            fence = tx.chunk(start, end, [(b0, src_ids[b0:b1])])
            fence.ready()
        ev = tx.wait()
        assert ev.outcome == Outcome.DONE and ev.error == Status.OK, ev
        ev = rx.wait()
        assert ev.outcome == Outcome.READY, (ev, rx.error_message())
        assert rx.blocks(0) == (0, dst_ids)
        assert rx.payload() == b"first-token"

        dst_layers = per_layer_views(dst_cache)
        compared = 0
        for i, layer in enumerate(dst_layers.values()):
            for t in range(prompt):
                got = layer[dst_ids[t // TPB], :, t % TPB]
                assert torch.equal(got, truth[i, :, t]), "layer %d token %d" % (i, t)
                compared += got.numel()
        assert compared == LAYERS * 2 * prompt * HEADS * HEAD
        assert not torch.equal(dst_cache[dst_ids[0]], torch.zeros_like(dst_cache[0]))
        tx.release()
        rx.release()
        ctx.free(0, src_ids)
        assert ctx.used(0) == 0 and gen.used(0) == 0  # the framework's ids never touched kvxfer's pool
    finally:
        ctx.close()
        gen.close()
    assert kvxfer.handle_count() == before


def test_numpy_pool_and_engine_allocated_destination():
    arr = np.zeros(1 << 20, dtype=np.uint8)
    before = kvxfer.handle_count()
    with kvxfer.Engine(small_config(unique("ctx")), memory=arr) as ctx, \
            kvxfer.Engine(small_config(unique("gen"))) as gen:
        assert ctx.info.pool_base == arr.__array_interface__["data"][0]
        g = ctx.groups[0]
        src = ctx.alloc(0, 2)
        rng = np.random.default_rng(3)
        for b in src:
            arr[g.offset + b * g.block_bytes:g.offset + (b + 1) * g.block_bytes] = \
                rng.integers(0, 256, g.block_bytes, dtype=np.uint8)
        rx = gen.receive("np-1", 32, ctx.instance)
        tx = ctx.send("np-1", 32)
        assert tx.chunk(0, 32, [(0, src)], fenced=False) is None
        assert rx.wait().outcome == Outcome.READY
        assert tx.wait().outcome == Outcome.DONE
        first, dst = rx.blocks(0)
        assert first == 0 and len(dst) == 2
        for s, d in zip(src, dst):
            want = bytes(arr[g.offset + s * g.block_bytes:g.offset + (s + 1) * g.block_bytes])
            assert gen.block_bytes(0, d) == want
        assert gen.used(0) == 2
        rx.free_blocks()  # the READY blocks back to the pool in one call
        assert gen.used(0) == 0
        with pytest.raises(KvxferError) as e:
            rx.free_blocks()
        assert e.value.status == Status.INVALID_ARGUMENT and "already freed" in e.value.message
        with pytest.raises(KvxferError) as e:
            tx.free_blocks()  # DONE: a context side has no destination blocks
        assert e.value.status == Status.INVALID_ARGUMENT and "not READY" in e.value.message
        ctx.free(0, src)
        tx.release()
        rx.release()
    assert kvxfer.handle_count() == before


def test_cancel_both_sides(pair):
    ctx, gen = pair
    rx = gen.receive("cancel-rx", 32, ctx.instance)
    rx.cancel()
    ev = rx.wait()
    assert (ev.outcome, ev.error) == (Outcome.CANCELLED, Status.CANCELLED)
    assert "cancel" in rx.error_message()
    rx.release()

    src = ctx.alloc(0, 2)
    tx = ctx.send("cancel-tx", 32)
    fence = tx.chunk(0, 32, [(0, src)])
    tx.cancel()
    with pytest.raises(KvxferError) as e:
        tx.release()  # the unfired fence holds the pins: no outcome yet
    assert e.value.status == Status.NOT_FINISHED
    fence.ready()
    ev = tx.wait()
    assert ev.outcome == Outcome.CANCELLED, ev
    tx.release()
    ctx.free(0, src)


def test_wait_on_another_engine_is_named(pair):
    """Waiting on one engine for another engine's request is a mistake
    named at once (it waited its whole timeout, then said "no event")."""
    ctx, gen = pair
    rx = gen.receive("elsewhere", 32, ctx.instance)
    with pytest.raises(ValueError, match="belongs to engine %r, not to engine %r" % (gen.instance, ctx.instance)):
        ctx.wait(rx, timeout=30)
    rx.cancel()
    rx.wait()
    rx.release()


def test_timeout(pair):
    ctx, gen = pair
    rx = gen.receive("timeout-1", 32, ctx.instance, timeout_ms=100)  # no sender ever comes
    ev = rx.wait()
    assert (ev.outcome, ev.error) == (Outcome.TIMED_OUT, Status.TIMEOUT)
    rx.release()


def test_failed_fence(pair):
    ctx, gen = pair
    rx = gen.receive("fence-1", 64, ctx.instance)
    tx = ctx.send("fence-1", 64)
    src = ctx.alloc(0, 4)
    tx.chunk(0, 32, [(0, src[:2])]).ready()
    tx.chunk(32, 64, [(2, src[2:])]).fail("cudaEventSynchronize: illegal address")
    ev = tx.wait()
    assert (ev.outcome, ev.error) == (Outcome.FAILED, Status.FENCE), ev
    assert "illegal address" in tx.error_message()
    ev = rx.wait()
    assert ev.outcome != Outcome.READY, ev
    with pytest.raises(KvxferError) as e:
        rx.blocks(0)
    assert e.value.status == Status.INVALID_ARGUMENT
    tx.release()
    rx.release()
    ctx.free(0, src)


def test_error_message_longer_than_1024_bytes_is_whole(pair):
    """A request's message of more than 1023 bytes (a peer's reason
    nested in the receiver's, each naming the request id) was cut to the
    1024-byte buffer error_message() passed, losing its end, the reason
    (checked to fail: the message ended inside the id or the padding)."""
    ctx, gen = pair
    rid = "long-" + "i" * 250  # the longest id: 256 bytes
    reason = "the kernel writing layer 31 failed on " + "cuda:0 " * 50 + "CUDA error 700 (an illegal memory access)"
    rx = gen.receive(rid, 32, ctx.instance)
    tx = ctx.send(rid, 32)
    tx.chunk(0, 32, [(0, ctx.alloc(0, 2))]).fail(reason)
    assert tx.wait().error == Status.FENCE and rx.wait().error == Status.PEER_FAILED
    msg = rx.error_message()
    assert len(msg) > 1024 and msg.endswith(reason), (len(msg), msg[-80:])
    assert tx.error_message().endswith(reason)
    tx.release()
    rx.release()


def test_bad_input_is_an_error_naming_the_value(pair):
    ctx, gen = pair
    src = ctx.alloc(0, 2)
    tx = ctx.send("bad-1", 32)
    with pytest.raises(KvxferError) as e:
        tx.chunk(0, 20, [(0, src[:2])], last=False)  # ends mid-block
    assert e.value.status == Status.BAD_CHUNK and "20" in e.value.message
    with pytest.raises(KvxferError) as e:
        tx.chunk(16, 32, [(1, src[1:])])  # skips the first block
    assert e.value.status == Status.BAD_CHUNK and "expected 0" in e.value.message
    with pytest.raises(KvxferError) as e:
        tx.chunk(0, 32, [(0, [src[0], 999])])  # a block outside the pool
    assert e.value.status in (Status.PIN, Status.INVALID_ARGUMENT) and "999" in e.value.message
    tx.chunk(0, 32, [(0, src)], fenced=False)  # the request went on
    tx.cancel()
    tx.wait()
    tx.release()
    ctx.free(0, src)

    for call, status, needle in [
        (lambda: kvxfer.Engine("{\"model\": "), Status.CONFIG, "model"),
        (lambda: kvxfer.Engine({"model": "Llama-3.1-8B", "tokens": 3}), Status.CONFIG, "tokens"),
        (lambda: kvxfer.Engine({"model": "no-such-model"}), Status.CONFIG, "no-such-model"),
        (lambda: ctx.send("x", 0), Status.BAD_REQUEST, "0"),
        (lambda: ctx.alloc(7, 1), Status.INVALID_ARGUMENT, "7"),
        (lambda: ctx.free(0, [5]), Status.INVALID_ARGUMENT, "5"),
        (lambda: kvxfer.Request(ctx, 123456789, "x", 1, "send").cancel(), Status.BAD_HANDLE, "123456789"),
        (lambda: kvxfer.Fence(ctx.handle).ready(), Status.BAD_HANDLE, "engine"),
        (lambda: kvxfer.node_open({"instance": "n"}), Status.CONFIG, "model"),
        (lambda: kvxfer.Node({"instance": "n", "model": "Llama-3.1-8B", "bnd": "x"}), Status.CONFIG, "bnd"),
    ]:
        with pytest.raises(KvxferError) as e:
            call()
        assert e.value.status == status, (e.value, status)
        assert needle in e.value.message, (needle, e.value.message)
    with pytest.raises(ValueError):
        kvxfer.Engine(small_config(unique("x")), memory=torch.zeros((64, 64)).t())  # not contiguous
    with pytest.raises(KvxferError) as e:
        kvxfer.Engine(small_config(unique("x"), pool_bytes=4096), memory=np.zeros(8192, np.uint8))
    assert e.value.status == Status.CONFIG and "8192" in e.value.message


def test_values_past_int32_are_refused_not_cut(pair):
    """ctypes keeps an int's low 32 bits: 2**32 + 32 would reach the
    library as 32, a valid chunk end. Every int the C ABI takes as int32_t
    is refused first, naming the argument and the value, and the request
    goes on."""
    ctx, gen = pair
    src = ctx.alloc(0, 2)
    tx = ctx.send("wide-1", 32)
    big = (1 << 32) + 32
    for call, needle in [
        (lambda: tx.chunk(0, big, [(0, src)]), "end = %d" % big),
        (lambda: tx.chunk(-(1 << 32), 32, [(0, src)]), "start = %d" % -(1 << 32)),
        (lambda: tx.chunk(0, 32, [(big, src)]), "runs[0] first = %d" % big),
        (lambda: tx.chunk(0, 32, [(0, [src[0], big])]), "block id = %d" % big),
        (lambda: tx.chunk(0, 32, [(0, src)], layers=(0, big, 4)), "layers hi = %d" % big),
        (lambda: ctx.send("wide-2", big), "prompt_len = %d" % big),
        (lambda: gen.receive("wide-3", 32, "ctx", timeout_ms=big), "timeout_ms = %d" % big),
    ]:
        with pytest.raises(ValueError) as e:
            call()
        assert needle in str(e.value), (needle, str(e.value))
    tx.chunk(0, 32, [(0, src)], fenced=False)  # the request went on
    tx.cancel()
    tx.wait()
    tx.release()
    ctx.free(0, src)


def test_unsigned_and_string_arguments_are_refused_not_cut(pair):
    """ctypes keeps an unsigned argument's low bits (2**32 is group 0, -1
    group 4294967295) and C ends a string at its first NUL ("a\\0b" and
    "a\\0c" would be one id): each is refused first, naming the argument
    and the value, and nothing is opened."""
    ctx, gen = pair
    before = kvxfer.handle_count()
    for call, needle in [
        (lambda: ctx.alloc(1 << 32, 1), "group = 4294967296"),
        (lambda: ctx.alloc(-1, 1), "group = -1"),
        (lambda: ctx.alloc(0, -1), "n = -1"),
        (lambda: ctx.used(1 << 32), "group = 4294967296"),
        (lambda: ctx.free(1 << 32, [0]), "group = 4294967296"),
        (lambda: ctx.block_address(-1, 0), "group = -1"),
        (lambda: ctx.block_address(0, 1 << 40), "block = %d" % (1 << 40)),
        (lambda: ctx.send("a\0b", 32), "id = 'a\\x00b' holds a NUL"),
        (lambda: gen.receive("a\0c", 32, ctx.instance), "id = 'a\\x00c' holds a NUL"),
        (lambda: gen.receive("r", 32, ctx.instance + "\0x"), "context = "),
        (lambda: ctx.send("s", 32, generation="g\0"), "generation = "),
        (lambda: gen.receive("u", 32, ctx.instance, user_data=-1), "user_data = -1"),
        (lambda: ctx.send("u", 32, user_data=1 << 64), "user_data = %d" % (1 << 64)),
        (lambda: gen.poll(1 << 31), "timeout_ms = %d" % (1 << 31)),
    ]:
        with pytest.raises(ValueError) as e:
            call()
        assert needle in str(e.value), (needle, str(e.value))
    assert kvxfer.handle_count() == before
    assert ctx.used(0) == 0
    tx = ctx.send("nul-fence", 32)
    src = ctx.alloc(0, 2)
    fence = tx.chunk(0, 32, [(0, src)])
    with pytest.raises(ValueError, match="reason = 'bad\\\\x00' holds a NUL"):
        fence.fail("bad\0")
    fence.ready()  # the fence was untouched
    tx.cancel()
    assert tx.wait().outcome == Outcome.CANCELLED
    tx.release()
    ctx.free(0, src)


def test_requests_refused_at_the_call(pair):
    """A negative timeout (0 is the engine's), a negative parallelism, a
    payload past 65536 bytes are refused by the library naming the value;
    a 5000-character id is named by its start and the 256-byte bound (the
    library reads no more of it), and the reason still fits the message."""
    ctx, gen = pair
    before = kvxfer.handle_count()
    for call, status, needles in [
        (lambda: ctx.send("neg", 32, timeout_ms=-1), Status.INVALID_ARGUMENT, ["timeout_ms = -1"]),
        (lambda: gen.receive("neg", 32, ctx.instance, timeout_ms=-100000), Status.INVALID_ARGUMENT,
         ["timeout_ms = -100000"]),
        (lambda: gen.receive("neg", 32, ctx.instance, context_tp=-1), Status.INVALID_ARGUMENT, ["context_tp = -1"]),
        (lambda: ctx.send("big", 32, payload=bytes(65537)), Status.INVALID_ARGUMENT, ["65537", "65536"]),
        (lambda: ctx.send("x" * 5000, 32), Status.BAD_REQUEST, ['req->id "xxxx', "longer than 256 bytes"]),
        (lambda: gen.receive("y" * 5000, 32, ctx.instance), Status.BAD_REQUEST,
         ['req->id "yyyy', "longer than 256 bytes"]),
    ]:
        with pytest.raises(KvxferError) as e:
            call()
        assert e.value.status == status, e.value
        for needle in needles:
            assert needle in e.value.message, (needle, e.value.message)
        assert len(e.value.message) < 300, e.value.message
    assert kvxfer.handle_count() == before


def test_handle_table_empty_after_1000_requests(pair):
    ctx, gen = pair
    base = kvxfer.handle_count()
    src = ctx.alloc(0, 2)
    for i in range(1000):
        rid = "many-%d" % i
        rx = gen.receive(rid, 32, ctx.instance)
        tx = ctx.send(rid, 32)
        tx.chunk(0, 32, [(0, src)]).ready()
        assert tx.wait().outcome == Outcome.DONE
        assert rx.wait().outcome == Outcome.READY
        gen.free(0, rx.blocks(0)[1])
        tx.release()
        rx.release()
    assert kvxfer.handle_count() == base
    assert gen.used(0) == 0
    ctx.free(0, src)


def test_exception_in_callback_does_not_kill_the_process(pair, capsys):
    ctx, gen = pair
    seen = []

    def cb(ev):
        seen.append(ev)
        if len(seen) == 1:
            raise RuntimeError("boom in a callback")

    gen.set_callback(cb)
    for i in range(2):
        rx = gen.receive("cb-%d" % i, 32, ctx.instance)
        rx.cancel()
        wait_until(lambda: len(seen) == i + 1, what="callback %d" % i)
        rx.release()
    assert len(gen.callback_errors) == 1 and "boom" in str(gen.callback_errors[0])
    assert [e.outcome for e in seen] == [Outcome.CANCELLED, Outcome.CANCELLED]
    assert "boom in a callback" in capsys.readouterr().err
    gen.set_callback(None)
    rx = gen.receive("cb-poll", 32, ctx.instance)
    rx.cancel()
    assert rx.wait().outcome == Outcome.CANCELLED  # back to polling
    rx.release()
    gc.collect()


def test_last_error_is_per_thread():
    import threading

    lib = kvxfer._lib.lib
    assert lib.kvxfer_cancel(111) == Status.BAD_HANDLE
    other = []

    def run():
        lib.kvxfer_engine_close(222, 0)
        other.append(lib.kvxfer_last_error())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert b"222" in other[0]
    assert b"111" in lib.kvxfer_last_error()
    assert ctypes.string_at(lib.kvxfer_status_name(Status.FENCE)) == b"KVXFER_ERR_FENCE"


def _cuda_driver_loads():
    """Whether a CUDA driver library can be loaded here ($KVXFER_LIBCUDA or
    libcuda.so.1), as kvxfer would."""
    try:
        ctypes.CDLL(os.environ.get("KVXFER_LIBCUDA") or "libcuda.so.1")
        return True
    except OSError:
        return False


class _FakeTorchEvent:
    """The two attributes of torch.cuda.Event that chunk() reads."""

    def __init__(self, handle, index):
        self.cuda_event = handle
        self.device = torch.device("cuda", index) if index is not None else None


def test_chunk_behind_cuda_event_errors(pair):
    """A chunk behind a CUDA event: an unrecorded torch event (handle 0) is
    refused naming cu_event; without a CUDA driver any handle is refused as
    UNSUPPORTED naming the missing driver (the handle is never used). The
    request goes on after both."""
    ctx, gen = pair
    rx = gen.receive("cuev-1", 32, ctx.instance)
    tx = ctx.send("cuev-1", 32)
    src = ctx.alloc(0, 2)
    with pytest.raises(KvxferError) as e:
        tx.chunk(0, 32, [(0, src)], cuda_event=_FakeTorchEvent(0, None))
    assert e.value.status == Status.INVALID_ARGUMENT and "cu_event" in e.value.message, e.value
    with pytest.raises(TypeError):
        tx.chunk(0, 32, [(0, src)], cuda_event="not an event")
    if _cuda_driver_loads():
        pytest.skip("a CUDA driver loads here: its absence cannot be tested (test/gpu covers a real event)")
    for ev, device in [(_FakeTorchEvent(0x1000, 1), None), (0x1000, 0)]:
        with pytest.raises(KvxferError) as e:
            tx.chunk(0, 32, [(0, src)], cuda_event=ev, device=device)
        assert e.value.status == Status.UNSUPPORTED, e.value
        assert "CUDA driver" in e.value.message and "0x1000" in e.value.message, e.value.message
    assert tx.chunk(0, 32, [(0, src)], fenced=False) is None  # the request went on
    assert tx.wait().outcome == Outcome.DONE
    assert rx.wait().outcome == Outcome.READY
    gen.free(0, rx.blocks(0)[1])
    tx.release()
    rx.release()
    ctx.free(0, src)


class _DroppedEvent:
    """A torch.cuda.Event stand-in whose collection a weakref sees."""

    def __init__(self, handle):
        self.cuda_event = handle
        self.device = torch.device("cuda", 0)


@pytest.mark.parametrize("ends", ["wait", "poll", "callback", "close"])
@pytest.mark.parametrize("layers", [None, (0, LAYERS, LAYERS)])
def test_chunk_keeps_its_cuda_event_until_the_request_ends(pair, monkeypatch, ends, layers):
    """A chunk behind a CUDA event whose caller dropped its reference (a
    fresh torch.cuda.Event per step, recorded and handed over): the event
    was collected (torch destroys its CUevent) while the engine still
    queried it, kept by nothing (checked to fail: collected at once).
    Kept alive until the request's event arrived (wait, poll, a callback)
    or its engine closed, then let go. The library is told the chunk is
    watched (no driver here): the request then waits for a chunk it never
    gets, and is cancelled."""
    ctx, gen = pair
    watched = []

    def chunk_cuda(h, start, end, last, *rest):
        watched.append(rest[-2])  # the event's handle: the library would query it
        return 0

    monkeypatch.setattr(kvxfer.core.lib, "kvxfer_chunk_cuda", chunk_cuda)
    monkeypatch.setattr(kvxfer.core.lib, "kvxfer_chunk_layers_cuda", chunk_cuda)
    src = ctx.alloc(0, 2)
    tx = ctx.send(unique("cuev-keep"), 32)
    ev = _DroppedEvent(0xE000)
    ref = weakref.ref(ev)
    assert tx.chunk(0, 32, [(0, src)], cuda_event=ev, layers=layers) is None
    del ev
    gc.collect()
    assert watched == [0xE000]
    assert ref() is not None, "the CUDA event of a watched chunk was collected: the engine queries a destroyed event"
    if ends == "close":
        ctx.close()
    else:
        if ends == "callback":
            seen = []
            ctx.set_callback(seen.append)
            tx.cancel()
            wait_until(lambda: seen, what="the callback's event")
        elif ends == "poll":
            tx.cancel()
            assert ctx.poll(5000)[0].outcome == Outcome.CANCELLED
        else:
            tx.cancel()
            assert tx.wait(5).outcome == Outcome.CANCELLED
        gc.collect()
        assert ref() is None, "the CUDA event outlived its request's event (%s)" % ends
        tx.release()
        ctx.free(0, src)
    gc.collect()
    assert ref() is None, "the CUDA event outlived its engine's close"
    assert not ctx._cuda_events, ctx._cuda_events


def test_cuda_event_of_a_refused_or_late_chunk(pair, monkeypatch):
    """A chunk behind a CUDA event that the library refuses keeps nothing;
    one it takes after the request's event came (a rank with nothing to
    write takes chunks and drops them) is let go when the request is
    released: neither lives for the rest of the process."""
    ctx, gen = pair
    src = ctx.alloc(0, 2)
    tx = ctx.send(unique("cuev-late"), 32)
    tx.cancel()
    assert tx.wait(5).outcome == Outcome.CANCELLED
    refs = []
    for status in (Status.BAD_CHUNK, 0):
        monkeypatch.setattr(kvxfer.core.lib, "kvxfer_chunk_cuda", lambda *a, st=status: st)
        ev = _DroppedEvent(0xE100 + status)
        refs.append(weakref.ref(ev))
        if status:
            with pytest.raises(KvxferError):
                tx.chunk(0, 32, [(0, src)], cuda_event=ev)
        else:
            tx.chunk(0, 32, [(0, src)], cuda_event=ev)
        del ev
    gc.collect()
    assert refs[0]() is None, "a refused chunk kept its CUDA event"
    tx.release()
    gc.collect()
    assert refs[1]() is None, "a released request kept its CUDA event"
    assert not ctx._cuda_events, ctx._cuda_events
    ctx.free(0, src)


def test_library_path_is_the_one_loaded():
    """library_path() names the library the package loaded: $KVXFER_LIB here
    (make pytest sets it); an installed wheel's is checked by make
    wheel-check."""
    want = os.environ.get("KVXFER_LIB")
    if not want:
        pytest.skip("KVXFER_LIB not set: the package found the library itself")
    assert kvxfer.library_path() == os.path.realpath(want)
    assert kvxfer.library_path() in open("/proc/self/maps").read()


def test_chunk_raw_groups_past_its_array_are_refused(pair):
    """chunk_raw takes the array and its count apart: a count that does not
    fit uint32_t or exceeds the array (the library would read past it) is
    refused naming the value, and the request goes on."""
    ctx, gen = pair
    src = ctx.alloc(0, 2)
    tx = ctx.send("raw-groups", 32)
    arr, keep = kvxfer.core._runs([(0, src)])
    for groups, needle in [(-1, "groups = -1 does not fit"), (1 << 32, "groups = %d does not fit" % (1 << 32)),
                           (2, "groups = 2, but runs_array holds 1 runs")]:
        with pytest.raises(ValueError) as e:
            tx.chunk_raw(0, 32, True, arr, groups, fenced=False)
        assert needle in str(e.value), (needle, str(e.value))
    with pytest.raises(ValueError, match="groups = 1, but runs_array holds 0 runs"):
        tx.chunk_raw(0, 32, True, None, 1, fenced=False)
    with pytest.raises(TypeError, match="runs_array must be a ctypes array of BlockRun, not"):
        tx.chunk_raw(0, 32, True, ctypes.pointer(arr[0]), 1, fenced=False)
    tx.chunk_raw(0, 32, True, arr, 1, fenced=False)  # the request went on
    tx.cancel()
    tx.wait()
    tx.release()
    ctx.free(0, src)


def _window_config(instance):
    """Layers 0-1 full attention, layers 2-3 a sliding window of 32 tokens."""
    layout = {"layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD, "dtype_bytes": 2, "tokens_per_block": TPB,
              "groups": [{"name": "full", "layers": [0, 1]}, {"name": "swa", "layers": [2, 3], "window": 32}]}
    return small_config(instance, layout=layout)


def test_receive_into_own_blocks_with_prefix_hits_and_a_window():
    """The caller's destination blocks of a group are those of its needed
    range: past 2 prefix-hit blocks for the full-attention group (global
    blocks [2, 7) of a 100-token prompt), only the window's [4, 7) for the
    sliding-window one. receive() tells the library where each run starts
    (it passed 0 for every group, which the library now refuses, and before
    took: READY's ids then held other global blocks than the caller's
    run said); each id gets its global block's bytes."""
    before = kvxfer.handle_count()
    with kvxfer.Engine(_window_config(unique("ctx"))) as ctx, kvxfer.Engine(_window_config(unique("gen"))) as gen:
        prompt, hits = 100, [2, 0]
        assert [gen.needed_range(prompt, g, hits[g]) for g in range(2)] == [(2, 7), (4, 7)]
        assert gen.needed_range(prompt, 1, 6) == (6, 7) and gen.needed_range(prompt, 0, 9) == (7, 7)
        assert gen.needed_range(20, 1) == (0, 2)  # a window longer than the prompt keeps it all
        src = [ctx.alloc(g, 7) for g in range(2)]
        rng = np.random.default_rng(5)
        for g in range(2):
            for b in src[g]:
                data = rng.integers(0, 256, ctx.groups[g].block_bytes, dtype=np.uint8).tobytes()
                ctypes.memmove(ctx.block_address(g, b), data, len(data))
        dst = [gen.alloc(0, 5), gen.alloc(1, 3)]
        rx = gen.receive("own-window", prompt, ctx.instance, blocks=dst, prefix_hit_blocks=hits)
        tx = ctx.send("own-window", prompt)
        tx.chunk(0, prompt, [(0, src[0]), (0, src[1])], fenced=False)
        assert tx.wait().outcome == Outcome.DONE
        ev = rx.wait()
        assert ev.outcome == Outcome.READY, (ev, rx.error_message())
        for g, first in enumerate([2, 4]):
            assert rx.blocks(g) == (first, dst[g])
            for k, d in enumerate(dst[g]):
                assert gen.block_bytes(g, d) == ctx.block_bytes(g, src[g][first + k]), (g, first + k)
        tx.release()
        rx.release()
        for g in range(2):
            ctx.free(g, src[g])
            gen.free(g, dst[g])
    assert kvxfer.handle_count() == before


def _mla_rank_config(instance):
    """Rank 1 of an MLA context instance of TP2: with a generation TP of 1
    it writes to no generation rank."""
    return {"instance": instance, "layout": {"layers": 2, "kv_heads": 1, "head_dim": 16, "dtype_bytes": 2,
                                             "tokens_per_block": 16, "mla": True},
            "tp": 2, "rank_tp": 1, "pool_bytes": 65536, "transfer_timeout_ms": 2000, "workers": 2}


def test_send_told_the_generation_parallelism(monkeypatch):
    """send(generation_tp=, generation_pp=) on a context rank that writes
    to no generation rank ends DONE at once, holding nothing (without them
    it fails at its deadline, 2 s here); bad values are refused naming
    them; a library without kvxfer_send_parallel is named, not called."""
    before = kvxfer.handle_count()
    with kvxfer.Engine(_mla_rank_config(unique("mla"))) as ctx:
        src = ctx.alloc(0, 2)
        tx = ctx.send("mla-1", 32, generation_tp=1, generation_pp=1)
        ev = tx.wait(timeout=10)
        assert (ev.outcome, ev.error) == (Outcome.DONE, Status.OK), (ev, tx.error_message())
        tx.chunk(0, 32, [(0, src)], fenced=False)  # taken; goes nowhere
        tx.release()
        ctx.free(0, src)
        assert ctx.used(0) == 0
        for tp, pp, status, needle in [(-1, 1, Status.INVALID_ARGUMENT, "generation_tp = -1, generation_pp = 1"),
                                       (2, 0, Status.INVALID_ARGUMENT, "generation_tp = 2, generation_pp = 0"),
                                       (1, 3, Status.BAD_REQUEST, "TP1/PP3")]:
            with pytest.raises(KvxferError) as e:
                ctx.send("mla-bad", 32, generation_tp=tp, generation_pp=pp)
            assert e.value.status == status and needle in e.value.message, e.value
        with pytest.raises(ValueError, match="generation_pp = %d does not fit" % (1 << 31)):
            ctx.send("mla-bad", 32, generation_tp=1, generation_pp=1 << 31)
        monkeypatch.setattr(kvxfer._lib, "missing", {"kvxfer_send_parallel"})
        with pytest.raises(KvxferError) as e:
            ctx.send("mla-old", 32, generation_tp=1, generation_pp=1)
        assert e.value.status == Status.UNSUPPORTED, e.value
        assert "kvxfer_send_parallel (KVXFER_ABI_MINOR 5)" in e.value.message, e.value.message
        tx = ctx.send("mla-plain", 32)  # kvxfer_send still serves a call that names neither
        tx.cancel()
        assert tx.wait().outcome == Outcome.CANCELLED
        tx.release()
    assert kvxfer.handle_count() == before


def test_set_payload_before_the_last_chunk(pair):
    """A payload known only when prefill ends (the first token; SGLang's
    aux slot, up to 64 KiB) is set before the last chunk, which carries it:
    READY has it in place of send()'s. After the last chunk, and on a
    receive, set_payload is refused."""
    ctx, gen = pair
    ids = ctx.alloc(0, 2)
    rx = gen.receive("late-payload", 32, ctx.instance)
    tx = ctx.send("late-payload", 32, payload=b"at open")
    tx.chunk(0, 16, [(0, ids[:1])], fenced=False)
    big = bytes(range(256)) * 256  # 65536 bytes, the most a payload holds
    tx.set_payload(big)
    tx.chunk(16, 32, [(1, ids[1:])], fenced=False)
    with pytest.raises(KvxferError) as e:
        tx.set_payload(b"too late")
    assert e.value.status == Status.BAD_REQUEST and "last chunk" in e.value.message
    with pytest.raises(KvxferError) as e:
        rx.set_payload(b"x")
    assert e.value.status == Status.INVALID_ARGUMENT and "receive" in e.value.message
    assert tx.wait(10).outcome == Outcome.DONE
    ev = rx.wait(10)
    assert ev.outcome == Outcome.READY, (ev, rx.error_message())
    assert rx.payload() == big
    rx.free_blocks()
    ctx.free(0, ids)


def test_stats(pair, monkeypatch):
    """Engine.stats(): a fresh engine counts nothing (the quarantine bound
    aside); a receive its context engine has no send for is an orphan
    there until it is cancelled (orphan_requests, then orphans_ended); a
    transfer posts ops. Every field of kvxfer_engine_stats is there, in
    its fixed layout, and those of kvxfer_engine_stats_ext (ops_in_doubt).
    A library older than KVXFER_ABI_MINOR 10 is named, not called."""
    ctx, gen = pair
    assert ctypes.sizeof(kvxfer._lib.EngineStats) == 240
    assert ctypes.sizeof(kvxfer._lib.EngineStatsExt) == 8 and kvxfer._lib.EngineStatsExt.ops_in_doubt.offset == 0
    st = ctx.stats()
    assert len(st) == 31 and {k for k, v in st.items() if v} <= {"quarantine_limit_bytes"}, st
    assert st["ops_in_doubt"] == 0, st
    for name in ("frames_stale", "cancels_deferred", "caller_blocks_awaiting_proof", "dest_block_errors",
                 "revoked_held_blocks", "closes_unproven", "parent_panics", "write_proofs_drained_goodbye"):
        assert name in st, name
    rx = gen.receive("st-orphan", 32, ctx.instance)
    wait_until(lambda: ctx.stats()["orphan_requests"] == 1, what="an orphan at the context engine")
    rx.cancel()
    assert rx.wait(10).outcome == Outcome.CANCELLED
    rx.release()
    wait_until(lambda: ctx.stats()["orphans_ended"] == 1 and ctx.stats()["orphan_requests"] == 0,
               what="the orphan ended")
    ids = ctx.alloc(0, 2)
    rx = gen.receive("st-moved", 32, ctx.instance)
    tx = ctx.send("st-moved", 32)
    tx.chunk(0, 32, [(0, ids)], fenced=False)
    assert tx.wait(10).outcome == Outcome.DONE and rx.wait(10).outcome == Outcome.READY
    rx.free_blocks()
    rx.release()
    tx.release()
    ctx.free(0, ids)
    st = ctx.stats()
    assert st["ops_posted"] > 0 and st["frames_rejected"] == 0 and st["quarantined_bytes"] == 0, st
    assert st["ops_in_doubt"] == 0, st
    monkeypatch.setattr(kvxfer._lib, "missing", {"kvxfer_engine_stats_ext_get"})
    old = ctx.stats()  # a library of KVXFER_ABI_MINOR 10: no ops_in_doubt to tell
    assert "ops_in_doubt" not in old and len(old) == 30 and old["ops_posted"] == st["ops_posted"], old
    monkeypatch.setattr(kvxfer._lib, "missing", {"kvxfer_engine_stats_get"})
    with pytest.raises(KvxferError) as e:
        ctx.stats()
    assert e.value.status == Status.UNSUPPORTED, e.value
    assert "kvxfer_engine_stats_get (KVXFER_ABI_MINOR 10)" in e.value.message, e.value.message


def test_stats_ops_in_doubt(pair, monkeypatch):
    """Engine.stats()["ops_in_doubt"] is kvxfer_engine_stats_ext's
    ops_in_doubt, read from the offset the library wrote, in the same
    snapshot as the other counters; a field the library says it did not
    write (an older library than this package) is left out, not read as
    0. (No backend of the C ABI leaves an op in doubt on demand: the Go
    tests make one; here the library's call is stood in for.)"""
    ctx, _ = pair
    real = kvxfer.core.lib.kvxfer_engine_stats_ext_get
    calls = []

    def ext_get(h, out, ext, size, written, wrote=8):
        st = real(h, out, ext, size, written)
        calls.append(size)
        if st == 0:
            ext._obj.ops_in_doubt = 3
            written._obj.value = wrote
        return st

    monkeypatch.setattr(kvxfer.core.lib, "kvxfer_engine_stats_ext_get", ext_get)
    st = ctx.stats()
    assert st["ops_in_doubt"] == 3 and calls == [ctypes.sizeof(kvxfer._lib.EngineStatsExt)], (st, calls)
    monkeypatch.setattr(kvxfer.core.lib, "kvxfer_engine_stats_ext_get",
                        lambda *a: ext_get(*a, wrote=0))
    st = ctx.stats()
    assert "ops_in_doubt" not in st and len(st) == 30, st
