//go:build linux && cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

// The few CUDA driver types kvxfer uses, declared here so that no CUDA
// header is needed at build time. Handles travel to Go as uintptr_t.
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef struct { char reserved[64]; } CUipcMemHandle;

enum {
	KVX_SUCCESS = 0,
	KVX_ERROR_NOT_READY = 600,
	KVX_NO_LIBRARY = -1,
};

static struct {
	void *handle;
	CUresult (*cuInit)(unsigned int);
	CUresult (*cuDriverGetVersion)(int *);
	CUresult (*cuDeviceGetCount)(int *);
	CUresult (*cuDeviceGet)(CUdevice *, int);
	CUresult (*cuDeviceGetName)(char *, int, CUdevice);
	CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
	CUresult (*cuDeviceGetPCIBusId)(char *, int, CUdevice);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
	CUresult (*cuCtxGetCurrent)(CUcontext *);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
	CUresult (*cuMemFree)(CUdeviceptr);
	CUresult (*cuMemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*cuPointerGetAttribute)(void *, int, CUdeviceptr);
	CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
	CUresult (*cuStreamCreate)(CUstream *, unsigned int);
	CUresult (*cuStreamDestroy)(CUstream);
	CUresult (*cuStreamSynchronize)(CUstream);
	CUresult (*cuStreamQuery)(CUstream);
	CUresult (*cuEventCreate)(CUevent *, unsigned int);
	CUresult (*cuEventDestroy)(CUevent);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuEventQuery)(CUevent);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*cuIpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
	CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
	CUresult (*cuGetErrorName)(CUresult, const char **);
	CUresult (*cuGetErrorString)(CUresult, const char **);
} kvx;

// kvx_load opens the driver library at path and resolves every symbol
// kvxfer uses (the versioned name first). On failure it writes why into
// err, closes the library and leaves the table empty. Called once, under
// the Go side's lock.
static int kvx_load(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	if (kvx.handle != NULL) {
		dlclose(h);
		snprintf(err, errlen, "%s: a CUDA driver library is already loaded", path);
		return -1;
	}
	struct { const char *names[2]; void **slot; } syms[] = {
		{{"cuInit", NULL}, (void **)&kvx.cuInit},
		{{"cuDriverGetVersion", NULL}, (void **)&kvx.cuDriverGetVersion},
		{{"cuDeviceGetCount", NULL}, (void **)&kvx.cuDeviceGetCount},
		{{"cuDeviceGet", NULL}, (void **)&kvx.cuDeviceGet},
		{{"cuDeviceGetName", NULL}, (void **)&kvx.cuDeviceGetName},
		{{"cuDeviceTotalMem_v2", "cuDeviceTotalMem"}, (void **)&kvx.cuDeviceTotalMem},
		{{"cuDeviceGetPCIBusId", NULL}, (void **)&kvx.cuDeviceGetPCIBusId},
		{{"cuDevicePrimaryCtxRetain", NULL}, (void **)&kvx.cuDevicePrimaryCtxRetain},
		{{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}, (void **)&kvx.cuDevicePrimaryCtxRelease},
		{{"cuCtxGetCurrent", NULL}, (void **)&kvx.cuCtxGetCurrent},
		{{"cuCtxSetCurrent", NULL}, (void **)&kvx.cuCtxSetCurrent},
		{{"cuMemAlloc_v2", NULL}, (void **)&kvx.cuMemAlloc},
		{{"cuMemFree_v2", NULL}, (void **)&kvx.cuMemFree},
		{{"cuMemGetAddressRange_v2", NULL}, (void **)&kvx.cuMemGetAddressRange},
		{{"cuPointerGetAttribute", NULL}, (void **)&kvx.cuPointerGetAttribute},
		{{"cuMemcpyHtoDAsync_v2", NULL}, (void **)&kvx.cuMemcpyHtoDAsync},
		{{"cuMemcpyDtoHAsync_v2", NULL}, (void **)&kvx.cuMemcpyDtoHAsync},
		{{"cuMemcpyDtoDAsync_v2", NULL}, (void **)&kvx.cuMemcpyDtoDAsync},
		{{"cuMemsetD8Async", NULL}, (void **)&kvx.cuMemsetD8Async},
		{{"cuStreamCreate", NULL}, (void **)&kvx.cuStreamCreate},
		{{"cuStreamDestroy_v2", "cuStreamDestroy"}, (void **)&kvx.cuStreamDestroy},
		{{"cuStreamSynchronize", NULL}, (void **)&kvx.cuStreamSynchronize},
		{{"cuStreamQuery", NULL}, (void **)&kvx.cuStreamQuery},
		{{"cuEventCreate", NULL}, (void **)&kvx.cuEventCreate},
		{{"cuEventDestroy_v2", "cuEventDestroy"}, (void **)&kvx.cuEventDestroy},
		{{"cuEventRecord", NULL}, (void **)&kvx.cuEventRecord},
		{{"cuEventQuery", NULL}, (void **)&kvx.cuEventQuery},
		{{"cuEventSynchronize", NULL}, (void **)&kvx.cuEventSynchronize},
		{{"cuIpcGetMemHandle", NULL}, (void **)&kvx.cuIpcGetMemHandle},
		{{"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"}, (void **)&kvx.cuIpcOpenMemHandle},
		{{"cuIpcCloseMemHandle", NULL}, (void **)&kvx.cuIpcCloseMemHandle},
		{{"cuGetErrorName", NULL}, (void **)&kvx.cuGetErrorName},
		{{"cuGetErrorString", NULL}, (void **)&kvx.cuGetErrorString},
	};
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *p = NULL;
		for (int k = 0; k < 2 && p == NULL && syms[i].names[k] != NULL; k++) {
			p = dlsym(h, syms[i].names[k]);
		}
		if (p == NULL) {
			snprintf(err, errlen, "%s: symbol %s not found", path, syms[i].names[0]);
			memset(&kvx, 0, sizeof(kvx));
			dlclose(h);
			return -1;
		}
		*syms[i].slot = p;
	}
	kvx.handle = h;
	return 0;
}

// kvx_use makes ctx current on the calling thread. Every wrapper below
// calls it first, inside the same cgo call as the driver function, so that
// Go's moving goroutines between threads never leaves a call without its
// context.
static CUresult kvx_use(uintptr_t ctx) {
	CUcontext cur = NULL;
	if (kvx.cuCtxGetCurrent(&cur) == KVX_SUCCESS && cur == (CUcontext)ctx) {
		return KVX_SUCCESS;
	}
	return kvx.cuCtxSetCurrent((CUcontext)ctx);
}

#define KVX_USE(ctx) do { CUresult r_ = kvx_use(ctx); if (r_ != KVX_SUCCESS) return r_; } while (0)

static const char *kvx_error_name(int r) {
	const char *s = NULL;
	if (kvx.cuGetErrorName == NULL || kvx.cuGetErrorName(r, &s) != KVX_SUCCESS) return NULL;
	return s;
}

static const char *kvx_error_string(int r) {
	const char *s = NULL;
	if (kvx.cuGetErrorString == NULL || kvx.cuGetErrorString(r, &s) != KVX_SUCCESS) return NULL;
	return s;
}

static int kvx_init(void) { return kvx.cuInit(0); }
static int kvx_driver_version(int *v) { return kvx.cuDriverGetVersion(v); }
static int kvx_device_count(int *n) { return kvx.cuDeviceGetCount(n); }
static int kvx_device_get(int ordinal, int *dev) { return kvx.cuDeviceGet(dev, ordinal); }
static int kvx_device_name(int dev, char *buf, int n) { return kvx.cuDeviceGetName(buf, n, dev); }
static int kvx_device_total_mem(int dev, uint64_t *n) {
	size_t s = 0;
	CUresult r = kvx.cuDeviceTotalMem(&s, dev);
	*n = s;
	return r;
}
static int kvx_device_pci_bus_id(int dev, char *buf, int n) { return kvx.cuDeviceGetPCIBusId(buf, n, dev); }
static int kvx_primary_ctx_retain(int dev, uintptr_t *ctx) {
	CUcontext c = NULL;
	CUresult r = kvx.cuDevicePrimaryCtxRetain(&c, dev);
	*ctx = (uintptr_t)c;
	return r;
}
static int kvx_primary_ctx_release(int dev) { return kvx.cuDevicePrimaryCtxRelease(dev); }

static int kvx_mem_alloc(uintptr_t ctx, uint64_t n, uint64_t *p) {
	KVX_USE(ctx);
	CUdeviceptr d = 0;
	CUresult r = kvx.cuMemAlloc(&d, (size_t)n);
	*p = d;
	return r;
}
static int kvx_mem_free(uintptr_t ctx, uint64_t p) { KVX_USE(ctx); return kvx.cuMemFree(p); }
static int kvx_mem_address_range(uintptr_t ctx, uint64_t p, uint64_t *base, uint64_t *size) {
	KVX_USE(ctx);
	CUdeviceptr b = 0;
	size_t s = 0;
	CUresult r = kvx.cuMemGetAddressRange(&b, &s, p);
	*base = b;
	*size = s;
	return r;
}

// kvx_pointer_device is the ordinal of the device whose memory p is
// (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 9).
static int kvx_pointer_device(uintptr_t ctx, uint64_t p, int *ordinal) {
	KVX_USE(ctx);
	return kvx.cuPointerGetAttribute(ordinal, 9, p);
}

// Synchronous copies are the asynchronous ones on the legacy default
// stream followed by its synchronisation: the plain cuMemcpy* calls may
// return before a pageable or device-to-device copy has landed.
static int kvx_copy_htod(uintptr_t ctx, uint64_t dst, const void *src, uint64_t n) {
	KVX_USE(ctx);
	CUresult r = kvx.cuMemcpyHtoDAsync(dst, src, (size_t)n, NULL);
	if (r != KVX_SUCCESS) return r;
	return kvx.cuStreamSynchronize(NULL);
}
static int kvx_copy_dtoh(uintptr_t ctx, void *dst, uint64_t src, uint64_t n) {
	KVX_USE(ctx);
	CUresult r = kvx.cuMemcpyDtoHAsync(dst, src, (size_t)n, NULL);
	if (r != KVX_SUCCESS) return r;
	return kvx.cuStreamSynchronize(NULL);
}
static int kvx_copy_dtod(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n) {
	KVX_USE(ctx);
	CUresult r = kvx.cuMemcpyDtoDAsync(dst, src, (size_t)n, NULL);
	if (r != KVX_SUCCESS) return r;
	return kvx.cuStreamSynchronize(NULL);
}
static int kvx_copy_htod_async(uintptr_t ctx, uint64_t dst, const void *src, uint64_t n, uintptr_t s) {
	KVX_USE(ctx);
	return kvx.cuMemcpyHtoDAsync(dst, src, (size_t)n, (CUstream)s);
}
static int kvx_copy_dtoh_async(uintptr_t ctx, void *dst, uint64_t src, uint64_t n, uintptr_t s) {
	KVX_USE(ctx);
	return kvx.cuMemcpyDtoHAsync(dst, src, (size_t)n, (CUstream)s);
}
static int kvx_copy_dtod_async(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, uintptr_t s) {
	KVX_USE(ctx);
	return kvx.cuMemcpyDtoDAsync(dst, src, (size_t)n, (CUstream)s);
}
static int kvx_memset_d8_async(uintptr_t ctx, uint64_t dst, unsigned char v, uint64_t n, uintptr_t s) {
	KVX_USE(ctx);
	return kvx.cuMemsetD8Async(dst, v, (size_t)n, (CUstream)s);
}

// kvx_copy_dtod_batch enqueues n device-to-device copies on stream s with
// one cgo call; *done is how many were enqueued when it returns.
static int kvx_copy_dtod_batch(uintptr_t ctx, uintptr_t s, const uint64_t *triples, int n, int *done) {
	*done = 0;
	KVX_USE(ctx);
	for (int i = 0; i < n; i++) {
		const uint64_t *t = triples + 3 * i;
		if (t[2] == 0) { *done = i + 1; continue; }
		CUresult r = kvx.cuMemcpyDtoDAsync(t[0], t[1], (size_t)t[2], (CUstream)s);
		if (r != KVX_SUCCESS) return r;
		*done = i + 1;
	}
	return KVX_SUCCESS;
}

static int kvx_stream_create(uintptr_t ctx, unsigned int flags, uintptr_t *s) {
	KVX_USE(ctx);
	CUstream st = NULL;
	CUresult r = kvx.cuStreamCreate(&st, flags);
	*s = (uintptr_t)st;
	return r;
}
static int kvx_stream_destroy(uintptr_t ctx, uintptr_t s) { KVX_USE(ctx); return kvx.cuStreamDestroy((CUstream)s); }
static int kvx_stream_synchronize(uintptr_t ctx, uintptr_t s) { KVX_USE(ctx); return kvx.cuStreamSynchronize((CUstream)s); }
static int kvx_stream_query(uintptr_t ctx, uintptr_t s) { KVX_USE(ctx); return kvx.cuStreamQuery((CUstream)s); }

static int kvx_event_create(uintptr_t ctx, unsigned int flags, uintptr_t *e) {
	KVX_USE(ctx);
	CUevent ev = NULL;
	CUresult r = kvx.cuEventCreate(&ev, flags);
	*e = (uintptr_t)ev;
	return r;
}
static int kvx_event_destroy(uintptr_t ctx, uintptr_t e) { KVX_USE(ctx); return kvx.cuEventDestroy((CUevent)e); }
static int kvx_event_record(uintptr_t ctx, uintptr_t e, uintptr_t s) { KVX_USE(ctx); return kvx.cuEventRecord((CUevent)e, (CUstream)s); }
static int kvx_event_query(uintptr_t ctx, uintptr_t e) { KVX_USE(ctx); return kvx.cuEventQuery((CUevent)e); }
static int kvx_event_synchronize(uintptr_t ctx, uintptr_t e) { KVX_USE(ctx); return kvx.cuEventSynchronize((CUevent)e); }

static int kvx_ipc_get(uintptr_t ctx, uint64_t p, void *handle) {
	KVX_USE(ctx);
	CUipcMemHandle h;
	memset(&h, 0, sizeof(h));
	CUresult r = kvx.cuIpcGetMemHandle(&h, p);
	memcpy(handle, &h, sizeof(h));
	return r;
}
static int kvx_ipc_open(uintptr_t ctx, const void *handle, unsigned int flags, uint64_t *p) {
	KVX_USE(ctx);
	CUipcMemHandle h;
	memcpy(&h, handle, sizeof(h));
	CUdeviceptr d = 0;
	CUresult r = kvx.cuIpcOpenMemHandle(&d, h, flags);
	*p = d;
	return r;
}
static int kvx_ipc_close(uintptr_t ctx, uint64_t p) { KVX_USE(ctx); return kvx.cuIpcCloseMemHandle(p); }
*/
import "C"

import (
	"unsafe"
)

// cgoAvailable reports whether this build can load the driver at all.
const cgoAvailable = true

// libLoad opens the driver library at path and resolves its symbols. It is
// called at most once per process (by loadDriver, under its lock).
func libLoad(path string) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	if C.kvx_load(cpath, &buf[0], C.size_t(len(buf))) != 0 {
		return loadError(C.GoString(&buf[0]))
	}
	return nil
}

// errorName returns the driver's name and description of a result code.
func errorName(code int) (name, desc string) {
	if s := C.kvx_error_name(C.int(code)); s != nil {
		name = C.GoString(s)
	}
	if s := C.kvx_error_string(C.int(code)); s != nil {
		desc = C.GoString(s)
	}
	return name, desc
}

func libInit() error { return check("cuInit", C.kvx_init()) }

func libDriverVersion() (int, error) {
	var v C.int
	err := check("cuDriverGetVersion", C.kvx_driver_version(&v))
	return int(v), err
}

func libDeviceCount() (int, error) {
	var n C.int
	err := check("cuDeviceGetCount", C.kvx_device_count(&n))
	return int(n), err
}

func libDeviceGet(ordinal int) (int, error) {
	var d C.int
	err := check("cuDeviceGet", C.kvx_device_get(C.int(ordinal), &d))
	return int(d), err
}

func libDeviceName(dev int) (string, error) {
	var buf [256]C.char
	if err := check("cuDeviceGetName", C.kvx_device_name(C.int(dev), &buf[0], C.int(len(buf)))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

func libDeviceTotalMem(dev int) (uint64, error) {
	var n C.uint64_t
	err := check("cuDeviceTotalMem", C.kvx_device_total_mem(C.int(dev), &n))
	return uint64(n), err
}

func libDevicePCIBusID(dev int) (string, error) {
	var buf [64]C.char
	if err := check("cuDeviceGetPCIBusId", C.kvx_device_pci_bus_id(C.int(dev), &buf[0], C.int(len(buf)))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

func libPrimaryCtxRetain(dev int) (uintptr, error) {
	var c C.uintptr_t
	err := check("cuDevicePrimaryCtxRetain", C.kvx_primary_ctx_retain(C.int(dev), &c))
	return uintptr(c), err
}

func libPrimaryCtxRelease(dev int) error {
	return check("cuDevicePrimaryCtxRelease", C.kvx_primary_ctx_release(C.int(dev)))
}

func libMemAlloc(ctx uintptr, n uint64) (DevicePtr, error) {
	var p C.uint64_t
	err := check("cuMemAlloc", C.kvx_mem_alloc(C.uintptr_t(ctx), C.uint64_t(n), &p))
	return DevicePtr(p), err
}

func libMemFree(ctx uintptr, p DevicePtr) error {
	return check("cuMemFree", C.kvx_mem_free(C.uintptr_t(ctx), C.uint64_t(p)))
}

func libMemAddressRange(ctx uintptr, p DevicePtr) (DevicePtr, uint64, error) {
	var base, size C.uint64_t
	err := check("cuMemGetAddressRange", C.kvx_mem_address_range(C.uintptr_t(ctx), C.uint64_t(p), &base, &size))
	return DevicePtr(base), uint64(size), err
}

func libPointerDevice(ctx uintptr, p DevicePtr) (int, error) {
	var o C.int
	err := check("cuPointerGetAttribute", C.kvx_pointer_device(C.uintptr_t(ctx), C.uint64_t(p), &o))
	return int(o), err
}

// hostPtr is the address of b's first byte for C (nil for an empty slice).
func hostPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

func libCopyHtoD(ctx uintptr, dst DevicePtr, src []byte) error {
	return check("cuMemcpyHtoD", C.kvx_copy_htod(C.uintptr_t(ctx), C.uint64_t(dst), hostPtr(src), C.uint64_t(len(src))))
}

func libCopyDtoH(ctx uintptr, dst []byte, src DevicePtr) error {
	return check("cuMemcpyDtoH", C.kvx_copy_dtoh(C.uintptr_t(ctx), hostPtr(dst), C.uint64_t(src), C.uint64_t(len(dst))))
}

func libCopyDtoD(ctx uintptr, dst, src DevicePtr, n uint64) error {
	return check("cuMemcpyDtoD", C.kvx_copy_dtod(C.uintptr_t(ctx), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(n)))
}

func libCopyHtoDAsync(ctx uintptr, dst DevicePtr, src []byte, s uintptr) error {
	return check("cuMemcpyHtoDAsync", C.kvx_copy_htod_async(C.uintptr_t(ctx), C.uint64_t(dst), hostPtr(src), C.uint64_t(len(src)), C.uintptr_t(s)))
}

func libCopyDtoHAsync(ctx uintptr, dst []byte, src DevicePtr, s uintptr) error {
	return check("cuMemcpyDtoHAsync", C.kvx_copy_dtoh_async(C.uintptr_t(ctx), hostPtr(dst), C.uint64_t(src), C.uint64_t(len(dst)), C.uintptr_t(s)))
}

func libCopyDtoDAsync(ctx uintptr, dst, src DevicePtr, n uint64, s uintptr) error {
	return check("cuMemcpyDtoDAsync", C.kvx_copy_dtod_async(C.uintptr_t(ctx), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(n), C.uintptr_t(s)))
}

func libMemsetD8Async(ctx uintptr, dst DevicePtr, v byte, n uint64, s uintptr) error {
	return check("cuMemsetD8Async", C.kvx_memset_d8_async(C.uintptr_t(ctx), C.uint64_t(dst), C.uchar(v), C.uint64_t(n), C.uintptr_t(s)))
}

// libCopyDtoDBatch enqueues the copies {dst, src, len} of triples (three
// words each) on stream s in one call and returns how many it enqueued.
func libCopyDtoDBatch(ctx uintptr, s uintptr, triples []uint64) (int, error) {
	if len(triples) == 0 {
		return 0, nil
	}
	var done C.int
	err := check("cuMemcpyDtoDAsync", C.kvx_copy_dtod_batch(C.uintptr_t(ctx), C.uintptr_t(s),
		(*C.uint64_t)(unsafe.Pointer(&triples[0])), C.int(len(triples)/3), &done))
	return int(done), err
}

func libStreamCreate(ctx uintptr, flags uint) (uintptr, error) {
	var s C.uintptr_t
	err := check("cuStreamCreate", C.kvx_stream_create(C.uintptr_t(ctx), C.uint(flags), &s))
	return uintptr(s), err
}

func libStreamDestroy(ctx, s uintptr) error {
	return check("cuStreamDestroy", C.kvx_stream_destroy(C.uintptr_t(ctx), C.uintptr_t(s)))
}

func libStreamSynchronize(ctx, s uintptr) error {
	return check("cuStreamSynchronize", C.kvx_stream_synchronize(C.uintptr_t(ctx), C.uintptr_t(s)))
}

func libStreamQuery(ctx, s uintptr) (bool, error) {
	return ready("cuStreamQuery", C.kvx_stream_query(C.uintptr_t(ctx), C.uintptr_t(s)))
}

func libEventCreate(ctx uintptr, flags uint) (uintptr, error) {
	var e C.uintptr_t
	err := check("cuEventCreate", C.kvx_event_create(C.uintptr_t(ctx), C.uint(flags), &e))
	return uintptr(e), err
}

func libEventDestroy(ctx, e uintptr) error {
	return check("cuEventDestroy", C.kvx_event_destroy(C.uintptr_t(ctx), C.uintptr_t(e)))
}

func libEventRecord(ctx, e, s uintptr) error {
	return check("cuEventRecord", C.kvx_event_record(C.uintptr_t(ctx), C.uintptr_t(e), C.uintptr_t(s)))
}

func libEventQuery(ctx, e uintptr) (bool, error) {
	return ready("cuEventQuery", C.kvx_event_query(C.uintptr_t(ctx), C.uintptr_t(e)))
}

func libEventSynchronize(ctx, e uintptr) error {
	return check("cuEventSynchronize", C.kvx_event_synchronize(C.uintptr_t(ctx), C.uintptr_t(e)))
}

func libIPCGet(ctx uintptr, p DevicePtr) (IPCHandle, error) {
	var h IPCHandle
	err := check("cuIpcGetMemHandle", C.kvx_ipc_get(C.uintptr_t(ctx), C.uint64_t(p), unsafe.Pointer(&h[0])))
	return h, err
}

func libIPCOpen(ctx uintptr, h IPCHandle, flags uint) (DevicePtr, error) {
	var p C.uint64_t
	err := check("cuIpcOpenMemHandle", C.kvx_ipc_open(C.uintptr_t(ctx), unsafe.Pointer(&h[0]), C.uint(flags), &p))
	return DevicePtr(p), err
}

func libIPCClose(ctx uintptr, p DevicePtr) error {
	return check("cuIpcCloseMemHandle", C.kvx_ipc_close(C.uintptr_t(ctx), C.uint64_t(p)))
}

// check turns a driver result into nil or an *Error naming op.
func check(op string, r C.int) error {
	if r == 0 {
		return nil
	}
	return newError(op, int(r))
}

// ready is check for the query calls: CUDA_ERROR_NOT_READY means not yet.
func ready(op string, r C.int) (bool, error) {
	switch r {
	case 0:
		return true, nil
	case C.KVX_ERROR_NOT_READY:
		return false, nil
	}
	return false, newError(op, int(r))
}
