package zmq

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/control"
)

// TestTerminalBacklogFullIsNamed: a terminal frame refused because its
// Conn's terminal backlog is full is lost for good (nothing sends it
// later, unlike a refused RequestData, which its sender retries), so
// Send says so apart from plain backpressure (ErrTerminalBacklogFull,
// still an ErrQueueFull: the Conn must be kept) naming the peer, and
// Stats counts it apart (TerminalRefused). The frames the backlog held
// and the Conn's Close then dropped are reported by Close
// (ErrTerminalDropped, naming the peer and the count) and counted
// (TerminalDropped). Before, the refusal was a bare ErrQueueFull, which
// the engine takes as "will retry", and Close dropped the backlog and
// returned nil: both losses were silent (checked by reverting conn.go).
func TestTerminalBacklogFullIsNamed(t *testing.T) {
	dir := t.TempDir()
	const hwm, backlog = 4, 8
	b := listen(t, pid("gen", 0), Config{Insecure: true, SendHWM: hwm, TerminalBacklog: backlog})
	ghost := pid("ctx", 9)
	if err := b.link.AddPeer(ghost, "ipc://"+filepath.Join(dir, "nobody.sock")); err != nil {
		t.Fatal(err)
	}
	conn, err := b.link.Dial(ghost)
	if err != nil {
		t.Fatal(err)
	}
	// A RequestData refused for room is backpressure, not a lost
	// terminal frame.
	if err := conn.Send(requestData(b.id, 0)); !errors.Is(err, ErrQueueFull) || errors.Is(err, ErrTerminalBacklogFull) {
		t.Fatalf("RequestData behind the Hello's backlog: %v, want ErrQueueFull and not ErrTerminalBacklogFull", err)
	}
	accepted := 0
	var full error
	for i := range 100 {
		if full = conn.Send(terminalOf(b.id, i)); full != nil {
			break
		}
		accepted++
	}
	if accepted != backlog-1 { // the Conn's Hello waits first
		t.Fatalf("%d terminal frames accepted, want %d", accepted, backlog-1)
	}
	if !errors.Is(full, ErrTerminalBacklogFull) || !errors.Is(full, ErrQueueFull) || !errors.Is(full, control.ErrQueueFull) {
		t.Fatalf("terminal frame past the backlog: %v, want ErrTerminalBacklogFull (an ErrQueueFull)", full)
	}
	if !strings.Contains(full.Error(), ghost.String()) || !strings.Contains(full.Error(), "NOT sent") {
		t.Fatalf("refusal %q does not name the peer %s and say the frame was not sent", full, ghost)
	}
	if st := b.link.Stats(); st.TerminalRefused != 1 || st.QueueFull != 2 || st.TerminalDropped != 0 {
		t.Fatalf("Stats() = %+v, want TerminalRefused 1, QueueFull 2, TerminalDropped 0", st)
	}
	// The peer never comes: Close waits closeLinger, then drops the
	// backlog, and says how many terminal frames it dropped.
	err = conn.Close()
	if !errors.Is(err, ErrTerminalDropped) || !strings.Contains(err.Error(), ghost.String()) || !strings.Contains(err.Error(), "7 terminal frames") {
		t.Fatalf("Close with %d terminal frames unsent: %v, want ErrTerminalDropped naming %s and the count", backlog-1, err, ghost)
	}
	if d := (*control.FramesDropped)(nil); !errors.As(err, &d) || d.N != backlog-1 || !errors.Is(err, control.ErrFramesDropped) {
		t.Fatalf("Close's error %v: want a control.FramesDropped of %d frames", err, backlog-1)
	}
	if st := b.link.Stats(); st.TerminalDropped != backlog-1 {
		t.Fatalf("Stats().TerminalDropped = %d, want %d", st.TerminalDropped, backlog-1)
	}
	if err := conn.Close(); err != nil {
		t.Fatalf("second Close: %v, want nil", err)
	}
}

// TestLinkCloseReportsTerminalBacklog: a Link closed while a Conn's
// terminal backlog waits (its peer never came up) drops that backlog;
// the Conn's Close then reports it (ErrTerminalDropped with the count)
// and Stats counts it. Before, the flusher dropped it at the Link's
// close with nothing but a nil Close to show (checked by reverting
// conn.go).
func TestLinkCloseReportsTerminalBacklog(t *testing.T) {
	dir := t.TempDir()
	b := listen(t, pid("gen", 0), Config{Insecure: true, SendHWM: 4})
	ghost := pid("ctx", 9)
	if err := b.link.AddPeer(ghost, "ipc://"+filepath.Join(dir, "nobody.sock")); err != nil {
		t.Fatal(err)
	}
	conn, err := b.link.Dial(ghost)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := conn.Send(terminalOf(b.id, i)); err != nil {
			t.Fatalf("terminal frame %d: %v", i, err)
		}
	}
	if err := b.link.Close(); err != nil {
		t.Fatal(err)
	}
	err = conn.Close()
	if !errors.Is(err, ErrTerminalDropped) || !strings.Contains(err.Error(), "3 terminal frames") {
		t.Fatalf("Close after the Link closed with 3 terminal frames unsent: %v, want ErrTerminalDropped naming the count", err)
	}
	if st := b.link.Stats(); st.TerminalDropped != 3 {
		t.Fatalf("Stats().TerminalDropped = %d, want 3", st.TerminalDropped)
	}
}
