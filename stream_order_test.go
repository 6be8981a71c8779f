//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// workerLog collects what every sender worker takes from its mailbox.
type workerLog struct {
	mu  sync.Mutex
	evs []actors.WorkerEvent
}

func (w *workerLog) add(ev actors.WorkerEvent) {
	w.mu.Lock()
	w.evs = append(w.evs, ev)
	w.mu.Unlock()
}

func (w *workerLog) snapshot() []actors.WorkerEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]actors.WorkerEvent(nil), w.evs...)
}

// submitted reports whether every peer in peers has had a submit of
// request id taken by its worker.
func (w *workerLog) submitted(id string, peers ...int) bool {
	seen := map[int]bool{}
	for _, ev := range w.snapshot() {
		if ev.Kind == "submit" && ev.Request == id {
			seen[ev.Peer] = true
		}
	}
	for _, p := range peers {
		if !seen[p] {
			return false
		}
	}
	return true
}

// TestStreamActorsOrderTerminalFrames: a context rank with 4 sender
// workers writes to 2 generation ranks (TP1 → TP2), requests succeeding,
// failing (a fence error), cancelled by the context side and cancelled by
// a generation rank. For every (request, generation rank) the peer-stream
// actor is the only sender of the stream's ops, flush and terminal frame
// (FAILED, CANCELLED, SUCCESS Result or CancelAck), it is a child of the
// request's session, everything goes to one worker, and the terminal frame
// is taken from that worker's mailbox after every op and flush of the
// stream.
func TestStreamActorsOrderTerminalFrames(t *testing.T) {
	l := smallLayout()
	ctxPar, genPar := kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 2, PP: 1}
	log := &workerLog{}
	actors.ObserveWorkers(log.add)
	defer actors.ObserveWorkers(nil)
	c := startCluster(t, l, ctxPar, genPar, 4)
	ce := c.ctx[0]

	const promptLen, chunkTokens, requests = 64, 16, 16
	chunks, err := kvcache.Chunks(promptLen, chunkTokens, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{} // request → mode
	for r := range requests {
		mode := []string{"ok", "fence", "txcancel", "rxcancel"}[r%4]
		id := fmt.Sprintf("r%02d-%s", r, mode)
		want[id] = mode
		var rxs []*kvxfer.RxHandle
		for _, g := range c.gen {
			h, err := g.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: promptLen,
				Context: "ctx", ContextParallel: ctxPar})
			if err != nil {
				t.Fatalf("%s: receive: %v", id, err)
			}
			rxs = append(rxs, h)
		}
		counts := make([]int, len(l.Groups))
		for g := range counts {
			counts[g] = l.BlocksFor(promptLen)
		}
		src, err := ce.Pools().Alloc(counts)
		if err != nil {
			t.Fatalf("%s: alloc: %v", id, err)
		}
		tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: promptLen})
		if err != nil {
			t.Fatalf("%s: send: %v", id, err)
		}
		var held *kvxfer.ManualFence
		for i, ch := range chunks {
			b0, b1 := ch.Blocks(l.TokensPerBlock)
			for g := range l.Groups {
				for b := b0; b < b1; b++ {
					fill(ce, l, g, src[g][b], b, r)
				}
			}
			if mode != "ok" && i == 1 {
				// Hold the second chunk until both streams have data in
				// flight, then fail, cancel, or cancel from the peer.
				held = &kvxfer.ManualFence{}
				if err := tx.Chunk(ch, ch.Runs(l.TokensPerBlock, src), held); err != nil {
					t.Fatalf("%s: chunk %d: %v", id, i, err)
				}
				break
			}
			if err := tx.Chunk(ch, ch.Runs(l.TokensPerBlock, src), actors.FiredFence{}); err != nil {
				t.Fatalf("%s: chunk %d: %v", id, i, err)
			}
		}
		if held != nil {
			deadline := time.Now().Add(20 * time.Second)
			for !log.submitted(id, 0, 1) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: no submit for both streams within 20s", id)
				}
				time.Sleep(time.Millisecond)
			}
			switch mode {
			case "fence":
				held.Fire(errors.New("producer failed"))
			case "txcancel":
				tx.Cancel()
				held.Fire(nil)
			case "rxcancel":
				rxs[0].Cancel()
				// The context side decides on the peer's cancel before the
				// held chunk could complete the request (Done waits for
				// the drain, which waits for the fence).
				deadline := time.Now().Add(20 * time.Second)
				for tx.Err() == nil {
					if time.Now().After(deadline) {
						t.Fatalf("%s: the context side did not learn the peer's cancel within 20s", id)
					}
					time.Sleep(time.Millisecond)
				}
				held.Fire(nil)
			}
		}
		if o := waitOutcome(t, tx.Done()); o.OK != (mode == "ok") {
			t.Fatalf("%s: tx outcome %s %v", id, o.Status, o.Err)
		}
		for i, h := range rxs {
			o := waitOutcome(t, h.Done())
			if o.OK != (mode == "ok") {
				t.Fatalf("%s: rx rank %d outcome %s %v", id, i, o.Status, o.Err)
			}
			<-h.Released()
		}
		if err := ce.Pools().Free(src); err != nil {
			t.Fatalf("%s: free source (still pinned?): %v", id, err)
		}
	}
	if n := ce.Stats().StreamViolations; n != 0 {
		t.Fatalf("%d stream violations", n)
	}
	checkStreamOrder(t, log.snapshot(), want)
}

// checkStreamOrder checks the worker log of the context side.
func checkStreamOrder(t *testing.T, evs []actors.WorkerEvent, want map[string]string) {
	t.Helper()
	type key struct {
		req  string
		peer int
	}
	type streamSeen struct {
		stream, session string
		worker          int
		lastData        int // index in evs of the last submit or flush
		terminal        []int
		ops             int
	}
	streams := map[key]*streamSeen{}
	statuses := map[string]int{}
	for i, ev := range evs {
		if _, ok := want[ev.Request]; !ok {
			continue
		}
		switch ev.Kind {
		case "submit", "flush", "close":
		case "send":
			switch f := ev.Frame.(type) {
			case *messages.Result:
				statuses[f.Status.String()]++
			case *messages.CancelAck:
				statuses["CancelAck"]++
			default:
				continue // the generation side's RequestData and Cancel
			}
			if ev.Stream == "" {
				t.Errorf("%s: %T sent by no stream (worker %d)", ev.Request, ev.Frame, ev.Worker)
				continue
			}
		default:
			continue
		}
		if ev.Stream == "" {
			t.Errorf("%s peer %d: %s sent by no stream", ev.Request, ev.Peer, ev.Kind)
			continue
		}
		k := key{ev.Request, ev.Peer}
		s := streams[k]
		if s == nil {
			s = &streamSeen{stream: ev.Stream, worker: ev.Worker, lastData: -1}
			streams[k] = s
		}
		if ev.Stream != s.stream {
			t.Errorf("%s peer %d: %s from stream %s, earlier ones from %s", ev.Request, ev.Peer, ev.Kind, ev.Stream, s.stream)
		}
		if ev.Worker != s.worker {
			t.Errorf("%s peer %d: %s on worker %d, earlier ones on worker %d", ev.Request, ev.Peer, ev.Kind, ev.Worker, s.worker)
		}
		if ev.Session != "" {
			s.session = ev.Session
		}
		switch ev.Kind {
		case "submit", "flush":
			if len(s.terminal) > 0 {
				t.Errorf("%s peer %d: %s after the stream's terminal frame", ev.Request, ev.Peer, ev.Kind)
			}
			s.lastData = i
			if ev.Kind == "submit" {
				s.ops++
			}
		case "send":
			s.terminal = append(s.terminal, i)
		}
	}
	for id := range want {
		for peer := range 2 {
			s := streams[key{id, peer}]
			if s == nil {
				t.Errorf("%s peer %d: no stream seen", id, peer)
				continue
			}
			if s.ops == 0 {
				t.Errorf("%s peer %d: no op submitted", id, peer)
			}
			if len(s.terminal) != 1 {
				t.Errorf("%s peer %d: %d terminal frames, want 1", id, peer, len(s.terminal))
				continue
			}
			if s.terminal[0] < s.lastData {
				t.Errorf("%s peer %d: terminal frame (event %d) before the stream's data (event %d)", id, peer, s.terminal[0], s.lastData)
			}
			if s.session == "" || !strings.HasPrefix(s.stream, s.session+"/") {
				t.Errorf("%s peer %d: stream %s is not a child of session %s", id, peer, s.stream, s.session)
			}
		}
		if a, b := streams[key{id, 0}], streams[key{id, 1}]; a != nil && b != nil && a.stream == b.stream {
			t.Errorf("%s: both peers share stream actor %s", id, a.stream)
		}
	}
	workers := map[int]bool{}
	for _, s := range streams {
		workers[s.worker] = true
	}
	if len(workers) < 2 {
		t.Errorf("streams used %d worker(s) of 4: the test does not exercise ordering across workers", len(workers))
	}
	for _, st := range []string{"SUCCESS", "FAILED", "CANCELLED", "CancelAck"} {
		if statuses[st] == 0 {
			t.Errorf("no %s terminal frame sent (got %v)", st, statuses)
		}
	}
	t.Logf("%d streams over %d workers; terminal frames %v", len(streams), len(workers), statuses)
}
