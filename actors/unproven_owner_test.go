//go:build kvxfer_invariants

package actors

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/faulty"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// unprovenEntries counts the ops the engine's workers keep as unproven
// (workerSlot.unproven), and the sessions they belong to.
func unprovenEntries(e *Engine) (ops, sessions int) {
	for _, s := range e.slots {
		for _, so := range s.unprovenOps() {
			ops += len(so.Ops)
			sessions++
		}
	}
	return ops, sessions
}

// TestUnprovenOpsForgottenWithTheirSession: each of several requests has
// its one batch hang on the wire; its deadline passes and the drain
// closes the endpoint, which cannot prove the write over but proves the
// source released (rdma.ErrCloseUnproven with rdma.ErrSourcesReleased),
// so the request fails, releases its source pins and its session stops.
// The worker kept every such op in its list of unproven ops for its whole
// life, with no owner: the list grew by one entry per cut request without
// bound, and once a request id came back (its tombstone evicted) on the
// same worker, a stop of that worker for good named the old op's ref as
// in doubt to the new session, which kept its own op of that ref in doubt
// and its pins held for good. Now the entries go once their session has
// stopped (the worker watches it), and carry it. Checked to fail with
// the fix reverted (the entries of all requests are still there at the
// poll's deadline).
func TestUnprovenOpsForgottenWithTheirSession(t *testing.T) {
	const prompt, requests = 32, 3
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	ag := faulty.New(loopback.New(loopback.WithNetwork(net)), faulty.WithUnprovenClose(), faulty.WithSourcesReleased(),
		faulty.Hang(func(uint64, *rand.Rand) bool { return true }))
	ctxR := startTestRankOn(t, "ctx", link, ag)
	// The generation side gets no proof that the writes are over: its
	// pages stay quarantined, so it may close undrained.
	genR := startTestRankClose(t, "gen", link, loopback.New(loopback.WithNetwork(net)), false)
	tpb := cancelOrderLayout.TokensPerBlock
	chunks, err := kvcache.Chunks(prompt, prompt, tpb)
	if err != nil {
		t.Fatal(err)
	}
	for i := range requests {
		id := fmt.Sprintf("cut-%d", i)
		if _, err := genR.e.Receive(RxRequest{ID: id, PromptLen: prompt, Context: "ctx",
			ContextParallel: kvcache.Parallel{TP: 1, PP: 1}, Deadline: time.Now().Add(20 * time.Second)}); err != nil {
			t.Fatal(err)
		}
		src, err := ctxR.e.Pools().Alloc([]int{prompt / tpb})
		if err != nil {
			t.Fatal(err)
		}
		tx, err := ctxR.e.Send(TxRequest{ID: id, PromptLen: prompt, Deadline: time.Now().Add(300 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chunks {
			tx.Chunk(c, c.Runs(tpb, src), FiredFence{})
		}
		// Done: the source pins are released (the close proved the
		// backend reads them no more).
		if o := wait(t, id+"'s outcome", tx.Done()); o.OK || !errors.Is(o.Err, ErrTimeout) {
			t.Fatalf("%s: %s %v, want a timeout", id, o.Status, o.Err)
		}
		if err := ctxR.e.FreeBlocks(src); err != nil {
			t.Fatalf("%s: free its source blocks: %v", id, err)
		}
	}
	if n := ctxR.e.stats.ClosesUnproven.Load(); n != requests {
		t.Fatalf("%d unproven closes, want %d", n, requests)
	}
	// Every session has stopped (or is stopping): nothing the worker
	// keeps can concern it any more.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ops, sessions := unprovenEntries(ctxR.e)
		if ops == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d unproven ops of %d stopped sessions still kept by the workers after %d cut requests", ops, sessions, requests)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}

// TestWorkerDeadTellsEachSessionItsOwnOps: a stop's report names, to each
// session, only the ops in doubt or released of that session, not those
// of another with the same request id (the same refs).
func TestWorkerDeadTellsEachSessionItsOwnOps(t *testing.T) {
	old, cur := actor.NewPID("test", "$1"), actor.NewPID("test", "$2")
	r0, r1 := core.OpRef{Request: "r", Peer: 0, Seq: 0}, core.OpRef{Request: "r", Peer: 0, Seq: 1}
	m := &workerDead{worker: 1,
		inDoubt:  []core.SessionOps[*actor.PID]{{Session: old, Ops: []core.OpRef{r0}}, {Session: cur, Ops: []core.OpRef{r1}}},
		released: []core.SessionOps[*actor.PID]{{Session: old, Ops: []core.OpRef{r0}}}}
	got := m.tx(actor.NewPID("test", "$2"))
	if got.Worker != 1 || !slices.Equal(got.InDoubt, []core.OpRef{r1}) || len(got.Released) != 0 {
		t.Fatalf("the current session hears %+v, want worker 1 with only %v in doubt", got, r1)
	}
	got = m.tx(old)
	if !slices.Equal(got.InDoubt, []core.OpRef{r0}) || !slices.Equal(got.Released, []core.OpRef{r0}) {
		t.Fatalf("the old session hears %+v, want %v in doubt and released", got, r0)
	}
}
