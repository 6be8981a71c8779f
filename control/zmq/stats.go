package zmq

import (
	"fmt"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/control"
)

// RejectReason is why the listener rejected a message; each is counted
// (Stats.Rejected) and published as kvxfer_frames_rejected_total{reason}.
type RejectReason uint8

// Reasons, in the order the listener checks them (departed, added last,
// is checked with the Hello's bounds).
const (
	// RejectEnvelope: not exactly one payload part after the routing id.
	RejectEnvelope RejectReason = iota
	// RejectOversize: longer than Config.MaxFrameBytes.
	RejectOversize
	// RejectDecode: messages.Decode refused it (version, type, a field
	// out of range). A RequestData that names its request validly is not
	// counted here: it takes the checks of any frame (counted under their
	// reasons) and, past them, is delivered for the engine to answer
	// FAILED (and count as invalid).
	RejectDecode
	// RejectVersion: written in another protocol version
	// (messages.VersionError). On a CURVE connection the link remembers
	// the version per key, and Link.Hello names it for the peers that key
	// may speak for.
	RejectVersion
	// RejectIdentity: the frame's sender is not an identity its CURVE key
	// is bound to (Curve.Identities, PeerServerKeys), or the connection
	// has no CURVE key, or its key changed.
	RejectIdentity
	// RejectTaken: a Hello for a PeerID that is alive and bound to another
	// CURVE key.
	RejectTaken
	// RejectNoHello: a frame on a connection that has not said Hello.
	RejectNoHello
	// RejectSender: a frame (or Hello) naming a PeerID other than the one
	// its connection said Hello as, or the listener's own.
	RejectSender
	// RejectFull: a Hello past the bounds on connections (in all, or of
	// one identity: maxConnsPerIdentity) or peers.
	RejectFull
	// RejectDeparted: a Hello of a peer incarnation that RemovePeer
	// forgot (it left the cluster and lives on: draining, or out of etcd
	// without knowing it). It puts nothing back in the directory and
	// binds the name to no key; its connection is bound, so that its
	// last frames (Result, CancelAck) are delivered.
	RejectDeparted
	// RejectGoodbye: a goodbye (a Heartbeat with Leaving) that passed the
	// checks of any frame but is not acted on: its connection's
	// incarnation is not the one the directory holds for the peer (an
	// earlier process's, still connected), or is none (a Hello without
	// incarnation), or the peer is not tracked (the directory forgot
	// it). The goodbye of an incarnation that left the cluster
	// (RemovePeer: with etcd, a closing node's lease revoke comes first)
	// is ignored, not counted. Either way the peer's state is left as it
	// is, and nothing is made for it.
	RejectGoodbye
	numRejectReasons
)

var rejectNames = [numRejectReasons]string{"envelope", "oversize", "decode", "version", "identity", "taken", "no_hello", "sender", "full", "departed", "goodbye"}

func (r RejectReason) String() string {
	if r < numRejectReasons {
		return rejectNames[r]
	}
	return fmt.Sprintf("RejectReason(%d)", uint8(r))
}

// RejectReasons lists every reason, in order.
func RejectReasons() []RejectReason {
	out := make([]RejectReason, numRejectReasons)
	for i := range out {
		out[i] = RejectReason(i)
	}
	return out
}

// Stats are a Link's counters so far (each only grows).
type Stats struct {
	// Rejected counts the messages the listener rejected, by reason.
	Rejected map[RejectReason]int64
	// Refused counts handshakes the ZAP handler refused (CURVE keys not
	// allowed); their frames are never seen.
	Refused int64
	// QueueFull counts frames Conn.Send refused for queue space:
	// RequestData (and Hellos) past SendHWM, and terminal frames past the
	// terminal backlog (Config.TerminalBacklog).
	QueueFull int64
	// Backlogged counts terminal frames (Result, Cancel, CancelAck, Misaddressed) that
	// found the send queue full and waited in their Conn's terminal
	// backlog instead of being dropped.
	Backlogged int64
	// TerminalRefused counts terminal frames Send refused because their
	// Conn's terminal backlog was full (ErrTerminalBacklogFull; also in
	// QueueFull): frames nobody sends later.
	TerminalRefused int64
	// TerminalDropped counts terminal frames Send accepted into a
	// backlog that were dropped unsent (ErrTerminalDropped).
	TerminalDropped int64
	// WarningsHeld counts warnings the link did not log because the
	// same kind about the same peer was logged just before (see
	// control.Throttle).
	WarningsHeld int64
}

// counters are the Link's atomic counters behind Stats.
type counters struct {
	rejected        [numRejectReasons]atomic.Int64
	refused         atomic.Int64
	failedHandshake atomic.Int64 // FailedHandshakes
	queueFull       atomic.Int64
	backlogged      atomic.Int64
	terminalRefused atomic.Int64
	terminalDropped atomic.Int64
	warningsHeld    atomic.Int64
}

// Stats returns the link's counters.
func (l *Link) Stats() Stats {
	s := Stats{Rejected: make(map[RejectReason]int64, numRejectReasons),
		Refused: l.stats.refused.Load(), QueueFull: l.stats.queueFull.Load(),
		Backlogged: l.stats.backlogged.Load(), WarningsHeld: l.stats.warningsHeld.Load(),
		TerminalRefused: l.stats.terminalRefused.Load(), TerminalDropped: l.stats.terminalDropped.Load()}
	for r := range numRejectReasons {
		s.Rejected[r] = l.stats.rejected[r].Load()
	}
	return s
}

// FramesRejected implements control.RejectCounter.
func (l *Link) FramesRejected() map[string]int64 {
	out := make(map[string]int64, numRejectReasons)
	for r := range numRejectReasons {
		out[r.String()] = l.stats.rejected[r].Load()
	}
	return out
}

var _ control.RejectCounter = (*Link)(nil)

// Rejected counts every message the listener rejected (the sum of
// Stats.Rejected).
func (l *Link) Rejected() int64 {
	var n int64
	for r := range numRejectReasons {
		n += l.stats.rejected[r].Load()
	}
	return n
}

// Refused counts handshakes the ZAP handler refused (unknown CURVE keys).
func (l *Link) Refused() int64 { return l.stats.refused.Load() }

// FailedHandshakes counts the handshakes of connections the listener
// accepted that failed before the ZAP handler judged a key (those it
// refused are Refused): a dialer of the other security mechanism (one
// side insecure, the other CURVE), a CURVE client that holds another
// server key for this link, one that speaks no ZeroMQ, or one that hung
// up during the handshake. Each such dialer's handshake failed
// on its side too (its PeerState of this link says so). It stays 0 when
// the listener's socket monitor could not be set up (logged).
func (l *Link) FailedHandshakes() int64 { return l.stats.failedHandshake.Load() }

// warn returns a warning event about peer of kind, or nil (which
// discards; zerolog's methods accept a nil *Event) when the throttle holds
// it back. A line let through after some were held says how many.
func (l *Link) warn(peer, kind string) *zerolog.Event {
	ok, held := l.throttle.Allow(l.cfg.Clock(), peer, kind)
	if !ok {
		l.stats.warningsHeld.Add(1)
		return nil
	}
	ev := l.log.Warn()
	if held > 0 {
		ev = ev.Int("held_back", held)
	}
	return ev
}
