"""The installed wheel, from outside the repository (`make wheel-check`):
the package loads the libkvxfer.so it carries — no $KVXFER_LIB, no
repository on the path — and two engines move a request, every byte
checked. Standard library only, as the package is."""

import ctypes
import os
import sys

if os.environ.get("KVXFER_LIB"):
    sys.exit("wheel_smoke: unset KVXFER_LIB: the point is the library inside the wheel")

import kvxfer  # noqa: E402

here = os.path.dirname(os.path.realpath(kvxfer.__file__))
want = os.path.join(here, "libkvxfer.so")
if kvxfer.library_path() != want:
    sys.exit("wheel_smoke: loaded %s, want the wheel's %s" % (kvxfer.library_path(), want))
# Where the wheel was installed: $WHEEL_SMOKE_DIR (pip --target), else a
# site-packages.
target = os.environ.get("WHEEL_SMOKE_DIR")
if not (here.startswith(os.path.realpath(target) + os.sep) if target else "site-packages" in here):
    sys.exit("wheel_smoke: kvxfer imported from %s, not from the installed wheel" % here)

layout = {"name": "tiny", "layers": 4, "kv_heads": 2, "head_dim": 8, "dtype_bytes": 2, "tokens_per_block": 16}
cfg = {"layout": layout, "pool_bytes": 1 << 20, "transfer_timeout_ms": 10000, "workers": 2}
pid = os.getpid()
with kvxfer.Engine(dict(cfg, instance="ctx-%d" % pid)) as ctx, kvxfer.Engine(dict(cfg, instance="gen-%d" % pid)) as gen:
    src = ctx.alloc(0, 2)
    g = ctx.groups[0]
    data = {}
    for b in src:
        data[b] = bytes((b * 7 + i) % 251 for i in range(g.block_bytes))
        ctypes.memmove(ctx.block_address(0, b), data[b], len(data[b]))
    rx = gen.receive("wheel-1", 32, ctx.instance)
    tx = ctx.send("wheel-1", 32)
    tx.chunk(0, 32, [(0, src)], fenced=False)
    if rx.wait().outcome != kvxfer.Outcome.READY or tx.wait().outcome != kvxfer.Outcome.DONE:
        sys.exit("wheel_smoke: the request did not complete")
    _, dst = rx.blocks(0)
    for s, d in zip(src, dst):
        if gen.block_bytes(0, d) != data[s]:
            sys.exit("wheel_smoke: block %d arrived with other bytes" % d)
    rx.free_blocks()
    ctx.free(0, src)
    tx.release()
    rx.release()
print("wheel_smoke: OK, kvxfer %s loaded %s; a request moved, every byte checked" % (
    getattr(kvxfer, "__version__", "?"), kvxfer.library_path()))
