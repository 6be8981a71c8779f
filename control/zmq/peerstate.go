package zmq

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// ConnState is what the link's heartbeat connection to a peer has
// reached, as libzmq's socket monitor reports it.
//
// Transitions:
//
//	Connecting      → Up | HandshakeFailed
//	Up              → Down
//	Down            → Up | HandshakeFailed
//	HandshakeFailed → Up (the peer was fixed and a reconnect succeeded)
//
// A new socket (the peer's endpoint or server key changed) starts again
// at Connecting. A peer that refused our key (ZAP) stays HandshakeFailed:
// libzmq does not retry a session refused by authentication; the socket is
// made again (Connecting) once the peer says Hello on a new connection, or
// at Redial.
type ConnState uint8

const (
	// ConnConnecting: no handshake has completed or failed yet (the peer
	// is not listening yet, or its endpoint is wrong, or it is slow).
	// PeerState.Reason says so once a connection attempt failed: nothing
	// accepted it (refusedReason).
	ConnConnecting ConnState = iota
	// ConnHandshakeFailed: the last handshake failed; PeerState.Reason
	// says why (a key that is not allowed, a wrong server key, one side
	// insecure).
	ConnHandshakeFailed
	// ConnUp: the handshake completed; frames flow.
	ConnUp
	// ConnDown: the connection was up and was lost; libzmq reconnects.
	ConnDown
)

func (s ConnState) String() string {
	switch s {
	case ConnConnecting:
		return "connecting"
	case ConnHandshakeFailed:
		return "handshake failed"
	case ConnUp:
		return "up"
	case ConnDown:
		return "down"
	}
	return fmt.Sprintf("ConnState(%d)", uint8(s))
}

// Cause classifies PeerState.Reason: which of the link's reasons it is,
// for callers to decide by (Reason's words are for people and may change).
type Cause uint8

const (
	// CauseNone: no reason (the connection is up, or nothing failed yet).
	CauseNone Cause = iota
	// CauseRefused: connection attempts fail before any handshake:
	// nothing accepts them at the endpoint (refused or unreachable), or
	// its host name has no address.
	CauseRefused
	// CauseStalled: the transport connected but the handshake has gone on
	// without a word (ConnConnecting or ConnDown: a hint while it goes on).
	CauseStalled
	// CauseHandshakeTimeout: a handshake that stayed silent ended at
	// libzmq's handshake timeout: nothing answered there.
	CauseHandshakeTimeout
	// CauseHungUp: what listens hung up during the handshake without
	// naming why (a wrong server key, a mechanism mismatch libzmq did not
	// name, or no kvxfer engine: the reason names them all).
	CauseHungUp
	// CauseMechanismMismatch: one side uses CURVE, the other does not
	// (libzmq named the mismatch).
	CauseMechanismMismatch
	// CauseCryptographic: a cryptographic error in the handshake (a wrong
	// public key on one side).
	CauseCryptographic
	// CauseKeyRefused: the peer's ZAP handler refused our public key.
	CauseKeyRefused
	// CauseProtocol: another ZeroMQ protocol error (its code in Reason).
	CauseProtocol
)

var causeNames = [...]string{"none", "refused", "stalled", "handshake_timeout", "hung_up",
	"mechanism_mismatch", "cryptographic", "key_refused", "protocol"}

func (c Cause) String() string {
	if int(c) < len(causeNames) {
		return causeNames[c]
	}
	return fmt.Sprintf("Cause(%d)", uint8(c))
}

// NamesMistake reports whether the cause names the handshake's mistake
// (a mechanism mismatch, a cryptographic error, our key refused, another
// protocol error) rather than only that what listens hung up or did not
// answer, which several mistakes share.
func (c Cause) NamesMistake() bool {
	switch c {
	case CauseMechanismMismatch, CauseCryptographic, CauseKeyRefused, CauseProtocol:
		return true
	}
	return false
}

// PeerState is the state of the link's heartbeat connection to one
// directory peer (Link.PeerState). It says whether our side can reach the
// peer; whether the peer reached us is Hello's business.
type PeerState struct {
	Conn ConnState
	// Reason says why the handshake failed (ConnHandshakeFailed), or, for
	// ConnConnecting and ConnDown, that the connection attempts fail:
	// nothing accepts them at the endpoint (empty while none failed).
	Reason string
	// Cause is which reason Reason is (CauseNone when Reason is empty):
	// decide by it, not by Reason's words.
	Cause Cause
	// Endpoint is the peer's endpoint the connection dials.
	Endpoint string
	// Since is when Conn last changed (Config.Clock).
	Since time.Time
}

func (s PeerState) String() string {
	switch {
	case s.Conn == ConnHandshakeFailed:
		return "handshake failed: " + s.Reason
	case s.Reason != "":
		return s.Conn.String() + ": " + s.Reason
	}
	return s.Conn.String()
}

// Err is nil unless the handshake failed; then it is a *HandshakeError,
// which wraps ErrHandshakeFailed and says why (CauseOf tells its Cause).
func (s PeerState) Err() error {
	if s.Conn != ConnHandshakeFailed {
		return nil
	}
	return &HandshakeError{State: s}
}

// HandshakeError is PeerState.Err's error: the state of a connection
// whose handshake failed. It wraps ErrHandshakeFailed.
type HandshakeError struct {
	State PeerState
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("%v with %s: %s", ErrHandshakeFailed, e.State.Endpoint, e.State.Reason)
}

func (e *HandshakeError) Unwrap() error { return ErrHandshakeFailed }

// CauseOf is the Cause of the first *HandshakeError in err's chain, or
// CauseNone when there is none.
func CauseOf(err error) Cause {
	var he *HandshakeError
	if errors.As(err, &he) {
		return he.State.Cause
	}
	return CauseNone
}

// PeerState reports the state of the link's heartbeat connection to peer:
// whether its handshake completed and, if it failed, why. It is known only
// while the link listens with heartbeats on (ErrNotListening,
// ErrNoHeartbeats otherwise); a peer without an endpoint in the directory
// is control.ErrPeerGone; a peer the link cannot dial (no CURVE server
// key) returns that error (ErrNoServerKey).
func (l *Link) PeerState(peer messages.PeerID) (PeerState, error) {
	if !l.cfg.heartbeats() {
		return PeerState{}, fmt.Errorf("%w: the state of %s is watched on its heartbeat connection", ErrNoHeartbeats, peer)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.self == nil {
		return PeerState{}, fmt.Errorf("%w: state of %s", ErrNotListening, peer)
	}
	info := l.peers[peer]
	if info == nil || info.endpoint == "" || peer == l.self.From {
		return PeerState{}, fmt.Errorf("%w: %s: no endpoint in the directory", control.ErrPeerGone, peer)
	}
	if info.connErr != nil {
		return PeerState{}, info.connErr
	}
	st := info.conn
	if st.Endpoint != info.endpoint { // not dialled yet, or moved
		st = PeerState{Conn: ConnConnecting, Endpoint: info.endpoint, Since: st.Since}
	}
	return st, nil
}

// watchedEvents are the socket-monitor events a heartbeat socket reports.
const watchedEvents = zmq4.EVENT_CONNECTED | zmq4.EVENT_DISCONNECTED | zmq4.EVENT_HANDSHAKE_SUCCEEDED |
	zmq4.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq4.EVENT_HANDSHAKE_FAILED_AUTH |
	zmq4.EVENT_CONNECT_RETRIED

// connWatch turns a heartbeat socket's monitor events into its PeerState.
// It is pure (time comes in) and owned by the heartbeat goroutine.
type connWatch struct {
	state       PeerState
	handshaking bool // the transport is connected, the handshake not done
	secure      bool
	// named is when a handshake last failed with a reason that names the
	// mistake (a protocol error, a refused key); zero when none since the
	// last handshake that succeeded.
	named time.Time
	// connected is when the transport last connected (EVENT_CONNECTED):
	// the handshake began then.
	connected time.Time
	// silent: the handshake begun at connected has gone on for
	// handshakeStall without a word (stalled).
	silent bool
	// spoke: a handshake completed on this socket before (its endpoint
	// has a ZeroMQ peer behind it, or had one).
	spoke bool
}

// namedHold is how long a named handshake failure outlasts bare hang-ups.
// Against a server of another mechanism libzmq reports, attempt by
// attempt, either the mismatch or only that the peer hung up (EPIPE: the
// server closed first), the hang-up most of the time on a loaded machine;
// the name must not flicker away between two polls. A hang-up that goes
// on past namedHold is reported as such (the peer's configuration may
// have changed to one that only hangs up).
const namedHold = 5 * time.Second

// step applies one monitor event; it reports whether the state (or the
// reason of a failure) changed.
func (w *connWatch) step(ev zmq4.Event, value int, now time.Time) bool {
	old := w.state
	switch ev {
	case zmq4.EVENT_CONNECTED:
		w.handshaking, w.connected, w.silent = true, now, false
		if w.state.Conn == ConnHandshakeFailed {
			return false
		}
		w.state.Reason, w.state.Cause = "", CauseNone // something accepts connections again
	case zmq4.EVENT_CONNECT_RETRIED:
		// A connection attempt failed before any handshake (refused,
		// unreachable, no such ipc:// file); libzmq retries. A failed
		// handshake says more and stays.
		if w.state.Conn == ConnHandshakeFailed {
			return false
		}
		w.handshaking = false
		w.state.Reason, w.state.Cause = refusedReasonFor(w.state.Endpoint), CauseRefused
	case zmq4.EVENT_HANDSHAKE_SUCCEEDED:
		w.handshaking, w.spoke = false, true
		w.named = time.Time{}
		w.set(ConnUp, CauseNone, "", now)
	case zmq4.EVENT_HANDSHAKE_FAILED_AUTH:
		w.handshaking = false
		w.named = now
		w.set(ConnHandshakeFailed, CauseKeyRefused, fmt.Sprintf("the peer refused our key (ZAP status %d): this engine's public key is not among its peer keys", value), now)
	case zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL:
		w.handshaking = false
		w.named = now
		w.set(ConnHandshakeFailed, protocolCause(value), protocolReason(value, w.secure), now)
	case zmq4.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
		w.hungUp(value, now)
		w.handshaking = false
	case zmq4.EVENT_DISCONNECTED:
		switch {
		case w.handshaking:
			w.hungUp(0, now)
			w.handshaking = false
		case w.state.Conn == ConnUp:
			w.set(ConnDown, CauseNone, "", now)
		}
	default:
		return false
	}
	return w.state.Conn != old.Conn || w.state.Reason != old.Reason || w.state.Cause != old.Cause
}

// hungUp records a handshake that ended without a word, unless a named
// failure came less than namedHold ago: that one says more. One found
// silent (stalled) that ended about libzmq's handshake timeout after it
// began (handshakeTimedOut) was no hang-up of the peer's: nothing
// answered, and libzmq gave up. One that ended sooner was a hang-up,
// slow as it was (a loaded peer that then refused the handshake, or a
// service that closes idle connections).
func (w *connWatch) hungUp(errno int, now time.Time) {
	if w.state.Conn == ConnHandshakeFailed && !w.named.IsZero() && now.Sub(w.named) < namedHold {
		return
	}
	if w.handshaking && w.silent && now.Sub(w.connected) >= handshakeTimedOut {
		w.set(ConnHandshakeFailed, CauseHandshakeTimeout, w.stalledReason()+" (the handshake timed out)", now)
		return
	}
	w.set(ConnHandshakeFailed, CauseHungUp, closedReason(errno, w.secure), now)
}

// handshakeStall is how long a connection's handshake may go on, the
// transport connected, before PeerState.Reason says that nothing has
// answered there yet. A handshake between two engines takes milliseconds
// (a CURVE one a few more), but a peer on a loaded machine (its ZAP
// handler waiting for a CPU, its process paused) may take longer: the
// reason is a hint while the handshake goes on, and names that case too.
// libzmq itself gives up only at handshakeTimeout.
const handshakeStall = time.Second

// handshakeTimeout is libzmq's handshake timeout (ZMQ_HANDSHAKE_IVL, 30 s
// by default; the link keeps the default). A silent handshake that ends
// handshakeTimedOut or more after it began is taken for that timeout:
// half of it, because the monitor's events are read late on a loaded
// machine (the connection's start among them).
const (
	handshakeTimeout  = 30 * time.Second
	handshakeTimedOut = handshakeTimeout / 2
)

// stalled notes a connection whose transport connected handshakeStall or
// more ago without its handshake completing or failing, and names it
// (stalledReason) while nothing else is said of it; it reports whether
// the state changed. The heartbeat goroutine calls it as it reads the
// monitors: no event comes for a silence.
func (w *connWatch) stalled(now time.Time) bool {
	if !w.handshaking || w.state.Conn == ConnUp || now.Sub(w.connected) < handshakeStall {
		return false
	}
	w.silent = true
	if w.state.Conn == ConnHandshakeFailed || w.state.Reason != "" {
		return false
	}
	w.state.Reason, w.state.Cause = w.stalledReason(), CauseStalled
	return true
}

// stalledReason is PeerState.Reason for a connection accepted at the
// endpoint whose handshake has not completed: what accepted it speaks no
// ZeroMQ (a service other than a kvxfer engine), or the process there is
// stopped, or so loaded that its handshake is slow. Where a handshake on
// this socket completed before, a ZeroMQ peer is there: the endpoint is
// not in question.
func (w *connWatch) stalledReason() string {
	if w.spoke {
		return "connected to " + w.state.Endpoint + ", where handshakes completed before, but this one has not: is the peer's process stopped, or too loaded to answer?"
	}
	return "connected to " + w.state.Endpoint + ", but nothing there completed a ZeroMQ handshake: is that the peer's control endpoint (and its process not stopped, nor too loaded to answer)?"
}

func (w *connWatch) set(c ConnState, cause Cause, reason string, now time.Time) {
	if c != w.state.Conn {
		w.state.Since = now
	}
	w.state.Conn, w.state.Reason, w.state.Cause = c, reason, cause
}

// refusedReason is PeerState.Reason while connection attempts fail
// before a handshake: on one host, nothing listens at the endpoint.
const refusedReason = "nothing accepts connections there (refused or unreachable; libzmq retries): is the peer's process running, at that endpoint?"

// refusedReasonFor is refusedReason, or, for a tcp:// endpoint whose host
// name was looked up with no address found (a mistyped name), what names
// that name: libzmq reports both as a connection attempt that failed.
func refusedReasonFor(endpoint string) string {
	if h := unresolvedHost(endpoint); h != "" {
		return fmt.Sprintf("host name %q has no address (its lookup failed; libzmq retries): is the host in the peer's endpoint spelled right, and known to this host's resolver?", h)
	}
	return refusedReason
}

// libzmq's ZMQ_PROTOCOL_ERROR_* values (zmq.h) that name a mistake.
const (
	protocolErrorCryptographic     = 0x11000001
	protocolErrorMechanismMismatch = 0x11000002
)

// protocolCause is the Cause of protocolReason(code, ...).
func protocolCause(code int) Cause {
	switch code {
	case protocolErrorMechanismMismatch:
		return CauseMechanismMismatch
	case protocolErrorCryptographic:
		return CauseCryptographic
	}
	return CauseProtocol
}

func protocolReason(code int, secure bool) string {
	switch code {
	case protocolErrorMechanismMismatch:
		if secure {
			return "security mechanism mismatch: we use CURVE, the peer does not"
		}
		return "security mechanism mismatch: we are insecure, the peer uses CURVE"
	case protocolErrorCryptographic:
		return "cryptographic error in the handshake: a wrong public key on one side"
	}
	return fmt.Sprintf("protocol error 0x%x", code)
}

// closedReason explains a connection closed at the endpoint before the
// handshake completed. Several mistakes look alike from here: a CURVE
// server that cannot decrypt a client's HELLO (the client holds a wrong
// server key for it) hangs up without a word, and so, attempt after
// attempt, may a peer of the other mechanism (libzmq reports the mismatch
// itself only when it reads the peer's greeting before the peer has
// closed: on a loaded machine, a minority of attempts), and so does a
// service that is not a kvxfer engine (no ZeroMQ) and closes what it
// accepts. The reason names them all.
func closedReason(errno int, secure bool) string {
	why := "what listens there hung up during the handshake"
	if errno != 0 {
		why += " (" + syscall.Errno(errno).Error() + ")"
	}
	const stranger = "or it is not a kvxfer engine at all (is that the peer's control endpoint?)"
	if secure {
		return why + ": a CURVE server does so when the server key we hold for it is not its key, " +
			"and a peer without CURVE (insecure) on a security mechanism mismatch; " + stranger
	}
	return why + ": a peer that uses CURVE does so on a security mechanism mismatch (we are insecure); " + stranger
}
