"""Every timeout the package raises is one exception type,
KvxferTimeoutError: a KvxferError with Status.TIMEOUT and the builtin
TimeoutError, so `except TimeoutError` and `except KvxferError` (with
.status) both catch it. (wait() raised the builtin TimeoutError alone,
wait_peers() and close() a KvxferError alone.) The close that times out is
test_twoproc.py's test_close_that_times_out_keeps_the_memory_alive."""

import tempfile

import pytest

import kvxfer
from kvxfer import KvxferError, KvxferTimeoutError, Outcome, Status

from conftest import unique


def _is_timeout(exc):
    assert isinstance(exc, KvxferTimeoutError), type(exc)
    assert isinstance(exc, KvxferError) and isinstance(exc, TimeoutError), type(exc).__mro__
    assert exc.status == Status.TIMEOUT, exc.status
    assert str(exc).startswith("TIMEOUT: ") and exc.message in str(exc), str(exc)


def test_timeout_errors_exported():
    assert "KvxferTimeoutError" in kvxfer.__all__
    assert issubclass(kvxfer.KvxferTimeoutError, kvxfer.KvxferError)
    assert issubclass(kvxfer.KvxferTimeoutError, TimeoutError)
    e = KvxferTimeoutError(Status.TIMEOUT, "made here")
    assert (e.status, e.message, str(e)) == (Status.TIMEOUT, "made here", "TIMEOUT: made here")


@pytest.mark.parametrize("by", ["request", "handle"])
def test_timeout_errors_request_wait(pair, by):
    """A wait() past its timeout, of a Request or of a bare handle."""
    ctx, gen = pair
    rx = gen.receive(unique("r"), 32, ctx.instance)  # no sender comes
    with pytest.raises(TimeoutError) as err:
        if by == "request":
            rx.wait(timeout=0.05)
        else:
            gen.wait(rx.handle, timeout=0.05)
    _is_timeout(err.value)
    assert "request handle %d" % rx.handle in err.value.message
    with pytest.raises(KvxferError) as err:  # the other except catches it as well
        rx.wait(timeout=0)
    _is_timeout(err.value)
    rx.cancel()
    assert rx.wait(timeout=None).outcome == Outcome.CANCELLED
    rx.release()


def test_timeout_errors_wait_peers():
    """A node's wait_peers() for a peer that never comes."""
    with tempfile.TemporaryDirectory(prefix="kvx") as d:
        node = kvxfer.Node({"instance": unique("n"), "model": "Llama-3.1-8B", "tokens_per_block": 16,
                            "pool_bytes": 4 << 20, "backend": "shm", "workers": 2, "insecure": True,
                            "bind": "ipc://%s/a.sock" % d,
                            "peers": [{"instance": "ghost", "endpoint": "ipc://%s/g.sock" % d}]})
        try:
            with pytest.raises(TimeoutError) as err:
                node.wait_peers(50)
            _is_timeout(err.value)
            assert "ghost" in err.value.message, err.value.message
            with pytest.raises(KvxferError) as err:
                node.wait_peers(0)
            _is_timeout(err.value)
        finally:
            node.close()


def test_timeout_errors_pickle():
    # A kvxfer error crossing processes (multiprocessing pickles it) comes
    # back as itself: same class, status and message. (Before, unpickling
    # called __init__ with the text alone and raised TypeError.)
    import pickle
    for err in (kvxfer.KvxferError(kvxfer.Status.CONFIG, "layers -1"),
                kvxfer.KvxferTimeoutError(kvxfer.Status.TIMEOUT, "no Hello")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert back.status == err.status and back.message == err.message
        assert str(back) == str(err)
