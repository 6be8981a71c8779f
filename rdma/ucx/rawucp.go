//go:build cgo && linux && !kvxfer_noucx

package ucx

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// rawUCP is a UCP context and worker of the shim driven directly by its
// caller, without an Agent's progress goroutine, links or key checks: the
// package's benchmarks and tests use it to measure what UCX itself does —
// what a registration costs, whether a put with a withdrawn rkey lands —
// which the agent's own protocol (revokes sent to peers, keys checked
// before a post) would otherwise hide. Use it from one goroutine, locked to
// its thread.
type rawUCP struct {
	c    *C.kvx_worker
	next uint64
}

// rawMemh is a ucp_mem_map handle of a rawUCP.
type rawMemh struct{ h C.ucp_mem_h }

// rawEP is an endpoint of a rawUCP, with the rkeys unpacked on it.
type rawEP struct {
	h     C.ucp_ep_h
	ctx   unsafe.Pointer
	id    uint64
	peer  *peerMDs // the peer's memory domains, for its rkeys
	rkeys []C.ucp_rkey_h
	err   C.ucs_status_t // the endpoint's error, once reported
}

// rawRkey is an unpacked remote key.
type rawRkey struct{ h C.ucp_rkey_h }

// openRawUCP opens a context and worker; mods are "NAME=VALUE" lines of UCX
// variables without the UCX_ prefix (the environment applies too).
func openRawUCP(mods string) (*rawUCP, error) {
	cm := C.CString(mods)
	defer C.free(unsafe.Pointer(cm))
	var errbuf [256]C.char
	var c *C.kvx_worker
	if st := C.kvx_open(&c, cm, &errbuf[0], C.size_t(len(errbuf))); st != ucsOK {
		return nil, fmt.Errorf("ucx: open (%q): %s", mods, C.GoString(&errbuf[0]))
	}
	return &rawUCP{c: c}, nil
}

func (u *rawUCP) close() { C.kvx_close_worker(u.c) }

// address is the worker's address, for connect.
func (u *rawUCP) address() []byte { return C.GoBytes(unsafe.Pointer(u.c.addr), C.int(u.c.addr_len)) }

// memMap registers existing host memory (ucp_mem_map without
// UCP_MEM_MAP_ALLOCATE).
func (u *rawUCP) memMap(base uintptr, n uint64) (rawMemh, error) {
	var m rawMemh
	if st := C.kvx_mem_map(u.c, C.uint64_t(base), C.uint64_t(n), 0, &m.h); st != ucsOK {
		return m, fmt.Errorf("ucp_mem_map(%#x, %d): %s", base, n, statusText(st))
	}
	return m, nil
}

// memAlloc allocates n bytes where UCX's transports reach them best
// (UCP_MEM_MAP_ALLOCATE), as Agent.Alloc does; memUnmap frees them.
func (u *rawUCP) memAlloc(n uint64) (rawMemh, []byte, error) {
	var m rawMemh
	var p unsafe.Pointer
	if st := C.kvx_mem_alloc(u.c, C.uint64_t(n), &m.h, &p); st != ucsOK {
		return m, nil, fmt.Errorf("ucp_mem_map(ALLOCATE, %d): %s", n, statusText(st))
	}
	return m, unsafe.Slice((*byte)(p), n), nil
}

// rkeyPack packs the handle's rkey (ucp_rkey_pack) and returns its bytes.
func (u *rawUCP) rkeyPack(m rawMemh) ([]byte, error) {
	var buf unsafe.Pointer
	var n C.size_t
	if st := C.kvx_rkey_pack(u.c, m.h, &buf, &n); st != ucsOK {
		return nil, fmt.Errorf("ucp_rkey_pack: %s", statusText(st))
	}
	b := C.GoBytes(buf, C.int(n))
	C.kvx_rkey_buffer_release(buf)
	return b, nil
}

// memUnmap is ucp_mem_unmap.
func (u *rawUCP) memUnmap(m rawMemh) { C.kvx_mem_unmap(u.c, m.h) }

// window registers [base, base+n) and packs its rkey, as a registration per
// request window would when the request opens, and unmaps it, as its
// revocation would: one request's registration cost. It returns the
// packed rkey's length.
func (u *rawUCP) window(base uintptr, n uint64) (int, error) {
	m, err := u.memMap(base, n)
	if err != nil {
		return 0, err
	}
	var buf unsafe.Pointer
	var kn C.size_t
	st := C.kvx_rkey_pack(u.c, m.h, &buf, &kn)
	if st == ucsOK {
		C.kvx_rkey_buffer_release(buf)
	}
	C.kvx_mem_unmap(u.c, m.h)
	if st != ucsOK {
		return 0, fmt.Errorf("ucp_rkey_pack: %s", statusText(st))
	}
	return int(kn), nil
}

// connect creates an endpoint to the worker at addr (peer error handling,
// as the agent's endpoints).
func (u *rawUCP) connect(addr []byte) (*rawEP, error) {
	wa, err := validateWorkerAddress(addr)
	if err != nil {
		return nil, err
	}
	u.next++
	e := &rawEP{id: u.next, peer: peerMemoryDomains(wa)}
	if st := C.kvx_ep_create(u.c, unsafe.Pointer(&addr[0]), C.uint64_t(e.id), &e.h, &e.ctx); st != ucsOK {
		return nil, fmt.Errorf("ucp_ep_create: %s", statusText(st))
	}
	return e, nil
}

// info is ucp_ep_print_info's text: the endpoint's lanes and transports.
func (u *rawUCP) info(e *rawEP) string {
	p := C.kvx_ep_info(e.h)
	if p == nil {
		return ""
	}
	defer C.free(unsafe.Pointer(p))
	return C.GoString(p)
}

// unpack unpacks a packed rkey on e, once validated (validateRkey) and
// its shared-memory segments probed (probeSegments; their bounds are not
// checked: a rawUCP put takes any remote address).
func (u *rawUCP) unpack(e *rawEP, packed []byte) (rawRkey, error) {
	pk, err := validateRkey(packed, e.peer)
	if err != nil {
		return rawRkey{}, err
	}
	_, release, err := pk.probeSegments()
	if err != nil {
		return rawRkey{}, err
	}
	defer release()
	return u.unpackUnchecked(e, packed)
}

// unpackUnchecked is unpack without the checks: tests use it, in a child
// process, to show what UCX does with the rkeys the checks refuse.
func (u *rawUCP) unpackUnchecked(e *rawEP, packed []byte) (rawRkey, error) {
	var rk rawRkey
	if len(packed) == 0 {
		return rk, errors.New("empty rkey")
	}
	if st := C.kvx_rkey_unpack(e.h, unsafe.Pointer(&packed[0]), &rk.h); st != ucsOK {
		return rk, fmt.Errorf("ucp_ep_rkey_unpack: %s", statusText(st))
	}
	e.rkeys = append(e.rkeys, rk.h)
	return rk, nil
}

// put posts one put of n bytes from local address src to remote address
// dst with rk. An error is the status ucp_put_nbx returned.
func (u *rawUCP) put(e *rawEP, rk rawRkey, src, dst uintptr, n uint64) error {
	if C.kvx_segs(u.c, 1) == 0 {
		return errors.New("out of memory")
	}
	seg := unsafe.Slice(u.c.segs, 1)
	seg[0] = C.kvx_seg{src: 0, dst: 0, len: C.uint64_t(n)}
	if C.kvx_put(u.c, e.h, rk.h, nil, C.uint64_t(src), C.uint64_t(dst), 1) >= 0 {
		return fmt.Errorf("ucp_put_nbx: %s", statusText(u.c.st))
	}
	return nil
}

// poll progresses the worker once and handles its events: endpoint errors
// are recorded on eps, a completed flush or close with its id is reported.
func (u *rawUCP) poll(eps []*rawEP, done map[uint64]C.ucs_status_t) {
	k := int(C.kvx_poll(u.c, 64))
	for i := range k {
		ev := &u.c.out[i]
		switch ev.kind {
		case C.KVX_EV_FLUSH, C.KVX_EV_CLOSE:
			done[uint64(ev.id)] = C.ucs_status_t(ev.status)
		case C.KVX_EV_EPERR:
			for _, e := range eps {
				if e.id == uint64(ev.id) {
					e.err = C.ucs_status_t(ev.status)
				}
			}
		case C.KVX_EV_AM:
			C.free(ev.data)
		}
	}
}

// progress polls the worker once, recording endpoint errors on eps.
func (u *rawUCP) progress(eps ...*rawEP) { u.poll(eps, map[uint64]C.ucs_status_t{}) }

// flush flushes e, progressing u and every worker of others until it
// completes or the limit passes; it returns the flush's status.
func (u *rawUCP) flush(e *rawEP, limit time.Duration, others ...*rawUCP) error {
	u.next++
	id := u.next
	var st C.ucs_status_t
	if C.kvx_flush(u.c, e.h, C.uint64_t(id)) == 0 {
		st = u.c.st
	} else {
		done := map[uint64]C.ucs_status_t{}
		deadline := time.Now().Add(limit)
		for {
			u.poll([]*rawEP{e}, done)
			for _, o := range others {
				o.poll(nil, map[uint64]C.ucs_status_t{})
			}
			if s, ok := done[id]; ok {
				st = s
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("flush: not complete within %v", limit)
			}
		}
	}
	// Let the receivers apply what the flush carried (software RMA).
	for range 100 {
		for _, o := range others {
			o.poll(nil, map[uint64]C.ucs_status_t{})
		}
	}
	if st != ucsOK {
		return fmt.Errorf("flush: %s", statusText(st))
	}
	return nil
}

// closeEP destroys e's rkeys and force-closes it, progressing until done.
func (u *rawUCP) closeEP(e *rawEP, others ...*rawUCP) {
	for _, rk := range e.rkeys {
		C.kvx_rkey_destroy(rk)
	}
	e.rkeys = nil
	u.next++
	id := u.next
	if C.kvx_close(u.c, e.h, C.uint64_t(id)) != 0 {
		done := map[uint64]C.ucs_status_t{}
		deadline := time.Now().Add(10 * time.Second)
		for _, ok := done[id]; !ok; _, ok = done[id] {
			if time.Now().After(deadline) {
				return // the error handler may still use ctx: leaked
			}
			u.poll(nil, done)
			for _, o := range others {
				o.poll(nil, map[uint64]C.ucs_status_t{})
			}
		}
	}
	C.kvx_ep_ctx_free(e.ctx)
}

// errText is the endpoint's reported error, or "".
func (e *rawEP) errText() string {
	if e.err == ucsOK {
		return ""
	}
	return statusText(e.err)
}
