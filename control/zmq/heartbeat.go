package zmq

import (
	"fmt"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/messages"
)

// beatSock is the heartbeat goroutine's DEALER to one peer and the PAIR
// socket that receives its monitor events.
type beatSock struct {
	peer      messages.PeerID
	sock      *zmq4.Socket
	mon       *zmq4.Socket // nil when the monitor could not be set up
	endpoint  string
	serverKey string
	info      *peerInfo
	helloInc  uint64
	redials   uint64
	// peerConns is the count of the peer's connections that said Hello
	// (peerInfo.incarnation) when this socket was made (readmitted).
	peerConns uint64
	needHello bool
	watch     connWatch
}

// readmitted reports whether s was refused at the peer's authentication
// (ZAP) and the peer has since said Hello on a new connection of its own:
// it knows this link now, and most likely admits its key (a registry told
// it of this link only after this link dialed it). libzmq does not retry
// a session refused at authentication, so refresh makes the socket anew,
// once for each such connection: a peer that keeps refusing is not
// redialed again until it connects anew.
func (s *beatSock) readmitted() bool {
	return s.watch.state.Conn == ConnHandshakeFailed && s.watch.state.Cause == CauseKeyRefused &&
		s.info.incarnation.Load() != s.peerConns
}

// beater is the state of the heartbeat goroutine, which alone touches its
// sockets (DEALERs and their monitors' PAIRs).
type beater struct {
	l     *Link
	self  messages.PeerID
	inc   uint64 // self's incarnation, as its Hello names it
	hello []byte
	socks map[messages.PeerID]*beatSock
	// failed remembers peers whose socket could not be made, to log once.
	failed map[messages.PeerID]bool
	seq    uint64
	monSeq uint64
}

// beat is the heartbeat goroutine: every interval it (re)connects to the
// directory's peers and sends each a Heartbeat, preceded by the link's
// Hello on a new socket, when the peer has a new incarnation, and every
// HeartbeatMisses beats. Between beats it reads the sockets' monitor
// events (PeerState). When stop is closed it leaves the sockets of the
// peers it is connected to for Link.Close to say goodbye on (park).
func (l *Link) beat(stop <-chan struct{}, self messages.PeerID, hello []byte) {
	defer l.wg.Done()
	l.mu.Lock()
	inc := l.self.Incarnation
	l.mu.Unlock()
	b := &beater{l: l, self: self, inc: inc, hello: hello, socks: map[messages.PeerID]*beatSock{}, failed: map[messages.PeerID]bool{}}
	defer b.closeAll()
	next := time.Now()
	for {
		if now := time.Now(); !now.Before(next) {
			b.refresh()
			b.send()
			next = now.Add(l.cfg.HeartbeatInterval)
		}
		select {
		case <-stop:
			b.park()
			return
		default:
		}
		if err := b.watch(b.watchFor(time.Until(next)), stop); err != nil {
			l.log.Error().Err(err).Msg("control/zmq: heartbeat poll failed; heartbeats stop")
			return
		}
	}
}

// beatPoll bounds one wait of the heartbeat goroutine while a peer's
// connection is not up (watchFor), so that it reads its monitors' events
// (PeerState: for people and redials, not for liveness) within it; Close
// ends a wait at once. Each wait is a wake of an idle process: two
// connected idle nodes cost 4.3 % of a CPU at 10 ms, 2.6 % at 100 ms
// (node's BenchmarkIdlePair, BENCHMARKS.md).
const beatPoll = 100 * time.Millisecond

// watchFor is how long the heartbeat goroutine may sleep before it reads
// its monitors again, the next beat being untilBeat away: until the beat
// while every peer's connection is up (what a monitor could still say —
// the connection dropped — waits a beat; liveness does not hang on it),
// at most beatPoll while one is connecting, failed or down, so that a
// handshake's outcome reaches PeerState (and WaitPeers, and the etcd
// redial) within it.
func (b *beater) watchFor(untilBeat time.Duration) time.Duration {
	for _, s := range b.socks {
		if s.watch.state.Conn != ConnUp {
			return min(untilBeat, beatPoll)
		}
	}
	return untilBeat
}

// watch applies the monitor events waiting, then sleeps d or until stop.
//
// It polls the monitors without blocking and sleeps in Go rather than in
// zmq_poll: a goroutine blocked in a cgo call keeps its P (see sockWait),
// and on a two-core machine that P is half the engine's.
func (b *beater) watch(d time.Duration, stop <-chan struct{}) error {
	if d < time.Millisecond {
		d = time.Millisecond
	}
	poller := zmq4.NewPoller()
	byMon := make(map[*zmq4.Socket]*beatSock, len(b.socks))
	for _, s := range b.socks {
		if s.mon != nil {
			poller.Add(s.mon, zmq4.POLLIN)
			byMon[s.mon] = s
		}
	}
	if len(byMon) == 0 {
		sleep(d, stop)
		return nil
	}
	polled, err := poller.Poll(0)
	if err != nil {
		return err
	}
	for _, p := range polled {
		if s := byMon[p.Socket]; s != nil {
			b.events(s)
		}
	}
	now := b.l.cfg.Clock()
	for _, s := range byMon {
		if s.watch.stalled(now) {
			b.publish(s)
		}
	}
	sleep(d, stop)
	return nil
}

// sleep waits d, or until stop is closed.
func sleep(d time.Duration, stop <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
	case <-t.C:
	}
}

// events applies the monitor events waiting for s.
func (b *beater) events(s *beatSock) {
	for range maxBatch {
		ev, _, value, err := s.mon.RecvEvent(zmq4.DONTWAIT)
		if err != nil {
			if !isAgain(err) {
				b.l.log.Warn().Err(err).Stringer("peer", s.peer).Msg("control/zmq: reading a socket monitor")
			}
			return
		}
		if s.watch.step(ev, value, b.l.cfg.Clock()) {
			b.publish(s)
		}
	}
}

// publish makes s's connection state the peer's PeerState, unless a newer
// socket superseded s, and logs the change.
func (b *beater) publish(s *beatSock) {
	st := s.watch.state
	b.l.mu.Lock()
	if s.info.endpoint == s.endpoint && s.info.redials == s.redials { // not superseded
		s.info.conn = st
	}
	b.l.mu.Unlock()
	b.logState(s.peer, st)
}

// logState logs a change of a peer's connection state: a failed handshake
// at warn (throttled), naming the likely mistake; the rest at debug, but
// a recovery at info.
func (b *beater) logState(peer messages.PeerID, st PeerState) {
	switch st.Conn {
	case ConnHandshakeFailed:
		what, hint := "CURVE handshake", fmt.Sprintf("is %s's public key right? is one side --insecure?", peer)
		if b.l.cfg.Insecure {
			// No key to get wrong on this side.
			what, hint = "handshake (insecure)", "is the peer --insecure too?"
		}
		ev := b.l.warn(peer.String(), "handshake failed")
		if ev == nil {
			return
		}
		ev.Stringer("peer", peer).Str("endpoint", st.Endpoint).Str("reason", st.Reason).
			Msgf("control/zmq: %s with %s at %s failed: %s (%s)", what, peer, st.Endpoint, st.Reason, hint)
	case ConnUp:
		b.l.log.Debug().Stringer("peer", peer).Str("endpoint", st.Endpoint).Msg("control/zmq: connected to peer")
	default:
		b.l.log.Debug().Stringer("peer", peer).Str("endpoint", st.Endpoint).Stringer("state", st).Msg("control/zmq: peer connection")
	}
}

// refresh makes a socket for every directory peer with an endpoint,
// remakes one whose endpoint or server key changed, that is a new
// directory entry (a peer removed and added again), that Redial asked for,
// or that the peer refused before it said Hello to this link (readmitted),
// and closes those of peers no longer in the directory (RemovePeer) or
// without an endpoint.
func (b *beater) refresh() {
	type want struct {
		endpoint, serverKey string
		redials             uint64
		info                *peerInfo
	}
	wants := map[messages.PeerID]want{}
	b.l.mu.Lock()
	for id, info := range b.l.peers {
		if id != b.self && info.endpoint != "" {
			wants[id] = want{info.endpoint, info.serverKey, info.redials, info}
		}
	}
	b.l.mu.Unlock()
	defer func() { b.l.beating.Store(int64(len(b.socks))) }()
	for id, s := range b.socks {
		if _, ok := wants[id]; !ok {
			s.close()
			delete(b.socks, id)
		}
	}
	for id := range b.failed {
		if _, ok := wants[id]; !ok {
			delete(b.failed, id)
		}
	}
	for id, w := range wants {
		old := b.socks[id]
		same := old != nil && old.info == w.info && old.endpoint == w.endpoint && old.serverKey == w.serverKey && old.redials == w.redials
		if same && !old.readmitted() {
			continue
		}
		if same {
			b.l.log.Info().Stringer("peer", id).Str("endpoint", w.endpoint).
				Msg("control/zmq: dialing a peer again that refused our key and has said Hello since (it admits it now?)")
		}
		if old != nil {
			old.close()
			delete(b.socks, id)
		}
		now := b.l.cfg.Clock()
		s := &beatSock{peer: id, endpoint: w.endpoint, serverKey: w.serverKey, redials: w.redials, info: w.info, needHello: true,
			peerConns: w.info.incarnation.Load(),
			watch:     connWatch{secure: !b.l.cfg.Insecure, state: PeerState{Conn: ConnConnecting, Endpoint: w.endpoint, Since: now}}}
		sock, err := b.l.newDealer(id, w.endpoint, w.serverKey, b.l.cfg.HeartbeatMisses+2, false, func(sock *zmq4.Socket) error {
			if err := b.monitor(s, sock); err != nil {
				b.l.log.Warn().Err(err).Stringer("peer", id).Msg("control/zmq: cannot watch the connection to peer; its handshake errors go unreported")
			}
			return nil
		})
		if err != nil {
			if s.mon != nil {
				closeSocket(s.mon)
			}
			b.l.mu.Lock()
			w.info.connErr = err
			b.l.mu.Unlock()
			if !b.failed[id] {
				b.failed[id] = true
				b.l.log.Warn().Err(err).Stringer("peer", id).Msg("control/zmq: cannot heartbeat peer")
			}
			continue
		}
		delete(b.failed, id)
		s.sock = sock
		b.l.mu.Lock()
		w.info.connErr = nil
		w.info.conn = s.watch.state
		b.l.mu.Unlock()
		b.socks[id] = s
	}
}

// monitor attaches a socket monitor to s's DEALER sock and connects a
// PAIR to it, from which watch reads the handshake events. It runs before
// the DEALER connects, so that no event is missed.
func (b *beater) monitor(s *beatSock, sock *zmq4.Socket) error {
	b.monSeq++
	mon, err := b.l.watchSocket(sock, fmt.Sprintf("inproc://kvxfer.monitor.beat.%d", b.monSeq), watchedEvents)
	if err != nil {
		return fmt.Errorf("control/zmq: monitor of %s: %w", s.peer, err)
	}
	s.mon = mon
	return nil
}

// watchSocket attaches a socket monitor of events to sock, before it
// connects, at the inproc address addr (unique in the link's context),
// and returns the PAIR connected to it, from which its owner reads them
// (RecvEvent). Stop the monitor (sock.Monitor("", 0)) before closing
// either socket.
func (l *Link) watchSocket(sock *zmq4.Socket, addr string, events zmq4.Event) (*zmq4.Socket, error) {
	if err := sock.Monitor(addr, events); err != nil {
		return nil, err
	}
	mon, err := l.zctx.NewSocket(zmq4.PAIR)
	if err == nil {
		err = mon.SetLinger(0)
	}
	if err == nil {
		err = mon.Connect(addr)
	}
	if err != nil {
		closeSocket(mon)
		_ = sock.Monitor("", 0)
		return nil, err
	}
	return mon, nil
}

// close stops the monitor and closes both sockets.
func (s *beatSock) close() {
	if s.mon != nil {
		_ = s.sock.Monitor("", 0)
	}
	closeSocket(s.sock)
	closeSocket(s.mon)
}

// send sends one round of heartbeats. A full queue (peer unreachable)
// drops the beat: the peer will see silence, which is the truth.
func (b *beater) send() {
	b.seq++
	beat, err := encode(&messages.Heartbeat{From: b.self, Seq: b.seq, FromIncarnation: b.inc})
	if err != nil {
		b.l.log.Error().Err(err).Msg("control/zmq: encoding a heartbeat")
		return
	}
	periodic := b.seq%uint64(b.l.cfg.HeartbeatMisses) == 0
	for _, s := range b.socks {
		inc := s.info.incarnation.Load()
		if s.needHello || inc != s.helloInc || periodic {
			if _, err := s.sock.SendBytes(b.hello, zmq4.DONTWAIT); err != nil {
				continue
			}
			s.needHello, s.helloInc = false, inc
		}
		_, _ = s.sock.SendBytes(beat, zmq4.DONTWAIT)
	}
}

func (b *beater) closeAll() {
	for id, s := range b.socks {
		s.close()
		delete(b.socks, id)
	}
	b.l.beating.Store(0)
}

// goodbyeLinger bounds how long the goodbyes Link.Close sends may wait to
// leave (ZMQ_LINGER of the heartbeat sockets they go on): the zmq
// context's end (Close, or the last Conn's Close) waits at most this for
// them, and a goodbye to a peer that is gone is dropped then.
const goodbyeLinger = 200 * time.Millisecond

// goodbyes are the heartbeat sockets the heartbeat goroutine left, as it
// stopped, for Link.Close to say goodbye on, and the goodbye: hb, with
// Drained set when the link's owner said its writes are over
// (Link.MarkDrained) and its reason (Link.SetGoodbyeReason) by the time
// Close sends it.
type goodbyes struct {
	hb    messages.Heartbeat
	socks []*zmq4.Socket
	// waiting are the sockets whose connection was not up, or had not
	// carried our Hello, to peers heard from (awaitable), as the
	// goroutine stopped with a reason given:
	// Close waits for them (awaitGoodbyes), with their monitors, and says
	// hello (our Hello) and then the goodbye on each that comes up.
	waiting []*beatSock
	hello   []byte
}

// goodbyeWaitFloor is the least goodbyeWait is (a variable for tests).
var goodbyeWaitFloor = time.Second

// goodbyeWait bounds how long Link.Close waits, before it returns, for
// the heartbeat connections that were not up as the link stopped to come
// up and carry a goodbye that names a reason (awaitGoodbyes): two of
// libzmq's reconnect intervals at their longest (reconnectMax, at most a
// second), so that a peer that starts listening meanwhile is tried at
// least once more and has time for its handshake, but never less than
// goodbyeWaitFloor (1 s), the time a CURVE handshake with a peer on a
// loaded machine may take when heartbeats are fast. So 1 to 2 s (2 s at
// the default interval): spent only by a close on an error its owner
// found, and only while such a connection, to a peer heard from, is
// neither up nor failed.
func (c *Config) goodbyeWait() time.Duration {
	return max(2*c.reconnectMax(), goodbyeWaitFloor)
}

// goodbyePoll is how often awaitGoodbyes reads the monitors of the
// connections it waits for.
const goodbyePoll = 10 * time.Millisecond

// park ends the heartbeat goroutine's sockets as the link stops: when
// the link's Hello names an incarnation, the DEALERs to peers whose
// connection is up (as its monitor last said, after the events waiting
// are read) and that heard our Hello on it are left to Link.Close
// (Link.byes), which sends each a goodbye. When the link's owner gave a
// reason (SetGoodbyeReason) by then, the sockets are first brought up to
// the directory (refresh), and the others it may still reach and whose
// peer it heard from (awaitable) are left too, with their monitors:
// Close waits, bounded, for them to come up (awaitGoodbyes). The rest, and every other monitor, are
// closed (closeAll). The goodbye waits for Link.Close, not for the
// listener's Close: an engine closes its listener before its workers
// send their last frames, which a goodbye sent then would overtake.
func (b *beater) park() {
	if b.inc == 0 {
		return // no goodbye is taken from a Hello without incarnation
	}
	reason := b.l.byeReason.Load() != nil
	if reason {
		// The sockets the next beat would make: a peer's added since the
		// last, one the peer refused at authentication and has said
		// Hello since (readmitted).
		b.refresh()
	}
	g := &goodbyes{hb: messages.Heartbeat{From: b.self, Seq: b.seq + 1, FromIncarnation: b.inc, Leaving: true}}
	for id, s := range b.socks {
		if s.mon != nil {
			b.events(s)
		}
		if s.watch.state.Conn != ConnUp || s.needHello {
			if reason && b.awaitable(s) {
				g.waiting = append(g.waiting, s)
				delete(b.socks, id)
			}
			continue
		}
		if s.mon != nil {
			_ = s.sock.Monitor("", 0)
			closeSocket(s.mon)
		}
		g.socks = append(g.socks, s.sock)
		delete(b.socks, id)
	}
	if len(g.socks)+len(g.waiting) == 0 {
		return
	}
	g.hello = b.hello
	b.l.mu.Lock()
	b.l.byes = g
	b.l.mu.Unlock()
}

// awaitable reports whether a goodbye with a reason waits for s, whose
// connection is not up or has not carried our Hello: its monitor says
// when it comes up, its handshake has not failed (libzmq does not retry
// one that failed on a protocol error), its peer was heard from (it said
// Hello on this link, under its name or, misnamed, under another its key
// may not speak for: a peer never heard from, most often a static peer
// that never started, is not waiting for us, and the close would wait
// for it in vain; one that starts meanwhile learns the close from missed
// heartbeats), and its peer did not say goodbye itself (its link closed:
// nothing would answer).
func (b *beater) awaitable(s *beatSock) bool {
	if s.mon == nil || s.watch.state.Conn == ConnHandshakeFailed {
		return false
	}
	if s.info.incarnation.Load() == 0 {
		if _, misnamed := b.l.MisnamedHello(s.peer, time.Time{}); !misnamed {
			return false
		}
	}
	b.l.mu.Lock()
	defer b.l.mu.Unlock()
	return !s.info.left
}

// sayGoodbye sends the goodbye on each socket the heartbeat goroutine
// parked, without waiting, and closes them with goodbyeLinger (the rest
// of the wait falls to the context's end): a drained goodbye when the
// link's owner said its writes are over (MarkDrained), naming the reason
// it gave (SetGoodbyeReason). Then, with a reason, it waits for the
// connections that were not up (awaitGoodbyes). Best effort: a goodbye
// the socket cannot queue is dropped, and the peer learns the close from
// missed heartbeats as before (and gets no proof from it).
func (l *Link) sayGoodbye() {
	l.mu.Lock()
	g := l.byes
	l.byes = nil
	l.mu.Unlock()
	if g == nil {
		return
	}
	hb := g.hb
	hb.Drained = l.drained.Load()
	if r := l.byeReason.Load(); r != nil {
		hb.Reason = *r
	}
	frame, err := encode(&hb)
	if err != nil {
		l.log.Error().Err(err).Msg("control/zmq: encoding a goodbye")
		frame = nil // the sockets still close, at once
	}
	for _, sock := range g.socks {
		linger := time.Duration(0)
		if frame != nil {
			if _, err := sock.SendBytes(frame, zmq4.DONTWAIT); err == nil {
				linger = goodbyeLinger
			}
		}
		_ = sock.SetLinger(linger)
		_ = sock.Close()
	}
	if frame == nil || hb.Reason == "" {
		for _, s := range g.waiting {
			s.close()
		}
		return
	}
	l.awaitGoodbyes(g.waiting, g.hello, frame)
}

// awaitGoodbyes waits, at most goodbyeWait, for the heartbeat connections
// in waiting (not up, or without our Hello, as the link stopped) to come
// up, as their monitors say, and says goodbye (frame, which names a
// reason) on each that does, after our Hello (hello): a peer takes a
// goodbye only on a connection that said Hello, and may never have heard
// ours (the close came at startup, before the connection was up). The
// Hello goes again on every connection that comes up during the wait:
// what it carried before may have gone on an earlier connection. A
// connection whose handshake fails is given up at once. Those still not
// up at the end are closed without a goodbye; their peers learn the close
// from missed heartbeats, without the reason.
func (l *Link) awaitGoodbyes(waiting []*beatSock, hello, frame []byte) {
	wait := l.cfg.goodbyeWait()
	deadline := time.Now().Add(wait)
	for _, s := range waiting {
		s.needHello = true
	}
	for {
		rest := waiting[:0]
		for _, s := range waiting {
			if !l.sayGoodbyeOn(s, hello, frame) {
				rest = append(rest, s)
			}
		}
		waiting = rest
		left := time.Until(deadline)
		if len(waiting) == 0 || left <= 0 {
			break
		}
		sleep(min(left, goodbyePoll), nil)
	}
	for _, s := range waiting {
		l.log.Info().Stringer("peer", s.peer).Str("endpoint", s.endpoint).Stringer("state", s.watch.state).
			Msgf("control/zmq: no goodbye said to %s: its connection was not up within %v (it learns of the close from missed heartbeats, without the reason)", s.peer, wait)
		s.close()
	}
}

// sayGoodbyeOn reads s's monitor events and, its connection up, sends
// our Hello (once per connection) and then frame, the goodbye, on it. It
// reports whether it is done with s, which it then closed: the goodbye
// is queued (s lingers goodbyeLinger for it to leave), or the handshake
// failed.
func (l *Link) sayGoodbyeOn(s *beatSock, hello, frame []byte) (done bool) {
	for range maxBatch {
		ev, _, value, err := s.mon.RecvEvent(zmq4.DONTWAIT)
		if err != nil {
			break
		}
		s.watch.step(ev, value, l.cfg.Clock())
	}
	switch s.watch.state.Conn {
	case ConnUp:
	case ConnHandshakeFailed:
		s.close()
		return true
	default:
		s.needHello = true // a connection that comes up hears our Hello first
		return false
	}
	if s.needHello {
		if _, err := s.sock.SendBytes(hello, zmq4.DONTWAIT); err != nil {
			return false // the queue is full: again at the next poll
		}
		s.needHello = false
	}
	if _, err := s.sock.SendBytes(frame, zmq4.DONTWAIT); err != nil {
		return false
	}
	l.log.Debug().Stringer("peer", s.peer).Msg("control/zmq: goodbye said on a connection that came up as the link closed")
	_ = s.sock.Monitor("", 0)
	closeSocket(s.mon)
	_ = s.sock.SetLinger(goodbyeLinger)
	_ = s.sock.Close()
	return true
}
