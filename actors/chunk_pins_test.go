package actors

import (
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestChunkNotTakenIsUnpinned: a chunk whose pins the handle took but
// that reaches a session whose outcome is decided (here: cancelled, then a
// chunk handed past the kvxfer handle's own check, as a Chunk racing the
// decision does) is not taken, and its shell releases those pins: the
// blocks free at once. (Checked to fail without the shell's unpin: the
// blocks stay pinned for good.)
func TestChunkNotTakenIsUnpinned(t *testing.T) {
	r := startTestRank(t, "ctx-pins", control.NewMemLink())
	src, err := r.e.Pools().Alloc([]int{2})
	if err != nil {
		t.Fatal(err)
	}
	h, err := r.e.Send(TxRequest{ID: "decided", PromptLen: 32, Deadline: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	h.Cancel()
	o := wait(t, "the cancelled send's Done", h.Done())
	if o.Status != StatusCancelled {
		t.Fatalf("outcome %s, want CANCELLED", o.Status)
	}
	c := kvcache.Chunk{Start: 0, End: 32, Last: true}
	err = h.ChunkPayload(c, c.Runs(16, src), nil, nil)
	if err != nil && !errors.Is(err, ErrBadRequest) {
		t.Fatalf("chunk after the outcome: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ferr := r.e.Pools().Free(src)
		if ferr == nil {
			break
		}
		if !errors.Is(ferr, kvcache.ErrBlockPinned) || time.Now().After(deadline) {
			t.Fatalf("the untaken chunk's blocks: %v (still pinned after 10 s)", ferr)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}

// TestPinLedger: each pin the handle takes is released once — consumed by
// the session (in order, or not: the record is found), or swept when the
// actor stops — and none is taken after.
func TestPinLedger(t *testing.T) {
	var l pinLedger
	runs := []kvcache.BlockRun{{IDs: []kvcache.BlockID{1}}}
	pinned := 0
	pin := func() error { pinned++; return nil }
	a, err, open := l.take(pin, runs)
	if !open || err != nil {
		t.Fatal(open, err)
	}
	b, _, _ := l.take(pin, runs)
	if pinned != 2 || a == b {
		t.Fatalf("pinned %d, seqs %d %d", pinned, a, b)
	}
	c, _, _ := l.take(pin, runs)
	if !l.consume(c) || l.consume(c) { // out of order: found all the same
		t.Fatal("a chunk consumed out of order twice, or not once")
	}
	if !l.consume(a) || l.consume(a) {
		t.Fatal("a chunk consumed twice, or not once")
	}
	if swept := l.stop(); len(swept) != 1 {
		t.Fatalf("stop swept %d chunks, want the 1 never consumed", len(swept))
	}
	if l.consume(b) {
		t.Fatal("a swept chunk consumed after the stop: its pins would be released twice")
	}
	if _, _, open := l.take(pin, runs); open || pinned != 3 {
		t.Fatal("a pin taken after the stop")
	}
	refused := errors.New("refused")
	var l2 pinLedger
	if _, err, open := l2.take(func() error { return refused }, runs); !open || !errors.Is(err, refused) || len(l2.pending) != 0 {
		t.Fatalf("a refused pin: %v, %d pending", err, len(l2.pending))
	}
}
