"""Run by test_close.py as its own process: an Engine and a Node left open
at exit, where starting a thread fails as Python 3.12 makes it fail in an
atexit handler ("can't create new thread at interpreter shutdown", cpython
gh-113964), on any version. argv[1]: a directory for the node's sockets.
Prints "open N" now and, once the module's exit hook ran, "after exit:
handles N engine H node H" (N the library's handle count)."""

import atexit
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def report():
    # Registered before kvxfer is imported: atexit runs it after the
    # module's hook.
    print("after exit: handles %d engine %d node %d" % (kvxfer.handle_count(), engine.handle, node.handle), flush=True)


atexit.register(report)

import kvxfer  # noqa: E402
from conftest import small_config, unique  # noqa: E402


def refuse_threads():
    # Registered after kvxfer is imported: atexit runs it before the
    # module's hook, which then can start no thread.
    def start(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    threading.Thread.start = start


atexit.register(refuse_threads)

d = sys.argv[1]
engine = kvxfer.Engine(small_config(unique("exit-nothread")))
node = kvxfer.Node({"instance": unique("exit-nothread-n"), "model": "Llama-3.1-8B", "tokens_per_block": 16,
                    "pool_bytes": 4 << 20, "backend": "shm", "workers": 2, "insecure": True,
                    "bind": "ipc://%s/a.sock" % d,
                    "peers": [{"instance": "ghost", "endpoint": "ipc://%s/g.sock" % d}]})
print("open %d" % kvxfer.handle_count(), flush=True)
