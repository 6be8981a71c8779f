import itertools
import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kvxfer  # noqa: E402

_names = itertools.count()


def unique(prefix):
    """A name no other test in the process uses (engines of one process
    share the in-memory control link and find each other by instance)."""
    return "%s-%d-%d" % (prefix, os.getpid(), next(_names))


def small_config(instance, **kw):
    cfg = {"instance": instance, "layout": {"name": "tiny", "layers": 4, "kv_heads": 2, "head_dim": 8,
                                            "dtype_bytes": 2, "tokens_per_block": 16},
           "pool_bytes": 1 << 20, "transfer_timeout_ms": 10000, "workers": 2}
    cfg.update(kw)
    return cfg


def wait_until(cond, timeout=10.0, what="condition"):
    """Polls cond() until true or the deadline (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(0.001)


@pytest.fixture
def pair():
    """A context and a generation engine of the tiny layout, closed after
    the test; the handle table must be back where it was."""
    before = kvxfer.handle_count()
    ctx = kvxfer.Engine(small_config(unique("ctx")))
    gen = kvxfer.Engine(small_config(unique("gen")))
    yield ctx, gen
    ctx.close()
    gen.close()
    assert kvxfer.handle_count() == before


def reap_within(pid, seconds=20.0):
    """The wait status of forked child pid once it exited, polled until the
    deadline; None when it did not exit (it is killed and reaped then)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def run_children(child, jobs, env=None, timeout=120):
    """Runs each job in its own Python process running the script child
    (the job as JSON in argv[1]; env added to this process's environment)
    and waits for all; {name: (exit code, its last JSON line, its stderr's
    end)}. A child past timeout kills them all and raises."""
    env = dict(os.environ, **(env or {}))
    procs = {k: subprocess.Popen([sys.executable, child, json.dumps(job)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env) for k, job in jobs.items()}
    out = {}
    for k, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            raise
        lines = stdout.strip().splitlines()
        out[k] = (p.returncode, json.loads(lines[-1]) if lines else None, stderr[-2000:])
    return out
