"""kvxfer from Python: ctypes over libkvxfer.so (`make lib`), the standard
library only. NumPy arrays and PyTorch CPU tensors register as KV memory
through __array_interface__ / data_ptr().

    import kvxfer
    with kvxfer.Engine({"instance": "prefill", "model": "Llama-3.1-8B"}) as e:
        ...

See Engine, Request, Fence; connector.py maps the roles of a vLLM KV
connector onto them.
"""

from ._lib import ABI_VERSION
from .core import (
    Engine,
    Event,
    Fence,
    KvxferError,
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

__all__ = [
    "ABI_VERSION",
    "Engine",
    "Event",
    "Fence",
    "KvxferError",
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
