"""ctypes declarations of include/kvxfer.h and the loading of libkvxfer.so.

The library is found at $KVXFER_LIB, else next to this package, else in the
repository's lib/ (where `make lib` puts it). It is loaded at the first
call of one of its functions, not at import: loading it starts its Go
runtime, which a forked child does not inherit, and a process that only
imports kvxfer before it forks (vLLM's engine process, whose scheduler-side
connector makes no call, before it forks its workers) must leave its
children able to load it themselves.
"""

import ctypes
import os
import threading

ABI_VERSION = 1  # KVXFER_ABI_VERSION this package was written against

engine_t = ctypes.c_uint64
request_t = ctypes.c_uint64
fence_t = ctypes.c_uint64


class Event(ctypes.Structure):
    _fields_ = [
        ("request", request_t),
        ("outcome", ctypes.c_int32),
        ("error", ctypes.c_int32),
        ("bytes", ctypes.c_uint64),
        ("user_data", ctypes.c_uint64),
    ]


class BlockRun(ctypes.Structure):
    _fields_ = [
        ("first", ctypes.c_int32),
        ("count", ctypes.c_uint32),
        ("ids", ctypes.POINTER(ctypes.c_int32)),
    ]


class EngineInfo(ctypes.Structure):
    _fields_ = [
        ("groups", ctypes.c_uint32),
        ("tokens_per_block", ctypes.c_uint32),
        ("kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32),
        ("dtype_bytes", ctypes.c_uint32),
        ("parts", ctypes.c_uint32),
        ("pool_base", ctypes.c_uint64),
        ("pool_bytes", ctypes.c_uint64),
        ("bytes_per_token", ctypes.c_uint64),
    ]


class GroupInfo(ctypes.Structure):
    _fields_ = [
        ("offset", ctypes.c_uint64),
        ("block_bytes", ctypes.c_uint64),
        ("blocks", ctypes.c_uint32),
        ("layers", ctypes.c_uint32),
        ("window", ctypes.c_int32),
        ("reserved", ctypes.c_uint32),
    ]


class EngineStats(ctypes.Structure):
    """kvxfer_engine_stats (KVXFER_ABI_MINOR 10): 30 fields of 8 bytes,
    a layout that never changes."""

    _fields_ = [(name, ctypes.c_uint64 if name.startswith("quarantine") else ctypes.c_int64) for name in (
        "ops_posted", "worker_restarts", "frames_unsent", "frames_rejected", "frames_stale", "frames_shed",
        "cancels_deferred", "session_panics", "session_panics_past_budget", "parent_panics", "pin_errors",
        "leases_lapsed", "stream_violations", "blocks_revoked", "revoked_held_blocks",
        "caller_blocks_awaiting_proof", "dest_block_errors", "quarantined_bytes", "quarantine_limit_bytes",
        "closes_unproven", "frames_silenced", "waiting_for_blocks", "orphan_requests", "orphans_ended",
        "write_proofs_exited", "write_proof_requests_exited", "write_proofs_pidfd_exit",
        "write_proof_requests_pidfd_exit", "write_proofs_drained_goodbye", "write_proof_requests_drained_goodbye")]


class EngineStatsExt(ctypes.Structure):
    """kvxfer_engine_stats_ext (KVXFER_ABI_MINOR 11): the counters added
    after kvxfer_engine_stats, 8 bytes each, a later minor's at the end.
    kvxfer_engine_stats_ext_get is told this struct's size and says how
    many bytes of it the library wrote (an older library writes fewer)."""

    _fields_ = [
        ("ops_in_doubt", ctypes.c_int64),  # minor 11
    ]


class SendRequest(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_char_p),
        ("prompt_len", ctypes.c_int32),
        ("timeout_ms", ctypes.c_int32),
        ("payload", ctypes.c_void_p),
        ("payload_len", ctypes.c_uint32),
        ("generation", ctypes.c_char_p),
        ("user_data", ctypes.c_uint64),
    ]


class ReceiveRequest(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_char_p),
        ("prompt_len", ctypes.c_int32),
        ("timeout_ms", ctypes.c_int32),
        ("context", ctypes.c_char_p),
        ("context_tp", ctypes.c_int32),
        ("context_pp", ctypes.c_int32),
        ("blocks", ctypes.POINTER(BlockRun)),
        ("groups", ctypes.c_uint32),
        ("prefix_hit_blocks", ctypes.POINTER(ctypes.c_int32)),
        ("user_data", ctypes.c_uint64),
    ]


CALLBACK = ctypes.CFUNCTYPE(None, ctypes.POINTER(Event), ctypes.c_void_p)

_u32p = ctypes.POINTER(ctypes.c_uint32)
_i32p = ctypes.POINTER(ctypes.c_int32)
_st = ctypes.c_int32

_PROTOTYPES = {
    "kvxfer_abi_version": (ctypes.c_int32, []),
    "kvxfer_last_error": (ctypes.c_char_p, []),
    "kvxfer_status_name": (ctypes.c_char_p, [ctypes.c_int32]),
    "kvxfer_engine_open": (_st, [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(engine_t)]),
    "kvxfer_node_open": (_st, [ctypes.c_char_p, ctypes.POINTER(engine_t)]),
    "kvxfer_node_endpoint": (_st, [engine_t, ctypes.c_char_p, ctypes.c_uint32]),
    "kvxfer_node_public_key": (_st, [engine_t, ctypes.c_char_p, ctypes.c_uint32]),
    "kvxfer_node_wait_peers": (_st, [engine_t, ctypes.c_int32]),
    "kvxfer_keygen": (_st, [ctypes.c_char_p, ctypes.c_char_p]),
    "kvxfer_engine_close": (_st, [engine_t, ctypes.c_int32]),
    "kvxfer_engine_info_get": (_st, [engine_t, ctypes.POINTER(EngineInfo)]),
    "kvxfer_engine_group": (_st, [engine_t, ctypes.c_uint32, ctypes.POINTER(GroupInfo)]),
    "kvxfer_blocks_alloc": (_st, [engine_t, ctypes.c_uint32, ctypes.c_uint32, _i32p]),
    "kvxfer_blocks_free": (_st, [engine_t, ctypes.c_uint32, _i32p, ctypes.c_uint32]),
    "kvxfer_blocks_used": (_st, [engine_t, ctypes.c_uint32, _u32p]),
    "kvxfer_send": (_st, [engine_t, ctypes.POINTER(SendRequest), ctypes.POINTER(request_t)]),
    "kvxfer_chunk": (_st, [request_t, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(BlockRun),
                           ctypes.c_uint32, ctypes.POINTER(fence_t)]),
    "kvxfer_chunk_cuda": (_st, [request_t, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(BlockRun),
                                ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32]),
    "kvxfer_chunk_layers": (_st, [request_t, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                  ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(BlockRun), ctypes.c_uint32,
                                  ctypes.POINTER(fence_t)]),
    "kvxfer_chunk_layers_cuda": (_st, [request_t, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                       ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(BlockRun), ctypes.c_uint32,
                                       ctypes.c_uint64, ctypes.c_int32]),
    "kvxfer_fence_ready": (_st, [fence_t]),
    "kvxfer_fence_fail": (_st, [fence_t, ctypes.c_char_p]),
    "kvxfer_receive": (_st, [engine_t, ctypes.POINTER(ReceiveRequest), ctypes.POINTER(request_t)]),
    "kvxfer_cancel": (_st, [request_t]),
    "kvxfer_poll": (_st, [engine_t, ctypes.POINTER(Event), ctypes.c_uint32, _u32p, ctypes.c_int32]),
    "kvxfer_set_callback": (_st, [engine_t, CALLBACK, ctypes.c_void_p]),
    "kvxfer_request_blocks": (_st, [request_t, ctypes.c_uint32, _i32p, ctypes.c_uint32, _u32p, _i32p]),
    "kvxfer_request_payload": (_st, [request_t, ctypes.c_void_p, ctypes.c_uint32, _u32p]),
    "kvxfer_request_error": (_st, [request_t, ctypes.c_char_p, ctypes.c_uint32]),
    "kvxfer_request_free_blocks": (_st, [request_t]),
    "kvxfer_request_release": (_st, [request_t]),
    "kvxfer_handle_count": (ctypes.c_uint64, []),
    "kvxfer_bench_go": (_st, [engine_t, engine_t, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                              ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_uint64)]),
}

# Functions the package uses only when a call needs them, with the
# KVXFER_ABI_MINOR that added each (those above are required at load). A
# library older than that lacks one and loads all the same (missing names
# it); the call that needs it raises, naming the function and the minor.
SINCE_MINOR = {
    "kvxfer_send_parallel": (5, (_st, [engine_t, ctypes.POINTER(SendRequest), ctypes.c_int32, ctypes.c_int32,
                                       ctypes.POINTER(request_t)])),
    "kvxfer_engine_pool_device": (7, (_st, [engine_t, ctypes.POINTER(ctypes.c_int32)])),
    "kvxfer_request_set_payload": (8, (_st, [request_t, ctypes.c_void_p, ctypes.c_uint32])),
    "kvxfer_receive_stages": (9, (_st, [engine_t, ctypes.POINTER(ReceiveRequest), ctypes.c_char_p,
                                        ctypes.POINTER(request_t)])),
    "kvxfer_engine_stats_get": (10, (_st, [engine_t, ctypes.POINTER(EngineStats)])),
    "kvxfer_engine_stats_ext_get": (11, (_st, [engine_t, ctypes.POINTER(EngineStats), ctypes.POINTER(EngineStatsExt),
                                               ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)])),
}


def _candidates():
    env = os.environ.get("KVXFER_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "libkvxfer.so"), os.path.join(here, "..", "..", "lib", "libkvxfer.so")]


def load():
    global path
    tried = []
    for candidate in _candidates():
        if os.path.exists(candidate):
            path = os.path.realpath(candidate)
            try:
                lib = ctypes.CDLL(path)
            except OSError as exc:
                # dlopen's words alone ("Is a directory", "invalid ELF
                # header", a missing libzmq) name neither where the path
                # came from nor what to do.
                raise OSError("libkvxfer.so at %s%s cannot be loaded: %s; it must be the library `make lib` builds "
                              "(lib/libkvxfer.so), and it needs libzmq and UCX at run time"
                              % (candidate, " (from $KVXFER_LIB)" if os.environ.get("KVXFER_LIB") else "", exc)) from None
            break
        tried.append(candidate)
    else:
        raise OSError("libkvxfer.so not found (tried %s); run `make lib` or set KVXFER_LIB "
                      "(an installed wheel carries it: `make wheel`)" % ", ".join(tried))
    for name, (res, args) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    missing.clear()
    for name, (_minor, (res, args)) in SINCE_MINOR.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.add(name)
            continue
        fn.restype = res
        fn.argtypes = args
    got = lib.kvxfer_abi_version()
    if got != ABI_VERSION:
        raise OSError("libkvxfer.so at %s has ABI %d, this package needs %d" % (path, got, ABI_VERSION))
    return lib


path = None  # the library loaded (library_path())
missing = set()  # the functions of SINCE_MINOR that library lacks
_loaded = None  # the CDLL, once loaded
_load_lock = threading.Lock()


def library():
    """The library, loaded (once) if it was not yet: OSError when it cannot
    be found or has another ABI."""
    global _loaded
    if _loaded is None:
        with _load_lock:
            if _loaded is None:
                _loaded = load()
    return _loaded


class _Library:
    """lib: libkvxfer.so's functions, the library loaded at the first one
    used (library()). Each function found is kept in the instance's
    dict, so later calls look it up as a plain attribute (__getattr__ runs
    only for a name not found there: a lookup through it cost ~0.4 µs a
    call); setting or deleting one (a test's monkeypatch) does both."""

    def __getattr__(self, name):
        fn = getattr(library(), name)
        self.__dict__[name] = fn
        return fn

    def __setattr__(self, name, value):
        setattr(library(), name, value)
        self.__dict__[name] = value

    def __delattr__(self, name):
        delattr(library(), name)
        self.__dict__.pop(name, None)


lib = _Library()


def _refuse_after_fork():
    """In a child forked from this process (os.fork, multiprocessing's
    "fork" start method) after the library was loaded: its Go runtime did
    not survive the fork (only the forking thread did), and its first call
    would block forever. Every function of the library raises instead,
    naming the fork; the engines open in the parent are the parent's."""
    msg = ("kvxfer: this process (pid %d) was forked from process %d after it loaded libkvxfer: the library's "
           "runtime does not survive a fork. Start the process with the 'spawn' or 'forkserver' start method "
           "(vLLM: VLLM_WORKER_MULTIPROC_METHOD=spawn), or import kvxfer only in the child" % (os.getpid(), os.getppid()))

    def refuse(*_args, **_kwargs):
        raise RuntimeError(msg)

    global _load_lock
    if _loaded is None:  # not loaded before the fork: the child loads its own
        # (another thread of the parent may have held the lock, loading)
        _load_lock = threading.Lock()
        return
    for name in list(_PROTOTYPES) + list(SINCE_MINOR):
        setattr(_loaded, name, refuse)
        lib.__dict__[name] = refuse  # what the proxy kept


os.register_at_fork(after_in_child=_refuse_after_fork)
