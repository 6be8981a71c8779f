"""The fake CUDA driver (cuda/cudatest/csrc/fakecuda.c: device memory as
shared memfd mappings, IPC handles that open across processes) for the
Python tests that move "GPU" memory without a GPU: build() compiles it,
Driver(path) drives it through ctypes in the same process as kvxfer's
library, which loads the same file when KVXFER_LIBCUDA names it (one
dlopen of one path is one library: both see the same allocations)."""

import ctypes
import os
import shutil
import subprocess

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "cuda", "cudatest", "csrc", "fakecuda.c")


def build(directory):
    """Compiles the fake driver into directory; its path, or None (with the
    reason) when there is no C compiler."""
    cc = os.environ.get("CC", "cc").split()
    if shutil.which(cc[0]) is None:
        return None, "no C compiler (%s)" % cc[0]
    lib = os.path.join(directory, "libcuda.so.1")
    subprocess.run(cc + ["-shared", "-fPIC", "-O2", "-Wall", "-o", lib, SOURCE, "-lpthread"], check=True,
                   capture_output=True)
    return lib, None


class Driver:
    """The few driver calls a test needs: a context on device 0, device
    allocations, synchronous host↔device copies."""

    def __init__(self, path, device=0):
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        self._check("cuInit", self.lib.cuInit(0))
        dev = ctypes.c_int()
        self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), device))
        ctx = ctypes.c_void_p()
        self._check("cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self._check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctx))
        self.device = device

    @staticmethod
    def _check(call, rc):
        if rc != 0:
            raise RuntimeError("fake CUDA driver: %s returned %d" % (call, rc))

    def alloc(self, n):
        p = ctypes.c_uint64()
        self._check("cuMemAlloc_v2", self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)))
        return p.value

    def htod(self, dst, data):
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        self._check("cuMemcpyHtoDAsync_v2", self.lib.cuMemcpyHtoDAsync_v2(
            ctypes.c_uint64(dst), buf, ctypes.c_size_t(len(data)), None))

    def dtoh(self, src, n):
        buf = ctypes.create_string_buffer(n)
        self._check("cuMemcpyDtoHAsync_v2", self.lib.cuMemcpyDtoHAsync_v2(
            buf, ctypes.c_uint64(src), ctypes.c_size_t(n), None))
        return buf.raw


class DeviceTensor:
    """What kvxfer reads of a contiguous torch.Tensor on a GPU (data_ptr,
    device, shape, stride, element_size, numel, dtype, is_contiguous), over
    a device allocation of the driver's."""

    def __init__(self, shape, addr, index=0, dtype=torch.bfloat16, element_size=2):
        self.shape = torch.Size(shape)
        self.device = torch.device("cuda", index)
        self.dtype = dtype
        self._addr, self._es = addr, element_size
        st, n = [], 1
        for d in reversed(shape):
            st.append(n)
            n *= d
        self._stride = tuple(reversed(st))

    def data_ptr(self):
        return self._addr

    def element_size(self):
        return self._es

    def numel(self):
        return self.shape.numel()

    def stride(self, dim=None):
        return self._stride if dim is None else self._stride[dim]

    def is_contiguous(self):
        return True
