package control

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
)

// Sentinel errors of the control plane.
var (
	// ErrPeerGone is the engine's one "peer gone" sentinel
	// (rdma.ErrPeerGone): errors.Is matches it whichever layer noticed.
	ErrPeerGone  = rdma.ErrPeerGone
	ErrDuplicate = errors.New("control: already listening")
	ErrClosed    = errors.New("control: closed")
	// ErrQueueFull is backpressure: the frame was not queued (the peer is
	// slow or unreachable), the Conn stays usable and what it queued
	// before stays queued, so a caller keeps the Conn.
	ErrQueueFull = errors.New("control: send queue full")
	// ErrFrameRefused: Send refused this one frame (too large, say): the
	// Conn is fine and what it queued stays queued, so a caller keeps it.
	ErrFrameRefused = errors.New("control: frame refused")
	// ErrFramesDropped: frames Send had accepted were dropped unsent (the
	// Conn or the Link closed before the peer took them, or the socket
	// failed). errors.As into *FramesDropped gives how many.
	ErrFramesDropped = errors.New("control: frames dropped unsent")
)

// FramesDropped is an error saying N frames a Conn had accepted were
// dropped unsent; it matches ErrFramesDropped and what Err matches.
type FramesDropped struct {
	N   int
	Err error
}

func (e *FramesDropped) Error() string   { return e.Err.Error() }
func (e *FramesDropped) Unwrap() []error { return []error{e.Err, ErrFramesDropped} }

// Link is the control-plane seam between engines: an engine listens for
// frames addressed to it, and each worker dials its own connection to each
// peer. The in-memory MemLink implements it inside one process; the ZeroMQ
// control plane implements it between processes.
type Link interface {
	// Listen registers self's Hello and delivers every frame addressed to
	// self to deliver, in the order each connection sent them. deliver
	// must not block.
	Listen(self *messages.Hello, deliver func(messages.Frame)) (Listener, error)
	// Dial opens a connection to peer, owned by one goroutine at a time.
	Dial(peer messages.PeerID) (Conn, error)
	// Hello returns what peer said about itself, once known.
	Hello(peer messages.PeerID) (*messages.Hello, error)
}

// Listener stops a Listen. Once Close returns, deliver is not running and
// is not called again: a frame is delivered before, or not at all.
type Listener interface{ Close() error }

// Conn sends frames to one peer, in order.
type Conn interface {
	Send(f messages.Frame) error
	Close() error
}

// MemLink is an in-process Link: a hub of engines keyed by PeerID.
type MemLink struct {
	mu    sync.RWMutex
	peers map[messages.PeerID]*memPeer
}

type memPeer struct {
	hello   *messages.Hello
	deliver func(messages.Frame)
}

var _ Link = (*MemLink)(nil)

// NewMemLink returns an empty hub.
func NewMemLink() *MemLink { return &MemLink{peers: map[messages.PeerID]*memPeer{}} }

// Listen implements Link.
func (l *MemLink) Listen(self *messages.Hello, deliver func(messages.Frame)) (Listener, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.peers[self.From]; dup {
		return nil, fmt.Errorf("%w: %s", ErrDuplicate, self.From)
	}
	l.peers[self.From] = &memPeer{hello: self, deliver: deliver}
	return memListener{l, self.From}, nil
}

type memListener struct {
	l  *MemLink
	id messages.PeerID
}

func (m memListener) Close() error {
	m.l.mu.Lock()
	delete(m.l.peers, m.id)
	m.l.mu.Unlock()
	return nil
}

// Dial implements Link.
func (l *MemLink) Dial(peer messages.PeerID) (Conn, error) {
	return &memConn{l: l, to: peer}, nil
}

// Hello implements Link.
func (l *MemLink) Hello(peer messages.PeerID) (*messages.Hello, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	p := l.peers[peer]
	if p == nil {
		return nil, fmt.Errorf("%w: %s", ErrPeerGone, peer)
	}
	return p.hello, nil
}

type memConn struct {
	l  *MemLink
	to messages.PeerID
}

// Send delivers f under the link's read lock: a listener's Close (the
// write lock) waits for deliveries in progress, so a frame Send accepts
// is handed over before Close returns, and one it cannot hand over is
// refused (ErrPeerGone), never accepted and dropped. deliver must not
// block (Link.Listen), or Close would wait for it.
func (c *memConn) Send(f messages.Frame) error {
	c.l.mu.RLock()
	defer c.l.mu.RUnlock()
	p := c.l.peers[c.to]
	if p == nil {
		return fmt.Errorf("%w: %s", ErrPeerGone, c.to)
	}
	p.deliver(f)
	return nil
}

func (c *memConn) Close() error { return nil }

// RejectCounter is implemented by a Link that refuses frames before they
// are delivered (the ZeroMQ link); an engine publishes its counts as
// kvxfer_frames_rejected_total{reason}.
type RejectCounter interface {
	// FramesRejected returns how many frames the link rejected so far,
	// by reason. The set of reasons is fixed (every one is present, zero
	// or not) and counts only grow.
	FramesRejected() map[string]int64
}
