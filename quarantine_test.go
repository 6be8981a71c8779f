package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// partLink is a MemLink whose frames to the generation instance can be
// held back (a partition in one direction: the writer is alive and
// answers, its answers do not arrive) and delivered later, in order.
type partLink struct {
	*control.MemLink
	mu   sync.Mutex
	cut  bool
	held []func()
	// older: Hello shows every peer as a version without features would.
	older atomic.Bool
	// atCtx counts the RequestData frames delivered to the context side;
	// lastRD is the last of them; cancelsAtCtx counts the Cancels.
	atCtx        atomic.Int64
	lastRD       atomic.Pointer[messages.RequestData]
	cancelsAtCtx atomic.Int64
	// deaf: the generation side hears nothing of the context side, its
	// heartbeats included — a partition its link sees, whose Hello then
	// fails — where cut alone holds only the frames.
	deaf atomic.Bool
	// toGen delivers a frame to the generation side past the partition
	// (a forged frame).
	toGen func(messages.Frame)
}

func (p *partLink) Hello(peer messages.PeerID) (*messages.Hello, error) {
	if p.deaf.Load() && peer.Instance == "ctx" {
		return nil, fmt.Errorf("%w: %s missed its heartbeats (partLink)", control.ErrPeerGone, peer)
	}
	h, err := p.MemLink.Hello(peer)
	if err == nil && p.older.Load() {
		c := *h
		c.Features = 0
		return &c, nil
	}
	return h, err
}

func (p *partLink) Listen(self *messages.Hello, deliver func(messages.Frame)) (control.Listener, error) {
	if self.From.Instance != "gen" {
		return p.MemLink.Listen(self, func(f messages.Frame) {
			if rd, ok := f.(*messages.RequestData); ok {
				p.lastRD.Store(rd)
				p.atCtx.Add(1)
			}
			if _, ok := f.(*messages.Cancel); ok {
				p.cancelsAtCtx.Add(1)
			}
			deliver(f)
		})
	}
	p.toGen = deliver
	return p.MemLink.Listen(self, func(f messages.Frame) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.cut {
			p.held = append(p.held, func() { deliver(f) })
			return
		}
		deliver(f)
	})
}

func (p *partLink) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if !cut {
		for _, f := range p.held {
			f()
		}
		p.held = nil
	}
}

// dropHeld loses the frames held for the generation side (the writer's
// answers lost in the partition).
func (p *partLink) dropHeld() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = nil
}

func (p *partLink) heldFrames() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// receiveAtWriter opens request id (64 tokens from "ctx") on gen and waits
// until the context side has its RequestData, so that the tests' premise —
// the writer knows the request and may write — holds whatever the timing.
func receiveAtWriter(t *testing.T, gen *kvxfer.Engine, link *partLink, id string) *kvxfer.RxHandle {
	t.Helper()
	before := link.atCtx.Load()
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, id+"'s RequestData at the context side", func() bool { return link.atCtx.Load() > before })
	return rx
}

// startPartCluster starts a ctx TP1 and a gen TP1 engine on a partLink;
// the gen engine's quarantine bound is maxQ bytes (0: the default).
func startPartCluster(t *testing.T, l kvcache.Layout, maxQ uint64) (*cluster, *partLink) {
	t.Helper()
	return startPartClusterWith(t, l, func(_ string, cfg *kvxfer.Config) { cfg.MaxQuarantinedBytes = maxQ })
}

// startPartClusterWith is startPartCluster with each engine's config
// changed by with first.
func startPartClusterWith(t *testing.T, l kvcache.Layout, with func(inst string, cfg *kvxfer.Config)) (*cluster, *partLink) {
	t.Helper()
	link := &partLink{MemLink: control.NewMemLink()}
	c := &cluster{ctxPar: tp1, genPar: tp1}
	for _, inst := range []string{"ctx", "gen"} {
		cfg := kvxfer.Config{Instance: inst, Parallel: tp1, Rank: tp1.RankAt(0),
			Layout: &l, PoolBytes: 4 << 20, Workers: 2, Link: link, TransferTimeout: 20 * time.Second}
		with(inst, &cfg)
		e, err := kvxfer.Start(context.Background(), cfg)
		if err != nil {
			t.Fatalf("start %s: %v", inst, err)
		}
		if inst == "ctx" {
			c.ctx = append(c.ctx, e)
		} else {
			c.gen = append(c.gen, e)
		}
	}
	t.Cleanup(func() {
		link.setCut(false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, e := range append(c.ctx, c.gen...) {
			if err := c.closeErr(e, e.Close(ctx)); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})
	return c, link
}

// waitUntil polls cond with a deadline (integration tests only).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}

// Issue 17: a writer suspected by missed heartbeats while alive (here:
// its frames to the generation side are held back) fails the request at
// once, but its destination blocks are quarantined — counted in
// Stats.QuarantinedBytes, not free, not reusable — until its CancelAck
// (the proof) arrives. With the quarantine bound at 1 byte, a new request
// waits for destination blocks meanwhile, and starts (then completes) once
// the proof releases the quarantine.
func TestSuspectedWriterQuarantinedUntilProof(t *testing.T) {
	l := smallLayout()
	c, link := startPartCluster(t, l, 1)
	gen, ctxE := c.gen[0], c.ctx[0]
	total := 0
	for _, st := range gen.Pools().Stats() {
		total += st.Total
	}
	rx := receiveAtWriter(t, gen, link, "q1")
	link.setCut(true)
	gen.PeerDown(ctxE.Hello().From)
	o := waitOutcome(t, rx.Done())
	if o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) {
		t.Fatalf("rx after suspicion: %s %v, want a failure matching ErrPeerGone", o.Status, o.Err)
	}
	waitUntil(t, "the writer's CancelAck held by the partition", func() bool { return link.heldFrames() > 0 })
	// The handle fires at the outcome; the blocks move to quarantine in
	// the same step's later effects, which may run after the CancelAck is
	// held: wait for them (blocks freed instead would time out here).
	waitUntil(t, "q1's blocks quarantined", func() bool { return gen.Pools().Quarantined() > 0 })
	st := gen.Stats()
	q := gen.Pools().Quarantined()
	if st.QuarantinedBytes == 0 || q == 0 || st.QuarantineLimitBytes != 1 {
		t.Fatalf("after suspicion with the writer's answer held: %d blocks, %d bytes quarantined (limit %d); want > 0",
			q, st.QuarantinedBytes, st.QuarantineLimitBytes)
	}
	free := 0
	for _, s := range gen.Pools().Stats() {
		free += s.Free
	}
	if free+q != total {
		t.Fatalf("free %d + quarantined %d != %d blocks: quarantined blocks are not held apart", free, q, total)
	}
	// The bound is hit: a new request waits for destination blocks, its
	// allocation refused with ErrQuarantineFull, while the pool has room.
	if _, err := gen.Pools().Alloc([]int{1, 1}); !errors.Is(err, kvcache.ErrOutOfBlocks) {
		t.Fatalf("Alloc with the quarantine full: %v, want an error wrapping ErrOutOfBlocks", err)
	}
	// A new request waits for destination blocks while the bound is hit.
	rx2, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "q2", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	if u := gen.Pools().Used(); u != 0 {
		t.Fatalf("q2 got %d destination blocks while the quarantine is full", u)
	}
	// The proof arrives: the quarantine empties, the waiting request
	// starts and completes, every byte verified.
	link.setCut(false)
	waitUntil(t, "the quarantine to empty", func() bool { return gen.Stats().QuarantinedBytes == 0 })
	sendOneChunk(t, ctxE, l, "q2", 2, 64)
	o2 := waitOutcome(t, rx2.Done())
	if !o2.OK {
		t.Fatalf("q2 after the proof: %s %v", o2.Status, o2.Err)
	}
	if n := verify(t, gen, l, 64, o2.Blocks, 2); n == 0 {
		t.Fatal("q2: no byte verified")
	}
	if err := gen.FreeBlocks(o2.Blocks); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}

// DESIGN.md §6: a writer's Result that fails validation (here a status
// this version does not know, as a newer writer's would be) fails the
// request at once, naming the writer and the value — not at its deadline
// — but proves nothing: the blocks stay quarantined until the writer's
// CancelAck (held back here by a partition) arrives. A request beside it
// completes.
func TestInvalidResultFailsAtOnceAndQuarantines(t *testing.T) {
	l := smallLayout()
	c, link := startPartCluster(t, l, 0)
	gen, ctxE := c.gen[0], c.ctx[0]
	rx := receiveAtWriter(t, gen, link, "unreadable")
	rd := link.lastRD.Load()
	link.setCut(true) // from here the writer's own frames are held
	link.toGen(&messages.Result{RequestID: "unreadable", Epoch: rd.Epoch, From: ctxE.Hello().From, Status: 99, Bytes: 1 << 20})
	o := waitOutcome(t, rx.Done())
	if o.OK || !errors.Is(o.Err, kvxfer.ErrMismatch) || !strings.Contains(o.Err.Error(), "invalid Result") ||
		!strings.Contains(o.Err.Error(), "status 99") {
		t.Fatalf("rx after an invalid Result: %s %v, want FAILED matching ErrMismatch naming the invalid status 99", o.Status, o.Err)
	}
	waitUntil(t, "the writer's CancelAck held by the partition", func() bool { return link.heldFrames() > 0 })
	waitUntil(t, "the blocks quarantined", func() bool { return gen.Pools().Quarantined() > 0 })
	if r := gen.Stats().FramesRejected; r == 0 {
		t.Fatal("the invalid Result was not counted as rejected")
	}
	link.setCut(false)
	waitUntil(t, "the quarantine to empty on the CancelAck", func() bool { return gen.Stats().QuarantinedBytes == 0 })

	rx2, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "after", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	sendOneChunk(t, ctxE, l, "after", 2, 64)
	o2 := waitOutcome(t, rx2.Done())
	if !o2.OK || verify(t, gen, l, 64, o2.Blocks, 2) == 0 {
		t.Fatalf("the request after: %s %v", o2.Status, o2.Err)
	}
	if err := gen.FreeBlocks(o2.Blocks); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, c)
}

// Issue 17: the writer's death (Engine.WriterExited for its incarnation,
// as node reports a pidfd becoming readable) is the proof that frees the
// blocks quarantined on suspicion; and a request opened afterwards whose
// writer's known incarnation is the exited one fails at once, before any
// RequestData leaves, instead of being quarantined in turn on a proof
// that already came.
func TestWriterExitedFreesQuarantineAndIsNotAddressed(t *testing.T) {
	l := smallLayout()
	c, link := startPartCluster(t, l, 0)
	gen, ctxE := c.gen[0], c.ctx[0]
	writer := ctxE.Hello().From
	rx := receiveAtWriter(t, gen, link, "x1")
	link.setCut(true)
	gen.PeerDown(writer)
	if o := waitOutcome(t, rx.Done()); o.OK {
		t.Fatalf("x1 after suspicion: %s", o.Status)
	}
	waitUntil(t, "the writer's CancelAck held by the partition", func() bool { return link.heldFrames() > 0 })
	waitUntil(t, "x1's blocks quarantined on suspicion", func() bool { return gen.Pools().Quarantined() > 0 })
	if n, err := gen.WriterRequests(writer, ctxE.Hello().Incarnation); err != nil || n != 1 {
		t.Fatalf("WriterRequests with x1 quarantined: %d, %v; want 1", n, err)
	}
	if n, err := gen.WriterRequests(writer, ctxE.Hello().Incarnation+1); err != nil || n != 0 {
		t.Fatalf("WriterRequests of another incarnation: %d, %v; want 0", n, err)
	}
	if n, err := gen.WriterExited(writer, ctxE.Hello().Incarnation, "test: process exited"); err != nil || n != 1 {
		t.Fatalf("WriterExited with x1 quarantined: %d, %v; want 1", n, err)
	}
	waitUntil(t, "the quarantine to empty on the exit proof", func() bool { return gen.Pools().Quarantined() == 0 })
	rx2, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "x2", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, rx2.Done())
	if o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) || !strings.Contains(o.Err.Error(), "has exited") {
		t.Fatalf("x2 to an exited writer: %s %v, want a failure matching ErrPeerGone naming the exit", o.Status, o.Err)
	}
	waitUntil(t, "x2's blocks back", func() bool { return gen.Pools().Used() == 0 && gen.Pools().Quarantined() == 0 })
}

// sendOneChunk sends request id from context engine e in one chunk, the
// source filled with pattern req, and waits for DONE.
func sendOneChunk(t *testing.T, e *kvxfer.Engine, l kvcache.Layout, id string, req, promptLen int) {
	t.Helper()
	nblk := l.BlocksFor(promptLen)
	counts := make([]int, len(l.Groups))
	for g := range counts {
		if len(e.Shape().Layers[g]) > 0 {
			counts[g] = nblk
		}
	}
	src, err := e.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	for g := range l.Groups {
		for b, id := range src[g] {
			fill(e, l, g, id, b, req)
		}
	}
	h, err := e.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: promptLen})
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := kvcache.Chunks(promptLen, promptLen, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chunks {
		if err := h.Chunk(ch, ch.Runs(l.TokensPerBlock, src), nil); err != nil {
			t.Fatal(err)
		}
	}
	if o := waitOutcome(t, h.Done()); !o.OK {
		t.Fatalf("tx %s: %s %v", id, o.Status, o.Err)
	}
	if err := e.Pools().Free(src); err != nil {
		t.Fatal(err)
	}
}

// After Close, an exit reported late (a pidfd that became readable while
// the engine stopped) gets an error, not a count: no supervisor is left to
// apply the proof.
func TestWriterExitedAfterClose(t *testing.T) {
	l := smallLayout()
	c, _ := startPartCluster(t, l, 0)
	gen, ctxE := c.gen[0], c.ctx[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := gen.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := gen.WriterExited(ctxE.Hello().From, ctxE.Hello().Incarnation, "test: process exited"); err == nil {
		t.Fatalf("WriterExited after Close: %d requests, no error", n)
	}
	if n, err := gen.WriterRequests(ctxE.Hello().From, 0); err == nil {
		t.Fatalf("WriterRequests after Close: %d requests, no error", n)
	}
}

// TestCloseReportsQuarantineAndReleasesBlocklessReceives: Close does not
// wait for proofs that may never come, but what it leaves behind it says.
// A receive whose writer was suspected (missed heartbeats), is not heard
// since and never proved its writes over keeps its blocks quarantined:
// Close reports it
// (ErrUndrained, naming the request; before, nil, and the engine unmapped
// a pool a late write could still reach), and its Released stays open. A
// receive that holds no destination block (every block a prefix hit) has
// nothing a write can touch: Close abandons it and says Released (before,
// never: a caller waiting for it — the C ABI's close — hung).
func TestCloseReportsQuarantineAndReleasesBlocklessReceives(t *testing.T) {
	l := smallLayout()
	c, link := startPartClusterWith(t, l, func(string, *kvxfer.Config) {})
	gen, ctxE := c.gen[0], c.ctx[0]
	hits := make([]int, len(l.Groups))
	for g := range hits {
		hits[g] = l.BlocksFor(64)
	}
	free, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "all-hits", PromptLen: 64, Context: "ctx", PrefixHitBlocks: hits})
	if err != nil {
		t.Fatal(err)
	}
	held, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "held", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "both RequestData at the context side", func() bool { return link.atCtx.Load() == 2 })
	link.setCut(true) // the writer's answers (its proofs) are held back
	link.deaf.Store(true)
	gen.PeerDown(ctxE.Hello().From)
	if o := waitOutcome(t, held.Done()); o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) {
		t.Fatalf("held: %s %v, want the writer suspected", o.Status, o.Err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.undrained = append(c.undrained, gen)
	err = gen.Close(ctx)
	if !errors.Is(err, actors.ErrUndrained) || !strings.Contains(err.Error(), "[held]") || !strings.Contains(err.Error(), "quarantined") {
		t.Fatalf("Close: %v, want ErrUndrained naming request held, its blocks quarantined", err)
	}
	select {
	case <-held.Released():
		t.Fatal("held's blocks released with its writer suspected and no proof")
	default:
	}
	if q := gen.Pools().Quarantined(); q == 0 || gen.Pools().Used() != 0 {
		t.Fatalf("after Close: %d quarantined, %d used; want held's blocks quarantined", q, gen.Pools().Used())
	}
	select {
	case <-free.Released():
	default:
		t.Fatal("all-hits holds no destination block, and Close did not say Released")
	}
}

// TestUnfiredFenceHoldsOnlyTheSourcePages: a chunk whose fence never
// fires (a producer that hangs) must not hold the generation side
// hostage. Once the context side's request is decided (here, cancelled),
// its op that never left never will: the generation side hears CANCELLED
// at once and its blocks are released, while the context side keeps the
// chunk's source pages pinned — and Done waits — until the fence fires.
// (Before, the op stayed ADMITTED until the fence: the generation side got
// nothing until its own deadline, then quarantined its blocks, and both
// engines' Close with a background context never returned.)
func TestUnfiredFenceHoldsOnlyTheSourcePages(t *testing.T) {
	l := smallLayout()
	c, link := startPartClusterWith(t, l, func(string, *kvxfer.Config) {})
	gen, ce := c.gen[0], c.ctx[0]
	rx := receiveAtWriter(t, gen, link, "hung")
	src, err := ce.Pools().Alloc([]int{l.BlocksFor(64), l.BlocksFor(64)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "hung", PromptLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	fence := &kvxfer.ManualFence{}
	all := kvcache.Chunk{Start: 0, End: 64, Last: true}
	if err := tx.Chunk(all, all.Runs(l.TokensPerBlock, src), fence); err != nil {
		t.Fatal(err)
	}
	tx.Cancel()
	if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusCancelled {
		t.Fatalf("generation side: %s %v, want CANCELLED while the fence has not fired", o.Status, o.Err)
	}
	<-rx.Released()
	waitUntil(t, "the generation side's blocks free", func() bool { return gen.Pools().Used()+gen.Pools().Quarantined() == 0 })
	select {
	case o := <-tx.Done():
		t.Fatalf("context side Done (%s) before its chunk's fence fired: its source pages were unpinned", o.Status)
	default:
	}
	if err := ce.Pools().Free(src); err == nil {
		t.Fatal("source blocks freed while the producer may still write them (fence not fired)")
	}
	fence.Fire(nil)
	if o := waitOutcome(t, tx.Done()); o.Status != kvxfer.StatusCancelled {
		t.Fatalf("context side: %s %v, want CANCELLED", o.Status, o.Err)
	}
	if err := ce.Pools().Free(src); err != nil {
		t.Fatalf("source blocks after the fence: %v", err)
	}
}

// TestSendTimeoutNamesTheRefusedRequestData: a context rank refuses a
// RequestData it cannot resolve (here: the generation side serves another
// layout) and, the request not being bound to that instance, goes on
// waiting (a frame from any peer cannot fail it). Its deadline's error
// now names the refusal — it said only that the deadline passed — while
// the generation side failed at once, naming both layouts.
func TestSendTimeoutNamesTheRefusedRequestData(t *testing.T) {
	l := smallLayout()
	other := l
	other.HeadDim *= 2
	link := control.NewMemLink()
	start := func(inst string, lay kvcache.Layout) *kvxfer.Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Parallel: tp1, Rank: tp1.RankAt(0),
			Layout: &lay, PoolBytes: 4 << 20, Link: link, TransferTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close(context.Background()) })
		return e
	}
	ce, ge := start("ctx", l), start("gen", other)
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "other-layout", PromptLen: 64, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "other-layout", PromptLen: 64, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, rx.Done()); o.OK {
		t.Fatalf("generation side READY across two layouts")
	}
	o := waitOutcome(t, tx.Done())
	if o.OK || !errors.Is(o.Err, kvxfer.ErrTimeout) || !strings.Contains(o.Err.Error(), "refused") || !strings.Contains(o.Err.Error(), "gen/0") {
		t.Fatalf("context side: %s %v, want its deadline's error naming gen/0's refused RequestData", o.Status, o.Err)
	}
}

// TestCloseWaitsForASuspectHeardAgain: a writer suspected of missed
// heartbeats that the control plane hears again when the engine closes (a
// partition healed, a stall over) may still answer: Close sends its
// request's Cancel again at once and waits for the answer, within its
// context, and the CancelAck releases the quarantined blocks — Close
// returns nil, nothing left quarantined. Before, Close stopped the session
// at once and reported it undrained, its blocks quarantined for the
// pool's lifetime, though the writer's answer was on its way (the flaky
// TestFrameworkBlocksRevokedEarlierAreRemapped, traced). (Checked to fail
// with the parent's RxHeard not sent: Close returned ErrUndrained before
// the Cancel came.)
func TestCloseWaitsForASuspectHeardAgain(t *testing.T) {
	l := smallLayout()
	c, link := startPartCluster(t, l, 0)
	gen, ctxE := c.gen[0], c.ctx[0]
	rx := receiveAtWriter(t, gen, link, "r1")
	link.setCut(true) // the writer's answers are held back
	gen.PeerDown(ctxE.Hello().From)
	if o := waitOutcome(t, rx.Done()); o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) {
		t.Fatalf("r1: %s %v, want the writer suspected", o.Status, o.Err)
	}
	waitUntil(t, "r1's blocks quarantined", func() bool { return gen.Pools().Quarantined() > 0 })
	before := link.cancelsAtCtx.Load()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- gen.Close(ctx) }()
	waitUntil(t, "r1's Cancel sent again as the engine closes", func() bool {
		select {
		case err := <-closed:
			t.Fatalf("Close returned %v before the writer, heard again, answered", err)
		default:
		}
		return link.cancelsAtCtx.Load() > before
	})
	link.setCut(false) // its answers go through
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v, want nil: the writer heard again proved its writes over", err)
		}
	case <-ctx.Done():
		t.Fatal("Close did not return after the writer answered")
	}
	if st := gen.Stats(); st.QuarantinedBytes != 0 {
		t.Fatalf("%d bytes still quarantined after Close", st.QuarantinedBytes)
	}
}

// TestSuspectHeardAgainGetsItsCancelAtOnce: a writer suspected of missed
// heartbeats whose answer to the request's Cancel was lost is heard again
// (its heartbeat: Engine.PeerAlive): its suspected request sends it the
// Cancel again at once, and its answer releases the blocks from
// quarantine — not only at the Cancel's next re-send (1 s, backing off to
// 30 s). The generation engine runs on a fake clock that never moves, so
// no re-send timer fires: only the heard writer's Cancel can bring the
// proof. (Checked to fail with the rx parent ignoring PeerAlive: the
// blocks stayed quarantined.)
func TestSuspectHeardAgainGetsItsCancelAtOnce(t *testing.T) {
	l := smallLayout()
	clk := actors.NewFakeClock(time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC))
	c, link := startPartClusterWith(t, l, func(inst string, cfg *kvxfer.Config) {
		if inst == "gen" {
			cfg.Clock = clk
		}
	})
	gen, ctxE := c.gen[0], c.ctx[0]
	rx := receiveAtWriter(t, gen, link, "r1")
	link.setCut(true) // the writer's answers are held back
	link.deaf.Store(true)
	gen.PeerDown(ctxE.Hello().From)
	if o := waitOutcome(t, rx.Done()); o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) {
		t.Fatalf("r1: %s %v, want the writer suspected", o.Status, o.Err)
	}
	waitUntil(t, "the writer's answer to r1's first Cancel, held", func() bool { return link.heldFrames() > 0 })
	link.dropHeld() // lost in the partition
	link.setCut(false)
	link.deaf.Store(false) // the partition heals: the writer is heard again
	if gen.Pools().Quarantined() == 0 {
		t.Fatal("r1's blocks not quarantined")
	}
	gen.PeerAlive(ctxE.Hello().From)
	waitUntil(t, "r1's blocks released on the answer to the Cancel sent when its writer was heard", func() bool {
		return gen.Pools().Quarantined() == 0 && gen.Pools().Used() == 0
	})
}
