package zmq

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/internal/hoptrace"
	"github.com/kvxfer/kvxfer/messages"
)

// maxBatch bounds the messages the listener reads per poll, so the ZAP
// handler and Close are served under load.
const maxBatch = 256

// listener is the state of the listener goroutine, which alone touches
// router; zap belongs to the ZAP goroutine it starts.
type listener struct {
	l      *Link
	router *zmq4.Socket
	zap    *zmq4.Socket // nil when insecure
	// mon is the PAIR connected to the ROUTER's socket monitor
	// (listenerWatchedEvents), nil when it could not be set up.
	mon     *zmq4.Socket
	secure  bool // CURVE: zap != nil
	deliver func(messages.Frame)
	self    messages.PeerID
	// selfInc is the incarnation of this listener's Hello (0: none):
	// misaddressed tells a RequestData addressed to an earlier one.
	selfInc uint64
	conns   map[string]*binding // by ROUTER routing id
	// owned is conns by identity (connOwner), for maxConnsPerIdentity:
	// bind and unbind keep the two in step. Made on first use.
	owned map[connOwner]map[string]*binding
	live  *liveness
	// told is when OnPeerAlive was last called for each peer.
	told map[messages.PeerID]time.Time
	// twins is, for each peer named by two live processes (checkTwin),
	// the pair of incarnations last warned about (xor), so that it is
	// said once.
	twins map[messages.PeerID]uint64
	// departedBeat is when each departed incarnation (Link.departedInc)
	// last beat: while it beats its bindings are not forgotten to make
	// room (forgetDownConns), though its name may be down.
	departedBeat map[goneInc]time.Time
	// byes are the goodbyes read and not yet acted on (goodbyes): those of
	// one batch of the ROUTER's, and those waiting behind held frames; one
	// per connection binding (addBye).
	byes []pendingBye
	// probed: probeDead sent on the ROUTER during this drain, which may
	// have taken ZMQ_FD's signal (drain).
	probed bool
	// busy: the last drain ended with a full batch, not with the ROUTER
	// found empty; timedOut: the last wait ended at its deadline
	// (afterWait).
	busy, timedOut bool
	// ghosts are, by routing id, the bindings probeDead forgot (a live
	// connection whose transport was being re-established, same routing
	// id, looked gone) and those of Hellos refused at a bound (room: a
	// closed connection still counted as there); a later frame on the
	// connection binds it (revive). Made on first use; at most maxGhosts.
	ghosts map[string]ghost
	// heldBytes is the size of the frames the ghosts hold (hold), at most
	// maxHeldBytes; heldRetry is when retryHeld last ran.
	heldBytes int
	heldRetry time.Time
	// ghostScan: when ghost last scanned the ghosts for old ones.
	ghostScan time.Time
	// removedScan: when forgetRemoved last walked liveness.
	removedScan time.Time
}

// ghost is a binding probeDead forgot, or a Hello refused at a bound
// would have made (refused), and when (wall clock).
//
// held are the frames that came on the connection while revive found no
// room for it (hold), in order: delivered, first, once it is bound.
type ghost struct {
	b       *binding
	at      time.Time
	refused bool
	held    [][]byte
	heldAt  time.Time // when the first of held came (wall clock)
}

// maxHeldPerConn and maxHeldBytes bound the frames held (hold): per
// connection, and in all. Variables for tests.
var (
	maxHeldPerConn = 1024
	maxHeldBytes   = 16 << 20
)

// heldRetryEvery bounds how often the listener tries the room of the
// connections whose frames are held (retryHeld).
const heldRetryEvery = 100 * time.Millisecond

// maxGhosts bounds the ghosts the listener remembers (revive): past it,
// those older than ghostKeep go, else any one. A variable for tests.
var maxGhosts = 4096

// ghostKeep is how long a forgotten binding is kept for sure when
// maxGhosts is reached: a DEALER reconnects within reconnectIvlMax of
// its peer being reachable again.
const ghostKeep = time.Minute

// pendingBye is a goodbye read on a bound connection; drained: it says
// the sender's writes are over (messages.Heartbeat.Drained); reason: why
// the sender closes, as it said (messages.Heartbeat.Reason, validated);
// at: when it was read (Config.Clock).
type pendingBye struct {
	id, key string
	b       *binding
	drained bool
	reason  string
	at      time.Time
}

// binding is what a connection said it is in its Hello.
type binding struct {
	peer messages.PeerID
	key  string // authenticated CURVE key ("" when insecure)
	// inc and pid are the incarnation and process its Hello named (0: not
	// told).
	inc uint64
	pid uint32
	// probedAt is when probeDead last found the connection there (wall
	// clock).
	probedAt time.Time
}

// connOwner is the identity whose bindings maxConnsPerIdentity bounds:
// the connection's CURVE key, or, insecure (no key), the PeerID its Hello
// named. Neither changes on a bound connection (handle, hello).
type connOwner struct {
	key  string
	peer messages.PeerID // only when key is ""
}

func ownerOf(key string, p messages.PeerID) connOwner {
	if key != "" {
		return connOwner{key: key}
	}
	return connOwner{peer: p}
}

func (b *binding) owner() connOwner { return ownerOf(b.key, b.peer) }

func (o connOwner) String() string {
	if o.key != "" {
		return "CURVE key " + o.key
	}
	return "peer " + o.peer.String() + " (insecure)"
}

// bind binds connection id to b.
// Frames its ghost held (hold) are the caller's to replay (takeHeld):
// here they are dropped, counted.
func (s *listener) bind(id string, b *binding) {
	s.conns[id] = b
	s.dropGhost(id, "its connection bound")
	o := b.owner()
	if s.owned == nil {
		s.owned = map[connOwner]map[string]*binding{}
	}
	if s.owned[o] == nil {
		s.owned[o] = map[string]*binding{}
	}
	s.owned[o][id] = b
}

// unbind forgets connection id's binding b.
func (s *listener) unbind(id string, b *binding) {
	delete(s.conns, id)
	o := b.owner()
	delete(s.owned[o], id)
	if len(s.owned[o]) == 0 {
		delete(s.owned, o)
	}
}

// room reports whether a new connection id may be bound to peer p with
// key; when not, it rejects the Hello (full). The identity's own bound
// first: one at maxConnsPerIdentity gets room only from its own bindings,
// never from another identity's: first those whose connection is gone
// (probeDead), else those forgetDownConns would forget (of its peers down
// or forgotten, then of its superseded incarnations); then the table's
// (maxConns) likewise.
//
// what names what wants the room: "Hello", or, for a connection revive
// binds again, its frame.
func (s *listener) room(what, id, key string, p messages.PeerID, now time.Time) bool {
	if why := s.noRoom(key, p, now); why != "" {
		s.reject(RejectFull, id, key, nil, "%s as %s: %s", what, p, why)
		return false
	}
	return true
}

// noRoom is room's test: "" when there is room (made), else why not.
func (s *listener) noRoom(key string, p messages.PeerID, now time.Time) string {
	o := ownerOf(key, p)
	if n := len(s.owned[o]); n >= maxConnsPerIdentity && !s.probeDead(s.owned[o]) && !s.forgetDownConns(now, s.owned[o]) {
		return fmt.Sprintf("%s already holds %d connections, at most %d per identity "+
			"(maxConnsPerIdentity): this new connection is not bound (a later frame on it is, once there is room); its bound ones stay", o, n, maxConnsPerIdentity)
	}
	if len(s.conns) >= maxConns && !s.probeDead(s.conns) && !s.forgetDownConns(now, s.conns) {
		return fmt.Sprintf("already %d connections", len(s.conns))
	}
	return ""
}

// revive binds connection id to its ghost's binding when frame f, which
// came on it with key, is that binding's (its key and sender) — a
// connection whose Conn will not say Hello again:
//   - one probeDead forgot: a live DEALER whose transport was being
//     re-established as the probe ran (its routing id is kept across
//     reconnects);
//   - one whose Hello was refused at a bound (room) while a closed
//     connection still counted as there (probed less than probeEvery
//     ago): only while the directory holds the Hello's incarnation,
//     bound to key (as that Hello, taken now, would find it).
//
// It needs room as a Hello does: else f (payload) is held (hold), ok is
// false, and a later frame, or retryHeld, tries again; the frames held
// are delivered first, in order, once it is bound. Its sender took them
// as sent (its Send returned nil): a rejection would lose them unknown
// to it. Past the hold's bounds f is rejected (full). A refused Hello's ghost is kept for a
// later frame too while the directory does not hold its incarnation (f is
// rejected as before Hello). It returns nil and true when id has no such
// ghost (f is then rejected as before Hello). Only frames on
// unbound connections come here: bound ones never look at ghosts.
func (s *listener) revive(id, key string, f messages.Frame, payload []byte, now time.Time) (b *binding, ok bool) {
	g, found := s.ghosts[id]
	if !found || g.b.key != key || g.b.peer != f.Sender() {
		return nil, true
	}
	if g.refused && !s.l.holdsIncarnation(g.b.peer, g.b.inc, key) {
		// Not yet (the incarnation's Hello on another connection may
		// come later), or no longer: the ghost stays for a later frame,
		// until maxGhosts makes it go, and f is held as for room (its
		// sender took it as sent): once the directory holds the
		// incarnation, retryHeld or a later frame binds the connection;
		// held for ghostKeep without, it is rejected (no_hello). A
		// RequestData the engine answers as misaddressed is not held:
		// it is answered now.
		if !s.misaddressed(f) && s.hold(id, payload) {
			return nil, false
		}
		return nil, true
	}
	if why := s.noRoom(key, g.b.peer, now); why != "" {
		if !s.hold(id, payload) {
			what := "frame on a connection that reconnected as a probe ran"
			if g.refused {
				what = "frame on a connection whose Hello was refused at the bound"
			}
			s.reject(RejectFull, id, key, nil, "%s as %s: %s; %d frames wait on it already, %d bytes on all such (at most %d, %d bytes)",
				what, g.b.peer, why, len(s.ghosts[id].held), s.heldBytes, maxHeldPerConn, maxHeldBytes)
		}
		return nil, false
	}
	return s.rebind(id, g), true
}

// rebind binds connection id to its ghost g's binding, there being room,
// and handles the frames g held, in order.
func (s *listener) rebind(id string, g ghost) *binding {
	held := s.takeHeld(id)
	g.b.probedAt = time.Now()
	s.bind(id, g.b)
	s.l.log.Debug().Stringer("peer", g.b.peer).Hex("conn", []byte(id)).Bool("refused", g.refused).Int("held", len(held)).
		Msg("control/zmq: a connection without binding (its Hello refused at a bound, or a probe found it gone) is bound")
	s.replay(id, g.b.key, held)
	return g.b
}

// hold keeps payload, a frame on connection id (a ghost's), behind those
// it holds already, within maxHeldPerConn and maxHeldBytes; false when
// past them.
func (s *listener) hold(id string, payload []byte) bool {
	g := s.ghosts[id]
	if len(g.held) >= maxHeldPerConn || s.heldBytes+len(payload) > maxHeldBytes {
		return false
	}
	if len(g.held) == 0 {
		g.heldAt = time.Now()
	}
	g.held = append(g.held, payload)
	s.heldBytes += len(payload)
	s.ghosts[id] = g
	return true
}

// takeHeld takes the frames connection id's ghost holds, if any.
func (s *listener) takeHeld(id string) [][]byte {
	g, ok := s.ghosts[id]
	if !ok || len(g.held) == 0 {
		return nil
	}
	held := g.held
	g.held = nil
	s.ghosts[id] = g
	for _, p := range held {
		s.heldBytes -= len(p)
	}
	return held
}

// replay handles frames held on connection id (takeHeld) again, in
// order, as if they came now.
func (s *listener) replay(id, key string, held [][]byte) {
	for _, p := range held {
		s.handle(id, p, key, 1)
	}
}

// dropGhost forgets connection id's ghost; frames it still holds are
// rejected (full), counted, and logged once, saying why.
func (s *listener) dropGhost(id, why string) {
	if _, ok := s.ghosts[id]; ok {
		s.dropHeld(id, RejectFull, why)
		delete(s.ghosts, id)
	}
}

// dropHeld rejects (r) the frames connection id's ghost holds, counted
// each and logged once, saying why; the ghost stays.
func (s *listener) dropHeld(id string, r RejectReason, why string) {
	g := s.ghosts[id]
	held := s.takeHeld(id)
	if n := len(held); n > 0 {
		s.l.stats.rejected[r].Add(int64(n - 1))
		s.reject(r, id, g.b.key, nil, "%d frames of %s held on a connection without binding dropped: %s", n, g.b.peer, why)
	}
}

// retryHeld tries the room of each connection whose frames are held,
// and binds it and delivers them when there is: the last frames a Conn
// sends have no later frame to try for them (revive).
func (s *listener) retryHeld() {
	if s.heldBytes == 0 {
		return
	}
	s.heldRetry = time.Now()
	var ids []string
	for id, g := range s.ghosts {
		if len(g.held) > 0 {
			ids = append(ids, id)
		}
	}
	now, at := s.l.cfg.Clock(), time.Now()
	for _, id := range ids {
		g, ok := s.ghosts[id]
		if !ok || len(g.held) == 0 || s.conns[id] != nil {
			continue
		}
		old := at.Sub(g.heldAt) >= ghostKeep || at.Before(g.heldAt)
		if g.refused && !s.l.holdsIncarnation(g.b.peer, g.b.inc, g.b.key) {
			if old {
				s.dropHeld(id, RejectNoHello, fmt.Sprintf("their connection's Hello (incarnation %d) was refused at a bound, and the directory has not held that incarnation since", g.b.inc))
			}
			continue
		}
		if s.noRoom(g.b.key, g.b.peer, now) != "" {
			if old {
				s.dropHeld(id, RejectFull, "no room for their connection for a minute")
			}
			continue
		}
		s.rebind(id, g)
	}
}

// holdsIncarnation reports whether the directory holds a Hello of
// incarnation inc for p, and p is bound to key (or to no key).
func (l *Link) holdsIncarnation(p messages.PeerID, inc uint64, key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	info := l.peers[p]
	return info != nil && info.hello != nil && info.hello.Incarnation == inc && (info.key == "" || info.key == key)
}

// ghost remembers binding b of connection id, which probeDead forgot
// (or a Hello refused at a bound would have made: refused) at wall time
// at, for revive.
func (s *listener) ghost(id string, b *binding, at time.Time, refused bool) {
	if s.ghosts == nil {
		s.ghosts = map[string]ghost{}
	}
	if len(s.ghosts) >= maxGhosts {
		// The old ones go, in one scan a second at most (else a peer
		// refused at the bound would make each refusal scan them all);
		// then any one, until there is room.
		if at.Sub(s.ghostScan) >= time.Second || at.Before(s.ghostScan) {
			s.ghostScan = at
			for gid, g := range s.ghosts {
				if at.Sub(g.at) >= ghostKeep || at.Before(g.at) {
					s.dropGhost(gid, "no room for a minute, and maxGhosts reached")
				}
			}
		}
		for gid := range s.ghosts {
			if len(s.ghosts) < maxGhosts {
				break
			}
			if gid != id {
				s.dropGhost(gid, "maxGhosts reached")
			}
		}
	}
	// A ghost made again for the connection keeps the frames it held.
	s.ghosts[id] = ghost{b: b, at: at, refused: refused, held: s.ghosts[id].held}
}

// serve is the listener goroutine: it waits for the ROUTER in Go's
// netpoller (rw) until stop is closed, then closes it. The ZAP handler,
// when there is one, has its own goroutine on zw (serveZAPs), so that the
// listener waits on one socket. Listen made both waits, so that a socket
// that cannot be waited on fails Listen instead of leaving a deaf link.
// The ROUTER's monitor, when there is one, is read by a goroutine of its
// own on mw (watchHandshakes); once that goroutine ended, this one stops
// the monitor and closes its PAIR, before the ROUTER.
func (s *listener) serve(stop <-chan struct{}, rw, zw, mw *sockWait) {
	defer s.l.wg.Done()
	defer closeSocket(s.router)
	defer rw.close()
	if zw != nil {
		s.l.wg.Add(1)
		go s.serveZAPs(stop, zw)
	}
	if mw != nil {
		// The watcher ends with this goroutine, at stop or when its poll
		// failed (the ROUTER then closes at once, not at the link's stop).
		done, watched := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(watched)
			s.watchHandshakes(done, mw)
		}()
		defer func() {
			close(done)
			mw.interrupt() // (every later wait returns at once: it sees done)
			<-watched      // the PAIR is this goroutine's again
			mw.close()
			closeWatched(s.router, s.mon)
		}()
	}
	s.waitLoop(stop, "listener poll failed; listener stops",
		func() (err error) { s.timedOut, err = rw.serve(s.tick(), s.drain); return err },
		s.afterWait)
}

// afterWait runs after each wait of the listener: the goodbyes read, the
// liveness expiry, and the names RemovePeer forgot once down
// (forgetRemoved).
//
// A wait that ended at its deadline may have ended while a delivery held
// this goroutine (a slow callback, a collection, a starved CPU) after the
// ROUTER was last found empty: the heartbeats that came meanwhile wait in
// it, and the expiry would take their senders for silent. They are read
// first. A goodbye is acted on once a read found the ROUTER empty, so
// that the frames its sender sent before it, fair-queued behind it on
// other connections, are handled while the peer is alive (goodbyes);
// while the ROUTER stays busy (full batches) it waits at most byeWaitMax.
func (s *listener) afterWait() {
	if s.timedOut {
		s.drain()
	}
	if s.busy {
		s.actOnGoodbyes(s.l.cfg.Clock().Add(-s.byeWaitMax()))
	} else {
		s.goodbyes()
	}
	if s.heldBytes > 0 {
		if at := time.Now(); at.Sub(s.heldRetry) >= heldRetryEvery || at.Before(s.heldRetry) {
			s.retryHeld()
		}
	}
	now := s.l.cfg.Clock()
	s.live.expire(now, s.down)
	s.forgetRemoved(now)
}

// removedScanEvery bounds how often forgetRemoved walks liveness.
const removedScanEvery = time.Second

// forgetRemoved forgets (forgetPeer) the names liveness tracks as down
// that the directory no longer holds, at most once per removedScanEvery.
// down forgets a name RemovePeer forgot, but it is told only of one that
// goes down while tracked as alive: one already down when it was removed
// — a crashed peer misses its heartbeats (3 s by default) before its etcd
// lease runs out (5 s), and a closing one's goodbye may come before the
// etcd Down — was never told down again, and stayed in liveness, in
// OnPeerAlive's table and in every expiry walk for as long as the link
// lived. Its bindings stay until forgetDownConns needs the room; a Hello
// of the name tracks it again.
func (s *listener) forgetRemoved(now time.Time) {
	if !s.removedScan.IsZero() && now.Sub(s.removedScan) < removedScanEvery && !now.Before(s.removedScan) {
		return
	}
	s.removedScan = now
	var gone []messages.PeerID
	s.l.mu.Lock()
	for p, st := range s.live.peers {
		if st.down && s.l.peers[p] == nil {
			gone = append(gone, p)
		}
	}
	s.l.mu.Unlock()
	for _, p := range gone {
		s.forgetPeer(p)
	}
}

// idleWait bounds a wait of the listener or the ZAP handler when nothing
// else does; Close interrupts their waits (sockWait.interrupt).
const idleWait = 30 * time.Second

// tick is how long the listener may wait for frames before it must run the
// liveness expiry: until the first alive peer's silence could reach the
// timeout, by the wall clock (at most idleWait), so that an idle link
// wakes about once per heartbeat timeout, not every poll interval. With an
// injected Config.Clock, which a test moves by hand, no wait can be
// computed from it: the listener polls every poll interval.
func (s *listener) tick() time.Duration {
	if !s.l.cfg.wallClock {
		return s.l.cfg.pollInterval()
	}
	t := max(s.live.next(time.Now(), idleWait), time.Millisecond)
	if s.heldBytes > 0 { // frames wait for room (retryHeld)
		t = min(t, heldRetryEvery)
	}
	return t
}

// serveZAPs is the ZAP goroutine: it answers ZAP requests as they come
// until stop is closed, then closes the handler socket.
func (s *listener) serveZAPs(stop <-chan struct{}, zw *sockWait) {
	defer s.l.wg.Done()
	defer closeSocket(s.zap)
	defer zw.close()
	s.waitLoop(stop, "ZAP handler poll failed; CURVE handshakes stall", func() error {
		ok, err := zw.wait(idleWait)
		if ok {
			s.serveZAP()
		}
		return err
	}, nil)
}

// watchHandshakes reads the ROUTER's monitor (mw, on s.mon) as its
// events come until done is closed (serve's end), counting the handshakes that failed
// at the listener (FailedHandshakes). It leaves the PAIR open: serve
// closes it after the monitor stopped.
func (s *listener) watchHandshakes(done <-chan struct{}, mw *sockWait) {
	s.waitLoop(done, "listener monitor poll failed; handshakes that fail at the listener go uncounted", func() error {
		ok, err := mw.wait(idleWait)
		if !ok {
			return err
		}
		for range maxBatch {
			ev, _, _, rerr := s.mon.RecvEvent(zmq4.DONTWAIT)
			if rerr != nil {
				if !isAgain(rerr) {
					s.l.log.Warn().Err(rerr).Msg("control/zmq: reading the listener's monitor")
				}
				break
			}
			if ev&listenerWatchedEvents != 0 {
				s.l.stats.failedHandshake.Add(1)
			}
		}
		return err
	}, nil)
}

// waitLoop calls wait, and then tick when set, until stop is closed or a
// wait fails (logged with failed).
func (s *listener) waitLoop(stop <-chan struct{}, failed string, wait func() error, tick func()) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		if err := wait(); err != nil {
			s.l.log.Error().Err(err).Msg("control/zmq: " + failed)
			return
		}
		if tick != nil {
			tick()
		}
	}
}

// drain reads up to maxBatch messages from the ROUTER without waiting and
// handles each, and reports whether it left the ROUTER empty. Each message
// is handled after the next receive, so that the last one is delivered
// after the receive that found the ROUTER empty and the goroutine then
// parks without another cgo call (sockWait.serve): the mailbox goroutine
// that delivery readied runs on this goroutine's P at once, instead of
// being stolen, while this goroutine sits in a cgo call, by a thread
// woken for it on another CPU.
//
// It also reports false when it held frames (hold) and none were held
// before: the wait under way set its deadline (tick) with none held, up
// to idleWait away, and only afterWait tries their room again
// (retryHeld). A frame held without a probe (those of its bound were
// probed less than probeEvery ago) sends nothing that ends the wait
// otherwise: it waited for that deadline or a later message, with
// heartbeats off 30 s, though a probe a second later finds room.
func (s *listener) drain() (empty bool) {
	var (
		id, key string
		payload []byte
		parts   int
		held    bool // id, key, payload, parts: read, not yet handled
	)
	heldBefore := s.heldBytes
	for range maxBatch {
		nid, npayload, nkey, nparts, err := s.recv()
		if err != nil {
			// Any other error is logged and taken as empty too: the
			// next signal or the poll's deadline tries again.
			if !isAgain(err) {
				s.l.log.Warn().Err(err).Msg("control/zmq: listener receive")
			}
			empty = true
			break
		}
		if held {
			s.handle(id, payload, key, parts)
		}
		id, payload, key, parts, held = nid, npayload, nkey, nparts, true
	}
	if held {
		s.handle(id, payload, key, parts)
	}
	s.busy = !empty
	if empty {
		s.goodbyes()
	}
	if s.probed {
		// A send (probeDead) processes the socket's commands, as a
		// receive does, and may have taken ZMQ_FD's signal of messages
		// that came after the empty receive: read again before parking.
		s.probed = false
		return false
	}
	if heldBefore == 0 && s.heldBytes > 0 {
		return false // the next wait is bounded by heldRetryEvery (tick)
	}
	return empty
}

// recv reads one ROUTER message: the routing id, the first payload part,
// the connection's authenticated CURVE key and the number of payload
// parts. Parts past the first are read and dropped.
//
// The key (ZAP User-Id) is read from the payload part: libzmq attaches the
// connection's metadata to the parts the peer sent, but not always to the
// routing-id part the ROUTER prepends (not when zmq_poll prefetched it).
func (s *listener) recv() (id string, payload []byte, key string, parts int, err error) {
	first, err := s.router.RecvBytes(zmq4.DONTWAIT)
	if err != nil {
		return "", nil, "", 0, err
	}
	id = string(first)
	for {
		more, err := s.router.GetRcvmore()
		if err != nil {
			return "", nil, "", 0, err
		}
		if !more {
			return id, payload, key, parts, nil
		}
		var part []byte
		if parts == 0 && s.secure {
			var meta map[string]string
			part, meta, err = s.router.RecvBytesWithMetadata(0, "User-Id")
			key = meta["User-Id"]
		} else {
			part, err = s.router.RecvBytes(0)
		}
		if err != nil {
			return "", nil, "", 0, err
		}
		if parts == 0 {
			payload = part
		}
		parts++
	}
}

// handle checks one message and stores, notes or delivers its frame.
func (s *listener) handle(id string, payload []byte, key string, parts int) {
	b := s.conns[id]
	if parts != 1 {
		s.reject(RejectEnvelope, id, key, b, "envelope has %d payload parts, want 1", parts)
		return
	}
	if len(payload) > s.l.cfg.MaxFrameBytes {
		s.reject(RejectOversize, id, key, b, "frame of %d bytes exceeds MaxFrameBytes %d", len(payload), s.l.cfg.MaxFrameBytes)
		return
	}
	f, err := decode(payload)
	// A RequestData or Result that fails validation but names its request
	// validly (messages.InvalidFrame) takes the same identity checks as
	// any frame; passing them, it goes on to the engine, which counts it
	// and fails the request with the reason instead of leaving it to its
	// deadline. It renews nothing and reaches no OnFrame hook.
	var inv *messages.InvalidFrame
	if err != nil {
		var ve *messages.VersionError
		if errors.As(err, &ve) {
			s.otherVersion(id, key, b, ve.Got)
			return
		}
		if !errors.As(err, &inv) {
			s.reject(RejectDecode, id, key, b, "decode: %v", err)
			return
		}
		f = inv.Frame
	}
	// In CURVE mode a frame may only name a sender its key is bound to.
	if s.secure {
		switch {
		case key == "":
			s.reject(RejectIdentity, id, key, b, "%T from %s on a connection without a CURVE key", f, f.Sender())
			return
		case b != nil && key != b.key:
			s.reject(RejectIdentity, id, key, b, "%T: connection's CURVE key changed from %s to %s", f, b.key, key)
			return
		case !s.l.keyPermits(key, f.Sender()):
			if h, ok := f.(*messages.Hello); ok {
				s.l.misnamed.Store(&misnamedHello{claimed: h.From, key: key, at: time.Now()})
			}
			s.reject(RejectIdentity, id, key, b, "%T claims sender %s, which CURVE key %s may not speak for",
				f, f.Sender(), key)
			return
		}
	}
	now := s.l.cfg.Clock()
	if h, ok := f.(*messages.Hello); ok {
		// Frames held on the connection (a ghost's) came before this
		// Hello: handled after it, bound to it or held again.
		held := s.takeHeld(id)
		s.hello(id, key, b, h, now)
		s.replay(id, key, held)
		return
	}
	if b == nil && len(s.ghosts) > 0 {
		var ok bool
		if b, ok = s.revive(id, key, f, payload, now); !ok {
			return
		}
	}
	switch {
	case b == nil && inv == nil && s.misaddressed(f):
		// Not bound, not a sign of life, not counted here: delivered
		// only to be dropped there and answered (the engine counts it
		// stale).
		s.deliver(f)
		return
	case b == nil:
		s.reject(RejectNoHello, id, key, b, "%T from %s before Hello on this connection", f, f.Sender())
		return
	case f.Sender() != b.peer:
		s.reject(RejectSender, id, key, b, "%T of request %q claims sender %s on a connection that said Hello as %s",
			f, f.Request(), f.Sender(), b.peer)
		return
	}
	if claimed, ok := ownIncarnation(b, f); !ok {
		s.reject(RejectSender, id, key, b, "%T of request %q claims incarnation %d of %s on a connection whose Hello named incarnation %d",
			f, f.Request(), claimed, b.peer, b.inc)
		return
	}
	if inv != nil {
		s.deliver(f)
		return
	}
	hb, beat := f.(*messages.Heartbeat)
	if beat && hb.Leaving {
		// Acted on once the ROUTER is drained (goodbyes): the peer's last
		// frames on its other connections (a Result it sent just before
		// it closed) may wait behind it in the ROUTER's fair queue.
		s.addBye(pendingBye{id, key, b, hb.Drained, hb.Reason, s.l.cfg.Clock()})
		return
	}
	switch {
	case s.l.departedInc(b.peer, b.inc):
		// The connection's incarnation left (RemovePeer) and lives on
		// (draining in its Close, or out of etcd without knowing it):
		// its frames are no life of the name, whose entry (if any) is
		// another incarnation's. Its heartbeats go no further; its
		// other frames (its last Result or CancelAck: proofs the other
		// side waits for) are delivered.
		if beat {
			s.departedBeating(b, now)
			return
		}
	case s.live.leftAs(b.peer, b.inc):
		// The connection's incarnation said goodbye: its frames are no
		// life of the name (one that came late on another connection
		// would bring it back). Its heartbeats go no further; its other
		// frames (a last Result or CancelAck, proofs the other side
		// waits for) are delivered.
		if beat {
			return
		}
	default:
		s.alive(b.peer, now)
		s.tellAlive(b.peer, now)
		if beat {
			if b.inc != 0 {
				s.checkTwin(b, now)
			}
			return
		}
	}
	if hoptrace.On {
		hoptrace.Mark(fmt.Sprintf("zmq.recv.%T", f), f.Request())
	}
	if fn := s.l.cfg.OnFrame; fn != nil {
		fn(f)
	}
	s.deliver(f)
	if hoptrace.On {
		hoptrace.Mark(fmt.Sprintf("zmq.delivered.%T", f), f.Request())
	}
}

// misaddressed reports whether f, a valid frame on a connection that has
// not said Hello, is a RequestData addressed to an earlier incarnation of
// this listener's rank whose sender takes a messages.Misaddressed answer
// (its Features). Such a frame is delivered instead of rejected
// (no_hello): its sender's connection was made to that earlier
// incarnation and reached this one, restarted on the same endpoint,
// before the sender heard of it (a DEALER reconnects transparently, and
// says Hello again only once its link hears of the new incarnation), and
// the sender took the frame as delivered. The engine drops it (addressed
// to an earlier incarnation) and answers it, so that the sender addresses
// it to this incarnation and sends it again, instead of waiting for an
// answer that never comes. It binds nothing and is no sign of life; in
// CURVE mode its sender was checked against the connection's key, as
// every frame's. Any other frame before Hello is rejected as before.
func (s *listener) misaddressed(f messages.Frame) bool {
	rd, ok := f.(*messages.RequestData)
	return ok && s.selfInc != 0 && rd.ToIncarnation != 0 && rd.ToIncarnation < s.selfInc && rd.FromIncarnation != 0 &&
		rd.Features&messages.FeatureMisaddressed != 0
}

// ownIncarnation holds frame f, on connection b, to the incarnation b's
// Hello named (b.inc): a connection is one process's, and its frames are
// that incarnation's whatever they claim. A frame naming no incarnation
// (FromIncarnation 0) is taken as b's; one naming another is refused
// (false, with the incarnation it claimed): it would be taken, by the
// request it names, for another incarnation's answer or proof, and a
// Heartbeat (a goodbye) for another incarnation's. A Hello that named
// none (a peer that predates incarnations) holds its frames to none.
func ownIncarnation(b *binding, f messages.Frame) (claimed uint64, ok bool) {
	if b.inc == 0 {
		return 0, true
	}
	var from *uint64
	switch m := f.(type) {
	case *messages.RequestData:
		from = &m.FromIncarnation
	case *messages.Result:
		from = &m.FromIncarnation
	case *messages.Cancel:
		from = &m.FromIncarnation
	case *messages.CancelAck:
		from = &m.FromIncarnation
	case *messages.Misaddressed:
		from = &m.FromIncarnation
	case *messages.Heartbeat:
		from = &m.FromIncarnation
	default:
		return 0, true
	}
	switch *from {
	case 0:
		*from = b.inc
	case b.inc:
	default:
		return *from, false
	}
	return 0, true
}

// hello binds a connection to the PeerID of its Hello and stores the Hello.
func (s *listener) hello(id, key string, b *binding, h *messages.Hello, now time.Time) {
	p := h.From
	switch {
	case p == s.self:
		s.reject(RejectSender, id, key, b, "Hello claims our own id %s", p)
		return
	case b != nil && b.peer != p:
		s.reject(RejectSender, id, key, b, "Hello as %s on a connection bound to %s", p, b.peer)
		return
	case b == nil && !s.room("Hello", id, key, p, now):
		// Its Conn will not say Hello again: a later frame on it binds
		// it once there is room (revive).
		s.ghost(id, &binding{peer: p, key: key, inc: h.Incarnation, pid: h.Process.Pid}, time.Now(), true)
		return
	}
	l := s.l
	l.mu.Lock()
	full := len(l.peers) >= maxPeers
	l.mu.Unlock()
	if full {
		// Those silent for the timeout by now are down before one of
		// them is chosen to make room (forgetDownPeerLocked).
		s.live.expire(now, s.down)
	}
	l.mu.Lock()
	if gone, ok := l.departedLocked(p, h.Incarnation); ok {
		l.mu.Unlock()
		s.departedHello(id, key, b, h, gone)
		return
	}
	if h.Incarnation != 0 && s.live.leftAs(p, h.Incarnation) {
		l.mu.Unlock()
		s.leftHello(id, key, b, h)
		return
	}
	info := l.peers[p]
	if info == nil && len(l.peers) >= maxPeers {
		gone, ok := l.forgetDownPeerLocked(s.live.isDown)
		if !ok {
			l.mu.Unlock()
			s.reject(RejectFull, id, key, b, "Hello as %s: directory full (%d peers)", p, maxPeers)
			return
		}
		s.forgetPeer(gone)
	}
	if info == nil {
		info = l.peerLocked(p)
	}
	if s.secure && info.key != "" && info.key != key && !s.live.isDown(p) {
		bound := info.key
		l.mu.Unlock()
		s.reject(RejectTaken, id, key, b, "Hello as %s from CURVE key %s: the peer is alive and bound to key %s", p, key, bound)
		return
	}
	info.key = key
	delete(l.foreign, key) // it speaks our version now
	prev := info.hello
	info.hello, info.helloAt = h, now
	info.maxFrame.Store(int64(h.PeerFrameLimit()))
	info.down = false
	back := false // h's incarnation was replaced by another before: two live processes
	if prev != nil && h.Incarnation != 0 && prev.Incarnation != h.Incarnation {
		back = slices.Contains(info.replaced[:], h.Incarnation)
		copy(info.replaced[1:], info.replaced[:])
		info.replaced[0] = prev.Incarnation
	}
	if b == nil {
		info.incarnation.Add(1)
	}
	l.helloAcceptedLocked(p, h.Incarnation)
	l.mu.Unlock()
	if b == nil {
		b = &binding{peer: p, key: key}
		s.bind(id, b)
	}
	b.inc, b.pid = h.Incarnation, h.Process.Pid
	if back {
		s.twin(p, h.Incarnation, h.Process.Pid, prev.Incarnation, prev.Process.Pid)
	}
	if s.live.hello(p, now) {
		l.log.Info().Stringer("peer", p).Msg("control/zmq: peer is back")
	}
	if l.cfg.OnHello != nil && (prev == nil || prev.Incarnation != h.Incarnation || prev.Process != h.Process) {
		l.cfg.OnHello(h)
	}
	s.tellAlive(p, now)
}

// departedHello refuses Hello h, of an incarnation RemovePeer forgot
// (which spoke with goneKey), its claim on the name: the directory is
// left as it is (no entry made, no Hello stored, the name bound to no
// key), and neither OnHello nor liveness hears of it. The connection is
// bound to the peer (b made if need be), so that the departed process's
// last frames on it (a Result, a CancelAck: proofs a generation side
// waits for) are delivered, as on its connections bound before the
// removal.
func (s *listener) departedHello(id, key string, b *binding, h *messages.Hello, goneKey string) {
	if b == nil {
		b = &binding{peer: h.From, key: key}
		s.bind(id, b)
	}
	b.inc, b.pid = h.Incarnation, h.Process.Pid
	was := ""
	if goneKey != "" && goneKey != key {
		was = " (it spoke with key " + goneKey + ")"
	}
	s.reject(RejectDeparted, id, key, b, "Hello of %s's incarnation %d (pid %d), which left the cluster (RemovePeer)%s: "+
		"it does not take the name back; its connection's frames are still delivered", h.From, h.Incarnation, h.Process.Pid, was)
}

// leftHello takes Hello h, of an incarnation that said goodbye (leftAs),
// as a late frame of it (a Conn's Hello that left its backlog after the
// goodbye, on a connection the ROUTER fair-queued behind it): it brings
// nothing back. The directory is left as it is (the peer stays down, or
// its newer incarnation's), and neither OnHello nor liveness hears of it;
// it is no rejection and is not counted. The connection is bound to the
// incarnation (b made if need be), so that its last frames on it (a
// Result, a CancelAck: proofs the other side waits for) are delivered,
// while its heartbeats are dropped (handle).
func (s *listener) leftHello(id, key string, b *binding, h *messages.Hello) {
	if b == nil {
		b = &binding{peer: h.From, key: key}
		s.bind(id, b)
	}
	b.inc, b.pid = h.Incarnation, h.Process.Pid
	s.l.log.Debug().Stringer("peer", h.From).Uint64("incarnation", h.Incarnation).
		Msg("control/zmq: late Hello of a peer incarnation that said goodbye: it stays gone")
}

// Two live processes may say Hello as one peer: one instance started
// twice with one name and rank. Nothing else names it: each process's
// Hello replaces the other's here (its exit then no proof for the
// other's writes), and the one this link does not dial waits for a peer
// that never answers it. The listener names it, once per pair of
// incarnations, when it sees either sign of two living processes (a dead
// process says nothing more, and a restarted one has a new incarnation):
//   - checkTwin: a connection whose Hello named another incarnation than
//     the peer's latest still sends heartbeats two beats after that
//     Hello (a restarted process's last frames arrive within a beat);
//   - hello: an incarnation says Hello again after another replaced it
//     (each connection repeats its Hello every HeartbeatMisses beats).

// checkTwin runs for each heartbeat on connection b.
func (s *listener) checkTwin(b *binding, now time.Time) {
	l := s.l
	l.mu.Lock()
	var cur *messages.Hello
	var at time.Time
	if info := l.peers[b.peer]; info != nil {
		cur, at = info.hello, info.helloAt
	}
	l.mu.Unlock()
	if cur == nil || cur.Incarnation == 0 || cur.Incarnation == b.inc || now.Sub(at) < 2*l.cfg.HeartbeatInterval {
		return
	}
	s.twin(b.peer, cur.Incarnation, cur.Process.Pid, b.inc, b.pid)
}

// twin logs that incarnations a and b (with their pids) both live as peer
// p, once per pair.
func (s *listener) twin(p messages.PeerID, a uint64, apid uint32, b uint64, bpid uint32) {
	pair := a ^ b
	if s.twins[p] == pair {
		return
	}
	if s.twins == nil {
		s.twins = map[messages.PeerID]uint64{}
	}
	s.twins[p] = pair
	s.l.log.Error().Stringer("peer", p).Uint64("incarnation", a).Uint64("other_incarnation", b).
		Msgf("two processes speak as %s: incarnation %d (pid %d) and incarnation %d (pid %d), each on its own connection: "+
			"is one instance started twice with the same name and rank? This link takes whichever said Hello last for %s",
			p, a, apid, b, bpid, p)
}

// otherVersion rejects a frame written in protocol version v, not ours.
// On a CURVE connection it also remembers that the key speaks v, so that
// Link.Hello names the version (PeerVersionError) for the peers the key
// may speak for: a request to such a writer then fails at once, and a
// wait for its Hello says why, instead of a silence until a deadline. The
// key is authenticated and was admitted by the ZAP handler, so the
// memory is bounded by the keys this link allows; a valid Hello from the
// key forgets it. Without a key (insecure) it keeps only the last such
// version, for OtherVersionUnnamed.
func (s *listener) otherVersion(id, key string, b *binding, v uint32) {
	if key == "" {
		s.l.anonForeign.Store(v)
	} else {
		s.l.mu.Lock()
		if s.l.foreign == nil {
			s.l.foreign = map[string]uint32{}
		}
		s.l.foreign[key] = v
		s.l.mu.Unlock()
	}
	s.reject(RejectVersion, id, key, b, "frame of control protocol version %d, this engine speaks %d: "+
		"its frames are refused until both sides run one version", v, messages.Version)
}

// tellAlive calls OnPeerAlive for p, at most once per heartbeat interval.
func (s *listener) tellAlive(p messages.PeerID, now time.Time) {
	fn := s.l.cfg.OnPeerAlive
	if fn == nil {
		return
	}
	if last, ok := s.told[p]; ok && now.Sub(last) < s.l.cfg.HeartbeatInterval && !now.Before(last) {
		return
	}
	if s.told == nil {
		s.told = map[messages.PeerID]time.Time{}
	}
	s.told[p] = now
	fn(p)
}

// forgetDownConns drops, of the bindings in conns (s.conns, or one
// identity's: s.owned), those of connections whose peer is down,
// or was forgotten to make room in the directory (forgetPeer: liveness no
// longer tracks it, and never will call it down), to make room; it
// reports whether any went. A departed incarnation (RemovePeer) still
// beating keeps its bindings, though its name goes down by silence (its
// beats are no life of the name): its last Result or CancelAck on them is
// a proof the other side waits for.
//
// When that frees nothing, the bindings of superseded incarnations go: a
// connection whose Hello named another incarnation than the one the
// directory holds for its peer now (a restarted process's old ones).
// Otherwise a peer that restarts again and again without ever being down
// long enough (a crash loop) left its old incarnations' bindings for
// good, and once they filled maxConns every new connection's Hello, of
// any peer, was refused. A superseded process still alive that sends on
// such a connection is refused (no Hello on it) until it repeats its
// Hello there; a Result or CancelAck it sends meanwhile is lost, which
// leaves the pages it names quarantined: nothing is freed for it.
func (s *listener) forgetDownConns(now time.Time, conns map[string]*binding) bool {
	n := len(s.conns)
	s.pruneDepartedBeats(now)
	for id, b := range conns {
		if _, beating := s.departedBeat[goneInc{b.peer, b.inc}]; beating && s.l.departedInc(b.peer, b.inc) {
			continue
		}
		if s.live.isDown(b.peer) || !s.live.tracks(b.peer) {
			s.unbind(id, b)
		}
	}
	if len(s.conns) < n {
		return true
	}
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	for id, b := range conns {
		if b.inc == 0 {
			continue
		}
		if _, beating := s.departedBeat[goneInc{b.peer, b.inc}]; beating && s.l.departedInc(b.peer, b.inc) {
			continue
		}
		if info := s.l.peers[b.peer]; info != nil && info.hello != nil && info.hello.Incarnation != 0 && info.hello.Incarnation != b.inc {
			s.unbind(id, b)
		}
	}
	return len(s.conns) < n
}

// probeEvery bounds how often probeDead sends to one connection: a
// Hello refused at a bound, again and again, costs a walk of the
// bindings, as before, not a send to each; and a live DEALER, which reads
// nothing, is sent at most one empty message a second, up to probeHWM.
const probeEvery = time.Second

// probeHWM is the ROUTER's send high-water mark (per connection): the
// listener sends only probes (probeDead), which no DEALER reads, so a
// live connection holds at most this many of them queued (and one in its
// DEALER's receive queue, ZMQ_RCVHWM 1); past that a probe finds the
// queue full (EAGAIN), which says the connection is there.
const probeHWM = 4

// probeDead forgets, of the bindings in conns (s.conns, or one
// identity's: s.owned), those whose connection is gone, and reports
// whether any went. The ROUTER forgets a connection that closed, but
// says nothing (ZMQ_ROUTER_NOTIFY is a draft API), so a binding of a live
// peer's closed connection (a DEALER it closed and dialled again: a
// worker restart, a redial of this node taken for down) stayed for good:
// its peer alive and current, forgetDownConns never freed it, and over a
// long uptime such bindings filled their identity's maxConnsPerIdentity,
// and every new connection of the identity was refused.
//
// It sends the connection an empty message, which the DEALER never
// reads: with ZMQ_ROUTER_MANDATORY a send to a routing id the ROUTER no
// longer has fails at once (EHOSTUNREACH) and the binding goes; a queued
// send, or a full queue (EAGAIN), says the connection is there, and any
// other error keeps the binding (when in doubt, keep). A binding that
// goes is remembered (ghost): a live connection reconnecting just then
// looks gone, and its next frame binds it again (revive). A connection is
// probed at most once per probeEvery (wall clock); one whose close the
// ROUTER has not processed yet counts as there until a later probe. The
// sends leave drain to read again before it parks (s.probed). Without a
// ROUTER (a test's bare listener) nothing is probed.
func (s *listener) probeDead(conns map[string]*binding) bool {
	if s.router == nil {
		return false
	}
	n := len(s.conns)
	at := time.Now()
	for id, b := range conns {
		if !b.probedAt.IsZero() && at.Sub(b.probedAt) < probeEvery && !at.Before(b.probedAt) {
			continue
		}
		s.probed = true
		if _, err := s.router.SendBytes([]byte(id), zmq4.SNDMORE|zmq4.DONTWAIT); err != nil {
			if zmq4.AsErrno(err) == zmq4.Errno(syscall.EHOSTUNREACH) {
				s.unbind(id, b)
				s.ghost(id, b, at, false)
				continue
			}
		} else {
			_, _ = s.router.SendBytes(nil, zmq4.DONTWAIT)
		}
		b.probedAt = at
	}
	return len(s.conns) < n
}

// departedBeating notes a heartbeat on b, a connection of a departed
// incarnation.
func (s *listener) departedBeating(b *binding, now time.Time) {
	if s.departedBeat == nil {
		s.departedBeat = map[goneInc]time.Time{}
	}
	s.departedBeat[goneInc{b.peer, b.inc}] = now
	if len(s.departedBeat) > maxPeers {
		s.pruneDepartedBeats(now)
	}
}

// pruneDepartedBeats forgets the departed incarnations silent for the
// liveness timeout, or no longer departed.
func (s *listener) pruneDepartedBeats(now time.Time) {
	for g, at := range s.departedBeat {
		if now.Sub(at) >= s.live.timeout || !s.l.departedInc(g.peer, g.inc) {
			delete(s.departedBeat, g)
		}
	}
}

// forgetPeer forgets what the listener remembers of p, a peer the full
// directory forgot (forgetDownPeerLocked), but its connections' bindings:
// their last frames are still delivered until forgetDownConns needs the
// room.
func (s *listener) forgetPeer(p messages.PeerID) {
	s.live.forget(p)
	delete(s.told, p)
	delete(s.twins, p)
}

// alive notes a sign of life from a peer that said Hello.
func (s *listener) alive(p messages.PeerID, now time.Time) {
	if !s.live.seen(p, now) {
		return
	}
	s.l.mu.Lock()
	if info := s.l.peers[p]; info != nil {
		info.down = false
	}
	s.l.mu.Unlock()
	s.l.log.Info().Stringer("peer", p).Msg("control/zmq: peer is back")
}

// down marks a silent peer down and tells OnPeerDown. A peer no longer
// in the directory (RemovePeer forgot it) is then forgotten here too
// (forgetPeer), as one the full directory forgot: else, with names that
// come and go, liveness would hold every name ever heard. Its bindings
// stay until forgetDownConns needs the room; a Hello of the name tracks
// it again.
func (s *listener) down(p messages.PeerID) {
	s.l.mu.Lock()
	info := s.l.peers[p]
	if info != nil {
		info.down, info.left = true, false
	}
	s.l.mu.Unlock()
	s.l.log.Warn().Stringer("peer", p).Dur("silence", s.live.timeout).Msg("control/zmq: peer down (missed heartbeats)")
	if s.l.cfg.OnPeerDown != nil {
		s.l.cfg.OnPeerDown(p)
	}
	if info == nil {
		s.forgetPeer(p)
	}
}

// goodbyes acts on the goodbyes read (goodbye), in order. The listener
// calls it when a read found the ROUTER empty: a goodbye comes on the
// sender's heartbeat connection, its last frames (a Result, a CancelAck)
// on others, which the ROUTER fair-queues, so a goodbye read first may
// have overtaken frames sent before it. Those are read, and handled while
// the peer is alive, before it takes the peer down.
func (s *listener) goodbyes() { s.actOnGoodbyes(time.Time{}) }

// byeWaitMax bounds how long a goodbye waits for the ROUTER to be found
// empty while other connections keep it busy: the heartbeat timeout (a
// second without heartbeats), after which the peer's silence would have
// taken it down anyway; the frames it sent before its goodbye are read by
// then unless far more than that is queued.
func (s *listener) byeWaitMax() time.Duration {
	if t := s.l.liveTimeout(); t > 0 {
		return t
	}
	return time.Second
}

// actOnGoodbyes is goodbyes for those read no later than before (all
// when zero); the others stay pending.
func (s *listener) actOnGoodbyes(before time.Time) {
	if len(s.byes) > 0 && s.heldBytes > 0 {
		// Frames held on connections without binding (hold) came before
		// these goodbyes, as the frames the drain read did: a peer's
		// last Result held there goes first where there is room now,
		// else a drained goodbye's proof failed the request it finished.
		s.retryHeld()
	}
	kept := s.byes[:0]
	for _, g := range s.byes {
		if !before.IsZero() && g.at.After(before) {
			kept = append(kept, g) // the ROUTER still busy (afterWait)
			continue
		}
		if s.heldBytes > 0 && s.holdsFramesOf(g.b) {
			// Frames of this incarnation still wait for room (a probe
			// runs at most once a second): the goodbye waits behind
			// them, as it waits behind the frames the drain reads. They
			// are delivered, or dropped after ghostKeep, and then it is
			// acted on (afterWait runs every heldRetryEvery meanwhile).
			kept = append(kept, g)
			continue
		}
		s.goodbye(g.id, g.key, g.b, g.drained, g.reason)
	}
	clear(s.byes[len(kept):])
	s.byes = kept
}

// addBye keeps goodbye g for goodbyes, one per connection binding: a
// goodbye repeated on a connection whose goodbye still waits (behind held
// frames, up to ghostKeep) is folded into it, drained if either said so,
// with the first reason given, so that byes stays bounded by the bound
// connections however many a peer sends. Acting on a goodbye twice
// changed nothing but telling OnPeerDrained twice.
func (s *listener) addBye(g pendingBye) {
	for i := range s.byes {
		if s.byes[i].b == g.b && s.byes[i].id == g.id {
			s.byes[i].drained = s.byes[i].drained || g.drained
			if s.byes[i].reason == "" {
				s.byes[i].reason = g.reason
			}
			return
		}
	}
	s.byes = append(s.byes, g)
}

// holdsFramesOf reports whether a connection without binding holds frames
// (hold) of b's peer and incarnation.
func (s *listener) holdsFramesOf(b *binding) bool {
	for _, g := range s.ghosts {
		if len(g.held) > 0 && g.b.peer == b.peer && g.b.inc == b.inc {
			return true
		}
	}
	return false
}

// goodbye acts on a goodbye (a Heartbeat with Leaving) read on
// connection b (goodbyes), which passed the checks of every frame: bound, its sender b's PeerID,
// its incarnation b's. It is taken only for the incarnation (named: not
// 0) the directory holds for the peer, while liveness tracks it: the peer
// is then down at once, as after missed heartbeats (Hello returns
// control.ErrPeerGone saying it closed), and OnPeerGoodbye (else
// OnPeerDown) is told, once, with the goodbye's reason (reason, "" when
// it gave none; logged too); from then on the frames of that incarnation
// are no sign of life. The goodbye of an incarnation that left the
// cluster (RemovePeer), or of a peer already down, is no news and
// ignored. Any other goodbye is rejected (RejectGoodbye) and changes
// nothing: it makes no entry and tracks no one.
//
// A drained goodbye (drained) that is taken, ignored as no news, or
// rejected only as liveness news (an incarnation the directory no longer
// holds: a successor said Hello first, or the directory forgot the peer)
// is also a proof: OnPeerDrained is told, after any Down, that this
// incarnation writes no more. It is the connection's own word, as a
// Result on it is (bound to the incarnation its Hello named, from a key
// that may speak for the peer), and it is about that incarnation alone:
// its liveness news may be old or another's, its proof is not. One
// rejected by the checks every frame passes (identity, sender, no
// Hello), or on a connection whose Hello named no incarnation, proves
// nothing.
func (s *listener) goodbye(id, key string, b *binding, drained bool, reason string) {
	l := s.l
	if b.inc == 0 {
		// Without incarnations, a process's goodbye could not be told
		// from its successor's name: it could take the successor down.
		s.reject(RejectGoodbye, id, key, b, "goodbye of %s on a connection whose Hello named no incarnation: ignored", b.peer)
		return
	}
	if l.departedInc(b.peer, b.inc) {
		// It left the cluster already (etcd: its lease revoke, which a
		// closing node says first) and is down: the goodbye is its own,
		// and no news, but for the reason it may give (why it exits),
		// which OnPeerGoodbye hears (not OnPeerDown: no down is news).
		l.log.Debug().Stringer("peer", b.peer).Uint64("incarnation", b.inc).Msg("control/zmq: goodbye of a peer incarnation that left the cluster")
		if reason != "" && l.cfg.OnPeerGoodbye != nil {
			l.log.Info().Stringer("peer", b.peer).Uint64("incarnation", b.inc).Str("reason", reason).
				Msg("control/zmq: the goodbye of a peer that left the cluster names why it exits")
			l.cfg.OnPeerGoodbye(b.peer, b.inc, reason)
		}
		s.drainedBye(b, drained)
		return
	}
	l.mu.Lock()
	info := l.peers[b.peer]
	var cur *messages.Hello
	if info != nil {
		cur = info.hello
	}
	switch {
	case cur == nil || !s.live.tracks(b.peer):
		l.mu.Unlock()
		s.reject(RejectGoodbye, id, key, b, "goodbye of %s, whose Hello the directory does not hold: ignored", b.peer)
		s.drainedBye(b, drained) // no liveness news, but its own word
		return
	case cur.Incarnation != b.inc:
		l.mu.Unlock()
		s.reject(RejectGoodbye, id, key, b, "goodbye of %s's incarnation %d on a connection of its Hello, the directory holding incarnation %d: ignored",
			b.peer, b.inc, cur.Incarnation)
		s.drainedBye(b, drained) // no liveness news, but its own word
		return
	}
	if !s.live.leave(b.peer, b.inc) {
		l.mu.Unlock()
		s.drainedBye(b, drained) // down already, and told so
		return
	}
	info.down, info.left, info.leftWhy = true, true, reason
	l.mu.Unlock()
	ev := l.log.Info().Stringer("peer", b.peer).Uint64("incarnation", b.inc)
	if reason != "" {
		ev = ev.Str("reason", reason)
	}
	ev.Msg("control/zmq: peer down (it said goodbye: its control link closed)")
	switch {
	case l.cfg.OnPeerGoodbye != nil:
		l.cfg.OnPeerGoodbye(b.peer, b.inc, reason)
	case l.cfg.OnPeerDown != nil:
		l.cfg.OnPeerDown(b.peer)
	}
	s.drainedBye(b, drained)
}

// drainedBye tells OnPeerDrained that incarnation b.inc of b.peer said,
// in a goodbye goodbye took, that its writes are over (drained); nothing
// when it did not say so.
func (s *listener) drainedBye(b *binding, drained bool) {
	if !drained {
		return
	}
	s.l.log.Info().Stringer("peer", b.peer).Uint64("incarnation", b.inc).
		Msg("control/zmq: the peer's goodbye says its writes are over (it closed after draining them)")
	if s.l.cfg.OnPeerDrained != nil {
		s.l.cfg.OnPeerDrained(b.peer, b.inc)
	}
}

// reject counts a dropped message by reason and logs it, throttled per
// (sender, reason): the connection's PeerID once it said Hello, else its
// CURVE key, else the connection.
func (s *listener) reject(r RejectReason, id, key string, b *binding, format string, args ...any) {
	s.l.stats.rejected[r].Add(1)
	who := ""
	switch {
	case b != nil:
		who = b.peer.String()
	case key != "":
		who = "key " + key
	default:
		who = fmt.Sprintf("conn %x", id)
	}
	ev := s.l.warn(who, "rejected "+r.String())
	if !ev.Enabled() {
		return
	}
	ev = ev.Hex("conn", []byte(id)).Stringer("reason", r)
	if key != "" {
		ev = ev.Str("key", key)
	}
	if b != nil {
		ev = ev.Stringer("peer", b.peer)
	}
	ev.Str("why", fmt.Sprintf(format, args...)).Msg("control/zmq: frame rejected")
}
