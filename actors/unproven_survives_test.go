//go:build kvxfer_invariants

package actors

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/faulty"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// unreleasedToAgent is an agent whose endpoints to peer address to prove
// less at Close than the backend says: an unproven close there does not
// prove the sources released (rdma.ErrSourcesReleased is dropped). The
// endpoints to other peers are the backend's.
type unreleasedToAgent struct {
	rdma.Agent
	to []byte
}

func (a *unreleasedToAgent) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := a.Agent.Connect(peer)
	if err != nil || !bytes.Equal(peer, a.to) {
		return ep, err
	}
	return &unreleasedEndpoint{Endpoint: ep}, nil
}

type unreleasedEndpoint struct{ rdma.Endpoint }

func (e *unreleasedEndpoint) Close() error {
	err := e.Endpoint.Close()
	if errors.Is(err, rdma.ErrCloseUnproven) {
		return fmt.Errorf("test: close proved neither the writes over nor the sources released (%v): %w", err, rdma.ErrCloseUnproven)
	}
	return err
}

// deadRecorder records, per session actor, the request of the ops it was
// told of (TxCompleted) and the TxWorkerDead it stepped on.
type deadRecorder struct {
	mu      sync.Mutex
	request map[string]string
	dead    map[string][]TxWorkerDead
}

func (r *deadRecorder) Record(actor string, msg any, _ time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch m := msg.(type) {
	case TxCompleted:
		r.request[actor] = m.Op.Request
	case TxWorkerDead:
		r.dead[actor] = append(r.dead[actor], m)
	}
}

// deadOf returns the TxWorkerDead the session of request stepped on.
func (r *deadRecorder) deadOf(request string) []TxWorkerDead {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []TxWorkerDead
	for actor, ms := range r.dead {
		if r.request[actor] == request {
			out = append(out, ms...)
		}
	}
	return out
}

// startRecordedRank is startTestRankClose (not drained) with rec as the
// engine's Recorder.
func startRecordedRank(t *testing.T, inst string, link control.Link, agent rdma.Agent, rec Recorder) *testRank {
	t.Helper()
	return startTestRankClose(t, inst, link, agent, false, rec) // it may well not drain
}

// unprovenOf is whether worker slot s keeps an unproven op of request.
func unprovenOf(s *workerSlot, request string) bool {
	for _, so := range s.unprovenOps() {
		for _, op := range so.Ops {
			if op.Request == request {
				return true
			}
		}
	}
	return false
}

// TestUnprovenOpsOutliveAnotherSessionsStop: sender worker 0 keeps the ops
// of two requests whose endpoints' closes proved nothing (each request's
// generation rank is declared down while its batch hangs on the wire, so
// its session closes the endpoint at once). Request A's
// close proved not even its sources released: its op stays in doubt and
// its session lives on, its source pins held. Request B's close proved
// its sources released: B fails, its session stops, and the worker
// forgets B's entries (workerSlot.sessionStopped). Then worker 0 stops
// for good (its restart budget spent): its stop must still name A's op as
// in doubt to A (TxWorkerDead.InDoubt), or A retires an op whose writes
// may still land, releases its source pins and ends as if drained. Checked
// to fail with sessionStopped mutated to forget every session's entries
// when one session stops (`s.unproven = nil`, and a DeleteFunc that drops
// every entry): A's TxWorkerDead names nothing, its Done comes and its
// source blocks can be freed.
func TestUnprovenOpsOutliveAnotherSessionsStop(t *testing.T) {
	const prompt = 32
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	genA := startTestRankClose(t, "genA", link, loopback.New(loopback.WithNetwork(net)), false)
	genB := startTestRankClose(t, "genB", link, loopback.New(loopback.WithNetwork(net)), false)
	ag := &unreleasedToAgent{to: genA.e.Hello().AgentAddr,
		Agent: faulty.New(loopback.New(loopback.WithNetwork(net)), faulty.WithUnprovenClose(), faulty.WithSourcesReleased(),
			faulty.Hang(func(uint64, *rand.Rand) bool { return true }))}
	rec := &deadRecorder{request: map[string]string{}, dead: map[string][]TxWorkerDead{}}
	ctxR := startRecordedRank(t, "ctx", link, ag, rec)
	slot := ctxR.e.slots[0]
	tpb := cancelOrderLayout.TokensPerBlock
	chunks, err := kvcache.Chunks(prompt, prompt, tpb)
	if err != nil {
		t.Fatal(err)
	}
	onWorker0 := func(gen *testRank, prefix string) string {
		for i := 0; ; i++ {
			if id := fmt.Sprintf("%s-%d", prefix, i); WorkerFor(id, gen.e.Hello().From, 2) == 0 {
				return id
			}
		}
	}
	// send starts a request to gen whose one batch hangs on the wire, and
	// declares gen down once the batch is posted: the session closes the
	// endpoint at once.
	send := func(gen *testRank, id string) (*TxHandle, [][]kvcache.BlockID) {
		posted := ctxR.e.stats.OpsPosted.Load()
		if _, err := gen.e.Receive(RxRequest{ID: id, PromptLen: prompt, Context: "ctx",
			ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Deadline: time.Now().Add(20 * time.Second)}); err != nil {
			t.Fatal(err)
		}
		src, err := ctxR.e.Pools().Alloc([]int{prompt / tpb})
		if err != nil {
			t.Fatal(err)
		}
		tx, err := ctxR.e.Send(TxRequest{ID: id, PromptLen: prompt, Deadline: time.Now().Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chunks {
			if err := tx.Chunk(c, c.Runs(tpb, src), FiredFence{}); err != nil {
				t.Fatal(err)
			}
		}
		pollUntil(t, id+"'s batch posted", func() bool { return ctxR.e.stats.OpsPosted.Load() > posted })
		ctxR.e.PeerDown(gen.e.Hello().From, "is gone (test)")
		return tx, src
	}

	idA, idB := onWorker0(genA, "a"), onWorker0(genB, "b")
	txA, srcA := send(genA, idA)
	pollUntil(t, "unproven close of "+idA, func() bool { return unprovenOf(slot, idA) })

	txB, srcB := send(genB, idB)
	if o := wait(t, idB+"'s outcome", txB.Done()); o.OK || !errors.Is(o.Err, ErrPeerGone) {
		t.Fatalf("%s: %s %v, want its peer gone", idB, o.Status, o.Err)
	}
	if err := ctxR.e.FreeBlocks(srcB); err != nil {
		t.Fatalf("%s: free its source blocks: %v", idB, err)
	}
	if n := ctxR.e.stats.ClosesUnproven.Load(); n != 2 {
		t.Fatalf("%d unproven closes, want 2", n)
	}
	// B's session has stopped: the worker forgets its entries.
	pollUntil(t, "the entries of "+idB+" forgotten", func() bool { return !unprovenOf(slot, idB) })
	if !unprovenOf(slot, idA) {
		t.Errorf("worker 0 forgot the unproven op of %s (its session alive) when %s's session stopped", idA, idB)
	}

	for range 11 { // the restart budget is 10
		ctxR.e.CrashWorker(0)
	}
	pollUntil(t, "worker 0 stopped for good", func() bool { return ctxR.e.env.dead[0].Load() })
	pollUntil(t, idA+"'s TxWorkerDead", func() bool { return len(rec.deadOf(idA)) > 0 })
	for _, m := range rec.deadOf(idA) {
		if m.Worker != 0 || !slices.ContainsFunc(m.InDoubt, func(r OpRef) bool { return r.Request == idA }) {
			t.Errorf("%s's session heard %+v, want worker 0 naming its op in doubt (its close proved nothing)", idA, m)
		}
		if slices.ContainsFunc(m.InDoubt, func(r OpRef) bool { return r.Request == idB }) {
			t.Errorf("%s's session heard %+v, naming an op of %s", idA, m, idB)
		}
	}
	select {
	case o := <-txA.Done():
		t.Fatalf("%s Done (%s %v) though its op is in doubt: its source pins were dropped", idA, o.Status, o.Err)
	default:
	}
	if err := ctxR.e.FreeBlocks(srcA); err == nil {
		t.Fatalf("the source blocks of %s, whose op is in doubt, were freed", idA)
	}
}
