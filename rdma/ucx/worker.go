//go:build cgo && linux && !kvxfer_noucx

package ucx

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// reqKind is what another goroutine asks of the progress goroutine.
type reqKind uint8

const (
	reqPost reqKind = iota
	reqConnect
	reqRegister
	reqDeregister
	reqCloseEndpoint
	reqCloseAgent
	reqAlloc
	reqFree
	reqPeerExited
	reqPeerDrained
	reqRun // run fn on the progress goroutine (tests)
)

type request struct {
	kind reqKind
	ep   *endpoint
	ent  *entry
	call *call
	fn   func() // reqRun's
	// A post's batch, as issue needs it.
	seq  uint64 // its entry's place in the endpoint's order
	src  *registration
	key  *remoteKey
	segs []kvcache.Segment
}

// call is a request its caller waits for.
type call struct {
	addr   address
	region *kvcache.Region
	size   uint64
	reg    *registration
	ep     *endpoint
	// by bounds a deregistration's wait for its peers' answers (zero:
	// the agent's revoke timeout alone; Agent.DeregisterBy).
	by   time.Time
	err  error
	done chan struct{}
	// ident and how: a peer's exit or drain proof (Agent.PeerExited,
	// Agent.PeerDrained), for addr.
	ident, how string
	// source: a register of memory no peer is given a key to
	// (Agent.RegisterSource).
	source bool
}

func (c *call) reply(err error) {
	c.err = err
	close(c.done)
}

// uep is one UCP endpoint: a data endpoint (ep set) or a link's control
// endpoint. Progress goroutine only.
type uep struct {
	id    uint64
	h     C.ucp_ep_h
	ctx   unsafe.Pointer // the error handler's argument (C memory)
	name  string
	link  *link
	ep    *endpoint
	rkeys map[uint64]*unpackedRkey // by the peer's registration id

	group     []*entry // issued this round, flushed at its end
	groupLast uint64   // the seq of the group's last batch
	// Flushes issued and not yet settled in order, oldest first: empty, or
	// the first is still in flight (settle drains the settled prefix).
	pend []*flushOp

	closing  bool
	force    bool      // close without waiting for the flushes
	reason   error     // what batches caught by the close get
	deadline time.Time // of the wait for the flushes
	closeID  uint64    // the pending ucp_ep_close_nbx
	closed   bool
	failed   error // UCX reported the endpoint failed
	// unproven: its writes on the wire were cut without proof that they
	// no longer land (the close timeout passed, its link failed
	// unproven, or UCX reported it failed: dataFailed); reason says so.
	unproven bool
}

// flushOp is one ucp_ep_flush_nbx and the batches it completes. Flushes of
// an endpoint settle in the order they were issued (see settle).
type flushOp struct {
	u       *uep
	id      uint64 // in w.flushes while in flight
	ents    []*entry
	last    uint64 // seq of the last batch in ents
	settled bool
	err     error
}

// deregOp is a Deregister waiting for its peers' replies.
type deregOp struct {
	reg      *registration
	c        *call
	restore  bool // second phase: undoing the revocation
	waiting  map[*link]uint64
	busy     string // why it fails
	deadline time.Time
	within   string // the wait deadline allows, named for errors
}

// worker is an agent's progress goroutine and everything it owns: the UCP
// worker (single-threaded: every UCX call is made here), the endpoints,
// links and registrations. Other goroutines reach it through submit.
type worker struct {
	a       *Agent
	c       *C.kvx_worker
	evfd    int
	epfd    int // epoll over UCP's event fd and evfd
	stopped chan struct{}

	mu     sync.Mutex
	reqs   []request
	exited bool
	parked atomic.Bool
	// cpu is the C worker's cpu (where kvx_poll last ran), copied after
	// each poll for other goroutines (progressCPU).
	cpu atomic.Int32
	tid int // the progress thread's id, set before New returns

	// Progress goroutine only.
	spare      []request
	nextID     uint64
	ueps       map[uint64]*uep
	flushes    map[uint64]*flushOp
	closes     map[uint64]*uep
	closing    []*uep
	links      map[agentID]*link
	linkTimers int // links waiting for a welcome or a bye-ack
	regs       map[uint64]*registration
	allocs     map[uintptr]*allocation
	nextReg    uint64
	replies    map[uint64]*deregOp
	deregs     []*deregOp
	grouped    []*uep
	touched    []*endpoint
	round      uint64
	napping    []*endpoint // signalled since the last idle point
	idleRound  uint64
	dirty      bool // links or the shutdown may move on
	shutdown   *call
	shutPhase  int
	// unacked names the linked peers whose acknowledgement of this
	// agent's bye never came (the revoke timeout passed, or a silent
	// peer was not waited for): nothing proves their writes into this
	// agent's memory over, so teardown keeps the allocations mapped and
	// Close says so (rdma.ErrCloseUnproven) — unless every registration
	// of this agent is a source, into which no peer writes.
	unacked    []string
	done       bool
	now        time.Time
	nextTimers time.Time
	dropped    int           // control messages malformed, or not sealed by their sender
	own        workerAddress // this worker's, parsed (aliasOf)
	unadmitted int           // hellos dropped by WithAdmission
	opPool     []*flushOp
	entPool    [][]*entry
	// A round's small batches, posted together by putPending; their
	// segments fill w.c.segs from 0 to nsegs.
	pending     []*entry
	nsegs       int
	cprogressed C.uint
	waitEvents  [2]syscall.EpollEvent
}

func newWorker(a *Agent) *worker {
	w := &worker{
		a:         a,
		stopped:   make(chan struct{}),
		ueps:      make(map[uint64]*uep),
		flushes:   make(map[uint64]*flushOp),
		closes:    make(map[uint64]*uep),
		links:     make(map[agentID]*link),
		regs:      make(map[uint64]*registration),
		allocs:    make(map[uintptr]*allocation),
		replies:   make(map[uint64]*deregOp),
		round:     1,
		idleRound: 1,
		pending:   make([]*entry, 0, C.KVX_DESCS),
	}
	w.cpu.Store(-1) // until the first poll
	return w
}

// submit queues r for the progress goroutine and wakes it if it sleeps;
// false once the goroutine has stopped.
func (w *worker) submit(r request) bool {
	w.mu.Lock()
	if w.exited {
		w.mu.Unlock()
		return false
	}
	w.reqs = append(w.reqs, r)
	w.mu.Unlock()
	if w.parked.Load() && w.parked.CompareAndSwap(true, false) {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		syscall.Write(w.evfd, one[:])
	}
	return true
}

// call submits a request and waits for its reply; false once the progress
// goroutine has stopped.
func (w *worker) call(kind reqKind, c *call) bool {
	if !w.submit(request{kind: kind, call: c}) {
		return false
	}
	<-c.done
	return true
}

func (w *worker) run(ready chan<- error) {
	defer close(w.stopped)
	// Never unlocked: the thread ends with the goroutine, and UCX's
	// single-threaded worker only ever sees this thread.
	runtime.LockOSThread()
	w.tid = unix.Gettid()
	err := w.pin()
	if err == nil {
		err = w.open()
	}
	if err != nil {
		w.mu.Lock()
		w.exited = true
		w.mu.Unlock()
		ready <- err
		return
	}
	ready <- nil
	w.loop()
	w.teardown()
}

// pin applies WithProgressCPUs to this, the progress thread.
func (w *worker) pin() error {
	if len(w.a.opts.cpus) == 0 {
		return nil
	}
	var set unix.CPUSet
	for _, c := range w.a.opts.cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("progress thread affinity %v: %w", w.a.opts.cpus, err)
	}
	return nil
}

func (w *worker) open() error {
	mods := C.CString(configMods(w.a.opts, os.Getenv))
	defer C.free(unsafe.Pointer(mods))
	var errbuf [256]C.char
	var c *C.kvx_worker
	if st := C.kvx_open(&c, mods, &errbuf[0], C.size_t(len(errbuf))); st != ucsOK {
		if tls, ok := os.LookupEnv("UCX_TLS"); ok {
			return fmt.Errorf("%s (UCX_TLS=%q)", C.GoString(&errbuf[0]), tls)
		}
		return fmt.Errorf("%s", C.GoString(&errbuf[0]))
	}
	w.c = c
	w.evfd = int(c.evfd)
	w.epfd = int(c.epfd)
	worker := C.GoBytes(unsafe.Pointer(c.addr), C.int(c.addr_len))
	w.a.addr = newAddress(w.a.pub, w.a.spub, worker).encode()
	w.own, _ = validateWorkerAddress(worker)
	w.a.memTypes = uint64(c.mem_types)
	return nil
}

// loop is the progress loop: take requests, progress UCX, handle its
// events; poll on for a short spin after the last work, then sleep on the
// worker's event fd (armed) until UCX or a submit wakes it.
func (w *worker) loop() {
	last := time.Now()
	for !w.done {
		n := w.drain()
		n += w.poll()
		w.now = time.Now()
		w.advance()
		if n > 0 {
			last = w.now
			continue
		}
		w.wakeNappers()
		idle := w.now.Sub(last)
		if w.busy() {
			if idle >= w.a.opts.busySpin {
				w.park(time.Millisecond)
			}
		} else if idle >= w.a.opts.spin {
			w.park(w.a.opts.tick)
		}
	}
}

// busy reports operations in flight: the loop then sleeps at most 1ms and
// checks deadlines.
func (w *worker) busy() bool {
	return len(w.flushes) > 0 || len(w.closes) > 0 || len(w.closing) > 0 ||
		len(w.replies) > 0 || w.linkTimers > 0 || w.shutdown != nil
}

// park sleeps until the worker's epoll fd is readable (a UCP event or a
// submit's eventfd write) or timeout (rounded up to a millisecond). The
// thread blocks in epoll_wait itself rather than in Go's poller: the
// kernel then wakes this thread directly, one context switch per wakeup
// instead of two (the poller's thread, then this locked one), which
// halves the context switches of a tcp transfer; the P is handed on while
// it sleeps, as for any system call.
func (w *worker) park(timeout time.Duration) {
	w.parked.Store(true)
	w.mu.Lock()
	pending := len(w.reqs) > 0
	w.mu.Unlock()
	if pending || C.kvx_arm(w.c) != ucsOK {
		w.parked.Store(false)
		return
	}
	ms := int((timeout + time.Millisecond - 1) / time.Millisecond)
	syscall.EpollWait(w.epfd, w.waitEvents[:], ms) // EINTR: as a timeout
	w.parked.Store(false)
	var buf [8]byte
	syscall.Read(w.evfd, buf[:]) // reset the eventfd (EAGAIN if a poll woke us)
}

func (w *worker) newID() uint64 {
	w.nextID++
	return w.nextID
}

// drain handles every queued request, then flushes the endpoints that got
// writes.
func (w *worker) drain() int {
	w.mu.Lock()
	reqs := w.reqs
	if len(reqs) == 0 {
		w.mu.Unlock()
		return 0
	}
	w.reqs = w.spare[:0]
	w.mu.Unlock()
	issued, bytes := 0, uint64(0)
	for i := range reqs {
		r := &reqs[i]
		if r.kind == reqPost {
			bytes += w.issue(r)
			if issued++; issued == roundBatches || bytes >= roundBytes {
				// Complete what is done so far: the poster refills its
				// window while the rest is written.
				issued, bytes = 0, 0
				w.flushGroups()
				w.signalTouched()
			}
		} else {
			w.handle(r)
		}
		*r = request{}
	}
	w.spare = reqs[:0]
	w.flushGroups()
	return len(reqs)
}

// roundBatches and roundBytes bound what the progress goroutine posts
// before it flushes it and hands the completions on.
const (
	roundBatches = 32
	roundBytes   = 32 << 20
)

// smallBatch is the most bytes a batch posted with the others of its round
// in one cgo call may carry.
const smallBatch = 256 << 10

func (w *worker) handle(r *request) {
	switch r.kind {
	case reqConnect:
		w.connect(r.call)
	case reqRegister:
		w.register(r.call)
	case reqDeregister:
		w.deregister(r.call)
	case reqCloseEndpoint:
		w.startClose(r.ep.u, fmt.Errorf("%s: %w", r.ep.name, rdma.ErrEndpointClosed), true)
	case reqCloseAgent:
		w.beginShutdown(r.call)
	case reqAlloc:
		w.alloc(r.call)
	case reqFree:
		w.free(r.call)
	case reqPeerExited:
		w.peerExited(r.call)
	case reqPeerDrained:
		w.peerDrained(r.call)
	case reqRun:
		r.fn()
		r.call.reply(nil)
	}
}

// do runs fn on the progress goroutine and waits for it; false once the
// goroutine has stopped. For tests, which look at and act on what only
// that goroutine touches.
func (w *worker) do(fn func()) bool {
	c := &call{done: make(chan struct{})}
	if !w.submit(request{kind: reqRun, call: c, fn: fn}) {
		return false
	}
	<-c.done
	return true
}

// poll progresses UCX and handles the events its callbacks recorded.
func (w *worker) poll() int {
	total := 0
	for {
		k := int(C.kvx_poll(w.c, 64))
		w.cpu.Store(int32(w.c.cpu))
		total += int(w.c.progressed) + k
		for i := range k {
			w.event(&w.c.out[i])
		}
		if k < C.KVX_EVENTS {
			return total
		}
	}
}

func (w *worker) event(ev *C.kvx_event) {
	id, st := uint64(ev.id), C.ucs_status_t(ev.status)
	switch ev.kind {
	case C.KVX_EV_FLUSH:
		w.onFlush(id, st)
	case C.KVX_EV_CLOSE:
		if u := w.closes[id]; u != nil {
			delete(w.closes, id)
			w.closedUEP(u)
		}
	case C.KVX_EV_EPERR:
		w.onError(id, st)
	case C.KVX_EV_AM:
		if uint64(ev.len) > maxMessage {
			// Longer than any control message, and from anyone who can
			// reach this worker: dropped unread (C.GoBytes takes a C
			// int, which 2 GiB and more overflow).
			C.free(ev.data)
			w.dropped++
			return
		}
		b := C.GoBytes(ev.data, C.int(ev.len))
		C.free(ev.data)
		w.onMessage(b)
	}
}

// advance moves closes, links, deregistrations and the shutdown on, checks
// deadlines, and wakes the dispatchers of endpoints with completions.
func (w *worker) advance() {
	if len(w.closing) > 0 {
		w.advanceCloses()
	}
	if w.busy() && !w.now.Before(w.nextTimers) {
		w.nextTimers = w.now.Add(time.Millisecond)
		w.checkTimers()
	}
	for w.dirty {
		w.dirty = false
		w.stepLinks()
		if w.shutdown != nil {
			w.stepShutdown()
		}
		if len(w.closing) > 0 {
			w.advanceCloses()
		}
	}
	w.signalTouched()
}

// signalTouched wakes the dispatchers of endpoints with completions (a
// parked one; a napping one wakes on its own, or at the next idle point).
func (w *worker) signalTouched() {
	for i, e := range w.touched {
		e.signal()
		if e.idle != w.idleRound {
			e.idle = w.idleRound
			w.napping = append(w.napping, e)
		}
		w.touched[i] = nil
	}
	w.touched = w.touched[:0]
	w.round++
}

// wakeNappers ends the naps of the dispatchers signalled since the last
// idle point: with nothing left to do, the progress goroutine's futex wake
// costs no stream anything, and a lone completion waits for no timer.
func (w *worker) wakeNappers() {
	if len(w.napping) == 0 {
		return
	}
	for i, e := range w.napping {
		e.napper.wake()
		w.napping[i] = nil
	}
	w.napping = w.napping[:0]
	w.idleRound++
}

// progressCPU is the CPU the progress thread last polled on (-1: unknown).
// It reads the Go copy the progress goroutine stores after each poll,
// never the C worker: an endpoint's dispatcher may ask while the agent
// closes, after the C worker is freed (the race detector caught the read
// of w.c racing teardown's w.c = nil).
func (w *worker) progressCPU() int { return int(w.cpu.Load()) }

func (w *worker) touch(e *endpoint) {
	if e.round != w.round {
		e.round = w.round
		w.touched = append(w.touched, e)
	}
}

// ---- Batches ----

// issue posts a batch's puts, and returns how many bytes they carry; the
// round's flush of its endpoint completes it.
func (w *worker) issue(r *request) uint64 {
	e, ent := r.ep, r.ent
	u := e.u
	switch {
	case u.closing || u.closed:
		reason := u.reason
		if u.unproven {
			// u.reason says that writes on the wire were cut and may
			// still land; this batch never reached UCX, so none of it
			// can: it fails with why a post is refused now.
			e.mu.Lock()
			reason = e.refusal()
			e.mu.Unlock()
			if reason == nil {
				reason = fmt.Errorf("%s: %w", e.name, rdma.ErrEndpointClosed)
			}
			reason = fmt.Errorf("batch not posted: %w", reason)
		}
		w.finish(ent, reason)
		return 0
	case e.closing.Load():
		w.finish(ent, fmt.Errorf("%s: %w", e.name, rdma.ErrEndpointClosed))
		return 0
	}
	rk, err := w.rkey(u, r.key)
	if err != nil {
		w.finish(ent, err)
		return 0
	}
	var bytes uint64
	segs := r.segs
	for _, s := range segs {
		bytes += s.Len
	}
	switch {
	case len(segs) == 0:
	case bytes <= smallBatch && len(w.pending) < C.KVX_DESCS && w.ensureSegs(w.nsegs+len(segs)):
		// Small: posted with the others of the round in one cgo call.
		cs := w.segs()
		for i, s := range segs {
			cs[w.nsegs+i] = C.kvx_seg{src: C.uint64_t(s.Src), dst: C.uint64_t(s.Dst), len: C.uint64_t(s.Len)}
		}
		w.c.descs[len(w.pending)] = C.kvx_put_desc{ep: u.h, rkey: rk, memh: r.src.memh,
			lbase: C.uint64_t(r.src.region.Base), rbase: C.uint64_t(r.key.base), off: C.uint32_t(w.nsegs), n: C.uint32_t(len(segs))}
		w.nsegs += len(segs)
		w.pending = append(w.pending, ent)
	default:
		w.putPending() // in order with the ones before
		if i, st := w.put(u.h, rk, r); i >= 0 {
			ent.err = &rdma.SegmentError{Index: i, Segment: segs[i],
				Err: fmt.Errorf("%s: ucp_put_nbx: %w", e.name, w.statusErr(u, st))}
		}
	}
	if u.group == nil {
		u.group = w.getEnts()
		w.grouped = append(w.grouped, u)
	}
	u.group = append(u.group, ent)
	u.groupLast = r.seq
	e.issuedSeq.Store(r.seq)
	return bytes
}

// putPending posts the round's small batches, in one cgo call.
func (w *worker) putPending() {
	n := len(w.pending)
	if n == 0 {
		return
	}
	C.kvx_put_many(w.c, C.size_t(n))
	for i, ent := range w.pending {
		if f := int(w.c.fails[i]); f >= 0 {
			segs := ent.batch.Segments
			ent.err = &rdma.SegmentError{Index: f, Segment: segs[f],
				Err: fmt.Errorf("%s: ucp_put_nbx: %w", ent.ep.name, w.statusErr(ent.ep.u, C.ucs_status_t(w.c.sts[i])))}
		}
		w.pending[i] = nil
	}
	w.pending, w.nsegs = w.pending[:0], 0
}

// ensureSegs grows the C worker's segment array to hold n segments; false
// when out of memory. The common case costs no cgo call.
func (w *worker) ensureSegs(n int) bool {
	return n <= int(w.c.segcap) || C.kvx_segs(w.c, C.size_t(n)) != 0
}

// segs is the C worker's segment array as a slice (C memory).
func (w *worker) segs() []C.kvx_seg {
	return unsafe.Slice(w.c.segs, w.c.segcap)
}

// put posts segs: runs of segments of at most putRun bytes in one cgo call
// each, a larger segment in putChunk pieces, one call each. A long cgo call
// lets the scheduler hand the goroutine's P to another thread (it counts as
// a system call), and the locked goroutine then waits for one to come back.
// It returns the index of the first segment UCX refused, or -1.
func (w *worker) put(h C.ucp_ep_h, rk C.ucp_rkey_h, r *request) (int, C.ucs_status_t) {
	segs, memh := r.segs, r.src.memh
	lbase, rbase := C.uint64_t(r.src.region.Base), C.uint64_t(r.key.base)
	for first := 0; first < len(segs); {
		n, bytes := 0, uint64(0)
		for first+n < len(segs) && (n == 0 || bytes+segs[first+n].Len <= putRun) {
			bytes += segs[first+n].Len
			n++
		}
		if !w.ensureSegs(n) {
			return first, C.UCS_ERR_NO_MEMORY
		}
		cs := w.segs()
		if n == 1 && bytes > putRun {
			s := segs[first]
			for off := uint64(0); off < s.Len; off += putChunk {
				cs[0] = C.kvx_seg{src: C.uint64_t(s.Src + off), dst: C.uint64_t(s.Dst + off), len: C.uint64_t(min(putChunk, s.Len-off))}
				if C.kvx_put(w.c, h, rk, memh, lbase, rbase, 1) >= 0 {
					return first, w.c.st
				}
			}
		} else {
			for i, s := range segs[first : first+n] {
				cs[i] = C.kvx_seg{src: C.uint64_t(s.Src), dst: C.uint64_t(s.Dst), len: C.uint64_t(s.Len)}
			}
			if i := C.kvx_put(w.c, h, rk, memh, lbase, rbase, C.size_t(n)); i >= 0 {
				return first + int(i), w.c.st
			}
		}
		first += n
	}
	return -1, ucsOK
}

// putRun bounds the bytes of one cgo call to kvx_put (about 50µs of
// copying in shared memory); a larger segment goes in putChunk pieces.
const (
	putRun   = 2 << 20
	putChunk = 256 << 10
)

// rkey returns the endpoint's unpacked rkey for the peer's registration.
// The packed rkey is checked first (rkey.go): its format against what the
// peer's address says of its memory domains, and the shared-memory
// segments it names against the kernel's objects and the key's region, so
// that UCX 1.13 neither takes its crashing error path nor copies outside
// the segment it maps.
//
// An rkey is unpacked once per registration and endpoint; every other key
// of that registration that comes to use it (the owner may hand out
// several, with other bounds) is checked against what the first one's
// checks found: the same packed bytes, and its region inside the same
// segments.
func (w *worker) rkey(u *uep, k *remoteKey) (C.ucp_rkey_h, error) {
	if u.link.peer == w.a.id {
		if err := w.ownKey(k); err != nil {
			return nil, fmt.Errorf("%s: %w", u.name, err)
		}
	}
	if ur, ok := u.rkeys[k.reg]; ok {
		if k.checked != ur {
			if err := ur.admit(k); err != nil {
				return nil, fmt.Errorf("%s: registration %d: %w", u.name, k.reg, err)
			}
			k.checked = ur
		}
		return ur.h, nil
	}
	ur, err := w.unpack(u, k)
	if err != nil {
		return nil, err
	}
	u.rkeys[k.reg], k.checked = ur, ur
	rk := ur.h
	// Where UCX mapped the peer's memory in this process (shared-memory
	// transports only): fill its page tables off this goroutine.
	var local C.uintptr_t
	if C.kvx_rkey_ptr(rk, C.uint64_t(k.base), &local) == ucsOK && local != 0 {
		w.a.prefaults.Add(1)
		go func() {
			defer w.a.prefaults.Done()
			prefault(uintptr(local), k.len)
		}()
	}
	return rk, nil
}

// ownKey checks a key of this agent's own registration, on an endpoint
// to itself, against the registration: this agent knows its regions, and
// a put on a link to itself is a copy within this process (UCX's self
// transport) to the key's address, bounded by nothing else: a peer that
// hands out this agent's own address as its own may pass on a key this
// agent signed, for a registration since deregistered (found by review,
// when keys carried a MAC under a secret every peer learnt: a key with
// any base, a write into this process's unregistered memory or a
// SIGSEGV).
func (w *worker) ownKey(k *remoteKey) error {
	r := w.regs[k.reg]
	if r == nil {
		return fmt.Errorf("%w: registration %d of this agent: not registered", rdma.ErrBadKey, k.reg)
	}
	lo, n := uint64(r.region.Base), r.region.Len
	if k.base < lo || k.len > n || k.base-lo > n-k.len {
		return fmt.Errorf("%w: registration %d of this agent is [%#x, +%d), the key says [%#x, +%d)", rdma.ErrBadKey, k.reg, lo, n, k.base, k.len)
	}
	return nil
}

// unpackedRkey is a peer's rkey unpacked on an endpoint, with what its
// checks found.
type unpackedRkey struct {
	h      C.ucp_rkey_h
	packed string     // the packed rkey it was unpacked from
	bounds []segBound // the shared-memory segments UCX maps for it
}

// admit checks another key of the same registration against ur.
func (ur *unpackedRkey) admit(k *remoteKey) error {
	if !rkeyChecks {
		return nil
	}
	if string(k.rkey) != ur.packed {
		return fmt.Errorf("%w: %w: a second packed rkey for the registration (%x, unpacked %x)", rdma.ErrBadKey, errBadRkey, k.rkey, ur.packed)
	}
	return within(ur.bounds, k.base, k.len)
}

// unpack checks the segments k's packed rkey names (its format was
// checked when the endpoint resolved the key: remoteKey.parsed) and
// unpacks it on u.
func (w *worker) unpack(u *uep, k *remoteKey) (*unpackedRkey, error) {
	ur := &unpackedRkey{packed: string(k.rkey)}
	release := func() {}
	var err error
	if rkeyChecks {
		ur.bounds, release, err = k.parsed.probeSegments()
		if err == nil {
			err = within(ur.bounds, k.base, k.len)
		}
		if err == nil && !isLocalAgent(u.link.peer) {
			err = k.parsed.notOwn()
		}
		if err != nil {
			release()
			return nil, fmt.Errorf("%s: registration %d: %w", u.name, k.reg, err)
		}
	}
	st := C.kvx_rkey_unpack(u.h, unsafe.Pointer(&k.rkey[0]), &ur.h)
	release()
	if st != ucsOK {
		return nil, fmt.Errorf("%s: %w: ucp_ep_rkey_unpack of registration %d: %s", u.name, rdma.ErrBadKey, k.reg, statusText(st))
	}
	return ur, nil
}

// flushGroups flushes every endpoint that got puts this round: the flush
// completes, in UCX's terms remotely, every put posted before it.
func (w *worker) flushGroups() {
	w.putPending()
	for i, u := range w.grouped {
		w.grouped[i] = nil
		op := w.flush(u)
		op.ents, op.last = u.group, u.groupLast
		u.group = nil
		w.settle(u)
	}
	w.grouped = w.grouped[:0]
}

// flush starts a ucp_ep_flush_nbx on u and queues its op on the endpoint;
// the op is settled at once when UCX completes the flush inline.
func (w *worker) flush(u *uep) *flushOp {
	op := w.getOp()
	op.u = u
	id := w.newID()
	if C.kvx_flush(w.c, u.h, C.uint64_t(id)) == 0 {
		w.flushFailed(u, w.c.st)
		op.settled, op.err = true, w.statusErr(u, w.c.st)
	} else {
		op.id = id
		w.flushes[id] = op
	}
	u.pend = append(u.pend, op)
	return op
}

func (w *worker) onFlush(id uint64, st C.ucs_status_t) {
	op := w.flushes[id]
	if op == nil {
		return // its endpoint closed first and failed its batches
	}
	delete(w.flushes, id)
	w.flushFailed(op.u, st)
	op.settled, op.err = true, w.statusErr(op.u, st)
	w.settle(op.u)
}

// flushFailed takes a flush of a data endpoint that UCX failed (st) as
// the endpoint's failure (dataFailed): UCX fails an endpoint's operations
// before it calls its error callback, so the flush's status may come
// first. A flush cancelled by this agent's own close of u (issued:
// closeID) is not one.
func (w *worker) flushFailed(u *uep, st C.ucs_status_t) {
	if st == ucsOK || u.ep == nil || u.failed != nil || (st == ucsCanceled && (u.closeID != 0 || u.closed)) {
		return
	}
	w.dataFailed(u, fmt.Errorf("%s: %w: UCX failed its flush: %s", u.name, rdma.ErrPeerGone, statusText(st)))
}

// settle completes the batches of u's settled flushes, oldest first, up to
// the first one still in flight. A flush that succeeded completes its
// batches by publishing its last seq to the endpoint, without touching
// them (their cache lines belong to the goroutines that post and dispatch
// them); a failed one marks each batch.
func (w *worker) settle(u *uep) {
	n := 0
	for _, op := range u.pend {
		if !op.settled {
			break
		}
		n++
		switch {
		case len(op.ents) == 0:
		case op.err == nil:
			e := u.ep
			e.doneSeq.Store(op.last)
			w.touch(e)
		default:
			w.completeGroup(u, op.ents, op.err)
		}
		clear(op.ents)
		if op.ents != nil {
			w.entPool = append(w.entPool, op.ents[:0])
		}
		*op = flushOp{}
		w.opPool = append(w.opPool, op)
	}
	if n > 0 {
		rest := copy(u.pend, u.pend[n:])
		clear(u.pend[rest:])
		u.pend = u.pend[:rest]
	}
}

// completeGroup completes batches that were flushed together; a batch that
// already failed keeps its error, and when the flush's failure says its
// writes may still land (rdma.ErrCloseUnproven) that is added to it: a put
// refused part way through a batch leaves its earlier ones on the wire.
func (w *worker) completeGroup(u *uep, ents []*entry, err error) {
	if len(ents) > 0 {
		e := ents[0].ep
		unproven := errors.Is(err, rdma.ErrCloseUnproven)
		e.mu.Lock()
		for _, ent := range ents {
			if !ent.done {
				switch {
				case ent.err == nil:
					ent.err = err
				case unproven && !errors.Is(ent.err, rdma.ErrCloseUnproven):
					ent.err = fmt.Errorf("%w; %w", ent.err, err)
				}
				ent.done = true
			}
		}
		e.mu.Unlock()
		w.touch(e)
	}
}

// finish completes a batch that was never issued.
func (w *worker) finish(ent *entry, err error) {
	e := ent.ep
	e.mu.Lock()
	if !ent.done {
		if ent.err == nil {
			ent.err = err
		}
		ent.done = true
	}
	e.mu.Unlock()
	w.touch(e)
}

func (w *worker) getEnts() []*entry {
	if n := len(w.entPool); n > 0 {
		s := w.entPool[n-1]
		w.entPool = w.entPool[:n-1]
		return s
	}
	return make([]*entry, 0, 16)
}

func (w *worker) getOp() *flushOp {
	if n := len(w.opPool); n > 0 {
		op := w.opPool[n-1]
		w.opPool = w.opPool[:n-1]
		return op
	}
	return new(flushOp)
}

// statusErr turns a completion status into the error of the batches it
// completes.
func (w *worker) statusErr(u *uep, st C.ucs_status_t) error {
	switch {
	case st == ucsOK:
		return nil
	case u.unproven:
		// Its writes on the wire were cut without proof that they no
		// longer land (the close timeout, failLink, dataFailed): so were
		// these, whether UCX cancelled the flush or failed it.
		return u.reason
	case st == ucsCanceled && u.reason != nil:
		return u.reason
	case st == ucsCanceled:
		return fmt.Errorf("%s: %w", u.name, rdma.ErrEndpointClosed)
	case u.failed != nil:
		return u.failed
	}
	return fmt.Errorf("%s: %w: %s", u.name, rdma.ErrPeerGone, statusText(st))
}

// ---- Endpoints ----

func (w *worker) createEP(l *link, name string) (*uep, error) {
	id := w.newID()
	var h C.ucp_ep_h
	var ctx unsafe.Pointer
	addr := l.addr.worker
	// parseAddress validated it; checked again here, where it matters:
	// ucp_ep_create aborts the process on some malformed addresses.
	if _, err := validateWorkerAddress(addr); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", name, rdma.ErrBadAddress, err)
	}
	if st := C.kvx_ep_create(w.c, unsafe.Pointer(&addr[0]), C.uint64_t(id), &h, &ctx); st != ucsOK {
		return nil, fmt.Errorf("%s: %w: ucp_ep_create: %s", name, rdma.ErrPeerGone, statusText(st))
	}
	u := &uep{id: id, h: h, ctx: ctx, name: name, link: l, rkeys: make(map[uint64]*unpackedRkey)}
	w.ueps[id] = u
	return u, nil
}

func (w *worker) onError(id uint64, st C.ucs_status_t) {
	u := w.ueps[id]
	if u == nil || u.closed {
		return
	}
	err := fmt.Errorf("%s: %w: UCX reports the endpoint failed: %s", u.name, rdma.ErrPeerGone, statusText(st))
	if u.ep != nil {
		w.dataFailed(u, err)
		return
	}
	if u.failed == nil {
		u.failed = err
	}
	if u.link.u == u {
		w.failLink(u.link, err)
	}
	w.startClose(u, err, false)
}

// dataFailed: UCX failed data endpoint u (its error callback, or a flush
// it failed first: flushFailed). Later posts are refused with err and u
// is closed by force. The failure concerns this endpoint of this agent
// alone and proves nothing of what its batches on the wire left behind:
// a peer that runs on (stopped long enough for a keepalive to time out,
// a paused VM), or one whose death UCX reports before its worker stopped,
// may still apply what reached its side (over tcp and UCX's software RMA
// its own worker applies what sits in its socket buffers). So those
// batches fail with rdma.ErrCloseUnproven beside err, and the endpoint's
// Close returns it, as when failLink cuts them — unless the peer's exit
// was proven first (Agent.PeerExited): its worker applies nothing more.
// Whichever comes first, this or its link's failure, the batches end the
// same. Idempotent.
func (w *worker) dataFailed(u *uep, err error) {
	if u.failed != nil {
		return
	}
	u.failed = err
	u.ep.setState(epFailed, err)
	w.startClose(u, err, false)
	if !u.unproven && u.link.exited == "" && (len(u.pend) > 0 || len(u.group) > 0) {
		u.unproven = true
		u.reason = fmt.Errorf("%w: %w (UCX's report proves nothing of what the peer already holds, and the peer's exit is not proven)", err, rdma.ErrCloseUnproven)
	}
}

// startClose closes u once its flushes completed (wait) or at once; the
// close itself is forced (ucp_ep_close_nbx with UCP_EP_CLOSE_FLAG_FORCE).
func (w *worker) startClose(u *uep, reason error, wait bool) {
	if u == nil || u.closed {
		return
	}
	if !u.closing {
		u.closing, u.reason = true, reason
		u.deadline = time.Now().Add(w.a.opts.close)
		w.closing = append(w.closing, u)
	}
	if !wait {
		u.force = true
	}
}

func (w *worker) advanceCloses() {
	list := w.closing
	w.closing = nil
	for _, u := range list {
		if !u.closed && u.closeID == 0 && (u.force || (len(u.pend) == 0 && u.group == nil)) {
			w.closeNow(u)
		}
		if !u.closed {
			w.closing = append(w.closing, u)
		}
	}
}

func (w *worker) closeNow(u *uep) {
	for reg, ur := range u.rkeys {
		C.kvx_rkey_destroy(ur.h)
		delete(u.rkeys, reg)
	}
	id := w.newID()
	if C.kvx_close(w.c, u.h, C.uint64_t(id)) == 0 {
		w.closedUEP(u)
		return
	}
	u.closeID = id
	w.closes[id] = u
}

// closedUEP: the UCP endpoint is gone; whatever it had in flight fails.
func (w *worker) closedUEP(u *uep) {
	u.closed, u.closeID = true, 0
	reason := u.reason
	if reason == nil {
		reason = fmt.Errorf("%s: %w", u.name, rdma.ErrEndpointClosed)
	}
	for _, op := range u.pend {
		if !op.settled {
			delete(w.flushes, op.id)
			op.settled, op.err = true, reason
		}
	}
	w.settle(u)
	C.kvx_ep_ctx_free(u.ctx)
	u.ctx = nil
	delete(w.ueps, u.id)
	if e := u.ep; e != nil {
		delete(u.link.eps, u)
		e.mu.Lock()
		e.ucpClosed = true
		if u.unproven {
			e.unproven = u.reason // the close timeout's, failLink's or dataFailed's
			if u.link.cut == "" {
				u.link.cut = fmt.Sprint(u.reason)
			}
		}
		e.mu.Unlock()
		w.touch(e)
	} else if u.link.u == u {
		u.link.u = nil
	}
	w.dirty = true
}

// checkTimers fails handshakes, byes, closes and deregistrations whose
// deadline passed.
func (w *worker) checkTimers() {
	now := w.now
	for _, l := range w.links {
		if l.u != nil && !l.deadline.IsZero() && now.After(l.deadline) && l.getState() == linkConnecting {
			err := fmt.Errorf("%w: agent %s did not answer the hello within %v (not running or not reachable there, or it did not admit this agent: a node's agent answers only agents whose address one of its peers sent it in its Hello)",
				rdma.ErrPeerGone, l.peer, w.a.opts.handshake)
			// A timeout, no proof: the peer may have taken the hello
			// (it runs again after a stop, or it is slow), brought its
			// side of the link up, and write into this agent's memory.
			l.unanswered, l.unproven = true, err.Error()
			w.failLink(l, err)
		}
		if l.byeReq != 0 && now.After(l.byeBy) {
			l.byeReq = 0
			if l.drained == "" { // else its writes are proven over
				w.unacked = append(w.unacked, fmt.Sprintf("agent %s did not acknowledge the bye within %v", l.peer, w.a.opts.revoke))
			}
			w.dirty = true
		}
	}
	for _, u := range w.closing {
		if !u.force && now.After(u.deadline) {
			u.force = true
			u.unproven = u.failed == nil && (len(u.pend) > 0 || len(u.group) > 0)
			if u.unproven {
				u.reason = fmt.Errorf("%s: %w: %w (close timeout %v, see WithCloseTimeout)", u.name, rdma.ErrEndpointClosed, rdma.ErrCloseUnproven, w.a.opts.close)
			}
		}
	}
	for _, op := range append([]*deregOp(nil), w.deregs...) {
		if now.After(op.deadline) {
			w.advanceDereg(op, true)
		}
	}
}
