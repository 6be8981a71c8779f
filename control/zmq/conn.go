package zmq

import (
	"fmt"
	"sync"
	"syscall"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/internal/hoptrace"
	"github.com/kvxfer/kvxfer/messages"
)

// Retry bounds of a terminal backlog's flusher: it tries again after
// minFlushWait, doubling up to maxFlushWait while the queue stays full.
const (
	minFlushWait = time.Millisecond
	maxFlushWait = 50 * time.Millisecond
)

// Conn is one worker's connection to one peer: a DEALER, used by the
// goroutine that holds the Conn and, while a terminal backlog waits, by
// that backlog's flusher, one at a time under mu (libzmq sockets may move
// between threads across a full memory barrier). Frames arrive in the
// order Send accepted them. Send never blocks.
//
// Terminal frames (Result, Cancel, CancelAck, Misaddressed) are never refused for queue
// space: when the socket's queue (SendHWM) is full they wait, in order, in
// the Conn's terminal backlog (at most Config.TerminalBacklog frames),
// which a flusher goroutine moves into the socket as it drains. While a
// backlog waits, every later frame must queue behind it (order), so a
// RequestData is refused (ErrQueueFull) and a terminal frame joins it.
type Conn struct {
	l    *Link
	peer messages.PeerID
	info *peerInfo
	stop chan struct{} // closed by Close: the flusher ends

	mu        sync.Mutex
	sock      *zmq4.Socket
	helloInc  uint64 // the peer's incarnation when this Conn last said Hello
	helloSent bool   // this Conn's Hello went out (or waits in the backlog)
	closed    bool
	backlog   []pending     // terminal frames (and the Hellos before them) waiting for room
	dropped   int           // terminal frames accepted into the backlog and dropped unsent
	broken    error         // the socket refused for good: Send returns it
	flushing  bool          // a flusher goroutine is running
	idle      chan struct{} // closed by the flusher once the backlog left (a Close waits on it)
	flusher   sync.WaitGroup
	// enc is the buffer Send encodes into, reused frame after frame (nil
	// once the backlog took it, or when a frame outgrew maxEncBuf).
	enc []byte
	// mon reads sock's socket monitor (connWatchedEvents) until a frame
	// first leaves on sock (its handshake completed: mon is then stopped
	// and nil, as when it could not be set up); failed is the Cause of a
	// handshake of sock's that failed for good, CauseNone while none did.
	mon    *zmq4.Socket
	failed Cause
	// peerConns and redials are the peer's count of connections that
	// said Hello (peerInfo.incarnation) and of Redials when sock was
	// made: a failed sock is made again when either changes
	// (redialLocked).
	peerConns, redials uint64
	// endpoint is where sock is dialled, and moves the peer entry's count
	// of endpoint changes when it was read (peerInfo.moves): when the
	// entry's differs, the endpoint is read again (followEndpointLocked).
	endpoint string
	moves    uint64
}

// connWatchedEvents are the socket-monitor events a Conn's socket reports
// until a frame leaves on it: the handshake failures after which libzmq
// ends the session and never dials it again (so at most one per socket).
const connWatchedEvents = zmq4.EVENT_HANDSHAKE_FAILED_AUTH | zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL

// maxEncBuf is the largest encode buffer a Conn keeps for the next frame:
// a rare large frame's buffer is not held for the Conn's life.
const maxEncBuf = 64 << 10

var _ control.Conn = (*Conn)(nil)

// pending is one frame in a terminal backlog: a terminal frame, or a
// Hello queued before one.
type pending struct {
	b        []byte
	terminal bool
}

// dropBacklogLocked drops the backlog and counts the terminal frames in
// it as dropped unsent (Stats.TerminalDropped; Close reports them).
// Callers hold c.mu.
func (c *Conn) dropBacklogLocked() int {
	n := 0
	for _, p := range c.backlog {
		if p.terminal {
			n++
		}
	}
	c.backlog = nil
	if n > 0 {
		c.dropped += n
		c.l.stats.terminalDropped.Add(int64(n))
	}
	return n
}

// Peer is the peer this Conn sends to.
func (c *Conn) Peer() messages.PeerID { return c.peer }

// Send implements control.Conn: it encodes f and queues it without
// blocking. It returns ErrQueueFull when the send queue is full (the peer
// is slow or unreachable) for a RequestData, or, as
// ErrTerminalBacklogFull, for a terminal frame when the terminal backlog
// is full too (that frame is never sent); ErrFrameTooLarge past
// MaxFrameBytes, ours or the one the peer's Hello said; a messages.ErrInvalid error for an invalid frame;
// ErrTerminalDropped once the socket failed for good and dropped the
// backlog; and control.ErrClosed after Close (of the Conn or the Link).
//
// An ErrQueueFull leaves the Conn usable, and what it queued before
// stays queued: closing the Conn on it would drop that.
func (c *Conn) Send(f messages.Frame) error {
	if c.l.closing.Load() {
		return fmt.Errorf("%w: send to %s", control.ErrClosed, c.peer)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Encoded into the Conn's buffer (under mu: a flusher, or another
	// sender, never sees it): zmq_send copies the bytes into its own
	// message before it returns, so once sent or refused the buffer is
	// free for the next frame. Only a frame the backlog keeps takes it.
	b, err := appendEncode(c.enc[:0], f)
	if err != nil {
		return fmt.Errorf("control/zmq: send to %s: %w", c.peer, err)
	}
	if cap(b) <= maxEncBuf {
		c.enc = b
	}
	if hoptrace.On {
		hoptrace.Mark(fmt.Sprintf("zmq.encoded.%T", f), f.Request())
	}
	if len(b) > c.l.cfg.MaxFrameBytes {
		return fmt.Errorf("%w: send %T of request %q to %s: %d bytes exceeds MaxFrameBytes %d",
			ErrFrameTooLarge, f, f.Request(), c.peer, len(b), c.l.cfg.MaxFrameBytes)
	}
	if c.info.removed.Load() {
		c.followLocked()
	}
	if c.info.moves.Load() != c.moves {
		c.followEndpointLocked()
	}
	// The peer's listener would drop a frame past the limit its Hello
	// said (oversize), and every frame of ours after a Hello of ours past
	// it (no_hello), unseen here: the request would wait for its
	// deadline. Refused instead, naming both limits.
	if peerMax := c.info.maxFrame.Load(); peerMax > 0 {
		if int64(len(b)) > peerMax {
			return fmt.Errorf("%w: send %T of request %q to %s: %d bytes exceeds the peer's MaxFrameBytes %d (its Hello; ours is %d)",
				ErrFrameTooLarge, f, f.Request(), c.peer, len(b), peerMax, c.l.cfg.MaxFrameBytes)
		}
		if int64(len(c.l.selfHello)) > peerMax {
			return fmt.Errorf("%w: send %T of request %q to %s: our Hello of %d bytes exceeds the peer's MaxFrameBytes %d (its Hello): it takes no frame of ours",
				ErrFrameTooLarge, f, f.Request(), c.peer, len(c.l.selfHello), peerMax)
		}
	}
	if c.closed {
		return fmt.Errorf("%w: send to %s", control.ErrClosed, c.peer)
	}
	if c.broken != nil {
		return c.broken
	}
	// The peer said Hello on a connection we had not seen: it may have
	// restarted and forgotten ours, so say Hello again before this frame.
	inc := c.info.incarnation.Load()
	needHello := !c.helloSent || inc != c.helloInc
	if len(c.backlog) == 0 {
		err := error(nil)
		if needHello {
			if err = c.trySendLocked(c.l.selfHello, "Hello"); err == nil {
				c.helloInc, c.helloSent, needHello = inc, true, false
			}
		}
		if err == nil {
			if err = c.trySendLocked(b, f); err == nil {
				if hoptrace.On {
					hoptrace.Mark(fmt.Sprintf("zmq.sent.%T", f), f.Request())
				}
				return nil
			}
		}
		if !isAgain(err) {
			return err
		}
	}
	// A terminal frame (messages.Terminal) is never dropped for queue
	// space. A Misaddressed is one: it is the only answer a RequestData
	// addressed to an earlier incarnation gets, and it is often the first
	// frame a just-restarted context rank sends its peer, on a Conn whose
	// connection is not up yet.
	if !messages.Terminal(f) {
		c.l.stats.queueFull.Add(1)
		if len(c.backlog) > 0 {
			return fmt.Errorf("%w: %T of request %q to %s: %d frames (a Hello, terminal frames) wait in the backlog for the connection or for room (SendHWM %d)",
				ErrQueueFull, f, f.Request(), c.peer, len(c.backlog), c.l.cfg.SendHWM)
		}
		return fmt.Errorf("%w: %T of request %q to %s: not connected, or %d frames queued (SendHWM)",
			ErrQueueFull, f, f.Request(), c.peer, c.l.cfg.SendHWM)
	}
	need := 1
	if needHello {
		need++
	}
	if len(c.backlog)+need > c.l.cfg.TerminalBacklog {
		// Not queued, and nothing will send it: unlike a refused
		// RequestData, no one retries a terminal frame, so the error
		// says so (ErrTerminalBacklogFull) and is counted apart.
		c.l.stats.queueFull.Add(1)
		c.l.stats.terminalRefused.Add(1)
		return fmt.Errorf("%w: %T of request %q to %s NOT sent: %d frames wait in the backlog behind %d queued (TerminalBacklog %d): the peer has taken nothing for long",
			ErrTerminalBacklogFull, f, f.Request(), c.peer, len(c.backlog), c.l.cfg.SendHWM, c.l.cfg.TerminalBacklog)
	}
	if needHello {
		c.backlog = append(c.backlog, pending{b: c.l.selfHello})
		c.helloInc, c.helloSent = inc, true
	}
	// The backlog keeps b until its flusher sent it: the next frame gets
	// a buffer of its own.
	c.enc = nil
	c.backlogLocked(pending{b: b, terminal: true})
	c.l.stats.backlogged.Add(1)
	return nil
}

// followLocked moves c to its peer's directory entry when the one it
// was dialled with was dropped (RemovePeer: an etcd Down) and the name
// has an entry again (AddPeer, or a Hello of the peer's next
// incarnation). The dropped entry no longer hears of the peer's Hellos:
// kept on it, c would never say Hello again, and the next incarnation,
// reached at the same endpoint, would reject every frame of c as sent
// before Hello (no_hello) while Send returned nil. c says Hello before
// its next frame, and again whenever the new entry hears of a new
// connection of the peer. Callers hold c.mu (then l.mu, as redialLocked).
func (c *Conn) followLocked() {
	c.l.mu.Lock()
	cur := c.l.peers[c.peer]
	c.l.mu.Unlock()
	if cur != nil && cur != c.info {
		c.info = cur
		c.helloSent = false
		c.moves = ^cur.moves.Load() // its endpoint is compared before the frame
	}
}

// followEndpointLocked dials c's peer at its directory endpoint when it is
// not the one c's socket was dialled to (AddPeer moved the peer: its next
// incarnation listens elsewhere). Kept on the old endpoint, c never
// connected again — over ipc a socket file nobody listens on, over tcp an
// address gone — and every frame of it waited in a queue that never
// drained: a worker that had talked to the peer's previous incarnation
// could not reach the next one when its Hello came before the previous
// one's Down (the engine keeps its connections then), and every request
// timed out with "RequestData never reached writer". The backlog goes on
// the new socket, in order, after a Hello; the old socket closes with
// Close's linger for what it queued. Callers hold c.mu.
func (c *Conn) followEndpointLocked() {
	c.l.mu.Lock()
	endpoint, serverKey, redials, moves := c.info.endpoint, c.info.serverKey, c.info.redials, c.info.moves.Load()
	c.l.mu.Unlock()
	c.moves = moves
	if endpoint == "" || endpoint == c.endpoint || c.l.closing.Load() {
		return
	}
	old, oldMon, was := c.sock, c.mon, c.endpoint
	if err := c.dialLocked(endpoint, serverKey, redials); err != nil {
		c.l.warn(c.peer.String(), "move").Err(err).Stringer("peer", c.peer).Str("endpoint", endpoint).
			Msg("control/zmq: cannot dial a peer at its new endpoint: this connection stays on the old one until the next change")
		return
	}
	c.l.log.Debug().Stringer("peer", c.peer).Str("from", was).Str("endpoint", endpoint).
		Msg("control/zmq: the peer moved: connection dialled at its new endpoint")
	if old != nil {
		_ = old.Monitor("", 0)
		// What it queued is for the endpoint left (the previous
		// incarnation, if it still listens there): it gets Close's
		// linger to leave, as a Conn's Close gives it.
		_ = old.SetLinger(closeLinger)
		_ = old.Close()
	}
	closeSocket(oldMon)
	// The new connection has heard no Hello of ours.
	if len(c.backlog) > 0 {
		c.backlog = append([]pending{{b: c.l.selfHello}}, c.backlog...)
		c.helloInc, c.helloSent = c.info.incarnation.Load(), true
	} else {
		c.helloSent = false
	}
}

// backlogLocked appends b to the backlog and starts its flusher if none
// runs. Callers hold c.mu.
func (c *Conn) backlogLocked(p pending) {
	c.backlog = append(c.backlog, p)
	if !c.flushing {
		c.flushing = true
		c.flusher.Add(1)
		go c.flush()
	}
}

// dialLocked makes c's socket: a DEALER to the peer at endpoint (Link.
// newDealer, with ZMQ_IMMEDIATE) whose handshake failures a socket
// monitor reports until a frame leaves on it. redials is the peer's
// Redial count the socket answers. Callers hold c.mu, or own c alone.
func (c *Conn) dialLocked(endpoint, serverKey string, redials uint64) error {
	var mon *zmq4.Socket
	peerConns := c.info.incarnation.Load()
	sock, err := c.l.newDealer(c.peer, endpoint, serverKey, c.l.cfg.SendHWM, true, func(sock *zmq4.Socket) error {
		addr := fmt.Sprintf("inproc://kvxfer.monitor.conn.%d", c.l.connMons.Add(1))
		m, err := c.l.watchSocket(sock, addr, connWatchedEvents)
		if err != nil {
			c.l.warn(c.peer.String(), "conn monitor").Err(err).Stringer("peer", c.peer).
				Msg("control/zmq: cannot watch the handshake of a connection to peer: if the peer refuses our key, this connection is not dialed again once it admits it (the heartbeat socket still is)")
			return nil
		}
		mon = m
		return nil
	})
	if err != nil {
		closeSocket(mon) // newDealer closed sock, and its monitor with it
		return err
	}
	c.sock, c.mon, c.failed, c.peerConns, c.redials, c.endpoint = sock, mon, CauseNone, peerConns, redials, endpoint
	return nil
}

// unwatchLocked stops the monitor of c's socket and closes the PAIR that
// read it. Callers hold c.mu.
func (c *Conn) unwatchLocked() {
	if c.mon == nil {
		return
	}
	_ = c.sock.Monitor("", 0)
	closeSocket(c.mon)
	c.mon = nil
}

// redialLocked makes c's socket anew when its handshake failed for good,
// as its monitor says, and, since the socket was made, either the peer
// said Hello on a new connection of its own (it knows this link now, and
// most likely admits its key: for a refused key only, as a heartbeat
// socket's readmitted) or Redial was called for it. libzmq ends a
// session that failed at authentication (ZAP) or on a protocol error and
// never dials it again: the Conn would stay silent for good. The flusher
// calls it while the backlog's first frame cannot leave. A socket whose
// monitor still runs never took a frame (the monitor stops at the first,
// and ZMQ_IMMEDIATE queues none on a connection that is not up), so
// everything the Conn queued waits in its backlog, its Hello first, and
// goes on the new connection, in order; the old socket closes at once.
// A socket that cannot be made leaves the old one, until the next
// change. Callers hold c.mu.
func (c *Conn) redialLocked() {
	if c.mon == nil || c.l.closing.Load() {
		return
	}
	for range maxBatch {
		ev, _, value, err := c.mon.RecvEvent(zmq4.DONTWAIT)
		if err != nil {
			break
		}
		switch ev {
		case zmq4.EVENT_HANDSHAKE_FAILED_AUTH:
			c.failed = CauseKeyRefused
		case zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL:
			c.failed = protocolCause(value)
		}
	}
	if c.failed == CauseNone {
		return
	}
	inc := c.info.incarnation.Load()
	c.l.mu.Lock()
	endpoint, serverKey, redials := c.info.endpoint, c.info.serverKey, c.info.redials
	c.l.mu.Unlock()
	readmitted := c.failed == CauseKeyRefused && inc != c.peerConns
	if endpoint == "" || !readmitted && redials == c.redials {
		return
	}
	old, oldMon, failed := c.sock, c.mon, c.failed
	if err := c.dialLocked(endpoint, serverKey, redials); err != nil {
		c.peerConns, c.redials = inc, redials // not again before the next change
		c.l.warn(c.peer.String(), "redial").Err(err).Stringer("peer", c.peer).Stringer("cause", failed).
			Msg("control/zmq: cannot dial a peer again whose handshake failed: this connection stays silent until the peer says Hello anew or Redial")
		return
	}
	c.l.log.Debug().Stringer("peer", c.peer).Str("endpoint", endpoint).Stringer("cause", failed).Bool("readmitted", readmitted).
		Msg("control/zmq: dialing a connection again whose handshake failed for good")
	_ = old.Monitor("", 0)
	closeSocket(oldMon)
	closeSocket(old)
}

// sayHello queues the Conn's first Hello: at once when the connection is
// up, else first in the backlog, which the flusher sends as soon as the
// handshake completes (so the peer learns who dialled it even before a
// frame follows).
func (c *Conn) sayHello(hello []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.trySendLocked(hello, "Hello")
	if isAgain(err) {
		c.backlogLocked(pending{b: hello})
		err = nil
	}
	if err == nil {
		c.helloSent = true
	}
	return err
}

// flush is a backlog's flusher: it moves the backlog into the socket as
// the queue drains, retrying with backoff, and ends when the backlog is
// empty or the Conn or the Link is closed.
func (c *Conn) flush() {
	defer c.flusher.Done()
	wait := minFlushWait
	for {
		c.mu.Lock()
		moved := false
		for len(c.backlog) > 0 && !c.closed {
			err := c.trySendLocked(c.backlog[0].b, "backlog")
			if isAgain(err) {
				c.redialLocked() // a socket refused for good
				if c.info.moves.Load() != c.moves {
					c.followEndpointLocked() // the peer moved
				}
				break
			}
			if err != nil {
				// The socket refuses for good (the context is ending): the
				// backlog is lost, and so is the Conn; its next Send and
				// its Close say so.
				n := c.dropBacklogLocked()
				c.broken = &control.FramesDropped{N: c.dropped, Err: fmt.Errorf("%w: %d terminal frames to %s never left (the socket refused them for good, %v): their peers' requests get no answer from us",
					ErrTerminalDropped, c.dropped, c.peer, err)}
				c.l.warn(c.peer.String(), "backlog").Err(err).Int("dropped", n).
					Msg("control/zmq: terminal backlog dropped")
				break
			}
			c.backlog[0] = pending{}
			c.backlog = c.backlog[1:]
			moved = true
		}
		if len(c.backlog) == 0 || c.closed {
			c.dropBacklogLocked() // empty, or Close counted it
			c.flushing = false
			if c.idle != nil { // a Close waits for the backlog to leave
				close(c.idle)
				c.idle = nil
			}
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if moved {
			wait = minFlushWait
		} else if wait < maxFlushWait {
			wait *= 2
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.stop:
			t.Stop()
		case <-c.l.done:
			t.Stop()
			c.mu.Lock()
			c.dropBacklogLocked()
			c.flushing = false
			c.mu.Unlock()
			return
		}
	}
}

// trySendLocked queues one encoded frame without blocking; a full queue
// returns the bare EAGAIN (isAgain). Callers hold c.mu.
//
// libzmq learns that the I/O thread has taken queued messages from
// commands that a send processes at most about once a millisecond, so a
// burst can find the queue "full" when it is not. On EAGAIN, reading
// ZMQ_EVENTS processes those commands at once; if the socket then says it
// can send, the frame is tried once more.
//
// what names the frame in an error: a string, or the frame itself (its
// type is formatted only on error, not on every send).
func (c *Conn) trySendLocked(b []byte, what any) error {
	_, err := c.sock.SendBytes(b, zmq4.DONTWAIT)
	if isAgain(err) {
		if ev, e := c.sock.GetEvents(); e == nil && ev&zmq4.POLLOUT != 0 {
			_, err = c.sock.SendBytes(b, zmq4.DONTWAIT)
		}
	}
	switch {
	case err == nil:
		if c.mon != nil {
			// The handshake completed (ZMQ_IMMEDIATE): its failures are
			// no news any more.
			c.unwatchLocked()
		}
		return nil
	case isAgain(err):
		return err
	}
	if _, ok := what.(string); !ok {
		what = fmt.Sprintf("%T", what)
	}
	return fmt.Errorf("control/zmq: send %s to %s: %w", what, c.peer, err)
}

// closeLinger bounds how long Close lets the frames queued before it (a
// drained session's last Result or CancelAck, often in the terminal
// backlog of a connection still handshaking) take to leave: first the
// backlog's flusher, then the socket's linger, which the zmq context's end
// waits out. Without it the peer of a process that closes right after its
// last request never learns that request's outcome.
const closeLinger = 500 * time.Millisecond

// Close implements control.Conn. Frames queued before it get up to
// closeLinger to leave (less once the Link is closing); what is left then
// is dropped. Close returns an ErrTerminalDropped error naming the peer
// and the count when terminal frames that Send had accepted into the
// backlog were dropped unsent (now or earlier: the Link closed, the
// socket failed): the requests they answer get no answer from us.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	if c.flushing && len(c.backlog) > 0 && !c.l.closing.Load() {
		idle := make(chan struct{})
		c.idle = idle
		c.mu.Unlock()
		t := time.NewTimer(closeLinger)
		select {
		case <-idle:
		case <-t.C:
		case <-c.l.done:
		}
		t.Stop()
		c.mu.Lock()
		c.idle = nil
		if c.closed {
			c.mu.Unlock()
			return nil
		}
	}
	c.closed = true
	c.dropBacklogLocked()
	if c.sock != nil {
		c.unwatchLocked()
		_ = c.sock.SetLinger(closeLinger)
		_ = c.sock.Close()
	}
	close(c.stop)
	c.mu.Unlock()
	c.flusher.Wait()
	c.l.release()
	// The flusher has ended: c.dropped is final.
	c.mu.Lock()
	dropped := c.dropped
	c.mu.Unlock()
	if dropped > 0 {
		return &control.FramesDropped{N: dropped, Err: fmt.Errorf("%w: %d terminal frames (Result, Cancel, CancelAck, Misaddressed) to %s were accepted and never left: the peer took nothing until the Conn or the Link closed",
			ErrTerminalDropped, dropped, c.peer)}
	}
	return nil
}

// isAgain reports whether a non-blocking zmq call found nothing to do
// (EAGAIN): a full send queue, or no message to receive.
func isAgain(err error) bool {
	return err != nil && zmq4.AsErrno(err) == zmq4.Errno(syscall.EAGAIN)
}
