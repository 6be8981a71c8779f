package zmq

import (
	"fmt"
	"syscall"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// Conn is one worker's connection to one peer: a DEALER it alone uses.
// Frames arrive in the order Send accepted them. Send never blocks.
type Conn struct {
	l        *Link
	peer     messages.PeerID
	info     *peerInfo
	sock     *zmq4.Socket
	helloInc uint64 // the peer's incarnation when this Conn last said Hello
	closed   bool
}

var _ control.Conn = (*Conn)(nil)

// Peer is the peer this Conn sends to.
func (c *Conn) Peer() messages.PeerID { return c.peer }

// Send implements control.Conn: it encodes f and queues it without
// blocking. It returns ErrQueueFull when the send high-water mark is
// reached (the peer is slow or unreachable), ErrFrameTooLarge past
// MaxFrameBytes, a messages.ErrInvalid error for an invalid frame, and
// control.ErrClosed after Close (of the Conn or the Link).
func (c *Conn) Send(f messages.Frame) error {
	if c.closed || c.l.closing.Load() {
		return fmt.Errorf("%w: send to %s", control.ErrClosed, c.peer)
	}
	b, err := encode(f)
	if err != nil {
		return fmt.Errorf("control/zmq: send to %s: %w", c.peer, err)
	}
	if len(b) > c.l.cfg.MaxFrameBytes {
		return fmt.Errorf("%w: send %T of request %q to %s: %d bytes exceeds MaxFrameBytes %d",
			ErrFrameTooLarge, f, f.Request(), c.peer, len(b), c.l.cfg.MaxFrameBytes)
	}
	// The peer said Hello on a connection we had not seen: it may have
	// restarted and forgotten ours, so say Hello again before this frame.
	if inc := c.info.incarnation.Load(); inc != c.helloInc {
		if err := c.sendRaw(c.l.selfHello, "Hello"); err != nil {
			return err
		}
		c.helloInc = inc
	}
	return c.sendRaw(b, fmt.Sprintf("%T", f))
}

// sendRaw queues one encoded frame without blocking.
func (c *Conn) sendRaw(b []byte, what string) error {
	if _, err := c.sock.SendBytes(b, zmq4.DONTWAIT); err != nil {
		if isAgain(err) {
			return fmt.Errorf("%w: %s to %s: %d frames queued", ErrQueueFull, what, c.peer, c.l.cfg.SendHWM)
		}
		return fmt.Errorf("control/zmq: send %s to %s: %w", what, c.peer, err)
	}
	return nil
}

// Close implements control.Conn: linger 0, so unsent frames are dropped.
func (c *Conn) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	closeSocket(c.sock)
	c.l.release()
	return nil
}

// isAgain reports whether a non-blocking zmq call found nothing to do
// (EAGAIN): a full send queue, or no message to receive.
func isAgain(err error) bool { return zmq4.AsErrno(err) == zmq4.Errno(syscall.EAGAIN) }
