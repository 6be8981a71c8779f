package node_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// TestDrainedGoodbyeReleasesUnreadRequests: a generation request whose
// RequestData reached its context node's socket but was never read there
// (it came as the node's engine stopped reading frames) gets no Result,
// and across hosts no pidfd proof (none in one process either: the
// writer's process is the test's). Here gen/0 sends ctx/0's frames to a
// socket bound for ctx/0 that takes them and never reads them, while
// ctx/0's Hello, heartbeats and goodbye come on its own connection to
// gen/0. When ctx/0's node closes after its engine drained every write it
// started (the drained case), its goodbye says so, and gen/0 takes it as
// proof: the request fails naming the close, its blocks are released,
// and gen/0 closes clean. When it did not — a send whose source chunk
// never became ready keeps its session from draining, so ctx/0's Close
// reports it undrained — its goodbye proves nothing: the request fails
// the same, its destination memory stays held (quarantined, or revoked
// with its old memory held), and gen/0's Close reports it.
// Heartbeats would take 100 s to call ctx/0 down and the deadline is 10
// minutes: only the goodbye ends the request within the test's wait.
// (Checked to fail: without the drained goodbye, the drained case's
// blocks stayed quarantined; with every goodbye marked drained, the
// undrained case's blocks were released.)
func TestDrainedGoodbyeReleasesUnreadRequests(t *testing.T) {
	for _, drained := range []bool{true, false} {
		name := "undrained"
		if drained {
			name = "drained"
		}
		t.Run(name, func(t *testing.T) { drainedGoodbyeCase(t, drained) })
	}
}

func drainedGoodbyeCase(t *testing.T, drained bool) {
	cc, gc := pair(t, shm.Backend)
	for _, c := range []*node.Config{&cc, &gc} {
		c.HeartbeatMisses = 200
		c.TransferTimeout = node.Duration(10 * time.Minute)
	}
	gc.Peers[0].Endpoint = unreadSocket(t, cc.SecretKey)
	tracePath := filepath.Join(t.TempDir(), "gen.jsonl")
	gc.TracePath = tracePath
	genN := mustOpen(t, gc)
	ctxN := mustOpen(t, cc)
	ctx0, gen0 := messages.PeerID{Instance: "ctx"}, messages.PeerID{Instance: "gen"}
	waitFor(t, patience, "ctx/0's Hello at gen/0 and its connection to gen/0 up", func() bool {
		_, err := genN.LinkHello(ctx0)
		st, serr := ctxN.PeerState(gen0)
		return err == nil && serr == nil && st.Conn == zmq.ConnUp
	})
	if !drained {
		holdSend(t, ctxN.Engine())
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: "gap", PromptLen: 32, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "gen/0's RequestData taken by its control plane (RxSent in its trace)", func() bool { return rxSent(t, tracePath) })

	timeout := patience
	if !drained {
		timeout = 300 * time.Millisecond // its held send never drains
	}
	cctx, ccancel := context.WithTimeout(context.Background(), timeout)
	defer ccancel()
	err = ctxN.Close(cctx)
	switch {
	case drained && err != nil:
		t.Fatalf("ctx/0's Close: %v, want nil", err)
	case !drained && !errors.Is(err, kvxfer.ErrUndrained):
		t.Fatalf("ctx/0's Close: %v, want ErrUndrained (its held send)", err)
	}
	if got := ctxN.Engine().WritesOver(); got != drained {
		t.Fatalf("ctx/0's engine closed: WritesOver %v, want %v", got, drained)
	}
	select {
	case o := <-rx.Done():
		if o.OK || !errors.Is(o.Err, kvxfer.ErrPeerGone) || !strings.Contains(o.Err.Error(), "ctx/0 closed (it said goodbye)") {
			t.Fatalf("request from a writer that closed: %s: %v; want FAILED with ErrPeerGone naming ctx/0 and its goodbye", o.Status, o.Err)
		}
	case <-time.After(patience):
		t.Fatalf("the request did not end within %v of ctx/0's goodbye", patience)
	}
	if drained {
		select {
		case <-rx.Released():
		case <-time.After(patience):
			t.Fatal("the request's blocks were not released: ctx/0's drained goodbye is proof that its writes are over")
		}
		waitFor(t, patience, "the request's destination memory given back", func() bool {
			st := genN.Engine().Stats()
			return st.QuarantinedBytes == 0 && st.RevokedHeldBlocks == 0
		})
		wantProofs(t, genN.Engine(), kvxfer.ProofDrainedGoodbye, kvxfer.ProofCount{Proofs: 1, Requests: 1})
		if err := genN.Close(ctx); err != nil {
			t.Fatalf("gen/0's Close after ctx/0's drained goodbye: %v, want nil", err)
		}
		return
	}
	// The pool revokes (shm): the blocks are reused at once with fresh
	// memory, their old memory held until a proof; without revokes they
	// would be quarantined.
	held := func() bool {
		st := genN.Engine().Stats()
		return st.QuarantinedBytes > 0 || st.RevokedHeldBlocks > 0
	}
	waitFor(t, patience, "the request's destination memory held (quarantined or revoked)", held)
	err = genN.Close(ctx)
	if !errors.Is(err, kvxfer.ErrUndrained) || !strings.Contains(err.Error(), "gap") {
		t.Fatalf("gen/0's Close after ctx/0's undrained goodbye: %v, want ErrUndrained naming request gap (quarantined)", err)
	}
	select {
	case <-rx.Released():
		t.Fatal("the request's blocks were released after a goodbye that proves nothing (ctx/0's close left a send undrained)")
	default:
	}
	if !held() {
		t.Fatal("the request's destination memory was given back after a goodbye that proves nothing")
	}
	wantProofs(t, genN.Engine(), 0, kvxfer.ProofCount{})
}

// wantProofs checks e's Stats.WriteProofs: want for kind, none of any
// other kind.
func wantProofs(t *testing.T, e *kvxfer.Engine, kind kvxfer.ProofKind, want kvxfer.ProofCount) {
	t.Helper()
	// The proof is counted once the engine answered the node's
	// WriterProven, which may be after the request's blocks were released.
	waitFor(t, patience, fmt.Sprintf("Stats.WriteProofs[%s] = %+v", kind, want), func() bool {
		return e.Stats().WriteProofs[kind] == want
	})
	st := e.Stats()
	for k := range kvxfer.NumProofKinds {
		w := kvxfer.ProofCount{}
		if kvxfer.ProofKind(k) == kind {
			w = want
		}
		if got := st.WriteProofs[k]; got != w {
			t.Errorf("Stats.WriteProofs[%s] = %+v, want %+v", kvxfer.ProofKind(k), got, w)
		}
	}
}

// unreadSocket binds a ROUTER that speaks CURVE as the holder of secret
// and never reads: frames sent to it arrive and are never read, as those
// that reach a node's socket as its engine stops reading. It returns its
// endpoint; the test's end closes it.
func unreadSocket(t *testing.T, secret string) string {
	t.Helper()
	sock, err := zmq4.NewSocket(zmq4.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sock.SetLinger(0)
		_ = sock.Close()
	})
	if err := sock.SetCurveServer(1); err != nil {
		t.Fatal(err)
	}
	if err := sock.SetCurveSecretkey(secret); err != nil {
		t.Fatal(err)
	}
	ep := "ipc://" + filepath.Join(t.TempDir(), "unread.sock")
	if err := sock.Bind(ep); err != nil {
		t.Fatal(err)
	}
	return ep
}

// mustOpen opens a node and closes it when the test ends, whatever its
// Close says (the test checks the Close it means).
func mustOpen(t *testing.T, c node.Config) *node.Node {
	t.Helper()
	n, err := node.Open(context.Background(), c)
	if err != nil {
		t.Fatalf("Open(%s): %v", c.Instance, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = n.Close(ctx)
	})
	return n
}

// holdSend starts a send on e whose one chunk's fence never fires: its
// session cannot release the chunk's source pins, so e's Close cannot
// drain it.
func holdSend(t *testing.T, e *kvxfer.Engine) {
	t.Helper()
	l := e.Layout()
	counts := make([]int, len(l.Groups))
	for g := range counts {
		if len(e.Shape().Layers[g]) > 0 {
			counts[g] = l.BlocksFor(32)
		}
	}
	src, err := e.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.Send(context.Background(), kvxfer.SendRequest{ID: "held", PromptLen: 32})
	if err != nil {
		t.Fatal(err)
	}
	c := kvcache.Chunk{Start: 0, End: 32, Last: true}
	if err := tx.Chunk(c, c.Runs(l.TokensPerBlock, src), &kvxfer.ManualFence{}); err != nil {
		t.Fatal(err)
	}
}

// rxSent reports whether the trace at path records an RxSent step
// without error: the control plane took a RequestData (it left).
func rxSent(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `"type":"RxSent"`) && !strings.Contains(line, `"Err"`) {
			return true
		}
	}
	return false
}
