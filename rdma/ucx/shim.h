// Package ucx's C side: a thin layer over UCP that the progress goroutine
// calls. Every function here runs on that goroutine's thread; callbacks
// record events into the worker's queue, which Go drains after progress.
// No Go pointer is ever kept by C: ids are integers.

#ifndef KVXFER_UCX_SHIM_H
#define KVXFER_UCX_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

// Event kinds.
enum {
	KVX_EV_FLUSH = 1, // an endpoint flush completed: id, status
	KVX_EV_CLOSE = 2, // an endpoint close completed: id, status
	KVX_EV_EPERR = 3, // an endpoint failed: id, status
	KVX_EV_AM    = 4  // a control message arrived: data, len (malloc'd)
};

typedef struct {
	uint32_t kind;
	int32_t  status;
	uint64_t id;
	void    *data;
	uint64_t len;
} kvx_event;

typedef struct {
	uint64_t src, dst, len;
} kvx_seg;

// kvx_put_desc is one batch's puts for kvx_put_many: segments off..off+n of
// the worker's segment array.
typedef struct {
	ucp_ep_h   ep;
	ucp_rkey_h rkey;
	ucp_mem_h  memh;
	uint64_t   lbase, rbase;
	uint32_t   off, n;
} kvx_put_desc;

#define KVX_EVENTS 256 // events moved to Go per kvx_poll
#define KVX_DESCS  32  // batches per kvx_put_many

typedef struct kvx_worker {
	ucp_context_h  ctx;
	ucp_worker_h   worker;
	ucp_address_t *addr;
	size_t         addr_len;
	uint64_t       mem_types;
	int            efd;  // UCP's event fd
	int            evfd; // eventfd other goroutines write to wake the worker
	int            epfd; // epoll over efd and evfd
	kvx_event     *ev;   // the callbacks' queue
	size_t         nev, cap;

	// Scratch space the Go side fills and reads, so that the hot calls
	// take no Go pointer (cgo would check, and box, every one).
	kvx_event      out[KVX_EVENTS];   // kvx_poll's events
	unsigned       progressed;        // kvx_poll's progress count
	ucs_status_t   st;                // kvx_put's, kvx_flush's, kvx_close's status
	kvx_put_desc   descs[KVX_DESCS];  // kvx_put_many's batches
	long           fails[KVX_DESCS];  // and their results
	int32_t        sts[KVX_DESCS];
	kvx_seg       *segs;              // segments for kvx_put and kvx_put_many
	size_t         segcap;
	int            cpu;               // where kvx_poll last ran (other threads read it)
} kvx_worker;

// kvx_open creates a context (RMA, AM, WAKEUP) and a single-threaded worker.
// mods holds "NAME=VALUE" lines applied with ucp_config_modify.
ucs_status_t kvx_open(kvx_worker **out, const char *mods, char *err, size_t errlen);
void kvx_close_worker(kvx_worker *w);
/* kvx_close_worker_keep_ctx destroys the worker but leaves the context, and
 * the memory it mapped, alive for the rest of the process. */
void kvx_close_worker_keep_ctx(kvx_worker *w);

// kvx_poll progresses the worker until it reports nothing (at most max
// rounds), then moves up to KVX_EVENTS events into w->out and returns how
// many; w->progressed is the sum of ucp_worker_progress results.
size_t kvx_poll(kvx_worker *w, unsigned max);
ucs_status_t kvx_arm(kvx_worker *w);

ucs_status_t kvx_ep_create(kvx_worker *w, const void *addr, uint64_t id, ucp_ep_h *ep, void **ctx);
void kvx_ep_ctx_free(void *ctx);
// kvx_flush and kvx_close report completion now (returns 0, w->st set) or
// later through an event with id (returns 1).
int kvx_flush(kvx_worker *w, ucp_ep_h ep, uint64_t id);
int kvx_close(kvx_worker *w, ucp_ep_h ep, uint64_t id);
ucs_status_t kvx_am_send(ucp_ep_h ep, const void *buf, size_t len);


// kvx_segs makes room for n segments in w->segs; 0 when out of memory.
int kvx_segs(kvx_worker *w, size_t n);

// kvx_put posts one put per non-empty segment of w->segs[0..n); it returns
// the index of the first segment that failed to post (w->st its status), or
// -1.
long kvx_put(kvx_worker *w, ucp_ep_h ep, ucp_rkey_h rkey, ucp_mem_h memh, uint64_t lbase, uint64_t rbase, size_t n);

// kvx_put_many is kvx_put for the batches w->descs[0..n); w->fails[i] and
// w->sts[i] are batch i's results.
void kvx_put_many(kvx_worker *w, size_t n);

ucs_status_t kvx_mem_map(kvx_worker *w, uint64_t addr, uint64_t len, int mem_type, ucp_mem_h *memh);
// kvx_mem_alloc allocates len bytes of host memory where UCX's transports
// reach it best (UCP_MEM_MAP_ALLOCATE).
ucs_status_t kvx_mem_alloc(kvx_worker *w, uint64_t len, ucp_mem_h *memh, void **addr);
ucs_status_t kvx_rkey_pack(kvx_worker *w, ucp_mem_h memh, void **rkey, size_t *rkey_len);
void kvx_mem_unmap(kvx_worker *w, ucp_mem_h memh);
void kvx_rkey_buffer_release(void *buf);
// kvx_rkey_ptr: where the remote address raddr of rkey is mapped in this
// process (UCX's shared-memory transports), or an error status.
ucs_status_t kvx_rkey_ptr(ucp_rkey_h rkey, uint64_t raddr, uintptr_t *local);
ucs_status_t kvx_rkey_unpack(ucp_ep_h ep, const void *buf, ucp_rkey_h *rkey);
void kvx_rkey_destroy(ucp_rkey_h rkey);
const char *kvx_status_string(ucs_status_t st);
// kvx_ep_info is ucp_ep_print_info's text (the endpoint's lanes and their
// transports), malloc'd; NULL when out of memory.
char *kvx_ep_info(ucp_ep_h ep);

#define KVX_AM_ID 0x6b76

#endif
