"""Engines, requests and fences over libkvxfer.so (standard library only)."""

import atexit
import collections.abc
import ctypes
import enum
import inspect
import json
import numbers
import os
import operator
import sys
import threading
import time
import traceback
import typing
import warnings
import weakref

from . import _lib
from ._lib import lib


class Status(enum.IntEnum):
    """kvxfer_status: what every call of the C ABI returns."""

    OK = 0
    INVALID_ARGUMENT = 1
    BAD_HANDLE = 2
    CONFIG = 3
    BAD_CHUNK = 4
    BAD_REQUEST = 5
    REQUEST_FAILED = 6
    PIN = 7
    TIMEOUT = 8
    CANCELLED = 9
    PEER_CANCELLED = 10
    PEER_GONE = 11
    MISMATCH = 12
    FENCE = 13
    ENGINE_FAILED = 14
    OUT_OF_BLOCKS = 15
    BUFFER_TOO_SMALL = 16
    NOT_FINISHED = 17
    UNSUPPORTED = 18
    CLOSED = 19
    INTERNAL = 20
    PEER_FAILED = 21  # the peer failed the request; its reason is in the message


class Outcome(enum.IntEnum):
    """kvxfer_outcome: how a request ended."""

    DONE = 1
    READY = 2
    FAILED = 3
    CANCELLED = 4
    TIMED_OUT = 5


class KvxferError(Exception):
    """A call refused: status is the Status, the message names the value."""

    def __init__(self, status, message):
        try:
            status = Status(status)
        except ValueError:
            pass
        super().__init__("%s: %s" % (getattr(status, "name", status), message))
        self.status = status
        self.message = message

    def __reduce__(self):
        # Built again from (status, message), not from args (the text):
        # an error that crosses processes (multiprocessing) unpickles.
        return (type(self), (self.status, self.message))


class KvxferTimeoutError(KvxferError, TimeoutError):
    """A kvxfer timeout: a KvxferError with Status.TIMEOUT that is also the
    builtin TimeoutError, so one `except TimeoutError` or one `except
    KvxferError` (with .status) catches every timeout the package raises:
    wait() past its timeout, and each call the library answers
    KVXFER_ERR_TIMEOUT (wait_peers(), a close() that did not finish).
    Built as KvxferError, (status, message), with its attributes."""


def _error(status, message):
    """The exception for a refused call's status: KvxferTimeoutError for
    Status.TIMEOUT, KvxferError for any other."""
    if status == Status.TIMEOUT:
        return KvxferTimeoutError(status, message)
    return KvxferError(status, message)


def _require(name, what):
    """KvxferError(UNSUPPORTED) when the loaded library lacks function name
    (one of _lib.SINCE_MINOR), naming what needed it and the minor."""
    _lib.library()  # what it lacks is known once it is loaded
    if name in _lib.missing:
        raise KvxferError(Status.UNSUPPORTED, "%s needs %s (KVXFER_ABI_MINOR %d), which libkvxfer.so at %s "
                          "lacks: load a newer library (make lib, or a newer wheel)"
                          % (what, name, _lib.SINCE_MINOR[name][0], _lib.path))


def _cuda_event(event, device):
    """(CUevent handle, device ordinal) of a torch.cuda.Event (its
    cuda_event and device attributes) or of an int handle."""
    handle = getattr(event, "cuda_event", event)
    if isinstance(handle, ctypes.c_void_p):
        handle = handle.value or 0
    if not isinstance(handle, int) or isinstance(handle, bool):
        raise TypeError("cuda_event must be a torch.cuda.Event or an int CUevent handle, not %r" % (event,))
    if device is None:
        dev = getattr(event, "device", None)  # torch: None until the event is recorded
        device = getattr(dev, "index", None)
        if device is None:
            device = 0
    return _u64("cuda_event", handle), _i32("device", device)


class LayerPart(typing.NamedTuple):
    """A layer part of a chunk (Request.chunk's layers=): the model's global
    layers [lo, hi) of its `of` layers (every layer of the model, not those
    this rank holds). LayerPart(0, 0, 0) is the whole chunk. Any (lo, hi,
    of) tuple does as well."""

    lo: int
    hi: int
    of: int


_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_U32_MAX, _U64_MAX = (1 << 32) - 1, (1 << 64) - 1


def _int(name, v):
    """v as an int (anything with __index__), or TypeError naming it: a
    float would otherwise be an unnamed "cannot be interpreted as an
    integer"."""
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError("%s = %r is a %s, not an int" % (name, v, type(v).__name__)) from None


def _i32(name, v):
    """v as an int that fits the C ABI's int32_t, or ValueError naming it
    (ctypes would silently keep its low 32 bits)."""
    v = _int(name, v)
    if not _I32_MIN <= v <= _I32_MAX:
        raise ValueError("%s = %d does not fit the C ABI's int32_t" % (name, v))
    return v


def _u32(name, v):
    """v as an int that fits the C ABI's uint32_t, or ValueError naming it
    (ctypes would keep its low 32 bits: 2**32 would be 0, -1 4294967295)."""
    v = _int(name, v)
    if not 0 <= v <= _U32_MAX:
        raise ValueError("%s = %d does not fit the C ABI's uint32_t" % (name, v))
    return v


def _u64(name, v):
    """v as an int that fits the C ABI's uint64_t, or ValueError naming it."""
    v = _int(name, v)
    if not 0 <= v <= _U64_MAX:
        raise ValueError("%s = %d does not fit the C ABI's uint64_t" % (name, v))
    return v


def _cstr(name, s):
    """s (a str) as the bytes of a C string, or ValueError naming it when it
    holds a NUL: C would end the string there, and "a\0b" and "a\0c" would
    be the same id; or when it is no UTF-8 (a lone surrogate)."""
    if not isinstance(s, str):
        raise TypeError("%s must be a str, not %s" % (name, type(s).__name__))
    shown = s if len(s) <= 64 else s[:64] + "... (%d characters)" % len(s)
    try:
        b = s.encode()
    except UnicodeEncodeError as exc:
        # A lone surrogate (os.fsdecode's or surrogateescape's stand-in
        # for a byte that is no UTF-8) has no UTF-8 form.
        raise ValueError("%s = %r is not valid UTF-8 text: %r at %d is a lone surrogate (a byte that was not "
                         "UTF-8, decoded with surrogateescape); pass the real text"
                         % (name, shown, s[exc.start], exc.start)) from None
    if b"\0" in b:
        raise ValueError("%s = %r holds a NUL character (at %d): a C string would end there"
                         % (name, shown, s.index("\0")))
    return b


def _payload_bytes(data):
    """A payload's bytes: a bytes-like object only. A str is a TypeError
    (encode it), and so is an int: bytes(5) would be five zero bytes."""
    if isinstance(data, str):
        raise TypeError("payload must be bytes-like, not str (%r): encode it" % (data[:64],))
    try:
        return bytes(memoryview(data))
    except TypeError:
        raise TypeError("payload must be bytes-like (bytes, bytearray, memoryview), not %s (%r)"
                        % (type(data).__name__, data)) from None


def _stages(name, stages):
    """A pipeline split (a Stages value: "7,8,8,7", or a list of each
    stage's layer count) as its string, "" for None; the library checks
    what it says. TypeError naming it for anything else."""
    if stages is None:
        return ""
    if isinstance(stages, str):
        return stages
    if isinstance(stages, (list, tuple)) and all(isinstance(n, int) and not isinstance(n, bool) for n in stages):
        return ",".join(str(n) for n in stages)
    raise TypeError("%s = %r: want each pipeline stage's layer count, \"7,8,8,7\" or [7, 8, 8, 7]" % (name, stages))


def _layer_part(layers):
    """(lo, hi, of) ints of a LayerPart or a 3-tuple; the library checks
    the values against the model."""
    try:
        lo, hi, of = layers
        lo, hi, of = operator.index(lo), operator.index(hi), operator.index(of)
    except (TypeError, ValueError):
        raise TypeError("layers must be a LayerPart or a (lo, hi, of) tuple of ints, not %r" % (layers,)) from None
    return _i32("layers lo", lo), _i32("layers hi", hi), _i32("layers of", of)


def _check(st):
    if st != 0:
        raise _error(st, lib.kvxfer_last_error().decode("utf-8", "replace"))


class Event:
    """One finished request (kvxfer_event)."""

    __slots__ = ("request", "outcome", "error", "bytes", "user_data")

    def __init__(self, ev):
        self.request = ev.request
        self.outcome = Outcome(ev.outcome)
        try:
            self.error = Status(ev.error)
        except ValueError:  # a code of a newer library: kept as the number
            self.error = ev.error
        self.bytes = ev.bytes
        self.user_data = ev.user_data

    @property
    def ok(self):
        return self.outcome in (Outcome.DONE, Outcome.READY)

    def __repr__(self):
        return "Event(request=%d, %s, error=%s, bytes=%d)" % (self.request, self.outcome.name,
                                                              getattr(self.error, "name", self.error), self.bytes)


def _cuda_index(t):
    """The CUDA ordinal of a torch tensor's memory (t.device: type "cuda",
    index), or None for host memory (a CPU tensor, or no device). Another
    device type is a ValueError naming it."""
    dev = getattr(t, "device", None)
    kind = getattr(dev, "type", "cpu")
    if dev is None or kind == "cpu":
        return None
    if kind != "cuda":
        raise ValueError("tensor on %s: kvxfer registers host memory and CUDA memory only" % (dev,))
    index = getattr(dev, "index", None)
    if not isinstance(index, int) or index < 0:
        raise ValueError("tensor on %s has no CUDA device index (%r)" % (dev, index))
    return index


def _where(device):
    """A memory's place as the errors name it: "cpu" or "cuda:N"."""
    return "cpu" if device is None else "cuda:%d" % device


# Why the in-process Engine refuses GPU memory, and what to use instead.
_ENGINE_NO_CUDA = ("the in-process Engine (kvxfer_engine_open, loopback data plane) copies with the CPU and cannot "
                   "read or write GPU memory: use a Node (kvxfer_node_open; for the vLLM connector, a node's keys "
                   "such as bind and peers) over backend 'ucx' with a UCX built with CUDA, or 'cudaipc' between "
                   "processes of one host")


def _buffer(mem):
    """(address, nbytes, CUDA ordinal or None, what to hold while the
    address is used: None, or a buffer's memoryview) of contiguous memory: a
    PyTorch tensor (data_ptr(); a CUDA tensor's address is a device
    pointer), anything with __array_interface__ (NumPy), or a writable
    buffer (bytearray, memoryview). Memory of no bytes is a ValueError: an
    empty tensor's address is 0, which the C ABI reads as "no pool given"
    (the engine would allocate one of its own and ignore the caller's)."""
    addr, nbytes, device, pin = _buffer_of(mem)
    if nbytes == 0:
        raise ValueError("memory is empty (0 bytes, %s of shape %s): want the KV pool's memory"
                         % (type(mem).__name__, tuple(getattr(mem, "shape", (0,)))))
    if device is None and hasattr(mem, "data_ptr") and hasattr(mem, "element_size"):
        # A CPU tensor the engine will address: its storage is made
        # unresizable (only here: buffer_address gives it to no engine).
        pin = _unresizable(mem)
    return addr, nbytes, device, pin


def _unresizable(t):
    """Makes a CPU tensor's storage unresizable, and returns the NumPy view
    that did it: t.resize_() to a larger size would move the bytes and free
    the old ones under the engine, whose copies into them then kill the
    process (SIGSEGV in the copier). PyTorch marks a storage unresizable,
    for good, once NumPy views it (it has no public setter); the tensor is
    otherwise untouched. The view is of the whole storage (a strided
    view's too). None when it cannot be made (it stays resizable, as
    before)."""
    torch = sys.modules.get("torch")
    try:
        if hasattr(t, "untyped_storage"):  # PyTorch 2
            whole = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
        else:
            whole = torch.empty(0, dtype=t.dtype).set_(t.storage()).view(torch.uint8)
        return whole.numpy()
    except Exception:  # noqa: BLE001 - another PyTorch's API, no NumPy: the contiguous view, or nothing
        try:
            return t.detach().reshape(-1).view(torch.uint8).numpy()
        except Exception:  # noqa: BLE001 - best effort
            return None


def _buffer_of(mem):
    """_buffer's (address, nbytes, device, pin), any size."""
    if hasattr(mem, "data_ptr") and hasattr(mem, "element_size"):  # torch.Tensor
        device = _cuda_index(mem)
        if not mem.is_contiguous():
            raise ValueError("tensor of shape %s is not contiguous" % (tuple(mem.shape),))
        return mem.data_ptr(), mem.numel() * mem.element_size(), device, None
    ai = getattr(mem, "__array_interface__", None)
    if ai is not None:
        if ai.get("strides") is not None and not mem.flags["C_CONTIGUOUS"]:
            raise ValueError("array of shape %s is not C-contiguous" % (ai["shape"],))
        addr, readonly = ai["data"]
        if readonly:
            raise ValueError("array is read-only")
        return addr, mem.nbytes, None, None
    try:
        view = memoryview(mem)
    except TypeError:
        raise TypeError("memory is a %s: want a PyTorch tensor, a NumPy array or a writable buffer (bytearray)"
                        % type(mem).__name__) from None
    if view.readonly or not view.contiguous:
        raise ValueError("buffer is read-only or not contiguous")
    if view.nbytes == 0:  # ctypes cannot take its address; _buffer names it
        return 0, 0, None, None
    # view, kept by the caller while the address is in use, holds the
    # buffer's export: a bytearray cannot be resized (moved) under it.
    return ctypes.addressof(ctypes.c_char.from_buffer(view)), view.nbytes, None, view


def buffer_address(mem):
    """(address, nbytes) of contiguous host memory: a PyTorch CPU tensor
    (data_ptr()), anything with __array_interface__ (NumPy), or a writable
    buffer (bytearray, memoryview). A CUDA tensor is a ValueError (a Node
    takes one as memory=)."""
    addr, nbytes, device, _ = _buffer_of(mem)
    if device is not None:
        raise ValueError("tensor on %s: buffer_address is for host memory (a Node takes a CUDA tensor as its "
                         "memory)" % _where(device))
    return addr, nbytes


_KV_KINDS = ("nhd", "hnd", "split_kv", "mla")


class _KvMemory(dict):
    """kv_memory's config object: the dict the library reads, plus the
    tensors its addresses point into (tensors), which an Engine opened with
    it keeps alive: the addresses alone would not."""

    __slots__ = ("tensors", "shape")


# Each kind's tensor dimensions (kv_memory), as the engine's info names them.
_KV_DIMS = {"nhd": ("2", "num_blocks", "tokens_per_block", "kv_heads", "head_dim"),
            "hnd": ("2", "num_blocks", "kv_heads", "tokens_per_block", "head_dim"),
            "split_kv": ("num_blocks", "tokens_per_block", "kv_heads", "head_dim"),
            "mla": ("num_blocks", "tokens_per_block", "head_dim")}


def _kv_shape_error(mem, info):
    """A message when the tensors of kv_memory's mem (its shape) do not
    have the engine's block size, heads of this rank or head dim (info):
    the library, given addresses and strides only, cannot tell, and would
    move part of each block, or past it. None when they match, or when mem
    is no kv_memory result (a copy made with dict() holds no shape)."""
    shape = getattr(mem, "shape", None)
    if shape is None or mem.get("kind") not in _KV_DIMS:
        return None
    dims = _KV_DIMS[mem["kind"]]
    known = {"2": 2, "num_blocks": shape[dims.index("num_blocks")], "tokens_per_block": info.tokens_per_block,
             "kv_heads": info.kv_heads, "head_dim": info.head_dim}
    want = tuple(known[d] for d in dims)
    if tuple(shape) == want:
        return None
    return ("memory: %s tensors of shape %s [%s], but kvxfer's layout for this rank has %s (%s; kv_heads: the "
            "heads this rank holds): the engine would move a part of each block, or past it"
            % (mem["kind"], tuple(shape), ", ".join(dims), want,
               ", ".join("%s %d" % (d, known[d]) for d in dims if d not in ("2", "num_blocks"))))


def _tensor(t):
    """(address, shape, byte strides, dtype, element size, CUDA ordinal or
    None) of a PyTorch tensor (CPU or CUDA) or NumPy array, any strides."""
    if hasattr(t, "data_ptr") and hasattr(t, "element_size"):  # torch.Tensor
        device = _cuda_index(t)
        es = t.element_size()
        return t.data_ptr(), tuple(t.shape), [s * es for s in t.stride()], t.dtype, es, device
    ai = getattr(t, "__array_interface__", None)
    if ai is None:
        raise TypeError("%r is neither a tensor nor an array" % (type(t),))
    return ai["data"][0], tuple(t.shape), list(t.strides), t.dtype, t.itemsize, None


def kv_memory(kind, layers, v_layers=None):
    """The "memory" config object for the framework's own KV tensors, one per
    layer this rank holds, in ascending layer order (PyTorch tensors, CPU or
    CUDA, or NumPy arrays, any strides):

      - "nhd": vLLM's [2, num_blocks, block_size, kv_heads, head_dim];
      - "hnd": [2, num_blocks, kv_heads, block_size, head_dim];
      - "split_kv": K tensors [num_blocks, block_size, kv_heads, head_dim] in
        layers and V tensors in v_layers;
      - "mla": [num_blocks, block_size, latent].

    Every tensor (V tensors too) must have the shape, dtype, strides and
    device of layers[0] (ValueError naming the first that differs):
    num_blocks and the strides are read from it. A read-only NumPy array
    is a ValueError naming it, as Engine(memory=) refuses one: a receive
    writes into the layers. Its element size goes in
    as dtype_bytes, which the engine refuses unless it is the layout's;
    an Engine or Node opened with the result refuses (ValueError naming
    both shapes) tensors whose block size, heads or
    head dim are not its layout's (block_size the tokens_per_block,
    kv_heads the heads the rank holds; mla's latent the head_dim).
    CUDA tensors (all on one GPU) put their ordinal in as "device": only a
    Node takes them (an Engine refuses them). Pass the result as
    config["memory"] of an Engine or a Node: the result holds the tensors,
    and an Engine or Node opened with it keeps them alive until it is
    closed (a copy made with dict(), or a config passed as JSON text, holds
    only addresses: pass the tensors as kv_caches then)."""
    if kind not in _KV_KINDS:
        raise ValueError("kind %r, want one of %s" % (kind, ", ".join(_KV_KINDS)))
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise TypeError("kv_memory: layers = %r: want a list of the layers' tensors" % (layers,))
    layers = list(layers)
    if not layers:
        raise ValueError("no layer tensors")
    want_dims = {"nhd": 5, "hnd": 5, "split_kv": 4, "mla": 3}[kind]
    tensors = [("layers[%d]" % i, t) for i, t in enumerate(layers)]
    tensors += [("v_layers[%d]" % i, t) for i, t in enumerate(v_layers or [])]
    addrs, first = [], None
    for name, t in tensors:
        if not hasattr(t, "shape"):
            raise TypeError("%s is a %s, neither a tensor nor an array" % (name, type(t).__name__))
        if len(t.shape) != want_dims:
            raise ValueError("%s: %s tensor of shape %s, want %d dimensions" % (name, kind, tuple(t.shape), want_dims))
        a, shape, st, dtype, es, device = _tensor(t)
        if not hasattr(t, "data_ptr") and t.__array_interface__["data"][1]:
            # A receive writes into it: a memmap opened "r" is mapped
            # read-only, and the copier's first write kills the process.
            raise ValueError("%s is a read-only array (shape %s): a receive writes into the layers' memory; pass "
                             "writable arrays (a memmap opened \"r+\", or a copy)" % (name, shape))
        if device is None and hasattr(t, "data_ptr"):  # a CPU tensor: resize_() would move it (_unresizable)
            _unresizable(t)
        neg = [d for d, x in enumerate(st) if x < 0]
        if neg:
            raise ValueError("%s has a negative stride (%d bytes in dimension %d, shape %s): the engine addresses "
                             "memory forward only; pass a copy in ascending order" % (name, st[neg[0]], neg[0], shape))
        if first is None:
            first = shape, st, dtype, es, device
        elif device != first[4]:
            raise ValueError("%s is on %s, layers[0] on %s: every layer's tensor must be on layers[0]'s device"
                             % (name, _where(device), _where(first[4])))
        elif shape != first[0]:
            raise ValueError("%s is of shape %s, layers[0] of %s: every layer's tensor must have layers[0]'s shape"
                             % (name, shape, first[0]))
        elif dtype != first[2]:
            raise ValueError("%s is %s, layers[0] %s (shape %s): every layer's tensor must have layers[0]'s dtype"
                             % (name, dtype, first[2], shape))
        elif st != first[1]:
            raise ValueError("%s has different strides from layers[0]: %s and %s bytes (shape %s)"
                             % (name, st, first[1], shape))
        addrs.append(a)
    shape, strides, _, elem_bytes, device = first
    if kind == "nhd":
        kv, block, token, head, elem = strides
    elif kind == "hnd":
        kv, block, head, token, elem = strides
    elif kind == "split_kv":
        (block, token, head, elem), kv = strides, 0
    else:
        (block, token, elem), head, kv = strides, 0, 0
    num_blocks = shape[1] if kind in ("nhd", "hnd") else shape[0]
    mem = _KvMemory(kind=kind, num_blocks=int(num_blocks), layers=addrs[:len(layers)], dtype_bytes=elem_bytes,
                    strides={"block": block, "token": token, "head": head, "elem": elem, "kv": kv})
    if device is not None:
        mem["device"] = device
    mem.tensors = [t for _, t in tensors]
    mem.shape = shape
    if kind == "split_kv":
        if v_layers is None or len(v_layers) != len(layers):
            raise ValueError("split_kv needs one V tensor per K tensor")
        mem["v_layers"] = addrs[len(layers):]
    elif v_layers:
        raise ValueError("v_layers is for split_kv only")
    return mem


def _ids_array(ids, name="block ids"):
    """A ctypes int32 array of block ids (ints, or anything with __index__:
    NumPy or torch integers). A float or str is a TypeError naming it:
    int() would cut 1.7 to block 1, another block than the caller's."""
    try:
        ids = [operator.index(i) for i in ids]
    except TypeError:
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError("%s = %r: want a list of int block ids" % (name, ids)) from None
        for k, i in enumerate(ids):
            try:
                operator.index(i)
            except TypeError:
                raise TypeError("%s[%d] = %r is a %s, not an int block id" % (name, k, i, type(i).__name__)) from None
        raise
    if ids and (min(ids) < _I32_MIN or max(ids) > _I32_MAX):
        bad = next(i for i in ids if not _I32_MIN <= i <= _I32_MAX)
        _i32("block id", bad)
    return (ctypes.c_int32 * len(ids))(*ids)


def _runs(runs, name="runs"):
    """A ctypes BlockRun array for [(first, ids), ...] (one per layer group),
    and the id arrays that must stay alive while it is used. name is what
    errors call runs (receive's blocks are its runs)."""
    if isinstance(runs, (str, bytes)) or not hasattr(runs, "__len__"):
        raise TypeError("%s = %r: want one (first global block, [block ids]) per layer group" % (name, runs))
    arr = (_lib.BlockRun * len(runs))()
    keep = []
    for g, run in enumerate(runs):
        try:
            first, ids = run
        except (TypeError, ValueError):
            raise TypeError("%s[%d] = %r: want a (first global block, [block ids]) pair per layer group, "
                            "[(0, [0, 1, 2])] for one group" % (name, g, run)) from None
        a = _ids_array(ids, "%s[%d] ids" % (name, g))
        keep.append(a)
        arr[g].first = _i32("runs[%d] first" % g, first)
        arr[g].count = len(a)
        arr[g].ids = ctypes.cast(a, ctypes.POINTER(ctypes.c_int32))
    return arr, keep


def handle_count():
    """Live handles of every kind in the process (engines, requests, fences)."""
    return lib.kvxfer_handle_count()


# What engines whose close did not finish (KVXFER_ERR_TIMEOUT, or an error
# after it began) registered as memory: their peers may still write into
# it, so it is referenced here for the rest of the process and never freed.
_held = []

# engine handle -> Engine, from its open until its close finished (or gave
# up and moved its memory to _held): the library holds the addresses of the
# engine's memory, kv_caches, config["memory"] tensors and callback thunks,
# so an Engine dropped without close() must not let Python free them.
_open = {}
_open_lock = threading.Lock()

# Per thread: the handles of the engines whose callback this thread is
# running (close() of such an engine would wait for itself).
_in_callback = threading.local()

# The longest single wait of poll() in the library: a KeyboardInterrupt
# (any signal's handler) waits at most this long.
_POLL_SLICE_MS = 100

# How many callback events of requests (Engine._called_back) an engine
# keeps before it first looks for released handles among them.
_PRUNE_MIN = 64

# How long the exit hook lets all engines still open drain, in all.
_EXIT_CLOSE_MS = 2000

# The longest request message Request.error_message() reads (it grows its
# buffer up to this size while a message fills it).
_ERROR_MESSAGE_MAX = 1 << 20


def _close_at_exit():
    """Closes every engine still open when the interpreter exits: a
    callback the library runs into a finalizing interpreter, or into
    memory Python frees on the way out, would crash the process. Each
    callback is unset first so that no new one starts; errors are warnings,
    never a failed exit."""
    with _open_lock:
        engines = list(_open.values())
    deadline = time.monotonic() + _EXIT_CLOSE_MS / 1000.0
    for e in engines:
        h = e.handle
        if not h:
            continue
        try:
            _check(lib.kvxfer_set_callback(h, _lib.CALLBACK(), None))
        except Exception as exc:  # noqa: BLE001 - the close below still runs
            warnings.warn("kvxfer: at exit, unsetting engine %s's callback failed: %s" % (e._name(), exc),
                          RuntimeWarning)
        try:
            # close() itself: where Python refuses to start a thread at
            # exit (3.12, cpython gh-113964) it runs the library's close in
            # this thread, elsewhere (3.9-3.11, 3.13) in its own thread.
            # That fallback lives in close(), not here, since a user's own
            # atexit handler that closes an engine needs it just as well.
            e.close(max(0, int((deadline - time.monotonic()) * 1000)))
        except Exception as exc:  # noqa: BLE001 - exiting: warn, go on with the others
            warnings.warn("kvxfer: at exit, closing engine %s failed: %s" % (e._name(), exc), RuntimeWarning)


atexit.register(_close_at_exit)


def _forget_after_fork():
    """In a forked child the engines of the parent are not this process's
    (the library refuses every call there, _lib._refuse_after_fork): none
    is closed at the child's exit. The lock may have been held by another
    thread of the parent at the fork."""
    global _open_lock
    _open_lock = threading.Lock()
    _open.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _nbytes(obj):
    """Bytes of a tensor, an array, a buffer, or lists / tuples / dicts of
    them (0 for what it cannot size)."""
    if obj is None:
        return 0
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):  # torch.Tensor
        return obj.numel() * obj.element_size()
    if hasattr(obj, "nbytes"):
        return obj.nbytes
    try:
        return memoryview(obj).nbytes
    except TypeError:
        return 0


def node_open(config, memory=None, kv_caches=None):
    """Opens a Node (see Node)."""
    return Node(config, memory, kv_caches)


def keygen():
    """A new CURVE keypair (public, secret), Z85 strings."""
    pub, sec = ctypes.create_string_buffer(41), ctypes.create_string_buffer(41)
    _check(lib.kvxfer_keygen(pub, sec))
    return pub.value.decode(), sec.value.decode()


def _json(config):
    """(JSON text, the config as a dict or None when it does not parse)."""
    if isinstance(config, str):
        try:
            return config, json.loads(config)
        except ValueError:
            return config, None  # the library names what is wrong
    try:
        # Not ASCII-escaped: a lone surrogate ("\udc80") would reach the
        # library as an escape it reads as U+FFFD, another name than the
        # caller's; as text, _cstr refuses it naming the config.
        return json.dumps(config, ensure_ascii=False), config
    except (TypeError, ValueError) as exc:  # a set, a tensor, a NaN...: name the config
        shown = repr(config)
        raise TypeError("config %s: not JSON: %s" % (shown if len(shown) <= 200 else shown[:200] + "...", exc)) from None


def _config_bytes(config):
    """(the config JSON as a C string, the config as a dict or None)."""
    js, cfg = _json(config)
    return _cstr("config", js), cfg


class Engine:
    """An in-process engine rank (loopback data plane): engines in one process
    find each other by instance name.

    config is a dict (or JSON string) as kvxfer_engine_open documents it.
    memory, when given, is the pool: a PyTorch CPU tensor, a NumPy array or a
    writable buffer, kept alive by the engine; block b of group g is at byte
    offset group(g).offset + b * group(g).block_bytes in it. It cannot be
    resized meanwhile (that would move it under the engine): a bytearray
    until close() finished, a tensor's storage for good (resize_() raises;
    kv_memory's CPU tensors too).

    Or the framework keeps its own KV tensors: config["memory"] is
    kv_memory(kind, tensors) and kv_caches the tensors (kept alive by the
    engine); block ids are then the tensors' own, and block_address and
    block_bytes do not apply.

    Host memory only: its loopback data plane copies with the CPU. CUDA
    tensors (as memory, or kv_memory of them) are a ValueError saying to
    use a Node, which takes them.

    memory and kv_caches (and the tensors of a kv_memory config["memory"])
    are kept alive by the module until close() succeeds, even when the
    Engine itself is dropped without it, and for the rest of the process
    when close() does not finish (a timeout: peers may still write into
    them; see close()). An engine still open at interpreter exit is closed
    then (its callback unset first), errors only warned about.
    """

    def __init__(self, config, memory=None, kv_caches=None):
        js, cfg = _config_bytes(config)
        addr, nbytes, device, pin = (None, 0, None, None) if memory is None else _buffer(memory)
        if device is None and isinstance(cfg, dict) and isinstance(cfg.get("memory"), dict):
            device = cfg["memory"].get("device")
        if device is not None:
            raise ValueError("memory on %s: %s" % (_where(device), _ENGINE_NO_CUDA))
        h = _lib.engine_t()
        _check(lib.kvxfer_engine_open(js, addr, nbytes, ctypes.byref(h)))
        self._keep_tensors(cfg, kv_caches)
        self._setup(h.value, cfg, memory, pin)

    def _keep_tensors(self, cfg, kv_caches):
        """Keeps the tensors config["memory"] (kv_memory) points into, and
        kv_caches, alive as long as the engine."""
        self.kv_caches = kv_caches
        mem = cfg.get("memory") if isinstance(cfg, dict) else None
        self._config_tensors = getattr(mem, "tensors", None)

    def _setup(self, handle, cfg, memory, pin=None):
        self.handle = handle
        # A memoryview of a buffer given as memory (a bytearray): while it
        # is held the buffer cannot be resized, which would move its bytes
        # away from the address the engine writes. Released by a close
        # that finished. (For a CPU tensor, the NumPy view that made its
        # storage unresizable, _unresizable: that lasts.)
        self._pin = pin
        with _open_lock:
            _open[handle] = self
        self.instance = (cfg.get("instance") or "kvxfer") if isinstance(cfg, dict) else None
        self.memory = memory
        if not hasattr(self, "kv_caches"):
            self.kv_caches = None
        if not hasattr(self, "_config_tensors"):
            self._config_tensors = None
        self._events = {}  # request handle -> Event, polled but not yet claimed
        self._waiting = {}  # request handle -> how many wait() calls wait for it
        # request handle -> its Event, which one wait() (or the callback)
        # got while other wait()s of it wait: each of them returns it too.
        # Gone once the last of them returned.
        self._shared = {}
        # request handle -> its Request while the caller holds it: an
        # event the callback takes is kept on it for a later wait().
        self._requests = weakref.WeakValueDictionary()
        # request handle -> the Event the callback got, for a later wait()
        # of its handle (its Request dropped meanwhile): until the handle is
        # released (Request.release, or found released by _prune_called_back)
        # or the engine closed.
        self._called_back = {}
        self._prune_at = _PRUNE_MIN
        # request handle -> the CUDA events (chunk(cuda_event=)) the library
        # may still query: kept alive until the request's event came, its
        # handle was released or the engine closed (kvxfer_chunk_cuda).
        self._cuda_events = {}
        self._closing = False  # a close() is under way (or done)
        self._lock = threading.Lock()
        # Held by a read of the pool (block_bytes) and by close() while it
        # marks the engine closing: a close never unmaps the pool under a
        # read that passed its closed check.
        self._reading = threading.Lock()
        self._tls = threading.local()  # per-thread poll buffers: any thread may poll
        self._cbs = []
        self.callback_errors = []
        info = _lib.EngineInfo()
        _check(lib.kvxfer_engine_info_get(self.handle, ctypes.byref(info)))
        self.info = info
        self.groups = []
        for g in range(info.groups):
            gi = _lib.GroupInfo()
            _check(lib.kvxfer_engine_group(self.handle, g, ctypes.byref(gi)))
            self.groups.append(gi)
        bad = _kv_shape_error(cfg.get("memory") if isinstance(cfg, dict) else None, info)
        if bad is not None:
            try:
                self.close()
            finally:
                raise ValueError(bad)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def tokens_per_block(self):
        return self.info.tokens_per_block

    def _live(self):
        """The engine's handle, or KvxferError(CLOSED) once it is closed."""
        h = self.handle
        if not h:
            raise KvxferError(Status.CLOSED, "engine %s is closed" % self._name())
        return h

    def _name(self):
        return "%r" % self.instance if self.instance else "(handle %d)" % self.handle

    def close(self, timeout_ms=5000):
        """Fails unfired fences, wakes every poll() / wait() / wait_peers()
        blocked on the engine (they raise KvxferError with Status.CLOSED),
        drains for up to timeout_ms, stops; releases every handle the engine
        owns. Idempotent once it succeeded; after it returns (or raises) no
        callback of the engine runs any more.

        A refused close (a negative timeout_ms, or a close from the engine's
        own callback, which would wait for that callback forever:
        Status.INVALID_ARGUMENT; another thread's close under way:
        Status.CLOSED) leaves the engine open, its handle kept. Any other
        error has closed it. (Status.CLOSED too when another thread's
        close finished meanwhile: that close answers for the memory.)

        Status.TIMEOUT (raised as KvxferTimeoutError, also a TimeoutError),
        or another error once the close began: some requests
        did not drain, or keep blocks quarantined (their writers suspected
        with no proof that their writes are over), and their peers may still
        write into this engine's memory. The engine's memory and kv_caches are then referenced by the
        module for the rest of the process (a RuntimeWarning names the
        engine and the bytes kept): never free them yourself.

        Ctrl-C (KeyboardInterrupt) ends a close() of the main thread within
        0.1 s, however long timeout_ms: the close goes on in the background
        and ends as it would have (its memory referenced until then, a
        RuntimeWarning if it does not finish), and the interpreter waits for
        it at exit. A close() called again meanwhile raises KvxferError with
        Status.CLOSED, leaving it to that one. (Where Python refuses to start
        that thread, at interpreter exit on 3.12, the close runs in the main
        thread itself, and Ctrl-C waits for it.)"""
        h = self.handle
        if not h:
            return
        timeout_ms = _i32("timeout_ms", timeout_ms)
        if h in getattr(_in_callback, "handles", ()):
            raise KvxferError(Status.INVALID_ARGUMENT, "close() of engine %s (handle %d) called from its own "
                              "callback: the close would wait for that callback to return, forever" % (self._name(), h))
        with self._reading:  # a read of the pool under way ends first; none starts after
            self._closing = True
        if threading.current_thread() is not threading.main_thread():
            self._close_done(h, lib.kvxfer_engine_close(h, timeout_ms))
            return
        # In the main thread the library's close runs in a thread of its
        # own, waited for in slices of _POLL_SLICE_MS: Python runs a
        # signal's handler (Ctrl-C's KeyboardInterrupt) only between C
        # calls, and would otherwise run it only once the whole close
        # returned. Interrupted, the close goes on in that thread, which
        # does what its status asks (the engine stays in _open, its memory
        # referenced, until then); the interpreter waits for it at exit.
        res = {}

        def run():
            try:
                self._close_done(h, lib.kvxfer_engine_close(h, timeout_ms))
            except BaseException as exc:  # noqa: B036 - handed to the caller below
                res["err"] = exc

        th = threading.Thread(target=run, name="kvxfer-close-%d" % h)
        try:
            th.start()
        except RuntimeError:
            # No thread could start, so run() never ran: Python 3.12
            # refuses new threads once the interpreter is exiting, in
            # atexit handlers too (_close_at_exit's close; cpython
            # gh-113964), and any version when the process is out of
            # threads. The close runs here instead, as run() would have (a
            # Ctrl-C then waits for it to return), so that the engine is
            # not left _closing with its handle open.
            self._close_done(h, lib.kvxfer_engine_close(h, timeout_ms))
            return
        while th.is_alive():
            th.join(_POLL_SLICE_MS / 1000.0)
        if "err" in res:
            raise res["err"]

    def _close_done(self, h, st):
        """What close() of handle h does once the library's close returned
        st: forgets or keeps the handle and the engine's memory as st says,
        and raises its error."""
        if st == Status.OK:
            self.handle = 0
            self._forget_requests()
            with _open_lock:
                _open.pop(h, None)
            if self._pin is not None:
                release = getattr(self._pin, "release", None)  # a memoryview's; a tensor's stays unresizable
                if release is not None:
                    release()
                self._pin = None
            return
        msg = lib.kvxfer_last_error().decode("utf-8", "replace")
        if st == Status.BAD_HANDLE:
            # Only a close releases an engine's handle: another thread's
            # close finished meanwhile and kept (or released) the memory
            # as its own status said. Nothing here did not finish.
            raise KvxferError(Status.CLOSED, "engine %s (handle %d) was closed by another thread's close() "
                              "meanwhile: %s" % (self._name(), h, msg))
        if st == Status.INVALID_ARGUMENT:  # refused: the engine is as it was
            self._closing = False
        elif st != Status.CLOSED:  # (CLOSED: another close is under way) the handle is gone
            self.handle = 0
            self._forget_requests()  # the library queries no CUDA event once its close returned
            self._hold(h, st)
            with _open_lock:
                _open.pop(h, None)
        raise _error(st, msg)

    def _forget_requests(self):
        """The close released every request handle: what was kept for
        them (callback events, CUDA events) goes."""
        with self._lock:
            self._called_back.clear()
            self._cuda_events.clear()

    def _closed_meanwhile(self, st, h):
        """Whether st (of a call on handle h) is BAD_HANDLE because a
        close() in another thread released the handle."""
        return st == Status.BAD_HANDLE and (self._closing or self.handle != h)

    def _call(self, fn, *args):
        """fn(handle, *args), a library call on the open engine, its status
        checked: BAD_HANDLE because another thread's close() released the
        handle after the closed check is CLOSED naming the engine, as the
        check itself would have said."""
        h = self._live()
        st = fn(h, *args)
        if self._closed_meanwhile(st, h):
            raise KvxferError(Status.CLOSED, "engine %s (handle %d) was closed by another thread's close() during "
                              "the call" % (self._name(), h))
        _check(st)

    def _hold(self, handle, status):
        """Keeps the memory of an engine whose close did not finish alive
        for the rest of the process (_held), with a warning."""
        objs = [o for o in (self.memory, self.kv_caches, self._config_tensors) if o is not None]
        if self._pin is not None:  # the buffer stays unresizable too
            _held.append(self._pin)
        if not objs:
            return
        _held.append(objs)
        warnings.warn("kvxfer: engine %s (handle %d) did not finish closing (%s): its memory, %d bytes, is kept "
                      "alive for the rest of the process, since its peers may still write into it"
                      % (self._name(), handle, Status(status).name, _nbytes(objs)),
                      RuntimeWarning, stacklevel=3)

    # Pool blocks -----------------------------------------------------------

    def alloc(self, group, n):
        """n source blocks of group from the engine's pool."""
        group, n = _u32("group", group), _u32("n", n)
        if group >= len(self.groups):  # before an array of n ids is built
            raise KvxferError(Status.INVALID_ARGUMENT, "alloc: layer group %d outside [0,%d)" % (group, len(self.groups)))
        if n > self.groups[group].blocks:
            raise KvxferError(Status.OUT_OF_BLOCKS, "alloc: n = %d blocks, group %d has %d in all"
                              % (n, group, self.groups[group].blocks))
        ids = (ctypes.c_int32 * n)()
        self._call(lib.kvxfer_blocks_alloc, group, n, ids)
        return list(ids)

    def free(self, group, ids):
        group = _u32("group", group)
        a = _ids_array(ids, "free ids")
        self._call(lib.kvxfer_blocks_free, group, a, len(a))

    def used(self, group=0):
        group = _u32("group", group)
        n = ctypes.c_uint32()
        self._call(lib.kvxfer_blocks_used, group, ctypes.byref(n))
        return n.value

    def block_address(self, group, block):
        """The address of a block of the pool (KvxferError with
        Status.CLOSED once the engine is closed: its pool may be freed)."""
        group, block = _int("group", group), _int("block", block)
        self._live()
        if not 0 <= group < len(self.groups):
            raise ValueError("group = %d outside [0, %d)" % (group, len(self.groups)))
        gi = self.groups[group]
        if not 0 <= block < gi.blocks:
            raise ValueError("block = %d outside group %d's [0, %d)" % (block, group, gi.blocks))
        return self.info.pool_base + gi.offset + block * gi.block_bytes

    @property
    def pool_device(self):
        """The CUDA ordinal of the pool's memory (a node on backend
        "cudaipc", or over CUDA tensors), or None for host memory. On a GPU
        block_address gives device pointers, which the CPU cannot read."""
        _lib.library()
        if "kvxfer_engine_pool_device" in _lib.missing:
            return None  # a library older than GPU memory: host memory only
        dev = ctypes.c_int32()
        self._call(lib.kvxfer_engine_pool_device, ctypes.byref(dev))
        return None if dev.value < 0 else dev.value

    def stats(self):
        """The engine's counters now, a dict of the fields of
        kvxfer_engine_stats and kvxfer_engine_stats_ext (kvxfer.h says
        what each counts): among them what holds pages (quarantined_bytes,
        revoked_held_blocks, caller_blocks_awaiting_proof,
        dest_block_errors), writes in doubt (ops_in_doubt now;
        closes_unproven, frames_silenced), refused frames (frames_rejected,
        frames_stale, frames_shed, cancels_deferred) and bugs survived
        (session_panics, parent_panics, stream_violations). A library older
        than KVXFER_ABI_MINOR 11 lacks kvxfer_engine_stats_ext_get: its
        dict has no ops_in_doubt (nor any later counter the library does
        not write). One older than KVXFER_ABI_MINOR 10 has none:
        KvxferError with Status.UNSUPPORTED naming kvxfer_engine_stats_get."""
        _require("kvxfer_engine_stats_get", "stats()")
        out = _lib.EngineStats()
        if "kvxfer_engine_stats_ext_get" in _lib.missing:
            self._call(lib.kvxfer_engine_stats_get, ctypes.byref(out))
            ext, written = None, 0
        else:
            ext, n = _lib.EngineStatsExt(), ctypes.c_size_t()
            self._call(lib.kvxfer_engine_stats_ext_get, ctypes.byref(out), ctypes.byref(ext),
                       ctypes.sizeof(ext), ctypes.byref(n))
            written = n.value
        st = {name: getattr(out, name) for name, _ in _lib.EngineStats._fields_}
        for name, typ in _lib.EngineStatsExt._fields_:
            if getattr(_lib.EngineStatsExt, name).offset + ctypes.sizeof(typ) <= written:
                st[name] = getattr(ext, name)
        return st

    def block_bytes(self, group, block):
        """A copy of one block's bytes (host memory; a ValueError on a GPU
        pool, whose block_address is a device pointer: copy it with CUDA)."""
        addr = self.block_address(group, block)
        dev = self.pool_device
        if dev is not None:
            raise ValueError("block %d of group %d is GPU memory (cuda:%d, device pointer %#x): block_bytes reads "
                             "host memory; copy it with CUDA" % (block, group, dev, addr))
        with self._reading:
            # Another thread's close() may have begun since the checks
            # above: its pool may be unmapped (a read would be SIGSEGV).
            if self._closing or not self.handle:
                raise KvxferError(Status.CLOSED, "engine %s was closed by another thread's close() during "
                                  "block_bytes(%d, %d): its pool may be unmapped" % (self._name(), group, block))
            return ctypes.string_at(addr, self.groups[group].block_bytes)

    # Requests --------------------------------------------------------------

    def send(self, id, prompt_len, payload=b"", timeout_ms=0, generation=None, user_data=0, generation_tp=0,
             generation_pp=0):
        """Opens the context side of request id (a str without NUL).
        payload: at most 65536 bytes (or set later: Request.set_payload); timeout_ms: 0 is the engine's transfer
        timeout, a negative one is refused.

        generation_tp, generation_pp: the generation instance's
        parallelism, when known (both, each >= 1; 0 and 0: not known). A
        context rank that writes to none of its ranks (MLA with a context
        TP larger than generation_tp) then ends DONE at once, pinning
        nothing, instead of failing at its deadline (kvxfer_send_parallel).
        A negative value, or one of the two 0, raises KvxferError with
        Status.INVALID_ARGUMENT naming both; a library older than
        KVXFER_ABI_MINOR 5 raises it with Status.UNSUPPORTED."""
        generation_tp, generation_pp = _i32("generation_tp", generation_tp), _i32("generation_pp", generation_pp)
        told = generation_tp != 0 or generation_pp != 0
        if told:
            _require("kvxfer_send_parallel",
                     "send(generation_tp=%d, generation_pp=%d)" % (generation_tp, generation_pp))
        payload = _payload_bytes(payload)
        buf = ctypes.create_string_buffer(payload, len(payload)) if payload else None
        req = _lib.SendRequest(_cstr("id", id), _i32("prompt_len", prompt_len), _i32("timeout_ms", timeout_ms),
                               ctypes.cast(buf, ctypes.c_void_p) if buf is not None else None,
                               _u32("payload length", len(payload)),
                               _cstr("generation", generation) if generation else None, _u64("user_data", user_data))
        h = _lib.request_t()
        if told:
            self._call(lib.kvxfer_send_parallel, ctypes.byref(req), generation_tp, generation_pp, ctypes.byref(h))
        else:
            self._call(lib.kvxfer_send, ctypes.byref(req), ctypes.byref(h))
        return self._adopt(Request(self, h.value, id, prompt_len, "send"))

    def _adopt(self, request):
        """request, known by its handle until the caller drops it (the
        callback keeps its event on it)."""
        self._requests[request.handle] = request
        with self._lock:
            ev = self._called_back.get(request.handle)  # the callback was first
            if ev is not None:
                request._event = ev
        return request

    def _keep_cuda_event(self, h, event):
        """Keeps event (a chunk's cuda_event) alive for request handle h."""
        with self._lock:
            self._cuda_events.setdefault(h, []).append(event)

    def _let_go_cuda_event(self, h, event):
        """The library refused the chunk behind event: one reference to it
        that _keep_cuda_event took for h goes."""
        with self._lock:
            kept = self._cuda_events.get(h, [])
            for i, e in enumerate(kept):
                if e is event:
                    del kept[i]
                    break
            if not kept:
                self._cuda_events.pop(h, None)

    def _ended(self, h):
        """(Under self._lock.) Request handle h's event came: the library
        queries none of its CUDA events any more."""
        self._cuda_events.pop(h, None)

    def _forget_request(self, h):
        """Request handle h was released: nothing is kept for it."""
        with self._lock:
            self._cuda_events.pop(h, None)
            self._called_back.pop(h, None)

    def _prune_called_back(self):
        """Forgets the callback's events of request handles that are
        released (through the library, not Request.release), once there
        are twice as many as after the last pruning."""
        with self._lock:
            handles = list(self._called_back)
        buf = ctypes.create_string_buffer(1)
        gone = [h for h in handles if lib.kvxfer_request_error(h, buf, 1) == Status.BAD_HANDLE]
        with self._lock:
            for h in gone:
                self._called_back.pop(h, None)
            self._prune_at = max(_PRUNE_MIN, 2 * len(self._called_back))

    def needed_range(self, prompt_len, group, prefix_hit_blocks=0):
        """(first, end): the global blocks [first, end) layer group `group`
        receives for a prompt of prompt_len tokens when the receiver holds
        its first prefix_hit_blocks blocks already (Go's
        kvcache.NeededRange): a sliding-window group only the blocks its
        window keeps, past the prefix hits. receive()'s blocks[group] are
        end - first ids, for these blocks in order."""
        group, prompt_len, hit = (_int("group", group), _int("prompt_len", prompt_len),
                                  _int("prefix_hit_blocks", prefix_hit_blocks))
        if not 0 <= group < len(self.groups):
            raise ValueError("group = %d outside [0, %d)" % (group, len(self.groups)))
        window, tpb = self.groups[group].window, self.tokens_per_block
        if prompt_len <= 0:
            return 0, 0
        end = -(-prompt_len // tpb)
        first = 0 if window <= 0 or window >= prompt_len else (prompt_len - window) // tpb
        first = max(first, hit)
        return min(first, end), end

    def receive(self, id, prompt_len, context, blocks=None, prefix_hit_blocks=None, context_tp=0, context_pp=0,
                timeout_ms=0, user_data=0, context_pp_stages=None):
        """Opens the generation side of request id. blocks, when given, are
        the caller's destination block ids per layer group (a list of lists),
        group g's for the global blocks needed_range(prompt_len, g,
        prefix_hit_blocks[g]) in order (a sliding-window group's only the
        window's, none past the prefix hits); else the engine allocates them
        from its pool.

        context_tp, context_pp: the context instance's parallelism (0 and
        0: 1 x 1, or, on a node, what the node knows of that instance).
        context_pp_stages: how its context_pp pipeline stages split the
        model's layers when not kvxfer's default, each stage's layer count
        in stage order ("7,8,8,7", or a list of ints), as that instance's
        pp_stages; None or "": the default split. A split that is no list
        of context_pp counts adding up to the model's layers raises
        KvxferError with Status.INVALID_ARGUMENT naming it; a library older
        than KVXFER_ABI_MINOR 9 raises it with Status.UNSUPPORTED
        (kvxfer_receive_stages)."""
        stages = _stages("context_pp_stages", context_pp_stages)
        if stages:
            _require("kvxfer_receive_stages", "receive(context_pp_stages=%r)" % stages)
        req = _lib.ReceiveRequest(_cstr("id", id), _i32("prompt_len", prompt_len), _i32("timeout_ms", timeout_ms),
                                  _cstr("context", context), _i32("context_tp", context_tp),
                                  _i32("context_pp", context_pp), None, 0, None, _u64("user_data", user_data))
        keep = []
        ph = None if prefix_hit_blocks is None else _ids_array(prefix_hit_blocks, "prefix_hit_blocks")
        if blocks is not None:
            if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__len__") or not len(blocks):
                # [] would reach the library as groups 0, which means "the
                # engine allocates": the caller's (empty) table ignored.
                raise ValueError("blocks = %r: want one list of block ids per layer group (the engine has %d); "
                                 "None lets the engine allocate them" % (blocks, len(self.groups)))
            for g, ids in enumerate(blocks):
                if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
                    raise TypeError("blocks[%d] = %r: want one list of block ids per layer group, [[10, 11, 12]] for "
                                    "one group" % (g, ids))
            # Each run names the global block its first id holds, which the
            # library checks: the group's first needed block.
            hits = list(ph) if ph is not None else []
            firsts = [self.needed_range(prompt_len, g, hits[g] if g < len(hits) else 0)[0]
                      if g < len(self.groups) else 0 for g in range(len(blocks))]
            arr, keep = _runs(list(zip(firsts, blocks)), "blocks")
            req.blocks = arr
            req.groups = len(blocks)
            keep.append(arr)
        if ph is not None:
            if blocks is not None and len(ph) != len(blocks):
                raise ValueError("prefix_hit_blocks has %d groups, blocks %d" % (len(ph), len(blocks)))
            req.prefix_hit_blocks = ph
            req.groups = len(ph)
            keep.append(ph)
        h = _lib.request_t()
        if stages:
            self._call(lib.kvxfer_receive_stages, ctypes.byref(req), _cstr("context_pp_stages", stages),
                       ctypes.byref(h))
        else:
            self._call(lib.kvxfer_receive, ctypes.byref(req), ctypes.byref(h))
        return self._adopt(Request(self, h.value, id, prompt_len, "receive"))

    # Completions -----------------------------------------------------------

    def poll(self, timeout_ms=0):
        """Finished events not yet claimed by wait(), waiting up to
        timeout_ms for the first (the GIL is released while waiting).

        Events another thread's wait() is waiting for are left to it (it
        finds them within 0.1 s), so poll() may return [] before
        timeout_ms. Ctrl-C (KeyboardInterrupt) ends a long poll() within
        0.1 s. An event poll() returned is not seen by a wait() that
        starts later. Once close() has begun, the events left are returned,
        then KvxferError with Status.CLOSED is raised."""
        timeout_ms = _i32("timeout_ms", timeout_ms)
        with self._lock:
            out = [ev for h, ev in self._events.items() if h not in self._waiting]
            for ev in out:
                del self._events[ev.request]
        if out:
            return out
        # Waits in slices of at most _POLL_SLICE_MS: Python runs a signal's
        # handler (Ctrl-C's KeyboardInterrupt) only between C calls, and
        # would otherwise run it only once the whole timeout had passed.
        deadline = time.monotonic() + timeout_ms / 1000.0
        left = timeout_ms  # a negative one goes to the library, which names it
        while True:
            evs = self._poll_raw(min(left, _POLL_SLICE_MS))
            if evs or left <= _POLL_SLICE_MS:
                break
            left = max(0, int((deadline - time.monotonic()) * 1000))
        with self._lock:
            for ev in evs:
                if ev.request in self._waiting:
                    self._events[ev.request] = ev
                else:
                    out.append(ev)
        return out

    def _poll_raw(self, timeout_ms):
        tls = self._tls
        buf = getattr(tls, "buf", None)
        if buf is None:
            buf = tls.buf = (_lib.Event * 64)()
            tls.got = ctypes.c_uint32()
        h = self._live()
        st = lib.kvxfer_poll(h, buf, len(buf), ctypes.byref(tls.got), timeout_ms)
        if self._closed_meanwhile(st, h):
            raise KvxferError(Status.CLOSED, "engine %s was closed" % self._name())
        _check(st)
        evs = [Event(buf[i]) for i in range(tls.got.value)]
        if evs and self._cuda_events:
            with self._lock:
                for ev in evs:
                    self._ended(ev.request)
        return evs

    def wait(self, request, timeout=30.0):
        """The event of request (a Request or handle), polling until it
        arrives or timeout seconds pass (then KvxferTimeoutError, a
        TimeoutError and a KvxferError with Status.TIMEOUT; None: no
        timeout). A Request's event is kept on it: a later wait() returns
        it again, and a wait() on a Request released after poll() or a
        callback took its event raises KvxferError with Status.BAD_HANDLE at
        once (not TimeoutError after timeout). Several wait()s of one
        request (threads) each return its event. With a callback set
        (set_callback), an event the callback gets is returned too to a
        wait() of its request under way, and to a later wait() of a Request
        the caller still holds or of its handle (until it is released). A
        close() of the engine meanwhile raises KvxferError with
        Status.CLOSED. Events of other requests it polls are kept for their
        wait() or poll(). A Request of another engine raises ValueError
        naming both: its event would never come here."""
        if not isinstance(request, Request) and (isinstance(request, bool) or not isinstance(request, int)):
            raise TypeError("wait: request = %r is a %s: want the Request send() or receive() returned (or its "
                            "handle), not its id" % (request, type(request).__name__))
        if isinstance(request, Request) and request.engine is not self:
            raise ValueError("request %r belongs to engine %s, not to engine %s: wait on its own engine"
                             % (request.id, request.engine._name(), self._name()))
        if isinstance(request, Request):
            if getattr(request, "_event", None) is not None:
                return request._event
            if getattr(request, "_released", False):
                raise KvxferError(Status.BAD_HANDLE, "request %r (handle %d) was released: its event went to poll() "
                                  "or a callback, and no other will come" % (request.id, request.handle))
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)):
            raise TypeError("timeout = %r: want seconds (a number) or None (no timeout)" % (timeout,))
        h = request.handle if isinstance(request, Request) else request
        req = request if isinstance(request, Request) else self._requests.get(h)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._waiting[h] = self._waiting.get(h, 0) + 1
        try:
            while True:
                with self._lock:
                    ev = self._events.pop(h, None)
                    if ev is None:
                        ev = self._shared.get(h)
                    if ev is None and req is not None:
                        ev = req._event  # the callback's
                    if ev is None:
                        ev = self._called_back.get(h)  # the callback's, its Request dropped
                    self._share(h, ev)
                if ev is not None:
                    break
                left = 0.1 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise KvxferTimeoutError(Status.TIMEOUT, "no event for request handle %d in %.1f s"
                                             % (h, timeout))
                for e in self._poll_raw(int(min(left, 0.1) * 1000) + 1):
                    with self._lock:
                        if e.request == h:
                            ev = e
                            self._share(h, ev)
                        else:
                            self._events[e.request] = e
                if ev is not None:
                    break
        finally:
            with self._lock:
                n = self._waiting.pop(h) - 1
                if n:
                    self._waiting[h] = n
                else:  # every wait() of it returned
                    self._shared.pop(h, None)
        if isinstance(request, Request):
            request._event = ev
        return ev

    def _share(self, h, ev):
        """(Under self._lock.) Keeps ev, the event of request handle h that
        a wait() got, for the other wait()s of h under way."""
        if ev is not None and self._waiting.get(h, 0) > 1:
            self._shared[h] = ev

    def _delivered(self, ev):
        """The callback got ev: a wait() of its request under way, or a
        later one of the Request the caller holds, returns it too."""
        req = self._requests.get(ev.request)
        with self._lock:
            self._ended(ev.request)
            if req is not None:
                req._event = ev
            if ev.request in self._waiting:
                self._shared[ev.request] = ev
            self._called_back[ev.request] = ev
            prune = len(self._called_back) > self._prune_at
        if prune:
            self._prune_called_back()

    def set_callback(self, fn):
        """Delivers each later event to fn(Event) on a library thread instead
        of the poll queue; None goes back to polling. An exception fn raises
        is caught, printed and appended to callback_errors: it never reaches
        the library. fn is called, never awaited: an async function is a
        TypeError (hand the event to an event loop from a plain function,
        loop.call_soon_threadsafe), and an awaitable fn returns anyway is
        a TypeError in callback_errors.

        fn may call any method of this engine except close(): close() waits
        for every callback under way, its own caller's too, and would never
        return (kvxfer_set_callback in kvxfer.h), so it raises KvxferError
        with Status.INVALID_ARGUMENT there instead. A callback being replaced
        may still run for an event already on its way, until close()
        returns; after it, none runs (even when the close timed out). A
        wait() of a request still gets its event (see wait())."""
        if fn is None:
            self._call(lib.kvxfer_set_callback, _lib.CALLBACK(), None)
            return
        if not callable(fn):  # else each event would be lost to a TypeError on a library thread
            raise TypeError("set_callback: fn = %r is not callable (None goes back to polling)" % (fn,))
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without one: taken as it is
            sig = None
        if sig is not None:
            try:
                sig.bind(None)
            except TypeError as exc:  # each event would be lost to this TypeError, on a library thread
                raise TypeError("set_callback: fn = %r cannot be called with one Event (%s): it would lose every "
                                "event" % (fn, exc)) from None
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            # Called on a library thread, it would only make a coroutine
            # that nothing awaits: its body would never run.
            raise TypeError("set_callback: fn = %r is an async function: kvxfer calls it on a library thread and never "
                            "awaits what it returns, so its body would never run; pass a plain function that hands "
                            "the event to your event loop (loop.call_soon_threadsafe, or "
                            "asyncio.run_coroutine_threadsafe(fn(ev), loop))" % (fn,))
        h = self._live()

        def trampoline(evp, _user):
            # close() reads this to refuse a close from the callback itself.
            handles = getattr(_in_callback, "handles", None)
            if handles is None:
                handles = _in_callback.handles = []
            handles.append(h)
            try:
                ev = Event(evp.contents)
                self._delivered(ev)
                res = fn(ev)
                if inspect.isawaitable(res):  # an async __call__: set_callback could not tell
                    close = getattr(res, "close", None)
                    if close is not None:
                        close()  # never run: no "never awaited" warning besides this error
                    raise TypeError("callback %r returned %r, an awaitable that kvxfer never awaits: it did not run "
                                    "for %r; pass a plain function that hands the event to your event loop "
                                    "(loop.call_soon_threadsafe)" % (fn, res, ev))
            except BaseException as exc:  # noqa: B036 - nothing may unwind into C
                self.callback_errors.append(exc)
                traceback.print_exc()
            finally:
                handles.pop()

        cb = _lib.CALLBACK(trampoline)
        self._call(lib.kvxfer_set_callback, cb, None)
        # Every thunk stays alive with the engine: one being replaced may
        # still run for an event already on its way.
        self._cbs.append(cb)


class Node(Engine):
    """One rank of kvxfer across processes (kvxfer_node_open): a ZeroMQ
    control link with CURVE, the ucx or shm data plane, pool memory peers can
    write (its own: see info.pool_base and block_address), heartbeats.
    config is node's JSON config as a dict or string; every Engine method
    works on a Node.

    Or the node runs over memory the framework allocated, as Engine does:
    memory, a tensor (CPU or CUDA), NumPy array or writable buffer, is the
    pool (config["pool_address"] and "pool_bytes" are set from it, and
    "pool_device" from a CUDA tensor's device; block b of group g at
    group(g).offset + b * group(g).block_bytes in it); or config["memory"]
    is kv_memory(kind, tensors), the framework's own tensors (kv_caches,
    optional, more tensors to keep alive), block ids the framework's. The
    node then has no pool of its own: peers write into that memory. A node
    that receives (not send_only) needs backend "ucx" (on "shm" it is
    refused naming the backend: shm's pool must live in its own /dev/shm
    file); a send_only node over host memory works on any backend. CUDA
    tensors need a data plane that reaches GPU memory (ucx with a UCX built
    with CUDA, or cudaipc between processes of one host; the library refuses
    others, naming them). memory and the tensors are kept alive as Engine
    keeps them (for the rest of the process when close() does not
    finish)."""

    def __init__(self, config, memory=None, kv_caches=None):
        pin = None
        if memory is not None:
            addr, nbytes, device, pin = _buffer(memory)
            _, cfg = _json(config)
            if not isinstance(cfg, dict):
                raise ValueError("memory given with a config that is no JSON object")
            if cfg.get("pool_bytes", nbytes) != nbytes:
                raise ValueError("pool_bytes = %r in the config but memory is %d bytes" % (cfg["pool_bytes"], nbytes))
            if cfg.get("pool_device", device) != device:
                raise ValueError("pool_device = %r in the config but memory is on %s"
                                 % (cfg["pool_device"], _where(device)))
            config = dict(cfg, pool_address=addr, pool_bytes=nbytes)
            if device is not None:
                config["pool_device"] = device
        js, cfg = _config_bytes(config)
        h = _lib.engine_t()
        _check(lib.kvxfer_node_open(js, ctypes.byref(h)))
        self._keep_tensors(cfg, kv_caches)
        self._setup(h.value, cfg, memory, pin)

    def _string(self, fn):
        buf = ctypes.create_string_buffer(512)
        self._call(fn, buf, len(buf))
        return buf.value.decode()

    def endpoint(self):
        """The bound control endpoint (a tcp port 0 resolved)."""
        return self._string(lib.kvxfer_node_endpoint)

    def public_key(self):
        """The node's CURVE public key (Z85), "" when insecure."""
        return self._string(lib.kvxfer_node_public_key)

    def wait_peers(self, timeout_ms=10000):
        """Waits for every configured peer's Hello (KvxferTimeoutError, a
        KvxferError with Status.TIMEOUT and a TimeoutError, after
        timeout_ms; KvxferError with Status.CLOSED at once when the node is
        closed meanwhile). Ctrl-C ends it within 0.1 s."""
        timeout_ms = _i32("timeout_ms", timeout_ms)
        h = self._live()
        # In calls of at most _POLL_SLICE_MS, as poll(): Ctrl-C's
        # KeyboardInterrupt runs only between C calls. The last call's
        # TIMEOUT names the peers that said nothing.
        deadline = time.monotonic() + timeout_ms / 1000.0
        left = timeout_ms  # a negative one goes to the library, which names it
        while True:
            st = lib.kvxfer_node_wait_peers(h, min(left, _POLL_SLICE_MS))
            if st != Status.TIMEOUT or left <= _POLL_SLICE_MS:
                break
            left = max(0, int((deadline - time.monotonic()) * 1000))
        if self._closed_meanwhile(st, h):
            raise KvxferError(Status.CLOSED, "node %s was closed" % self._name())
        _check(st)


def _engine_closed(engine):
    """Whether engine (an Engine, or None) is closed or closing: the handles
    of its requests and fences are released (or about to be)."""
    return engine is not None and (engine._closing or not engine.handle)


class Fence:
    """A chunk's fence: ready() once its KV is written, or fail(reason).
    Once its engine is closed (its close failed the fence), either raises
    KvxferError with Status.CLOSED naming the engine, as every call on a
    Request of that engine does."""

    __slots__ = ("handle", "engine")

    def __init__(self, handle, engine=None):
        self.handle = handle
        self.engine = engine

    def _check(self, st):
        if st == Status.BAD_HANDLE and _engine_closed(self.engine):
            raise KvxferError(Status.CLOSED, "fence %d: its engine %s was closed, which failed the fence (its chunk "
                              "was not sent) and released it: %s"
                              % (self.handle, self.engine._name(), lib.kvxfer_last_error().decode("utf-8", "replace")))
        _check(st)

    def ready(self):
        self._check(lib.kvxfer_fence_ready(self.handle))

    def fail(self, reason):
        self._check(lib.kvxfer_fence_fail(self.handle, _cstr("reason", reason)))


class Request:
    """One request's handle (send or receive side)."""

    def __init__(self, engine, handle, id, prompt_len, side):
        self.engine = engine
        self.handle = handle
        self.id = id
        self.prompt_len = prompt_len
        self.side = side
        self._event = None  # the event a wait() returned: a later wait() returns it again
        self._released = False

    def __repr__(self):
        return "Request(%r, %s, handle=%d)" % (self.id, self.side, self.handle)

    def _check(self, st):
        """_check(st) of a call on this request: BAD_HANDLE because its
        engine was closed (here or by another thread), which released the
        request's handle, is CLOSED naming the request and the engine."""
        if st == Status.BAD_HANDLE and not self._released and _engine_closed(self.engine):
            raise KvxferError(Status.CLOSED, "request %r (handle %d): its engine %s was closed, which released the "
                              "request: %s" % (self.id, self.handle, self.engine._name(),
                                               lib.kvxfer_last_error().decode("utf-8", "replace")))
        _check(st)

    def chunk(self, start, end, runs, last=None, fenced=True, cuda_event=None, device=None, layers=None):
        """Hands over tokens [start, end) whose KV sits in runs: one
        (first global block, [block ids]) per layer group. fenced: returns a
        Fence to call ready() on once the KV is written; else the KV is taken
        as written and None is returned.

        cuda_event: the chunk is sent once this CUDA event completed (and
        None is returned): a torch.cuda.Event recorded on the producing
        stream after the writes (its cuda_event handle is used; the event is
        created lazily by torch, so record it first), or a raw CUevent /
        cudaEvent_t handle as an int. device is its CUDA device ordinal:
        by default the torch event's own device, else 0. kvxfer only queries
        the event, and keeps a reference to it until this request's event
        arrived (wait(), poll() or the callback), the request was released
        or the engine closed: do not record it again before that (an int
        handle is the caller's to keep alive). Without a CUDA driver in the
        process it raises KvxferError with Status.UNSUPPORTED.

        A run may name more blocks than the chunk's own (a request's whole
        block table, first 0): the engine reads and pins only the chunk's
        blocks among them, and leaves the others alone.

        layers: hand only a layer part of the chunk, a LayerPart or (lo, hi,
        of) tuple: the model's layers [lo, hi) of its `of` layers, each part
        with its own fence or cuda_event (kvxfer_chunk_layers), as vLLM's
        save_kv_layer produces them. A chunk's parts come in layer order
        from layer 0, each starting where the one before ended, all with the
        same start, end, last and runs; the part ending at layer `of`
        completes the chunk. Anything else raises KvxferError with
        Status.BAD_CHUNK naming the layers; nothing of it is taken and the
        request goes on. None (or (0, 0, 0)) is the whole chunk."""
        if last is None:
            last = end == self.prompt_len
        start, end = _i32("start", start), _i32("end", end)
        arr, keep = _runs(runs)
        if cuda_event is not None:
            handle, dev = _cuda_event(cuda_event, device)
            lo, hi, of = (0, 0, 0) if layers is None else _layer_part(layers)
            # The engine holds the event, kept alive for it (a caller may
            # drop its own: torch would destroy the CUevent the library
            # queries) until the request's event came, it was released or
            # the engine closed. Kept before the call: the event may come
            # before the call returns.
            self.engine._keep_cuda_event(self.handle, cuda_event)
            try:
                if layers is None:
                    self._check(lib.kvxfer_chunk_cuda(self.handle, start, end, 1 if last else 0, arr, len(runs),
                                                      handle, dev))
                else:
                    self._check(lib.kvxfer_chunk_layers_cuda(self.handle, start, end, 1 if last else 0, lo, hi, of,
                                                             arr, len(runs), handle, dev))
            except BaseException:
                self.engine._let_go_cuda_event(self.handle, cuda_event)
                raise
            return None
        return self.chunk_raw(start, end, last, arr, len(runs), fenced, keep, layers=layers)

    def chunk_raw(self, start, end, last, runs_array, groups, fenced=True, _keep=None, layers=None):
        """chunk() with a prebuilt ctypes BlockRun array (the hot path);
        layers as chunk()'s. groups, the runs the library reads, is at most
        len(runs_array) (ValueError otherwise: it would read past it)."""
        start, end = _i32("start", start), _i32("end", end)
        groups = _u32("groups", groups)
        try:
            have = 0 if runs_array is None else len(runs_array)
        except TypeError:
            raise TypeError("runs_array must be a ctypes array of BlockRun, not %s"
                            % type(runs_array).__name__) from None
        if groups > have:
            raise ValueError("groups = %d, but runs_array holds %d runs: the library would read past it"
                             % (groups, have))
        if layers is not None:
            lo, hi, of = _layer_part(layers)
            f = _lib.fence_t() if fenced else None
            self._check(lib.kvxfer_chunk_layers(self.handle, start, end, 1 if last else 0, lo, hi, of, runs_array,
                                                groups, ctypes.byref(f) if fenced else None))
            return Fence(f.value, self.engine) if fenced else None
        if not fenced:
            self._check(lib.kvxfer_chunk(self.handle, start, end, 1 if last else 0, runs_array, groups, None))
            return None
        f = _lib.fence_t()
        self._check(lib.kvxfer_chunk(self.handle, start, end, 1 if last else 0, runs_array, groups, ctypes.byref(f)))
        return Fence(f.value, self.engine)

    def cancel(self):
        self._check(lib.kvxfer_cancel(self.handle))

    def wait(self, timeout=30.0):
        return self.engine.wait(self, timeout)

    def blocks(self, group=0):
        """(first global block, [destination block ids]) of a READY request."""
        group = _u32("group", group)
        n, first = ctypes.c_uint32(), ctypes.c_int32()
        ids = (ctypes.c_int32 * 256)()
        st = lib.kvxfer_request_blocks(self.handle, group, ids, len(ids), ctypes.byref(n), ctypes.byref(first))
        if st == Status.BUFFER_TOO_SMALL:
            ids = (ctypes.c_int32 * n.value)()
            st = lib.kvxfer_request_blocks(self.handle, group, ids, n.value, ctypes.byref(n), ctypes.byref(first))
        self._check(st)
        return first.value, list(ids[: n.value])

    def payload(self):
        n = ctypes.c_uint32()
        st = lib.kvxfer_request_payload(self.handle, None, 0, ctypes.byref(n))
        if st not in (0, Status.BUFFER_TOO_SMALL):
            self._check(st)
        buf = ctypes.create_string_buffer(n.value)
        self._check(lib.kvxfer_request_payload(self.handle, buf, n.value, ctypes.byref(n)))
        return buf.raw[: n.value]

    def error_message(self):
        """The outcome's message ("" on success), whole: the library cuts
        one that does not fit the buffer (before a character, up to 3
        bytes short of it), so a message that fills it is asked for again
        with a larger one (a peer's reason nested in this side's message
        outgrows 1 KiB), up to _ERROR_MESSAGE_MAX bytes."""
        cap = 1024
        while True:
            buf = ctypes.create_string_buffer(cap)
            self._check(lib.kvxfer_request_error(self.handle, buf, cap))
            if len(buf.value) < cap - 4 or cap >= _ERROR_MESSAGE_MAX:
                return buf.value.decode("utf-8", "replace")
            cap *= 4

    def set_payload(self, data):
        """Sets the payload this send's generation side gets with SUCCESS
        (bytes-like, at most 65536 bytes), replacing send()'s: for what is
        known only when prefill ends. Call it before the last chunk (or its
        last layer part), which carries it; refused after it, and for a
        receive."""
        _require("kvxfer_request_set_payload", "Request.set_payload")
        data = _payload_bytes(data)
        n = _u32("payload length", len(data))
        buf = ctypes.create_string_buffer(data, n) if data else None
        self._check(lib.kvxfer_request_set_payload(self.handle, buf, n))

    def free_blocks(self):
        """Frees a READY request's engine-allocated destination blocks (a receive
        into the caller's own blocks is refused: they are the caller's to free)."""
        self._check(lib.kvxfer_request_free_blocks(self.handle))

    def release(self):
        self._check(lib.kvxfer_request_release(self.handle))
        self._released = True
        self.engine._forget_request(self.handle)


def config_object(what, config):
    """A config as a dict, from a mapping or the JSON text of an object
    (as Engine takes it); anything else is a TypeError, and text that is
    no JSON object a ValueError, naming what took it."""
    if isinstance(config, str):
        try:
            cfg = json.loads(config)
        except ValueError as exc:
            raise ValueError("%s: config %r is no valid JSON: %s" % (what, config[:80], exc)) from None
        if not isinstance(cfg, dict):
            raise ValueError("%s: config %r: want a JSON object, got %s" % (what, config[:80], type(cfg).__name__))
        return cfg
    if isinstance(config, collections.abc.Mapping):
        return dict(config)
    raise TypeError("%s: config must be a dict (or its JSON text), not %s (%r)" % (what, type(config).__name__, config))


def config_from_env(var, missing):
    """The JSON object in environment variable var: JSON text, or the path
    of a file that holds it. A ValueError names what is missing (missing,
    when var is unset or empty) or wrong."""
    raw = os.environ.get(var)
    if not raw:
        raise ValueError(missing)
    text = raw
    if raw.lstrip()[:1] not in ("{", "["):  # not JSON text: a file's path
        try:
            with open(raw) as f:
                text = f.read()
        except OSError as exc:
            raise ValueError("%s = %r: neither JSON nor a readable file (%s)" % (var, raw, exc)) from None
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise ValueError("%s: invalid JSON: %s" % (var, exc)) from None
    if not isinstance(cfg, dict):
        raise ValueError("%s: want a JSON object, got %s" % (var, type(cfg).__name__))
    return cfg
