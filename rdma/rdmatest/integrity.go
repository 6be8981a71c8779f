package rdmatest

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

const (
	maxSegment  = 1 << 20 // the largest segment the suite writes
	integrityMB = 4       // source and destination size, MiB
)

// testIdentity: the agents name their backend and have distinct addresses.
func testIdentity(t *testing.T, e *env) {
	if e.p.Sender.Backend() == "" || e.p.Sender.Backend() != e.p.Receiver.Backend() {
		t.Errorf("Backend() = %q and %q, want one non-empty name", e.p.Sender.Backend(), e.p.Receiver.Backend())
	}
	a, b := e.p.Sender.Address(), e.p.Receiver.Address()
	if len(a) == 0 || bytes.Equal(a, b) {
		t.Errorf("addresses %q and %q: want two distinct non-empty addresses", a, b)
	}
	if !bytes.Equal(a, e.p.Sender.Address()) {
		t.Errorf("Address() changed between calls")
	}
}

// randomSegments returns segments of 1 byte … 1 MiB (log-uniform) whose
// destinations do not overlap, in random order, with random sources.
func randomSegments(r *rand.Rand, srcLen, dstLen uint64) []kvcache.Segment {
	var segs []kvcache.Segment
	off := uint64(0)
	for {
		n := 1 + r.Uint64N(uint64(1)<<r.IntN(21)) // 1 … 1 MiB
		gap := r.Uint64N(4096)
		if off+gap+n > dstLen {
			break
		}
		segs = append(segs, kvcache.Segment{Src: r.Uint64N(srcLen - n + 1), Dst: off + gap, Len: n})
		off += gap + n
	}
	r.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
	return segs
}

// testIntegrity: random patterns over random segment lists, several batches
// in flight at once, land byte for byte; nothing outside the segments
// changes.
func testIntegrity(t *testing.T, e *env) {
	const n = integrityMB << 20
	src, dst := e.src(n, 1), e.dst(n, 2)
	ep := e.connect()
	model := bytes.Clone(dst.bytes)
	r := rand.New(rand.NewPCG(7, 11))

	for round := range 8 {
		Pattern(src.bytes, uint64(100+round))
		segs := randomSegments(r, n, n)
		if round == 0 { // the extremes: one byte, and a whole 1 MiB segment
			segs = []kvcache.Segment{{Src: n - 1, Dst: 0, Len: 1}, {Src: 0, Dst: n - maxSegment, Len: maxSegment}}
		}
		apply(model, src.bytes, segs)

		// Split into 1…4 batches posted back to back.
		parts := 1 + r.IntN(4)
		tl := newTally(parts)
		for p := range parts {
			lo, hi := p*len(segs)/parts, (p+1)*len(segs)/parts
			if err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: segs[lo:hi], Done: tl.done(p)}); err != nil {
				t.Fatalf("round %d: Post batch %d (%d segments): %v", round, p, hi-lo, err)
			}
		}
		Recv(t, tl.all, "Done of every batch")
		tl.exactlyOnce(t)
		for p, err := range tl.errs {
			if err != nil {
				t.Fatalf("round %d batch %d: Done(%v), want nil", round, p, err)
			}
		}
		if d := diff(dst.bytes, model, segs); d != "" {
			t.Fatalf("round %d (%d segments in %d batches): %s", round, len(segs), parts, d)
		}
	}
}

// testEdgeBatches: an empty batch, zero-length segments (at the very end of
// a region too) and overlapping sources complete with nil.
func testEdgeBatches(t *testing.T, e *env) {
	const n = 64 << 10
	src, dst := e.src(n, 3), e.dst(n, 4)
	ep := e.connect()
	model := bytes.Clone(dst.bytes)
	cases := [][]kvcache.Segment{
		nil,
		{{Src: 0, Dst: 0, Len: 0}},
		{{Src: n, Dst: n, Len: 0}},
		{{Src: 0, Dst: 0, Len: n}},
		{{Src: 10, Dst: 100, Len: 50}, {Src: 20, Dst: 1000, Len: 50}},
	}
	for i, segs := range cases {
		if err := e.post(ep, src, dst, segs); err != nil {
			t.Errorf("case %d %v: Done(%v), want nil", i, segs, err)
		}
		apply(model, src.bytes, segs)
		if d := diff(dst.bytes, model, segs); d != "" {
			t.Errorf("case %d %v: %s", i, segs, d)
		}
	}
}
