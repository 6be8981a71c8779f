//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/cpu"

	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
)

// remoteKey is a peer's key as an endpoint caches it once verified.
type remoteKey struct {
	reg, base, len uint64
	rkey           []byte // packed, for ucp_ep_rkey_unpack
	// parsed is rkey as checkPackedRkey read it (its parts alias rkey),
	// for the segment probe before the unpack (worker.unpack).
	parsed packedRkey
	// checked: the unpacked rkey this key was last checked against
	// (worker.rkey). Progress goroutine only.
	checked *unpackedRkey
}

// entry is one batch, or one Flush, in an endpoint's completion order.
type entry struct {
	ep    *endpoint
	batch rdma.Batch
	src   *registration
	key   *remoteKey
	flush func(error) // a Flush's callback; nil for a batch
	seq   uint64      // its place in the endpoint's order, from 1
	done  bool        // completed: err is final (always true for a Flush)
	err   error
}

// Endpoint states besides open (a terminal one is never left).
const (
	epOpen   uint8 = iota
	epLeft         // the peer agent closed: posts refused, nothing lost
	epFailed       // the UCP endpoint failed: posts refused, batches failed
)

// endpoint is an rdma.Endpoint over one UCP endpoint. Post and Flush queue
// entries in post order; the progress goroutine marks batches done; the
// endpoint's dispatcher goroutine runs callbacks strictly in that order.
type endpoint struct {
	a    *Agent
	link *link
	name string

	u       *uep   // progress goroutine only
	round   uint64 // progress goroutine only: last round it was signalled
	idle    uint64 // progress goroutine only: last idle point it was listed for
	closing atomic.Bool
	// doneSeq: every entry up to this seq has completed (the progress
	// goroutine publishes it when a flush succeeds); entries completed
	// otherwise are marked done.
	doneSeq atomic.Uint64
	// issuedSeq: the seq of the last batch handed to UCX (tests: a batch
	// on the wire, as opposed to one refused at Close).
	issuedSeq atomic.Uint64

	// What follows is written by posters and the dispatcher on every
	// batch; the fields above, which the progress goroutine reads per
	// batch, stay on other cache lines.
	_         cpu.CacheLinePad
	mu        sync.Mutex
	keys      map[string]*remoteKey
	fifo      []*entry
	head      int
	posted    uint64 // seq of the last entry pushed
	free      []*entry
	state     uint8
	err       error // why left or failed
	closeReq  bool  // Close was called (by its owner or the agent)
	ucpClosed bool  // the progress goroutine closed the UCP endpoint
	gone      bool  // the dispatcher exited
	// unproven: the UCP endpoint was closed by force with writes on the
	// wire that may still land (the close timeout, an endpoint error:
	// ErrCloseUnproven); Close returns it.
	unproven error
	// cutSrcs: the source registrations of batches cut on the wire
	// (ErrCloseUnproven) whose Done ran before the forced close of the
	// UCP endpoint completed (ucpClosed): UCX may read them until then,
	// so each stays counted (busy) until the dispatcher sees ucpClosed.
	cutSrcs []*registration

	wake    chan struct{}
	stopped chan struct{}

	// The dispatcher writes this on every nap; the progress goroutine
	// reads the wake channel above on every round.
	_      cpu.CacheLinePad
	napper napper
}

var _ rdma.IdentifiedEndpoint = (*endpoint)(nil)

func newEndpoint(a *Agent, l *link, name string) *endpoint {
	e := &endpoint{
		a:       a,
		link:    l,
		name:    name,
		keys:    make(map[string]*remoteKey),
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
	go e.dispatch()
	return e
}

func (e *endpoint) String() string { return e.name }

// refusal says why a post must be refused now. Called with mu held.
func (e *endpoint) refusal() error {
	switch {
	case e.closeReq:
		return fmt.Errorf("%s: %w", e.name, rdma.ErrEndpointClosed)
	case e.state != epOpen:
		return fmt.Errorf("%s: %w", e.name, e.err)
	}
	return nil
}

// Post checks the batch (source registration, key, ranges), counts it
// against both regions and queues it for the progress goroutine.
func (e *endpoint) Post(b rdma.Batch) error {
	src, ok := b.Src.(*registration)
	if !ok || src == nil || src.a != e.a {
		return fmt.Errorf("%s: post: source %T: %w: not a registration of agent %s", e.name, b.Src, rdma.ErrUnregistered, e.a)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.refusal(); err != nil {
		return fmt.Errorf("post: %w", err)
	}
	k, err := e.resolve(b.Dst.Key)
	if err != nil {
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	if b.Dst.Len != k.len {
		return fmt.Errorf("%s: post: %w: remote region length %d, registration %d of %s is %d bytes",
			e.name, rdma.ErrBadKey, b.Dst.Len, k.reg, e.link.peer, k.len)
	}
	if err := copier.CheckSegments(b.Segments, src.region.Len, k.len); err != nil {
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	if !src.acquire() {
		return fmt.Errorf("%s: post: source registration %d: %w: deregistered", e.name, src.id, rdma.ErrUnregistered)
	}
	if err := e.link.acquire(k.reg); err != nil {
		src.release()
		return fmt.Errorf("%s: post: %w", e.name, err)
	}
	ent := e.newEntry()
	ent.batch, ent.src, ent.key = b, src, k
	e.push(ent)
	// What the progress goroutine needs to post the batch travels in the
	// request, which it reads in order, rather than in the entry, which
	// this goroutine has just written.
	if !e.a.w.submit(request{kind: reqPost, ep: e, ent: ent, seq: ent.seq, src: src, key: k, segs: b.Segments}) {
		// The agent's worker has stopped: it closed this endpoint, so
		// closeReq was set above. Not reached; undo all the same.
		e.fifo = e.fifo[:len(e.fifo)-1]
		e.posted--
		src.release()
		e.link.release(k.reg)
		return fmt.Errorf("%s: post: %w", e.name, rdma.ErrEndpointClosed)
	}
	return nil
}

// resolve returns the cached form of key, parsing and verifying it on
// first use. Called with mu held.
func (e *endpoint) resolve(key []byte) (*remoteKey, error) {
	if k := e.keys[string(key)]; k != nil {
		return k, nil
	}
	pk, err := parseKey(key)
	if err != nil {
		return nil, err
	}
	if pk.owner != e.link.peer {
		return nil, fmt.Errorf("%w: registration %d of agent %s, but this endpoint's peer is agent %s", rdma.ErrBadKey, pk.reg, pk.owner, e.link.peer)
	}
	if err := pk.verify(e.link.addr.spub); err != nil {
		return nil, err
	}
	// The packed rkey and the region around it are the owner's word: its
	// format and the bounds it carries are checked here, once per key, and
	// again with the segments it names just before UCX unpacks it
	// (worker.rkey).
	k := &remoteKey{reg: pk.reg, base: pk.base, len: pk.len, rkey: append([]byte(nil), pk.rkey...)}
	if k.parsed, err = checkPackedRkey(e.link.mds, k.rkey, k.base, k.len); err != nil {
		return nil, fmt.Errorf("registration %d of agent %s: %w", pk.reg, pk.owner, err)
	}
	if len(e.keys) >= maxCachedKeys {
		clear(e.keys)
	}
	e.keys[string(key)] = k
	return k, nil
}

// maxCachedKeys bounds an endpoint's key cache.
const maxCachedKeys = 4096

// Flush queues a marker behind every batch posted so far; the dispatcher
// calls done when it reaches it.
func (e *endpoint) Flush(done func(err error)) {
	e.mu.Lock()
	if e.gone {
		e.mu.Unlock()
		done(fmt.Errorf("%s: flush: %w", e.name, rdma.ErrEndpointClosed))
		return
	}
	ent := e.newEntry()
	ent.flush, ent.done = done, true
	e.push(ent)
	e.mu.Unlock()
	e.signal()
}

// PeerIdentity is whom the peer's agent serves, as its hello said
// (WithIdentity; sealed under the link key): rdma.IdentifiedEndpoint.
func (e *endpoint) PeerIdentity() string { return e.link.identity() }

// Close closes the UCP endpoint (after the writes already on the wire are
// acknowledged, or the close timeout) and returns once every callback has
// run. When the close timeout cut writes still on the wire, it returns an
// error wrapping rdma.ErrCloseUnproven (doc.go) and, beside it,
// rdma.ErrSourcesReleased: the dispatcher exits only once the forced
// close of the UCP endpoint has completed (ucpClosed, set where its
// completion is handled: closedUEP), which purged every request of the
// endpoint and released their buffers, and every callback has run, so
// UCX reads none of the cut writes' sources any more. Idempotent.
func (e *endpoint) Close() error {
	if e.requestClose() {
		e.a.w.submit(request{kind: reqCloseEndpoint, ep: e})
	}
	e.signal()
	<-e.stopped
	e.a.forget(e)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.unproven == nil || !e.ucpClosed {
		return e.unproven
	}
	return fmt.Errorf("%w: %w (the forced close completed)", e.unproven, rdma.ErrSourcesReleased)
}

// requestClose marks the endpoint closing; true the first time.
func (e *endpoint) requestClose() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closing.Store(true)
	first := !e.closeReq
	e.closeReq = true
	return first
}

func (e *endpoint) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Called with mu held.
func (e *endpoint) newEntry() *entry {
	if n := len(e.free); n > 0 {
		ent := e.free[n-1]
		e.free = e.free[:n-1]
		return ent
	}
	return &entry{ep: e}
}

// Called with mu held.
func (e *endpoint) push(ent *entry) {
	if e.head > 0 && e.head == len(e.fifo) {
		e.fifo, e.head = e.fifo[:0], 0
	} else if e.head > 1024 && e.head > len(e.fifo)/2 {
		n := copy(e.fifo, e.fifo[e.head:])
		clear(e.fifo[n:])
		e.fifo, e.head = e.fifo[:n], 0
	}
	e.posted++
	ent.seq = e.posted
	e.fifo = append(e.fifo, ent)
}

// dispatch runs callbacks in post order as entries complete, until the
// endpoint is closed and every callback has run. After running callbacks
// it yields once, so that the goroutines they woke run before it looks
// again, and keeps looking (yielding) for the dispatch spin, which catches
// the completion of a batch posted back at once without a wakeup. Then,
// while entries are outstanding, it naps (see napper) for up to the nap
// window since its last callback, and otherwise blocks until the progress
// goroutine signals. A nap ends early when the progress goroutine runs out
// of work, so a lone batch's completion waits for no timer.
func (e *endpoint) dispatch() {
	defer close(e.stopped)
	var run []*entry
	last := time.Now()
	yielded := true
	signalled := func() bool { return len(e.wake) > 0 }
	for {
		// What dispatchReady reads below includes every completion
		// signalled before this receive.
		select {
		case <-e.wake:
		default:
		}
		n, outstanding, exit := e.dispatchReady(&run)
		switch {
		case exit:
			return
		case n > 0:
			last, yielded = time.Now(), false
		case !yielded:
			yielded = true
			runtime.Gosched()
		case time.Since(last) < dispatchSpin:
			runtime.Gosched()
		case outstanding && time.Since(last) < napWindow:
			if cpu := currentCPU(); cpu >= 0 && cpu == e.a.w.progressCPU() {
				moveOff(cpu)
			}
			e.napper.nap(napFor, signalled)
		default:
			<-e.wake
			last = time.Now()
		}
	}
}

// A dispatcher's waits: it spins dispatchSpin after its last callback,
// then naps napFor at a time while batches are outstanding until napWindow
// after it, then blocks. A nap lasts napFor plus the kernel's timer slack
// (50µs by default), so a 50µs window is about one nap: a stream whose
// completions come at least that often (shared memory: every round, tens
// of µs) keeps napping; a sparser one (tcp: a flush group every few ms)
// blocks, which wakes less.
const (
	dispatchSpin = 10 * time.Microsecond
	napFor       = 20 * time.Microsecond
	napWindow    = 50 * time.Microsecond
)

// dispatchReady runs the callbacks of the completed entries at the head of
// the order; outstanding says entries remain that have not completed; exit
// once the endpoint is closed and drained.
func (e *endpoint) dispatchReady(run *[]*entry) (n int, outstanding, exit bool) {
	e.mu.Lock()
	ucpClosed := e.ucpClosed
	if ucpClosed && len(e.cutSrcs) > 0 {
		releaseAll(e.cutSrcs)
		e.cutSrcs = nil
	}
	r := (*run)[:0]
	done := e.doneSeq.Load()
	flushes := false
	for e.head < len(e.fifo) && (e.fifo[e.head].done || e.fifo[e.head].seq <= done) {
		flushes = flushes || e.fifo[e.head].flush != nil
		r = append(r, e.fifo[e.head])
		e.fifo[e.head] = nil
		e.head++
	}
	var flushErr error
	if flushes { // only then: it takes the link's lock
		flushErr = e.flushErr()
	}
	outstanding = e.head < len(e.fifo)
	if len(r) == 0 && e.closeReq && e.ucpClosed && !outstanding {
		e.gone = true
		e.mu.Unlock()
		return 0, false, true
	}
	e.mu.Unlock()
	*run = r
	if len(r) == 0 {
		return 0, outstanding, false
	}
	for _, ent := range r {
		if ent.flush != nil {
			ent.flush(flushErr)
			continue
		}
		// Uncount the batch just before its Done: until then a
		// Deregister of either region is refused. A batch whose writes
		// were cut on the wire (rdma.ErrCloseUnproven) may still land
		// in the peer's region: it stays counted there, so that the
		// peer's revoke is answered busy and its Deregister refuses
		// rather than unmap memory this agent may still write. Its
		// source stays counted until the forced close of the UCP
		// endpoint has completed, which purges its requests: until
		// then UCX may still read it (cutSrcs).
		cut := errors.Is(ent.err, rdma.ErrCloseUnproven)
		if !cut {
			e.link.release(ent.key.reg)
		}
		if !cut || ucpClosed {
			ent.src.release()
		}
		if ent.batch.Done != nil {
			ent.batch.Done(ent.err)
		}
	}
	e.mu.Lock()
	if !ucpClosed {
		for _, ent := range r {
			if ent.flush == nil && errors.Is(ent.err, rdma.ErrCloseUnproven) {
				e.cutSrcs = append(e.cutSrcs, ent.src)
			}
		}
		if e.ucpClosed && len(e.cutSrcs) > 0 { // closed meanwhile
			releaseAll(e.cutSrcs)
			e.cutSrcs = nil
		}
	}
	for i, ent := range r {
		*ent = entry{ep: e}
		e.free = append(e.free, ent)
		r[i] = nil
	}
	e.mu.Unlock()
	return len(r), outstanding, false
}

// releaseAll uncounts a batch from each of regs.
func releaseAll(regs []*registration) {
	for _, r := range regs {
		r.release()
	}
}

// flushErr is what a Flush reaching the head of the order reports. Called
// with mu held.
func (e *endpoint) flushErr() error {
	switch {
	case e.closeReq:
		return fmt.Errorf("%s: flush: %w", e.name, rdma.ErrEndpointClosed)
	case e.state == epFailed:
		return fmt.Errorf("%s: flush: %w", e.name, e.err)
	}
	// failLink marks the link failed before each of its endpoints: in
	// between, Post already refuses (link.acquire), and a Flush must not
	// say all is well.
	if err := e.link.failure(); err != nil {
		return fmt.Errorf("%s: flush: %w", e.name, err)
	}
	return nil
}

// setState moves an open endpoint to left or failed.
func (e *endpoint) setState(s uint8, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == epOpen {
		e.state, e.err = s, err
	}
}
