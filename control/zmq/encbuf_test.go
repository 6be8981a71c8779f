package zmq

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/kvxfer/kvxfer/messages"
)

// TestSendReusesEncodeBuffer: a Conn encodes frame after frame into one
// buffer (zmq_send copies the bytes before it returns), and every frame
// still arrives as it was sent. A frame the terminal backlog keeps takes
// the buffer with it (TestTerminalFramesNeverDroppedForQueueSpace fails
// when the backlog shares it: its frames arrive overwritten).
func TestSendReusesEncodeBuffer(t *testing.T) {
	a, b := pair(t, false, Config{})
	cc, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := cc.(*Conn)
	// The connection up, the Hello said, nothing backlogged.
	if err := c.Send(result(b.id, 0)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the first frame", func() bool { return len(a.in.from(b.id)) >= 1 })
	waitFor(t, patience, "an empty backlog", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.backlog) == 0 && !c.flushing
	})
	const n = 50
	var buf *byte
	reused := 0
	for i := 1; i <= n; i++ {
		before := b.link.Stats().Backlogged
		if err := c.Send(result(b.id, i)); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		c.mu.Lock()
		p := unsafe.SliceData(c.enc)
		c.mu.Unlock()
		if b.link.Stats().Backlogged != before {
			buf = nil // the backlog took it (a full queue): a new one next
			continue
		}
		if p == nil {
			t.Fatalf("frame %d went out, and the Conn kept no encode buffer", i)
		}
		if buf == p {
			reused++
		}
		buf = p
	}
	if reused == 0 {
		t.Fatalf("no send reused the encode buffer in %d frames", n)
	}
	waitFor(t, patience, fmt.Sprintf("%d frames", n+1), func() bool { return len(a.in.from(b.id)) >= n+1 })
	for i, f := range a.in.from(b.id)[:n+1] {
		r, ok := f.(*messages.Result)
		if !ok || r.RequestID != fmt.Sprintf("req-%d", i) || r.Epoch != uint64(i) || r.Bytes != uint64(i) {
			t.Fatalf("frame %d arrived as %#v", i, f)
		}
	}
}
