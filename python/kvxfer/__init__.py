"""kvxfer from Python: ctypes over libkvxfer.so (`make lib`), the standard
library only. NumPy arrays and PyTorch CPU tensors register as KV memory
through __array_interface__ / data_ptr().

    import kvxfer
    with kvxfer.Engine({"instance": "prefill", "model": "Llama-3.1-8B"}) as e:
        ...

See Engine, Request, Fence; connector.py maps the roles of a vLLM KV
connector onto them.
"""

__version__ = "0.1.0"  # the wheel's version (pyproject.toml reads it from here)

from . import _lib  # noqa: E402
from ._lib import ABI_VERSION  # noqa: E402
from .core import (  # noqa: E402
    Engine,
    Event,
    Fence,
    KvxferError,
    KvxferTimeoutError,
    LayerPart,
    Node,
    Outcome,
    Request,
    Status,
    buffer_address,
    handle_count,
    keygen,
    kv_memory,
    node_open,
)


def library_path():
    """The libkvxfer.so this package loaded: $KVXFER_LIB when set, else the
    one next to the package (an installed wheel's), else the repository's
    lib/. Loads it if no call did yet."""
    _lib.library()
    return _lib.path


__all__ = [
    "ABI_VERSION",
    "library_path",
    "Engine",
    "Event",
    "Fence",
    "KvxferError",
    "KvxferTimeoutError",
    "LayerPart",
    "Node",
    "Outcome",
    "Request",
    "Status",
    "buffer_address",
    "handle_count",
    "keygen",
    "kv_memory",
    "node_open",
]
