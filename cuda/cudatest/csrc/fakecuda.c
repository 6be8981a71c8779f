// fakecuda.c: a host-memory stand-in for the CUDA driver (libcuda.so.1),
// for kvxfer's tests on machines without a GPU. It implements only the
// entry points package cuda resolves, with the semantics kvxfer relies on:
//
//   - "device memory" is a shared memfd mapping, so that an IPC handle
//     (pid, fd) opens in another process through /proc/<pid>/fd/<fd>; a
//     process cannot open its own handles (CUDA_ERROR_INVALID_CONTEXT), as
//     with the real driver;
//   - each stream runs its copies and event records in order on its own
//     thread, asynchronously to the caller; FAKECUDA_COPY_DELAY_US delays
//     every stream copy, to keep events pending for a while;
//   - the legacy default stream (NULL) runs work at once;
//   - FAKECUDA_DEVICES sets the device count (default 1; 0 makes cuInit
//     fail with CUDA_ERROR_NO_DEVICE);
//   - FAKECUDA_FAIL_SYNC=1 makes cuStreamSynchronize of a stream fail at
//     once with CUDA_ERROR_UNKNOWN (a failing driver), its copies still
//     running.
//   - FAKECUDA_FAIL_RECORD=1 makes cuEventRecord on a stream fail with
//     CUDA_ERROR_UNKNOWN.
//   - FAKECUDA_FAIL_QUERY=1 makes cuEventQuery of an event not yet
//     complete fail with CUDA_ERROR_UNKNOWN (its stream's copies still
//     running).
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;

enum {
	SUCCESS = 0,
	INVALID_VALUE = 1,
	OUT_OF_MEMORY = 2,
	NOT_INITIALIZED = 3,
	NO_DEVICE = 100,
	INVALID_DEVICE = 101,
	INVALID_CONTEXT = 201,
	INVALID_HANDLE = 400,
	NOT_FOUND = 500,
	NOT_READY = 600,
	UNKNOWN = 999,
};

#define MAXDEV 8

struct ctx {
	int dev;
	int refs;
};

static struct ctx ctxs[MAXDEV];
static int ndev = 1;
static int inited;
static long delay_ns;
static int fail_sync;
static int fail_record;
static int fail_query;
static __thread struct ctx *cur;

// mu guards the allocation list and every event's state.
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t evcv = PTHREAD_COND_INITIALIZER;

struct alloc {
	uint64_t base, size;
	int fd;       // exported allocations keep their memfd open
	int imported; // mapped from another process's handle
	int refs;     // opens of an imported mapping
	pid_t pid;    // the exporter, for imports
	int efd;      // the exporter's fd number, for imports
	int dev;      // the device of the context current at cuMemAlloc or the import
	struct alloc *next;
};
static struct alloc *allocs;

struct event {
	uint64_t gen, done;
	int refs; // the handle, plus one per queued record
};

enum { OP_COPY, OP_EVENT, OP_MEMSET };

struct op {
	int kind;
	uint64_t dst, src, n;
	struct event *ev;
	uint64_t gen;
	struct op *next;
};

struct stream {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct op *head, *tail;
	int busy, stop;
	pthread_t th;
};

#define NEED_INIT() do { if (!inited) return NOT_INITIALIZED; } while (0)
#define NEED_CTX() do { NEED_INIT(); if (cur == NULL) return INVALID_CONTEXT; } while (0)

CUresult cuInit(unsigned int flags) {
	(void)flags;
	const char *s = getenv("FAKECUDA_DEVICES");
	if (s != NULL) {
		ndev = atoi(s);
		if (ndev > MAXDEV) ndev = MAXDEV;
	}
	s = getenv("FAKECUDA_COPY_DELAY_US");
	if (s != NULL) delay_ns = atol(s) * 1000;
	s = getenv("FAKECUDA_FAIL_SYNC");
	fail_sync = s != NULL && strcmp(s, "1") == 0;
	s = getenv("FAKECUDA_FAIL_RECORD");
	fail_record = s != NULL && strcmp(s, "1") == 0;
	s = getenv("FAKECUDA_FAIL_QUERY");
	fail_query = s != NULL && strcmp(s, "1") == 0;
	if (ndev <= 0) return NO_DEVICE;
	inited = 1;
	return SUCCESS;
}

CUresult cuDriverGetVersion(int *v) { *v = 12040; return SUCCESS; }

CUresult cuDeviceGetCount(int *n) { NEED_INIT(); *n = ndev; return SUCCESS; }

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	NEED_INIT();
	if (ordinal < 0 || ordinal >= ndev) return INVALID_DEVICE;
	*d = ordinal;
	return SUCCESS;
}

CUresult cuDeviceGetName(char *buf, int len, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev) return INVALID_DEVICE;
	snprintf(buf, len, "kvxfer fake CUDA device %d", d);
	return SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *n, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev) return INVALID_DEVICE;
	*n = (size_t)1 << 30;
	return SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *buf, int len, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev) return INVALID_DEVICE;
	snprintf(buf, len, "0000:%02X:00.0", 0x10 + d);
	return SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(void **c, CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	ctxs[d].dev = d;
	ctxs[d].refs++;
	pthread_mutex_unlock(&mu);
	*c = &ctxs[d];
	return SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	NEED_INIT();
	if (d < 0 || d >= ndev) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	CUresult r = ctxs[d].refs > 0 ? SUCCESS : INVALID_CONTEXT;
	if (ctxs[d].refs > 0) ctxs[d].refs--;
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult cuCtxGetCurrent(void **c) { NEED_INIT(); *c = cur; return SUCCESS; }

CUresult cuCtxSetCurrent(void *c) {
	NEED_INIT();
	if (c != NULL && (c < (void *)&ctxs[0] || c >= (void *)&ctxs[MAXDEV])) return INVALID_CONTEXT;
	cur = c;
	return SUCCESS;
}

// find returns the allocation containing p (exact base when exact), with
// mu held.
static struct alloc *find(uint64_t p, int exact) {
	for (struct alloc *a = allocs; a != NULL; a = a->next) {
		if (exact ? a->base == p : (p >= a->base && p < a->base + a->size)) return a;
	}
	return NULL;
}

static void unlink_alloc(struct alloc *a) {
	for (struct alloc **pp = &allocs; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == a) {
			*pp = a->next;
			return;
		}
	}
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	NEED_CTX();
	if (n == 0) return INVALID_VALUE;
	int fd = memfd_create("fakecuda", MFD_CLOEXEC);
	if (fd < 0) return OUT_OF_MEMORY;
	if (ftruncate(fd, (off_t)n) != 0) {
		close(fd);
		return OUT_OF_MEMORY;
	}
	void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		close(fd);
		return OUT_OF_MEMORY;
	}
	struct alloc *a = calloc(1, sizeof(*a));
	a->base = (uint64_t)(uintptr_t)m;
	a->size = n;
	a->fd = fd;
	a->dev = cur->dev;
	pthread_mutex_lock(&mu);
	a->next = allocs;
	allocs = a;
	pthread_mutex_unlock(&mu);
	*p = a->base;
	return SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p, 1);
	if (a == NULL || a->imported) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE;
	}
	unlink_alloc(a);
	pthread_mutex_unlock(&mu);
	munmap((void *)(uintptr_t)a->base, a->size);
	close(a->fd);
	free(a);
	return SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p, 0);
	if (a != NULL) {
		if (base) *base = a->base;
		if (size) *size = a->size;
	}
	pthread_mutex_unlock(&mu);
	return a != NULL ? SUCCESS : NOT_FOUND;
}

// cuPointerGetAttribute answers CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL (9)
// only: the device of the allocation that holds p, whatever the current
// context (as unified addressing does).
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
	NEED_CTX();
	if (attr != 9 || data == NULL) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p, 0);
	if (a != NULL) *(int *)data = a->dev;
	pthread_mutex_unlock(&mu);
	return a != NULL ? SUCCESS : INVALID_VALUE;
}

// ---- streams and events ----

static void event_done(struct event *ev, uint64_t gen) {
	pthread_mutex_lock(&mu);
	if (ev->done < gen) ev->done = gen;
	if (--ev->refs == 0) free(ev);
	pthread_cond_broadcast(&evcv);
	pthread_mutex_unlock(&mu);
}

static void *stream_main(void *arg) {
	struct stream *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (s->head == NULL && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
		if (s->head == NULL) break;
		struct op *o = s->head;
		s->head = o->next;
		if (s->head == NULL) s->tail = NULL;
		s->busy = 1;
		pthread_mutex_unlock(&s->mu);
		if (o->kind == OP_COPY) {
			if (delay_ns > 0) {
				struct timespec ts = {delay_ns / 1000000000L, delay_ns % 1000000000L};
				nanosleep(&ts, NULL);
			}
			memmove((void *)(uintptr_t)o->dst, (const void *)(uintptr_t)o->src, o->n);
		} else if (o->kind == OP_MEMSET) {
			if (delay_ns > 0) {
				struct timespec ts = {delay_ns / 1000000000L, delay_ns % 1000000000L};
				nanosleep(&ts, NULL);
			}
			memset((void *)(uintptr_t)o->dst, (int)o->src, o->n);
		} else {
			event_done(o->ev, o->gen);
		}
		free(o);
		pthread_mutex_lock(&s->mu);
		s->busy = 0;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static void enqueue(struct stream *s, struct op *o) {
	pthread_mutex_lock(&s->mu);
	if (s->tail) s->tail->next = o; else s->head = o;
	s->tail = o;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

CUresult cuStreamCreate(void **out, unsigned int flags) {
	(void)flags;
	NEED_CTX();
	struct stream *s = calloc(1, sizeof(*s));
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
		free(s);
		return OUT_OF_MEMORY;
	}
	*out = s;
	return SUCCESS;
}

CUresult cuStreamDestroy_v2(void *h) {
	NEED_CTX();
	struct stream *s = h;
	if (s == NULL) return INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	s->stop = 1; // the thread drains what is queued, then exits
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->th, NULL);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
	return SUCCESS;
}

CUresult cuStreamSynchronize(void *h) {
	NEED_CTX();
	struct stream *s = h;
	if (s == NULL) return SUCCESS;
	if (fail_sync) return UNKNOWN;
	pthread_mutex_lock(&s->mu);
	while (s->head != NULL || s->busy) pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	return SUCCESS;
}

CUresult cuStreamQuery(void *h) {
	NEED_CTX();
	struct stream *s = h;
	if (s == NULL) return SUCCESS;
	pthread_mutex_lock(&s->mu);
	int idle = s->head == NULL && !s->busy;
	pthread_mutex_unlock(&s->mu);
	return idle ? SUCCESS : NOT_READY;
}

static CUresult copy(uint64_t dst, uint64_t src, size_t n, void *h) {
	NEED_CTX();
	if (n == 0) return SUCCESS;
	if (dst == 0 || src == 0) return INVALID_VALUE;
	if (h == NULL) {
		memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
		return SUCCESS;
	}
	struct op *o = calloc(1, sizeof(*o));
	o->kind = OP_COPY;
	o->dst = dst;
	o->src = src;
	o->n = n;
	enqueue(h, o);
	return SUCCESS;
}

// Device addresses must lie in an allocation; host ones are anything.
static int is_device(uint64_t p, size_t n) {
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p, 0);
	int ok = a != NULL && n <= a->size - (p - a->base);
	pthread_mutex_unlock(&mu);
	return ok;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *h) {
	if (n > 0 && !is_device(dst, n)) return INVALID_VALUE;
	return copy(dst, (uint64_t)(uintptr_t)src, n, h);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *h) {
	if (n > 0 && !is_device(src, n)) return INVALID_VALUE;
	return copy((uint64_t)(uintptr_t)dst, src, n, h);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *h) {
	if (n > 0 && (!is_device(dst, n) || !is_device(src, n))) return INVALID_VALUE;
	return copy(dst, src, n, h);
}

// cuMemsetD8Async sets n bytes of device memory to v, in stream order
// (with the copy delay, like a copy).
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *h) {
	NEED_CTX();
	if (n == 0) return SUCCESS;
	if (!is_device(dst, n)) return INVALID_VALUE;
	if (h == NULL) {
		memset((void *)(uintptr_t)dst, v, n);
		return SUCCESS;
	}
	struct op *o = calloc(1, sizeof(*o));
	o->kind = OP_MEMSET;
	o->dst = dst;
	o->src = v;
	o->n = n;
	enqueue(h, o);
	return SUCCESS;
}

CUresult cuEventCreate(void **out, unsigned int flags) {
	(void)flags;
	NEED_CTX();
	struct event *ev = calloc(1, sizeof(*ev));
	ev->refs = 1;
	*out = ev;
	return SUCCESS;
}

CUresult cuEventDestroy_v2(void *h) {
	NEED_CTX();
	struct event *ev = h;
	if (ev == NULL) return INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	if (--ev->refs == 0) free(ev);
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

CUresult cuEventRecord(void *e, void *h) {
	NEED_CTX();
	struct event *ev = e;
	if (ev == NULL) return INVALID_HANDLE;
	if (fail_record && h != NULL) return UNKNOWN;
	pthread_mutex_lock(&mu);
	uint64_t gen = ++ev->gen;
	if (h == NULL) {
		ev->done = gen;
		pthread_cond_broadcast(&evcv);
		pthread_mutex_unlock(&mu);
		return SUCCESS;
	}
	ev->refs++;
	pthread_mutex_unlock(&mu);
	struct op *o = calloc(1, sizeof(*o));
	o->kind = OP_EVENT;
	o->ev = ev;
	o->gen = gen;
	enqueue(h, o);
	return SUCCESS;
}

CUresult cuEventQuery(void *e) {
	NEED_CTX();
	struct event *ev = e;
	if (ev == NULL) return INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	int done = ev->done >= ev->gen;
	pthread_mutex_unlock(&mu);
	if (!done && fail_query) return UNKNOWN;
	return done ? SUCCESS : NOT_READY;
}

CUresult cuEventSynchronize(void *e) {
	NEED_CTX();
	struct event *ev = e;
	if (ev == NULL) return INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	while (ev->done < ev->gen) pthread_cond_wait(&evcv, &mu);
	pthread_mutex_unlock(&mu);
	return SUCCESS;
}

// ---- IPC ----

struct handle {
	char magic[8];
	int32_t pid, fd;
	uint64_t size;
};

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p, 1);
	if (a == NULL || a->imported) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE;
	}
	struct handle k;
	memset(&k, 0, sizeof(k));
	memcpy(k.magic, "FAKECUDA", 8);
	k.pid = getpid();
	k.fd = a->fd;
	k.size = a->size;
	pthread_mutex_unlock(&mu);
	memset(h, 0, sizeof(*h));
	memcpy(h, &k, sizeof(k));
	return SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
	(void)flags;
	NEED_CTX();
	struct handle k;
	memcpy(&k, &h, sizeof(k));
	if (memcmp(k.magic, "FAKECUDA", 8) != 0 || k.size == 0) return INVALID_VALUE;
	if (k.pid == getpid()) return INVALID_CONTEXT; // as the real driver
	pthread_mutex_lock(&mu);
	for (struct alloc *a = allocs; a != NULL; a = a->next) {
		if (a->imported && a->pid == k.pid && a->efd == k.fd && a->size == k.size) {
			a->refs++;
			*p = a->base;
			pthread_mutex_unlock(&mu);
			return SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", k.pid, k.fd);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) return INVALID_VALUE;
	struct stat st;
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != k.size) {
		close(fd);
		return INVALID_VALUE;
	}
	void *m = mmap(NULL, k.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED) return OUT_OF_MEMORY;
	struct alloc *a = calloc(1, sizeof(*a));
	a->base = (uint64_t)(uintptr_t)m;
	a->size = k.size;
	a->fd = -1;
	a->imported = 1;
	a->refs = 1;
	a->pid = k.pid;
	a->efd = k.fd;
	a->dev = cur->dev;
	pthread_mutex_lock(&mu);
	a->next = allocs;
	allocs = a;
	pthread_mutex_unlock(&mu);
	*p = a->base;
	return SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p, 1);
	if (a == NULL || !a->imported) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE;
	}
	if (--a->refs > 0) {
		pthread_mutex_unlock(&mu);
		return SUCCESS;
	}
	unlink_alloc(a);
	pthread_mutex_unlock(&mu);
	munmap((void *)(uintptr_t)a->base, a->size);
	free(a);
	return SUCCESS;
}

// ---- errors ----

static const struct { int code; const char *name, *desc; } errs[] = {
	{SUCCESS, "CUDA_SUCCESS", "no error"},
	{INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	{NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
};

CUresult cuGetErrorName(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		if (errs[i].code == r) {
			*s = errs[i].name;
			return SUCCESS;
		}
	}
	*s = NULL;
	return INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		if (errs[i].code == r) {
			*s = errs[i].desc;
			return SUCCESS;
		}
	}
	*s = NULL;
	return INVALID_VALUE;
}
