"""Run by test_close.py as its own process: two engines with callbacks set
and requests timing out, left open when the interpreter exits while their
callbacks run. Prints one line, "exiting N" (N callbacks so far), and must
exit 0 without a crash."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kvxfer  # noqa: E402
from conftest import small_config, unique, wait_until  # noqa: E402

ctx = kvxfer.Engine(small_config(unique("exit-ctx"), pool_bytes=8 << 20))
gen = kvxfer.Engine(small_config(unique("exit-gen"), pool_bytes=8 << 20))
seen = [0]


def cb(ev):
    # A callback with some work in it, so that many are under way at exit.
    seen[0] += 1
    until = time.monotonic() + 0.001
    while time.monotonic() < until:
        pass


ctx.set_callback(cb)
gen.set_callback(cb)
for i in range(200):
    gen.receive("exit-%d" % i, 32, ctx.instance, timeout_ms=50)
    try:
        ctx.send("exit-%d" % i, 32, timeout_ms=50)
    except kvxfer.KvxferError:
        # On a loaded machine the receive's 50 ms may be over before the
        # Send: its session finished, and the Send is refused. Only the
        # exit is under test.
        pass
wait_until(lambda: seen[0] > 0, what="the first timed-out request's callback")
print("exiting %d" % seen[0], flush=True)
