package actors

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// tapLink wraps a Link: every frame its connections send goes through on
// first (on the sending worker's goroutine), which may hold it (it left,
// as far as the sender knows, but is delivered only by release) or refuse
// it with an error.
type tapLink struct {
	control.Link
	on   func(messages.Frame) (hold bool, err error)
	mu   sync.Mutex
	held []heldFrame
}

func (l *tapLink) Dial(peer messages.PeerID) (control.Conn, error) {
	c, err := l.Link.Dial(peer)
	if err != nil {
		return nil, err
	}
	return &tapConn{Conn: c, l: l}, nil
}

// release delivers the held frames, in the order they were sent.
func (l *tapLink) release() error {
	l.mu.Lock()
	held := l.held
	l.held = nil
	l.mu.Unlock()
	for _, h := range held {
		if err := h.c.Send(h.f); err != nil {
			return err
		}
	}
	return nil
}

type tapConn struct {
	control.Conn
	l *tapLink
}

func (c *tapConn) Send(f messages.Frame) error {
	hold, err := c.l.on(f)
	if err != nil {
		return err
	}
	if hold {
		c.l.mu.Lock()
		c.l.held = append(c.l.held, heldFrame{c: c.Conn, f: f})
		c.l.mu.Unlock()
		return nil
	}
	return c.Conn.Send(f)
}

type heldFrame struct {
	c control.Conn
	f messages.Frame
}

// testRank is one engine rank of TP 1, PP 1 on the loopback backend, with
// its pools (to read and write blocks).
type testRank struct {
	e     *Engine
	pools []*kvcache.Pool
	// undrainedOK: the test leaves a session undrained on purpose; the
	// Close at its end may say so (ErrUndrained).
	undrainedOK bool
}

var cancelOrderLayout = kvcache.Layout{Name: "test", Layers: 2, KVHeads: 2, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
	Groups: []kvcache.LayerGroup{{Name: "full", Layers: []int{0, 1}}}}

func startTestRank(t *testing.T, inst string, link control.Link) *testRank {
	t.Helper()
	return startTestRankOn(t, inst, link, loopback.New())
}

// startTestRankOn is startTestRank on a data-plane agent of the test's
// (closed when the test ends).
func startTestRankOn(t *testing.T, inst string, link control.Link, agent rdma.Agent) *testRank {
	t.Helper()
	return startTestRankClose(t, inst, link, agent, true)
}

// startTestRankClose is startTestRankOn; unless drained, the engine's
// Close may report it undrained when the test ends. rec, if given, is the
// engine's Recorder.
func startTestRankClose(t *testing.T, inst string, link control.Link, agent rdma.Agent, drained bool, rec ...Recorder) *testRank {
	t.Helper()
	return startTestRankWith(t, inst, link, agent, drained, func(c *EngineConfig) {
		if len(rec) > 0 {
			c.Recorder = rec[0]
		}
	})
}

// startTestRankWith is startTestRankClose with the engine's config
// adjusted by set before the engine starts.
func startTestRankWith(t *testing.T, inst string, link control.Link, agent rdma.Agent, drained bool, set func(*EngineConfig)) *testRank {
	t.Helper()
	l := cancelOrderLayout
	par := kvcache.Parallel{TP: 1, PP: 1}
	rank := par.RankAt(0)
	shape, err := l.Shape(par, rank)
	if err != nil {
		t.Fatal(err)
	}
	region, err := kvcache.NewHostRegion(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = region.Close() })
	r := &testRank{}
	var geoms []kvcache.PoolGeometry
	var off uint64
	for g := range l.Groups {
		bb := shape.BlockBytes(l, g)
		p, err := kvcache.NewPool(region, off, bb, 16)
		if err != nil {
			t.Fatal(err)
		}
		r.pools = append(r.pools, p)
		geoms = append(geoms, p.Geometry())
		off += bb * 16
	}
	t.Cleanup(func() { _ = agent.Close() })
	cfg := EngineConfig{Self: messages.PeerID{Instance: inst},
		Topology: Topology{Layout: l, LayoutHash: l.Hash(), Parallel: par, Rank: rank, Pools: geoms, Plans: NewPlanCache()},
		Workers:  2, Agent: agent, Region: region, Pools: NewPools(r.pools), Link: link, Timeout: 20 * time.Second}
	set(&cfg)
	r.e, err = StartEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d := 10 * time.Second
		if !drained {
			d = time.Second // it may well not drain
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		if err := r.e.Close(ctx); err != nil && !((r.undrainedOK || !drained) && errors.Is(err, ErrUndrained)) {
			t.Errorf("close %s: %v", inst, err)
		}
	})
	return r
}

// wait returns what ch yields, failing the test if nothing comes in time
// (a bound on a bug, not a way of waiting for a condition).
func wait[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
		panic("unreachable")
	}
}

// TestCancelOvertakesRequestData drives the real shells in-process: a
// generation rank's Cancel reaches the context rank before its own
// RequestData (a tapLink holds it), the context rank acknowledges it, and the
// generation rank frees the request's destination blocks (Released). The
// RequestData that arrives afterwards must never lead to a write into
// those blocks, whether the context side's Send comes after it (no session
// had the request at the Cancel: Send is refused with ErrPeerCancelled
// naming the cancel) or came before it (Send's session, naming no
// instance, fails CANCELLED at the Cancel). Before the fix, both wrote the
// prompt's KV into the freed blocks (checked: with TxTable.Cancel
// remembering nothing and the session only acknowledging, this test fails
// on the bytes found there).
func TestCancelOvertakesRequestData(t *testing.T) {
	for _, sendFirst := range []bool{false, true} {
		name := "send after the RequestData"
		if sendFirst {
			name = "send before the Cancel"
		}
		t.Run(name, func(t *testing.T) { testCancelOvertakesRequestData(t, sendFirst) })
	}
}

func testCancelOvertakesRequestData(t *testing.T, sendFirst bool) {
	const id, prompt = "overtaken", 32
	ml := control.NewMemLink()
	// The generation rank's connections take the request's RequestData
	// without delivering it, until release: what its control plane does
	// when the sender worker that queued it restarts (or dies) before it
	// leaves — the old connection still delivers what it queued while it
	// lingers, and the Cancel that follows leaves on a new connection
	// (frames keep their order within one connection only), so the
	// Cancel may arrive first.
	took := make(chan *messages.RequestData, 4)
	hl := &tapLink{Link: ml, on: func(f messages.Frame) (bool, error) {
		rd, ok := f.(*messages.RequestData)
		if ok && rd.RequestID == id {
			took <- rd
		}
		return ok && rd.RequestID == id, nil
	}}
	ctxR := startTestRank(t, "ctx", ml)
	genR := startTestRank(t, "gen", hl)
	tpb := cancelOrderLayout.TokensPerBlock

	// The context side's source blocks, filled with a byte the generation
	// side's blocks never hold unless a write lands.
	src, err := ctxR.e.Pools().Alloc([]int{prompt / tpb})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range src[0] {
		for i := range ctxR.pools[0].Block(b) {
			ctxR.pools[0].Block(b)[i] = 0xAB
		}
	}
	defer func() { _ = ctxR.e.FreeBlocks(src) }()

	send := func() (*TxHandle, error) {
		return ctxR.e.Send(TxRequest{ID: id, PromptLen: prompt, Deadline: time.Now().Add(20 * time.Second)})
	}
	var tx *TxHandle
	if sendFirst {
		if tx, err = send(); err != nil {
			t.Fatal(err)
		}
	}
	rx, err := genR.e.Receive(RxRequest{ID: id, PromptLen: prompt, Context: "ctx",
		ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Deadline: time.Now().Add(20 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	rd := wait(t, "RequestData", took)
	rx.Cancel()
	if o := wait(t, "generation outcome", rx.Done()); o.Status != StatusCancelled {
		t.Fatalf("generation side: %s %v, want CANCELLED", o.Status, o.Err)
	}
	// The context rank's CancelAck proved it quiescent: the blocks are
	// the pool's again.
	wait(t, "generation blocks released", rx.Released())

	// The overtaken RequestData arrives now.
	if err := hl.release(); err != nil {
		t.Fatal(err)
	}
	var sendErr error
	if !sendFirst {
		tx, sendErr = send()
	}
	if tx != nil {
		chunks, err := kvcache.Chunks(prompt, prompt, tpb)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chunks {
			tx.Chunk(c, c.Runs(tpb, src), FiredFence{})
		}
		// Done comes once the session released everything: no write of
		// it is still in flight.
		o := wait(t, "context outcome", tx.Done())
		written := false
		for _, b := range rd.Groups[0].Blocks {
			for _, x := range genR.pools[0].Block(kvcache.BlockID(b)) {
				written = written || x != 0
			}
		}
		if written {
			t.Fatalf("the context rank wrote into destination blocks %v the generation rank had freed on its CancelAck (context outcome %s %v)",
				rd.Groups[0].Blocks, o.Status, o.Err)
		}
		if !sendFirst {
			t.Fatalf("Send of a request its generation instance had cancelled: no error (outcome %s %v)", o.Status, o.Err)
		}
		if o.Status != StatusCancelled || !errors.Is(o.Err, ErrPeerCancelled) {
			t.Fatalf("context side: %s %v, want CANCELLED by the peer", o.Status, o.Err)
		}
		return
	}
	if !errors.Is(sendErr, ErrPeerCancelled) || !strings.Contains(sendErr.Error(), "generation instance gen") {
		t.Fatalf("Send of a request its generation instance had cancelled: %v, want ErrPeerCancelled naming instance gen", sendErr)
	}
}
