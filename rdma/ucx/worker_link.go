//go:build cgo && linux && !kvxfer_noucx

package ucx

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// ---- Links: hello, welcome, bye ----

func (w *worker) connect(c *call) {
	if w.shutdown != nil {
		c.reply(fmt.Errorf("%s: connect: %w", w.a, rdma.ErrAgentClosed))
		return
	}
	l := w.links[c.addr.id]
	if l != nil && l.unanswered && len(l.eps) == 0 {
		// Its hello went unanswered (the peer was not up yet, or did not
		// admit this agent then): a new link says hello again, rather
		// than fail every later Connect with the old error.
		delete(w.links, l.peer)
		l = nil
	}
	if l == nil {
		var err error
		if l, err = w.newLink(c.addr); err != nil {
			c.reply(fmt.Errorf("%s: connect: %w", w.a, err))
			return
		}
		l.deadline = time.Now().Add(w.a.opts.handshake)
		w.send(l, w.hello(msgHello, 0))
		w.dirty = true
	}
	switch l.getState() {
	case linkUp:
		w.openEndpoint(l, c)
	case linkConnecting:
		l.waiters = append(l.waiters, c)
	default:
		c.reply(fmt.Errorf("%s: connect to agent %s: %w", w.a, l.peer, l.errOr()))
	}
}

// newLink creates the link to a peer agent and its control endpoint.
func (w *worker) newLink(pa address) (*link, error) {
	if pa.id != w.a.id {
		if wa, err := validateWorkerAddress(pa.worker); err == nil {
			if why := aliasOf(w.own, wa); why != "" {
				return nil, fmt.Errorf("%w: agent %s: %s (a peer's address may not name this worker)", rdma.ErrBadAddress, pa.id, why)
			}
		}
	}
	l := newLink(pa, fmt.Sprintf("%s → agent %s", w.a, pa.id))
	key, err := linkKey(w.a.priv, pa.pub)
	if err != nil {
		return nil, fmt.Errorf("%w: agent %s: %w", rdma.ErrBadAddress, pa.id, err)
	}
	l.key = key
	u, err := w.createEP(l, l.name+" (control)")
	if err != nil {
		return nil, err
	}
	l.u = u
	w.links[pa.id] = l
	return l, nil
}

func (w *worker) openEndpoint(l *link, c *call) {
	name := fmt.Sprintf("ucx endpoint %d of %s", w.nextID+1, l.name)
	u, err := w.createEP(l, name)
	if err != nil {
		c.reply(err)
		return
	}
	e := newEndpoint(w.a, l, name)
	u.ep, e.u = e, u
	l.eps[u] = struct{}{}
	w.a.adopt(e)
	c.ep = e
	c.reply(nil)
}

// hello is this agent's hello or welcome: its secret, address and live
// registrations.
func (w *worker) hello(kind msgKind, req uint64) *message {
	m := &message{kind: kind, req: req, from: w.a.id, addr: w.a.addr, ident: []byte(w.a.opts.identity), nextReg: w.nextReg + 1}
	for id, r := range w.regs {
		if r.state.Load() == regLive {
			m.live = append(m.live, id)
		}
	}
	return m
}

// send sends a control message on the link's control endpoint.
func (w *worker) send(l *link, m *message) bool {
	return w.sendSealed(l, m.kind, seal(&l.key, m.encode()))
}

// sendSealed sends a sealed control message of kind k on the link's
// control endpoint.
func (w *worker) sendSealed(l *link, k msgKind, b []byte) bool {
	u := l.u
	if u == nil || u.closing || u.closed {
		return false
	}
	if st := C.kvx_am_send(u.h, unsafe.Pointer(&b[0]), C.size_t(len(b))); st != ucsOK && st != C.UCS_INPROGRESS {
		w.failLink(l, fmt.Errorf("%s: %w: sending %s: %s", l.name, rdma.ErrPeerGone, k, statusText(st)))
		return false
	}
	return true
}

// onMessage handles a control message from a peer agent. Nothing in it
// is acted on before its MAC proves that the agent it names sent it
// (linkkey.go); anything else is dropped (and counted).
func (w *worker) onMessage(b []byte) {
	body, mac, ok := unseal(b)
	if !ok {
		w.dropped++
		return
	}
	m, err := decodeMessage(body)
	if err != nil {
		w.dropped++
		return
	}
	l := w.links[m.from]
	if m.kind == msgHello {
		w.onHello(m, l, body, mac)
		return
	}
	if l == nil || !sealedBy(&l.key, body, mac) {
		w.dropped++
		return
	}
	l.silent = "" // it speaks again
	switch m.kind {
	case msgWelcome:
		w.linkUp(l, m)
	case msgRevoke:
		ok := l.revoke(m.reg)
		if ok {
			for u := range l.eps {
				if ur, found := u.rkeys[m.reg]; found {
					C.kvx_rkey_destroy(ur.h)
					delete(u.rkeys, m.reg)
				}
			}
		}
		w.send(l, &message{kind: msgReply, req: m.req, from: w.a.id, ok: ok})
	case msgRestore:
		l.restore(m.reg)
		w.send(l, &message{kind: msgReply, req: m.req, from: w.a.id, ok: true})
	case msgReply:
		w.onReply(l, m)
	case msgBye:
		w.onBye(l, m)
	case msgByeAck:
		if m.req != 0 && l.byeReq == m.req {
			l.byeReq, l.byeAcked = 0, true
			w.dirty = true
		}
	}
}

// onHello takes a peer's hello: its address names its public key (and
// so its id), under which, with this agent's private key, the hello must
// be sealed.
func (w *worker) onHello(m *message, l *link, body, mac []byte) {
	if w.shutdown != nil {
		return // the peer's Connect times out: this agent is going away
	}
	pa, err := parseAddress(m.addr)
	if err != nil || pa.id != m.from {
		w.dropped++
		return
	}
	if l == nil && w.a.opts.admit != nil && !w.a.opts.admit(m.addr) {
		// Nobody vouched for it (WithAdmission): dropped before the
		// X25519 of its MAC's key is paid for.
		w.dropped++
		w.unadmitted++
		return
	}
	key := l.keyOr(w.a.priv, pa.pub)
	if key == nil || !sealedBy(key, body, mac) {
		w.dropped++
		return
	}
	if l == nil {
		if l, err = w.newLink(pa); err != nil {
			return
		}
	}
	if st := l.getState(); st == linkLeft || st == linkFailed {
		return
	}
	w.send(l, w.hello(msgWelcome, m.req))
	w.linkUp(l, m)
}

// linkUp takes the peer's hello or welcome and opens the endpoints that
// waited for it.
func (w *worker) linkUp(l *link, m *message) {
	l.learn(m)
	if l.getState() != linkUp {
		return
	}
	for _, c := range l.waiters {
		w.openEndpoint(l, c)
	}
	l.waiters = nil
	w.dirty = true
}

// onBye: the peer is closing. Close the endpoints to it (after their
// writes are acknowledged), then acknowledge (stepLinks) — unless one of
// them had writes cut on the wire (link.cut): then no acknowledgement,
// which would claim they are over. The peer says bye only once it has
// closed every endpoint of its to this agent, and none with writes cut
// on the wire without proof (stepShutdown): its writes into this agent
// are over. That holds as well when the bye comes after the link failed
// without proof (an error on this agent's control endpoint, or a hello
// that went unanswered, while the peer ran on and kept its own
// endpoints): the bye, sealed under the link's key, is the proof the
// failure lacked. (A peer of an earlier version says bye after a cut as
// well; nothing here tells the two apart: docs/membership.md §4.)
func (w *worker) onBye(l *link, m *message) {
	err := fmt.Errorf("%w: agent %s closed", rdma.ErrPeerGone, l.peer)
	if l.setState(linkLeft, err) {
		for _, c := range l.waiters {
			c.reply(fmt.Errorf("%s: connect: %w", w.a, err))
		}
		l.waiters = nil
		for u := range l.eps {
			u.ep.setState(epLeft, err)
			w.startClose(u, fmt.Errorf("%s: %w", u.name, err), true)
		}
		w.peerGone(l)
	} else if l.unproven != "" {
		l.unproven = ""
	}
	l.ackTo, l.ackDue = m.req, true
	w.dirty = true
}

// failLink: the peer is unreachable (its control endpoint failed, it
// never answered, or its process exited: peerExited). Its endpoints are
// forced closed and no new work goes to it. None of the first two is
// proof that the peer writes no more into this agent's memory: an
// unanswered hello is a timeout (the peer, stopped or slow, may take it
// later, bring its side up and write once it runs), and an error UCX
// reports on the control endpoint (onError, sendSealed) concerns that
// one endpoint of this agent (a keepalive or retry timeout, or a reset a
// live peer causes by closing its end), while the peer writes on
// endpoints of its own that closing this agent's does not close
// (docs/membership.md §4, "ucx: what the agent's own link to a peer
// proves"). So the link is marked unproven, unless the peer acknowledged
// this agent's bye first: deregistrations waiting for it, and later
// ones, fail busy (the registration stays mapped), and Close keeps the
// memory and returns ErrCloseUnproven naming the peer — until the peer's
// exit is proven (peerExited), which releases the memory this agent
// allocated. This agent's own batches on the wire to the peer, cut by
// the forced close, may land as well: they fail with ErrCloseUnproven
// beside err, and their endpoint's Close returns it.
func (w *worker) failLink(l *link, err error) {
	if l.setState(linkFailed, err) && l.unproven == "" && l.exited == "" && !l.byeAcked {
		l.unproven = err.Error()
	}
	// This agent's own writes on the wire to the peer are cut unless the
	// peer's exit is proven: its bye, drained goodbye or acknowledgement
	// (what clears or spares l.unproven) prove only its writes into this
	// agent over, never this agent's into it.
	cut := l.exited == ""
	for _, c := range l.waiters {
		c.reply(fmt.Errorf("%s: connect: %w", w.a, err))
	}
	l.waiters = nil
	for u := range l.eps {
		u.ep.setState(epFailed, err)
		w.startClose(u, fmt.Errorf("%s: %w", u.name, err), false)
		// (An endpoint UCX reported failed itself was cut by dataFailed.)
		if cut && !u.closed && u.failed == nil && (len(u.pend) > 0 || len(u.group) > 0) {
			u.unproven = true
			u.reason = fmt.Errorf("%s: %w: %w (its link failed without proof that they no longer land)", u.name, err, rdma.ErrCloseUnproven)
		}
	}
	w.startClose(l.u, err, false)
	l.byeReq, l.ackDue = 0, false
	w.peerGone(l)
	w.dirty = true
}

// provenLink is the link a proof (what: "peer exited") is about: the one
// to the agent c names, which must serve the proof's identity as its
// sealed hello said (a link whose hello went unanswered learnt none). nil
// when there is none, c answered: no link is nothing to release, another
// identity is refused.
func (w *worker) provenLink(c *call, what string) *link {
	l := w.links[c.addr.id]
	if l == nil {
		c.reply(nil) // no link: no key of it, nothing it kept mapped
		return nil
	}
	if ident := l.identity(); c.ident == "" || ident != c.ident {
		c.reply(fmt.Errorf("%s: %s: %w: agent %s serves %q, the proof is for %q: nothing released", w.a, what, rdma.ErrBadAddress, l.peer, ident, c.ident))
		return nil
	}
	return l
}

// peerExited takes the proof that the process of a peer agent exited
// (Agent.PeerExited): for the memory this agent allocated (Alloc) its
// writes are over, as a peer of this host writes into it with copies of
// its own threads; memory registered with ucp_mem_map, into which UCX
// carries its puts as active messages that this worker applies as it
// progresses, stays unproven. A link still up fails (no answer can come
// from it); one that failed unproven releases what the proof covers. The
// link must be the one to the agent that serves the proof's identity, as
// its sealed hello said (a link whose hello went unanswered learnt none:
// refused).
func (w *worker) peerExited(c *call) {
	l := w.provenLink(c, "peer exited")
	if l == nil {
		return
	}
	switch st := l.getState(); {
	case st == linkLeft || l.exited != "":
	case st == linkFailed && l.unproven == "":
	case st == linkFailed:
		l.exited = c.how
		l.unproven += fmt.Sprintf("; its process exited since (%s), which is no proof for memory registered with ucp_mem_map: what it queued there is applied by this agent's worker", c.how)
	default:
		l.exited = c.how
		l.unproven = fmt.Sprintf("its process exited (%s) with its link up, which is no proof for memory registered with ucp_mem_map: what it queued there is applied by this agent's worker", c.how)
		w.failLink(l, fmt.Errorf("%w: agent %s's process exited (%s)", rdma.ErrPeerGone, l.peer, c.how))
	}
	c.reply(nil)
}

// peerDrained takes the peer's statement, made after its engine read
// its last frame, that every write it started is over (Agent.PeerDrained:
// its drained goodbye). As the peer's bye, it is proof for all of this
// agent's memory, allocated or registered: what a failure of the link
// left unproven is released, and a failure that comes later leaves
// nothing unproven (link.drained). A link still up stays up (the peer's
// agent may still say its bye); this agent's own writes into the peer
// are not covered (link.cut and the endpoints' unproven closes stay).
// The link must be the one to the agent that serves the proof's
// identity, as for peerExited.
func (w *worker) peerDrained(c *call) {
	l := w.provenLink(c, "peer drained")
	if l == nil {
		return
	}
	if l.drained == "" {
		l.drained = c.how
		w.dirty = true
	}
	c.reply(nil)
}

// stepLinks acknowledges byes whose endpoints have closed and counts the
// links with a deadline. A bye is not acknowledged when an endpoint of
// this agent to that peer had writes cut on the wire without proof
// (link.cut): the acknowledgement is the peer's proof that this agent's
// writes into its memory are over, and those may land after it. The
// peer's Close then waits its revoke timeout and keeps its memory
// (rdma.ErrCloseUnproven), the designed quarantine; no message says
// why, so that a peer of an earlier version reads nothing new.
func (w *worker) stepLinks() {
	w.linkTimers = 0
	for _, l := range w.links {
		if l.ackDue && len(l.eps) == 0 {
			l.ackDue = false
			if l.cut == "" {
				w.send(l, &message{kind: msgByeAck, req: l.ackTo, from: w.a.id})
			}
			if w.shutdown == nil {
				w.closeLink(l)
			}
		}
		if (l.u != nil && l.getState() == linkConnecting) || l.byeReq != 0 {
			w.linkTimers++
		}
	}
}

// closeLink closes the control endpoint once what was sent on it is
// delivered.
func (w *worker) closeLink(l *link) {
	u := l.u
	if u == nil || u.closing || u.closed {
		return
	}
	w.flush(u)
	w.settle(u)
	w.startClose(u, fmt.Errorf("%s: %w", l.name, rdma.ErrEndpointClosed), true)
}

func (l *link) errOr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	return rdma.ErrPeerGone
}

// ---- Registrations ----

func (w *worker) register(c *call) {
	if w.shutdown != nil {
		c.reply(fmt.Errorf("%s: register: %w", w.a, rdma.ErrAgentClosed))
		return
	}
	r := c.region
	reg := &registration{a: w.a, region: r, source: c.source}
	if al := w.allocs[r.Base]; al != nil && r.Kind == kvcache.HostMem && al.len == r.Len {
		if al.reg != nil {
			c.reply(fmt.Errorf("%s: register region at %#x: %w: already registered (registration %d)", w.a, r.Base, rdma.ErrRegionBusy, al.reg.id))
			return
		}
		reg.memh, reg.alloc = al.memh, al
	} else {
		mt := C.int(0) // UCS_MEMORY_TYPE_HOST
		if r.Kind == kvcache.DeviceMem {
			mt = memTypeCUDA
		}
		if st := C.kvx_mem_map(w.c, C.uint64_t(r.Base), C.uint64_t(r.Len), mt, &reg.memh); st != ucsOK {
			c.reply(fmt.Errorf("%s: register %s region at %#x (%d bytes): %w: ucp_mem_map: %s", w.a, r.Kind, r.Base, r.Len, kvcache.ErrBadRegion, statusText(st)))
			return
		}
	}
	w.nextReg++
	reg.id = w.nextReg
	if reg.source {
		reg.remote = rdma.RemoteRegion{Len: r.Len}
		w.adoptReg(reg)
		c.reg = reg
		c.reply(nil)
		return
	}
	var buf unsafe.Pointer
	var n C.size_t
	if st := C.kvx_rkey_pack(w.c, reg.memh, &buf, &n); st != ucsOK {
		if reg.alloc == nil {
			C.kvx_mem_unmap(w.c, reg.memh)
		}
		c.reply(fmt.Errorf("%s: register %s region at %#x (%d bytes): ucp_rkey_pack: %s", w.a, r.Kind, r.Base, r.Len, statusText(st)))
		return
	}
	rkey := C.GoBytes(buf, C.int(n))
	C.kvx_rkey_buffer_release(buf)
	k := regionKey{owner: w.a.id, reg: reg.id, base: uint64(r.Base), len: r.Len, rkey: rkey}
	reg.remote = rdma.RemoteRegion{Key: k.encode(w.a.sign), Len: r.Len}
	w.adoptReg(reg)
	c.reg = reg
	c.reply(nil)
}

// adoptReg records a new registration (and ties its allocation to it).
func (w *worker) adoptReg(reg *registration) {
	if reg.alloc != nil {
		reg.alloc.reg = reg
	}
	w.regs[reg.id] = reg
}

// unmap releases a registration's UCX mapping (an allocation's memory
// stays until it is freed).
func (w *worker) unmap(r *registration) {
	r.state.Store(regDead)
	if r.alloc != nil {
		r.alloc.reg = nil
	} else {
		C.kvx_mem_unmap(w.c, r.memh)
	}
	delete(w.regs, r.id)
}

// alloc allocates host memory with UCP_MEM_MAP_ALLOCATE.
func (w *worker) alloc(c *call) {
	if w.shutdown != nil {
		c.reply(fmt.Errorf("%s: alloc: %w", w.a, rdma.ErrAgentClosed))
		return
	}
	al := &allocation{len: c.size}
	var p unsafe.Pointer
	if st := C.kvx_mem_alloc(w.c, C.uint64_t(c.size), &al.memh, &p); st != ucsOK {
		c.reply(fmt.Errorf("%s: alloc %d bytes: ucp_mem_map(UCP_MEM_MAP_ALLOCATE): %s", w.a, c.size, statusText(st)))
		return
	}
	r, err := kvcache.ExternalHostRegion(p, c.size)
	if err != nil {
		C.kvx_mem_unmap(w.c, al.memh)
		c.reply(err)
		return
	}
	al.base = r.Base
	w.allocs[al.base] = al
	c.region = r
	c.reply(nil)
}

// free releases an allocation that no registration uses.
func (w *worker) free(c *call) {
	al := w.allocs[c.region.Base]
	switch {
	case al == nil:
		c.reply(nil) // freed already, or by the agent's Close
	case al.reg != nil:
		c.reply(fmt.Errorf("%s: free region at %#x: %w: registration %d uses it (deregister it first)", w.a, al.base, rdma.ErrRegionBusy, al.reg.id))
	default:
		C.kvx_mem_unmap(w.c, al.memh)
		delete(w.allocs, al.base)
		c.reply(nil)
	}
}

// deregister revokes the registration at every peer (each refuses while
// batches of its are in flight into it), then unmaps it.
func (w *worker) deregister(c *call) {
	r := c.reg
	switch {
	case w.regs[r.id] != r:
		c.reply(fmt.Errorf("%s: deregister registration %d: %w: already deregistered", w.a, r.id, rdma.ErrUnregistered))
		return
	case r.state.Load() == regRevoking:
		c.reply(fmt.Errorf("%s: deregister registration %d: %w: a deregistration is in progress", w.a, r.id, rdma.ErrRegionBusy))
		return
	case !r.tryRevoke():
		c.reply(fmt.Errorf("%s: deregister registration %d: %w: %d batches of this agent read it", w.a, r.id, rdma.ErrRegionBusy, r.busy.Load()))
		return
	}
	op := &deregOp{reg: r, c: c, waiting: make(map[*link]uint64)}
	op.deadline, op.within = w.answerBy(c)
	w.deregs = append(w.deregs, op)
	if !r.source { // no peer holds a source registration's key
		w.ask(op, msgRevoke)
	}
	w.advanceDereg(op, false)
}

// answerBy is when the peers must have answered a revoke or restore of
// c's deregistration, and that wait named for errors: the agent's revoke
// timeout from now, or c's own bound when earlier.
func (w *worker) answerBy(c *call) (time.Time, string) {
	d := time.Now().Add(w.a.opts.revoke)
	if !c.by.IsZero() && c.by.Before(d) {
		return c.by, "the caller's deadline"
	}
	return d, w.a.opts.revoke.String()
}

// ask sends a revoke or restore to every peer that may hold the key. A
// silent peer (link.silent) gets it too, but is not waited for: a revoke
// it has not answered makes the deregistration busy at once, which is
// what its timeout would decide (the registration stays mapped); a
// restore is for its use once it runs again. A peer whose link failed
// unproven (failLink) cannot be asked and may still write: a revoke is
// busy at once.
func (w *worker) ask(op *deregOp, kind msgKind) {
	for _, l := range w.links {
		if st := l.getState(); st != linkUp && st != linkConnecting {
			w.unprovenBusy(op, kind, l)
			continue
		}
		req := w.newID()
		if !w.send(l, &message{kind: kind, req: req, from: w.a.id, reg: op.reg.id}) {
			w.unprovenBusy(op, kind, l) // the link failed as it was sent
			continue
		}
		if l.silent != "" {
			if kind == msgRevoke && op.busy == "" {
				op.busy = fmt.Sprintf("agent %s is silent (%s), so it was not asked to wait for", l.peer, l.silent)
			}
			continue
		}
		op.waiting[l] = req
		w.replies[req] = op
	}
}

// unprovenBusy makes a revoke's deregistration busy when l failed
// without proof that the peer's writes are over.
func (w *worker) unprovenBusy(op *deregOp, kind msgKind, l *link) {
	if why := l.unprovenFor(op.reg); kind == msgRevoke && op.busy == "" && why != "" {
		op.busy = fmt.Sprintf("agent %s may still write into it: its link failed without proof that its writes are over (%s)", l.peer, why)
	}
}

func (w *worker) onReply(l *link, m *message) {
	op := w.replies[m.req]
	if op == nil || op.waiting[l] != m.req {
		return
	}
	delete(w.replies, m.req)
	delete(op.waiting, l)
	if !m.ok && !op.restore && op.busy == "" {
		op.busy = fmt.Sprintf("agent %s has batches in flight into it", l.peer)
	}
	w.advanceDereg(op, false)
}

// peerGone: a peer that left or failed answers nothing. One that left
// (its bye) writes no more; one whose link failed unproven may still
// write: a revoke waiting for it is busy.
func (w *worker) peerGone(l *link) {
	for _, op := range append([]*deregOp(nil), w.deregs...) {
		if req, ok := op.waiting[l]; ok {
			delete(op.waiting, l)
			delete(w.replies, req)
			if !op.restore {
				w.unprovenBusy(op, msgRevoke, l)
			}
			w.advanceDereg(op, false)
		}
	}
}

func (w *worker) advanceDereg(op *deregOp, timedOut bool) {
	if len(op.waiting) > 0 {
		if !timedOut {
			return
		}
		for l, req := range op.waiting {
			delete(w.replies, req)
			if op.busy == "" {
				op.busy = fmt.Sprintf("agent %s did not answer within %v", l.peer, op.within)
			}
			l.silent = fmt.Sprintf("it did not answer registration %d's revoke or restore within %v", op.reg.id, op.within)
		}
		clear(op.waiting)
	}
	r := op.reg
	if !op.restore {
		if op.busy == "" {
			w.unmap(r)
			w.endDereg(op, nil)
			return
		}
		r.state.Store(regLive)
		op.restore = true
		op.deadline, op.within = w.answerBy(op.c)
		w.ask(op, msgRestore)
		if len(op.waiting) > 0 {
			return
		}
	}
	w.endDereg(op, fmt.Errorf("%s: deregister registration %d: %w: %s", w.a, r.id, rdma.ErrRegionBusy, op.busy))
}

func (w *worker) endDereg(op *deregOp, err error) {
	for i, o := range w.deregs {
		if o == op {
			w.deregs = append(w.deregs[:i], w.deregs[i+1:]...)
			break
		}
	}
	op.c.reply(err)
}

// ---- Shutdown ----

// beginShutdown starts Agent.Close: close every endpoint, then say bye to
// every peer and wait for the acknowledgements, then close the control
// endpoints, then tear down (stepShutdown). A peer into which an
// endpoint of this agent had writes cut on the wire without proof
// (link.cut) is told no bye: the bye says this agent's writes into the
// peer are over, and the cut ones may be applied by the peer's worker
// after it (they travel on another connection than the bye's, over tcp
// and UCX's software RMA, with nothing to order the two).
func (w *worker) beginShutdown(c *call) {
	w.shutdown = c
	for _, l := range w.links {
		for _, wc := range l.waiters {
			wc.reply(fmt.Errorf("%s: connect: %w", w.a, rdma.ErrAgentClosed))
		}
		l.waiters = nil
	}
	for _, op := range w.deregs {
		for _, req := range op.waiting {
			delete(w.replies, req)
		}
		if op.restore {
			op.reg.state.Store(regLive)
		}
		op.c.reply(fmt.Errorf("%s: deregister registration %d: %w", w.a, op.reg.id, rdma.ErrAgentClosed))
	}
	w.deregs = nil
	for _, u := range w.ueps {
		if e := u.ep; e != nil {
			e.requestClose()
			w.startClose(u, fmt.Errorf("%s: %w", e.name, rdma.ErrEndpointClosed), true)
		}
	}
	w.shutPhase = 1
	w.dirty = true
}

func (w *worker) stepShutdown() {
	if w.shutPhase == 1 {
		for _, u := range w.ueps {
			if u.ep != nil {
				return
			}
		}
		for _, l := range w.links {
			if l.getState() != linkUp {
				continue
			}
			if l.cut != "" {
				// No bye, which the peer would take as proof: it holds
				// its memory in doubt (its link fails unproven, or its
				// revoke goes unanswered) until this agent's exit is
				// proven (Agent.PeerExited). Its own writes into this
				// agent are not proven over either (teardown).
				continue
			}
			// A silent peer is told too, but not waited for: its
			// acknowledgement's timeout ends the same way, later.
			req := w.newID()
			if !w.send(l, &message{kind: msgBye, req: req, from: w.a.id}) {
				continue // the link failed as it was sent
			}
			if l.silent != "" {
				// Not waited for. A drained goodbye already proved
				// its writes over (PeerDrained): nothing unacked.
				if l.drained == "" {
					w.unacked = append(w.unacked, fmt.Sprintf("agent %s is silent (%s), so its acknowledgement was not waited for", l.peer, l.silent))
				}
				continue
			}
			l.byeReq, l.byeBy = req, time.Now().Add(w.a.opts.revoke)
		}
		w.shutPhase = 2
		w.stepLinks()
	}
	if w.shutPhase == 2 {
		for _, l := range w.links {
			if l.byeReq != 0 || (l.ackDue && l.u != nil && !l.u.closing) {
				return
			}
		}
		for _, l := range w.links {
			w.closeLink(l)
		}
		w.shutPhase = 3
		w.advanceCloses()
	}
	if w.shutPhase == 3 && len(w.ueps) == 0 {
		w.done = true
	}
}

// unprovenOf says why the peer of l may still write into a registration
// of this agent since its link failed ("" if into none).
func (w *worker) unprovenOf(l *link) string {
	if l.drained != "" {
		return ""
	}
	if l.exited == "" {
		return l.unproven
	}
	for _, r := range w.regs {
		if why := l.unprovenFor(r); why != "" {
			return why
		}
	}
	return ""
}

// teardown unmaps every registration and destroys the worker and context
// — but for an agent told to keep its memory (Agent.KeepMemory): its
// allocations stay mapped and its context alive, for good.
func (w *worker) teardown() {
	// A peer whose link failed (failLink) or never came up (its hello
	// unanswered) proves nothing either: it may have taken the hello. Its
	// proven exit (peerExited) covers the memory this agent allocated,
	// not registered memory still mapped.
	// A peer holds the key of no source registration (RegisterSource):
	// with nothing else registered or allocated (an allocation counts,
	// unless registered as a source: it may have been registered
	// before), no peer can write into this agent's memory, whatever
	// became of its link.
	writable := false
	for _, r := range w.regs {
		writable = writable || !r.source
	}
	for _, al := range w.allocs {
		writable = writable || al.reg == nil || !al.reg.source
	}
	if !writable {
		// A bye not acknowledged in time (checkTimers), or a silent
		// peer's not waited for (stepShutdown), leaves nothing in doubt
		// either: no peer can have written into this agent's memory.
		w.unacked = nil
	}
	for _, l := range w.links {
		if !writable {
			break
		}
		switch why := w.unprovenOf(l); {
		case why != "":
			w.unacked = append(w.unacked, fmt.Sprintf("agent %s's link failed without proof that its writes into this agent are over (%s)", l.peer, why))
		case l.getState() == linkConnecting:
			w.unacked = append(w.unacked, fmt.Sprintf("agent %s never answered this agent's hello, which it may have taken", l.peer))
		case l.cut != "" && l.getState() == linkUp:
			// Told no bye (stepShutdown), it acknowledged none, and
			// said none of its own.
			w.unacked = append(w.unacked, fmt.Sprintf("agent %s was told no bye, and so acknowledged none, since this agent's writes into it were cut on the wire without proof that they no longer land (%s)", l.peer, l.cut))
		}
	}
	// A peer that never acknowledged the bye may still write into this
	// agent's memory (a peer of this host writes by address over cma):
	// its allocations stay mapped, as KeepMemory keeps them.
	keep := w.a.keep.Load() || len(w.unacked) > 0
	for _, r := range w.regs {
		w.unmap(r)
	}
	for base, al := range w.allocs {
		if !keep {
			C.kvx_mem_unmap(w.c, al.memh)
		}
		delete(w.allocs, base)
	}
	w.mu.Lock()
	w.exited = true
	late := w.reqs
	w.reqs = nil
	w.mu.Unlock()
	for _, r := range late {
		switch r.kind {
		case reqConnect, reqRegister, reqAlloc, reqPeerExited, reqPeerDrained:
			r.call.reply(fmt.Errorf("%s: %w", w.a, rdma.ErrAgentClosed))
		case reqFree:
			r.call.reply(nil)
		case reqPost: // not reached: every endpoint closed before the loop ended
			w.finish(r.ent, fmt.Errorf("%s: %w", r.ep.name, rdma.ErrEndpointClosed))
			r.ep.signal()
		case reqDeregister:
			r.call.reply(fmt.Errorf("%s: deregister: %w: the agent closed", w.a, rdma.ErrUnregistered))
		}
	}
	if keep {
		C.kvx_close_worker_keep_ctx(w.c)
	} else {
		C.kvx_close_worker(w.c)
	}
	w.c = nil
	var err error
	if len(w.unacked) > 0 {
		err = fmt.Errorf("%s: close: %w: %s; the memory this agent allocated stays mapped for the rest of the process, and registered memory must not be reused either",
			w.a, rdma.ErrCloseUnproven, strings.Join(w.unacked, "; "))
	}
	w.shutdown.reply(err)
}
