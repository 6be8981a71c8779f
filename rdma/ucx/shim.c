//go:build cgo && linux && !kvxfer_noucx

#define _GNU_SOURCE // sched_getcpu
#include "shim.h"

#include <sched.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

// kvx_op is the user data of one flush, close or endpoint: C memory, freed
// by the callback (or right away when the operation completed at once).
typedef struct {
	kvx_worker *w;
	uint64_t    id;
	uint32_t    kind;
} kvx_op;

static void kvx_push(kvx_worker *w, uint32_t kind, ucs_status_t st, uint64_t id, void *data, uint64_t len)
{
	if (w->nev == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 256;
		kvx_event *ev = realloc(w->ev, cap * sizeof(*ev));
		if (ev == NULL) {
			fprintf(stderr, "kvxfer/ucx: out of memory growing the event queue\n");
			abort();
		}
		w->ev = ev;
		w->cap = cap;
	}
	kvx_event *e = &w->ev[w->nev++];
	e->kind = kind;
	e->status = (int32_t)st;
	e->id = id;
	e->data = data;
	e->len = len;
}

static kvx_op *kvx_op_new(kvx_worker *w, uint32_t kind, uint64_t id)
{
	kvx_op *op = malloc(sizeof(*op));
	if (op == NULL) {
		fprintf(stderr, "kvxfer/ucx: out of memory\n");
		abort();
	}
	op->w = w;
	op->id = id;
	op->kind = kind;
	return op;
}

static void kvx_op_done(void *request, ucs_status_t st, void *user_data)
{
	kvx_op *op = user_data;
	kvx_push(op->w, op->kind, st, op->id, NULL, 0);
	free(op);
	ucp_request_free(request);
}

static void kvx_ep_err(void *arg, ucp_ep_h ep, ucs_status_t st)
{
	kvx_op *op = arg;
	(void)ep;
	kvx_push(op->w, KVX_EV_EPERR, st, op->id, NULL, 0);
}

static ucs_status_t kvx_am_recv(void *arg, const void *header, size_t header_length,
                                void *data, size_t length, const ucp_am_recv_param_t *param)
{
	kvx_worker *w = arg;
	(void)header;
	(void)header_length;
	if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
		return UCS_OK; // never sent (control messages are eager): dropped
	}
	void *copy = malloc(length ? length : 1);
	if (copy == NULL) {
		fprintf(stderr, "kvxfer/ucx: out of memory for a control message\n");
		abort();
	}
	memcpy(copy, data, length);
	kvx_push(w, KVX_EV_AM, UCS_OK, 0, copy, length);
	return UCS_OK;
}

static void kvx_am_sent(void *request, ucs_status_t st, void *user_data)
{
	(void)st;
	free(user_data);
	ucp_request_free(request);
}

ucs_status_t kvx_open(kvx_worker **out, const char *mods, char *err, size_t errlen)
{
	ucs_status_t st;
	ucp_config_t *cfg = NULL;
	kvx_worker *w = calloc(1, sizeof(*w));
	if (w == NULL) {
		snprintf(err, errlen, "out of memory");
		return UCS_ERR_NO_MEMORY;
	}
	w->efd = w->evfd = w->epfd = -1;
	w->cpu = -1; // until kvx_poll runs (sched_getcpu: -1 if it fails)

	st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_config_read: %s", ucs_status_string(st));
		goto fail;
	}
	// mods is "NAME=VALUE" lines, UCX variables without the UCX_ prefix.
	for (const char *p = mods; p != NULL && *p != '\0';) {
		char line[256], *eq;
		size_t n = strcspn(p, "\n");
		if (n >= sizeof(line)) {
			snprintf(err, errlen, "configuration line too long");
			st = UCS_ERR_INVALID_PARAM;
			goto fail;
		}
		memcpy(line, p, n);
		line[n] = '\0';
		p += n + (p[n] == '\n');
		if ((eq = strchr(line, '=')) == NULL) {
			continue;
		}
		*eq = '\0';
		st = ucp_config_modify(cfg, line, eq + 1);
		if (st != UCS_OK) {
			snprintf(err, errlen, "ucp_config_modify(%s=%s): %s", line, eq + 1, ucs_status_string(st));
			goto fail;
		}
	}
	ucp_params_t params;
	memset(&params, 0, sizeof(params));
	params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
	params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
	params.mt_workers_shared = 0;
	params.name = "kvxfer";
	st = ucp_init(&params, cfg, &w->ctx);
	ucp_config_release(cfg);
	cfg = NULL;
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_init: %s", ucs_status_string(st));
		goto fail;
	}

	ucp_context_attr_t attr;
	memset(&attr, 0, sizeof(attr));
	attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
	if (ucp_context_query(w->ctx, &attr) == UCS_OK) {
		w->mem_types = attr.memory_types;
	}

	ucp_worker_params_t wp;
	memset(&wp, 0, sizeof(wp));
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_SINGLE;
	st = ucp_worker_create(w->ctx, &wp, &w->worker);
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_worker_create: %s", ucs_status_string(st));
		goto fail;
	}
	st = ucp_worker_get_address(w->worker, &w->addr, &w->addr_len);
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_worker_get_address: %s", ucs_status_string(st));
		goto fail;
	}
	ucp_am_handler_param_t am;
	memset(&am, 0, sizeof(am));
	am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
	                UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
	am.id = KVX_AM_ID;
	am.flags = UCP_AM_FLAG_WHOLE_MSG;
	am.cb = kvx_am_recv;
	am.arg = w;
	st = ucp_worker_set_am_recv_handler(w->worker, &am);
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_worker_set_am_recv_handler: %s", ucs_status_string(st));
		goto fail;
	}
	st = ucp_worker_get_efd(w->worker, &w->efd);
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_worker_get_efd: %s", ucs_status_string(st));
		goto fail;
	}
	w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	w->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (w->evfd < 0 || w->epfd < 0) {
		snprintf(err, errlen, "eventfd/epoll_create1: %m");
		st = UCS_ERR_IO_ERROR;
		goto fail;
	}
	struct epoll_event ev;
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.fd = w->efd;
	if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->efd, &ev) != 0) {
		snprintf(err, errlen, "epoll_ctl(UCP event fd): %m");
		st = UCS_ERR_IO_ERROR;
		goto fail;
	}
	ev.data.fd = w->evfd;
	if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->evfd, &ev) != 0) {
		snprintf(err, errlen, "epoll_ctl(eventfd): %m");
		st = UCS_ERR_IO_ERROR;
		goto fail;
	}
	*out = w;
	return UCS_OK;

fail:
	if (cfg != NULL) {
		ucp_config_release(cfg);
	}
	kvx_close_worker(w);
	return st;
}

static void close_worker(kvx_worker *w, int keep_ctx)
{
	if (w->addr != NULL) {
		ucp_worker_release_address(w->worker, w->addr);
	}
	if (w->worker != NULL) {
		ucp_worker_destroy(w->worker);
	}
	if (w->ctx != NULL && !keep_ctx) {
		ucp_cleanup(w->ctx);
	}
	if (w->evfd >= 0) {
		close(w->evfd);
	}
	if (w->epfd >= 0) {
		close(w->epfd);
	}
	for (size_t i = 0; i < w->nev; i++) {
		free(w->ev[i].data);
	}
	free(w->ev);
	free(w->segs);
	free(w);
}

void kvx_close_worker(kvx_worker *w) { close_worker(w, 0); }

void kvx_close_worker_keep_ctx(kvx_worker *w) { close_worker(w, 1); }

size_t kvx_poll(kvx_worker *w, unsigned max)
{
	__atomic_store_n(&w->cpu, sched_getcpu(), __ATOMIC_RELAXED);
	unsigned n = 0, r;
	do {
		r = ucp_worker_progress(w->worker);
		n += r;
	} while (r != 0 && --max != 0 && w->nev < KVX_EVENTS);
	w->progressed = n;
	size_t k = w->nev < KVX_EVENTS ? w->nev : KVX_EVENTS;
	memcpy(w->out, w->ev, k * sizeof(*w->out));
	if (k < w->nev) {
		memmove(w->ev, w->ev + k, (w->nev - k) * sizeof(*w->ev));
	}
	w->nev -= k;
	return k;
}

ucs_status_t kvx_arm(kvx_worker *w)
{
	if (w->nev != 0) {
		return UCS_ERR_BUSY;
	}
	return ucp_worker_arm(w->worker);
}

ucs_status_t kvx_ep_create(kvx_worker *w, const void *addr, uint64_t id, ucp_ep_h *ep, void **ctx)
{
	kvx_op *op = kvx_op_new(w, KVX_EV_EPERR, id);
	ucp_ep_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
	               UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = addr;
	p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	p.err_handler.cb = kvx_ep_err;
	p.err_handler.arg = op;
	ucs_status_t st = ucp_ep_create(w->worker, &p, ep);
	if (st != UCS_OK) {
		free(op);
		return st;
	}
	*ctx = op;
	return UCS_OK;
}

void kvx_ep_ctx_free(void *ctx) { free(ctx); }

static int kvx_track(kvx_worker *w, ucs_status_ptr_t r, kvx_op *op)
{
	if (r == NULL) {
		free(op);
		w->st = UCS_OK;
		return 0;
	}
	if (UCS_PTR_IS_ERR(r)) {
		free(op);
		w->st = UCS_PTR_STATUS(r);
		return 0;
	}
	return 1;
}

int kvx_flush(kvx_worker *w, ucp_ep_h ep, uint64_t id)
{
	kvx_op *op = kvx_op_new(w, KVX_EV_FLUSH, id);
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.cb.send = kvx_op_done;
	p.user_data = op;
	return kvx_track(w, ucp_ep_flush_nbx(ep, &p), op);
}

int kvx_close(kvx_worker *w, ucp_ep_h ep, uint64_t id)
{
	kvx_op *op = kvx_op_new(w, KVX_EV_CLOSE, id);
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
	p.cb.send = kvx_op_done;
	p.user_data = op;
	p.flags = UCP_EP_CLOSE_FLAG_FORCE;
	return kvx_track(w, ucp_ep_close_nbx(ep, &p), op);
}

ucs_status_t kvx_am_send(ucp_ep_h ep, const void *buf, size_t len)
{
	void *copy = malloc(len ? len : 1);
	if (copy == NULL) {
		return UCS_ERR_NO_MEMORY;
	}
	memcpy(copy, buf, len);
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
	p.cb.send = kvx_am_sent;
	p.user_data = copy;
	p.flags = UCP_AM_SEND_FLAG_EAGER;
	ucs_status_ptr_t r = ucp_am_send_nbx(ep, KVX_AM_ID, NULL, 0, copy, len, &p);
	if (r == NULL) {
		free(copy);
		return UCS_OK;
	}
	if (UCS_PTR_IS_ERR(r)) {
		free(copy);
		return UCS_PTR_STATUS(r);
	}
	return UCS_INPROGRESS;
}

static long kvx_put_segs(ucp_ep_h ep, ucp_rkey_h rkey, ucp_mem_h memh, uint64_t lbase, uint64_t rbase,
                         const kvx_seg *segs, size_t n, ucs_status_t *st)
{
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	if (memh != NULL) {
		p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
		p.memh = memh;
	}
	for (size_t i = 0; i < n; i++) {
		if (segs[i].len == 0) {
			continue;
		}
		ucs_status_ptr_t r = ucp_put_nbx(ep, (void *)(uintptr_t)(lbase + segs[i].src), segs[i].len,
		                                 rbase + segs[i].dst, rkey, &p);
		if (r == NULL) {
			continue;
		}
		if (UCS_PTR_IS_ERR(r)) {
			*st = UCS_PTR_STATUS(r);
			return (long)i;
		}
		// Completion is learnt from the endpoint flush that follows.
		ucp_request_free(r);
	}
	*st = UCS_OK;
	return -1;
}

int kvx_segs(kvx_worker *w, size_t n)
{
	if (n <= w->segcap) {
		return 1;
	}
	size_t cap = w->segcap ? w->segcap : 64;
	while (cap < n) {
		cap *= 2;
	}
	kvx_seg *segs = realloc(w->segs, cap * sizeof(*segs));
	if (segs == NULL) {
		return 0;
	}
	w->segs = segs;
	w->segcap = cap;
	return 1;
}

long kvx_put(kvx_worker *w, ucp_ep_h ep, ucp_rkey_h rkey, ucp_mem_h memh, uint64_t lbase, uint64_t rbase, size_t n)
{
	return kvx_put_segs(ep, rkey, memh, lbase, rbase, w->segs, n, &w->st);
}

void kvx_put_many(kvx_worker *w, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const kvx_put_desc *d = &w->descs[i];
		ucs_status_t s;
		w->fails[i] = kvx_put_segs(d->ep, d->rkey, d->memh, d->lbase, d->rbase, w->segs + d->off, d->n, &s);
		w->sts[i] = (int32_t)s;
	}
}

ucs_status_t kvx_mem_map(kvx_worker *w, uint64_t addr, uint64_t len, int mem_type, ucp_mem_h *memh)
{
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
	               UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
	p.address = (void *)(uintptr_t)addr;
	p.length = len;
	p.memory_type = (ucs_memory_type_t)mem_type;
	return ucp_mem_map(w->ctx, &p, memh);
}

ucs_status_t kvx_mem_alloc(kvx_worker *w, uint64_t len, ucp_mem_h *memh, void **addr)
{
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS |
	               UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
	p.length = len;
	p.flags = UCP_MEM_MAP_ALLOCATE;
	p.memory_type = UCS_MEMORY_TYPE_HOST;
	ucs_status_t st = ucp_mem_map(w->ctx, &p, memh);
	if (st != UCS_OK) {
		return st;
	}
	ucp_mem_attr_t attr;
	memset(&attr, 0, sizeof(attr));
	attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
	st = ucp_mem_query(*memh, &attr);
	if (st != UCS_OK || attr.length < len) {
		ucp_mem_unmap(w->ctx, *memh);
		return st != UCS_OK ? st : UCS_ERR_NO_MEMORY;
	}
	*addr = attr.address;
	return UCS_OK;
}

ucs_status_t kvx_rkey_pack(kvx_worker *w, ucp_mem_h memh, void **rkey, size_t *rkey_len)
{
	return ucp_rkey_pack(w->ctx, memh, rkey, rkey_len);
}

void kvx_mem_unmap(kvx_worker *w, ucp_mem_h memh) { ucp_mem_unmap(w->ctx, memh); }

void kvx_rkey_buffer_release(void *buf) { ucp_rkey_buffer_release(buf); }

ucs_status_t kvx_rkey_unpack(ucp_ep_h ep, const void *buf, ucp_rkey_h *rkey)
{
	return ucp_ep_rkey_unpack(ep, buf, rkey);
}

void kvx_rkey_destroy(ucp_rkey_h rkey) { ucp_rkey_destroy(rkey); }

const char *kvx_status_string(ucs_status_t st) { return ucs_status_string(st); }

ucs_status_t kvx_rkey_ptr(ucp_rkey_h rkey, uint64_t raddr, uintptr_t *local)
{
	void *p = NULL;
	ucs_status_t st = ucp_rkey_ptr(rkey, raddr, &p);
	*local = (uintptr_t)p;
	return st;
}

char *kvx_ep_info(ucp_ep_h ep)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (f == NULL) {
		return NULL;
	}
	ucp_ep_print_info(ep, f);
	fclose(f);
	return buf;
}
