package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/internal/testlog"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// departedWriter opens a generation node on etcd, lets ctx/0 (found
// through etcd) say Hello to it and move a request, then closes ctx/0 and
// waits for its Down there: the engine was told ctx/0 is down. It returns
// the generation node, its config's public key and its log. misses is the
// generation node's HeartbeatMisses (0: the default).
func departedWriter(t *testing.T, cluster string, misses int) (genN *node.Node, gc node.Config, genPublic string, logs *testlog.Buffer) {
	t.Helper()
	url, dir := etcdURL(t), t.TempDir()
	gk := newKeys(t)
	gc = etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx"})
	gc.SecretKey, gc.TransferTimeout, gc.HeartbeatMisses = gk.secret, node.Duration(patience), misses
	var genEvents events
	gc.OnMembership = genEvents.add
	logs = logged(t, &gc)
	genN = open(t, gc)
	cc := etcdNode(t, url, cluster, dir, "ctx", node.Peer{Instance: "gen"})
	cc.SendOnly = true
	ctx1, err := node.Open(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for _, n := range []*node.Node{genN, ctx1} {
		if err := n.WaitPeers(ctx); err != nil {
			t.Fatal(err)
		}
	}
	moveOne(t, ctx1, genN, "before", 32)
	if err := ctx1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "ctx/0's Down at the generation node", func() bool {
		_, ok := genEvents.find(discovery.EventDown, "ctx", 0)
		return ok
	})
	return genN, gc, gk.public, logs
}

// newRecord is an etcd record of ctx/0 at endpoint ep with key k, of a
// new incarnation.
func newRecord(ep string, k keys) discovery.Record {
	return discovery.Record{Instance: "ctx", Incarnation: discovery.NewIncarnation(), ControlEndpoint: ep,
		CurvePublicKey: k.public, Backend: shm.Backend, AgentAddr: []byte("nobody"), Parallel: messages.Parallel{TP: 1, PP: 1}}
}

// TestReceiveWaitsForARestartedWritersHello: ctx/0 left etcd (the
// generation engine was told it is down), and etcd holds its next
// incarnation, which has not said Hello yet (it registered, its Hello is
// on its way). A Receive in that window waits for the Hello, and the
// request moves once ctx/0's new process speaks, every byte verified.
// (Checked to fail: without Node.awaitReturning the request failed at
// once, "writer ctx/0 is down".)
func TestReceiveWaitsForARestartedWritersHello(t *testing.T) {
	// The wait is HeartbeatMisses beats from the record: 10 (5 s) leave a
	// loaded machine room to start the new process within it.
	genN, gc, genPublic, logs := departedWriter(t, clusterName("node-returning"), 10)
	k2 := newKeys(t)
	ep2 := "ipc://" + filepath.Join(t.TempDir(), "ctx2.sock")
	genN.Apply(discovery.Event{Kind: discovery.EventUp, Record: newRecord(ep2, k2)})

	type received struct {
		rx  *kvxfer.RxHandle
		err error
	}
	got := make(chan received, 1)
	go func() {
		rx, err := genN.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "after", PromptLen: 32, Context: "ctx"})
		got <- received{rx, err}
	}()
	// The new process starts once the request waits (or, without the
	// wait, has its handle): its Hello must not come first.
	var r received
	returned := false
	waitFor(t, patience, "the request waiting for ctx/0's Hello", func() bool {
		select {
		case r = <-got:
			returned = true
		default:
		}
		return returned || logs.Has("waits for the Hello of ctx/0's new incarnation")
	})
	cc2 := node.Config{Instance: "ctx", Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend, SendOnly: true,
		Bind: ep2, SecretKey: k2.secret, HeartbeatInterval: node.Duration(beat), TransferTimeout: node.Duration(patience),
		Peers: []node.Peer{{Instance: "gen", Endpoint: gc.Bind, PublicKey: genPublic}}}
	ctx2 := open(t, cc2)
	if !returned {
		select {
		case r = <-got:
		case <-time.After(patience):
			t.Fatalf("Receive did not return within %v of ctx/0's new process", patience)
		}
	}
	if r.err != nil {
		t.Fatalf("Receive while ctx/0's new incarnation had not said Hello: %v", r.err)
	}
	sendAndVerify(t, ctx2, genN, r.rx, "after", "request from ctx/0's new incarnation")
}

// sendAndVerify sends request id (32 tokens) from ctxN while rx, its
// receive at genN, waits, and checks that rx ends READY with every byte
// the pattern's (what names the request in a failure).
func sendAndVerify(t *testing.T, ctxN, genN *node.Node, rx *kvxfer.RxHandle, id, what string) {
	t.Helper()
	sent := make(chan error, 1)
	go func() { sent <- send(ctxN.Engine(), kvxfer.SendRequest{ID: id, PromptLen: 32}, pattern) }()
	var o kvxfer.Outcome
	select {
	case o = <-rx.Done():
	case <-time.After(patience):
		t.Fatalf("%s: no outcome within %v", what, patience)
	}
	if !o.OK {
		t.Fatalf("%s: %s: %v", what, o.Status, o.Err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	n, err := verify(genN.Engine(), id, o.Blocks, pattern)
	if err != nil {
		t.Fatal(err)
	}
	if n != o.Bytes || n == 0 {
		t.Fatalf("%s: verified %d bytes, READY says %d", what, n, o.Bytes)
	}
	if err := genN.Engine().FreeBlocks(o.Blocks); err != nil {
		t.Fatal(err)
	}
}

// TestReceiveNamesARestartedWriterThatStaysSilent: etcd holds ctx/0's
// next incarnation, whose process never says Hello. A Receive waits at
// most HeartbeatMisses heartbeat intervals from when the record was found,
// then fails with ErrPeerGone saying ctx/0 restarted, its incarnation and
// endpoint; nothing is held. (Checked to fail: without the wait's
// bound the call waited out its context; without the wait the error said
// "writer ctx/0 is down", naming no restart.)
func TestReceiveNamesARestartedWriterThatStaysSilent(t *testing.T) {
	genN, _, _, _ := departedWriter(t, clusterName("node-returning-silent"), 0)
	ep2 := "ipc://" + filepath.Join(t.TempDir(), "ctx2.sock")
	rec := newRecord(ep2, newKeys(t))
	genN.Apply(discovery.Event{Kind: discovery.EventUp, Record: rec})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: "silent", PromptLen: 32, Context: "ctx"})
	if err == nil {
		o := <-rx.Done()
		t.Fatalf("Receive from a restarted writer that never spoke: handle, outcome %s: %v; want ErrPeerGone naming the restart", o.Status, o.Err)
	}
	if ctx.Err() != nil {
		t.Fatalf("Receive waited out its context: %v", err)
	}
	if !errors.Is(err, kvxfer.ErrPeerGone) || !strings.Contains(err.Error(), "ctx/0 restarted") ||
		!strings.Contains(err.Error(), ep2) || !strings.Contains(err.Error(), "has not said Hello") {
		t.Fatalf("Receive from a restarted writer that never spoke: %v; want ErrPeerGone naming ctx/0's restart and endpoint", err)
	}
	if u := genN.Engine().Pools().Used(); u != 0 {
		t.Fatalf("%d blocks in use", u)
	}
}

// TestDownOfAReplacedIncarnationSparesItsSuccessor: ctx/0 restarted at
// the same endpoint with the same key before its first incarnation's
// etcd lease expired (a crash and a quick restart): its new incarnation
// said Hello while etcd still held the old record, and a request
// addressed to the new one is in flight when the old record's Down
// (lease expired) comes. The Down fails the old incarnation's requests,
// not this one: it moves, every byte verified. Nor does the Down tell the
// application the peer is down (OnPeerDown), as a predecessor's exit
// does not. (Checked to fail: with the node calling PeerDownBecause, by
// name, the request failed, "ctx/0 is out of etcd cluster … (lease
// expired)"; without the Hello's check before OnPeerDown, found in a
// review, the application was told ctx/0 was down while it served.)
func TestDownOfAReplacedIncarnationSparesItsSuccessor(t *testing.T) {
	url, cluster, dir := etcdURL(t), clusterName("node-replaced"), t.TempDir()
	gk, ck := newKeys(t), newKeys(t)
	gc := etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx"})
	gc.SecretKey, gc.TransferTimeout = gk.secret, node.Duration(patience)
	var downs atomic.Int32
	gc.OnPeerDown = func(string, int) { downs.Add(1) }
	genN := open(t, gc)
	ep := "ipc://" + filepath.Join(dir, "ctx.sock")
	cc := node.Config{Instance: "ctx", Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend, SendOnly: true,
		Bind: ep, SecretKey: ck.secret, HeartbeatInterval: node.Duration(beat), TransferTimeout: node.Duration(patience),
		Peers: []node.Peer{{Instance: "gen", Endpoint: gc.Bind, PublicKey: gk.public}}}
	ctx1, err := node.Open(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	inc1 := ctx1.Engine().Hello().Incarnation
	rec := newRecord(ep, ck)
	rec.Incarnation = inc1
	genN.Apply(discovery.Event{Kind: discovery.EventUp, Record: rec})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := genN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ctx1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ctx2 := open(t, cc)
	inc2 := ctx2.Engine().Hello().Incarnation
	ctx0 := messages.PeerID{Instance: "ctx"}
	waitFor(t, patience, "the Hello of ctx/0's second incarnation", func() bool {
		h, err := genN.LinkHello(ctx0)
		return err == nil && h.Incarnation == inc2
	})
	rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	before := downs.Load() // the first incarnation's goodbye may have told it
	genN.Apply(discovery.Event{Kind: discovery.EventDown, Instance: "ctx", Incarnation: inc1, Reason: discovery.ReasonLeaseExpired})
	if n := downs.Load() - before; n != 0 {
		t.Fatalf("OnPeerDown told %d times for the Down of ctx/0's first incarnation while its second is up", n)
	}
	sendAndVerify(t, ctx2, genN, rx, "r", "a request addressed to ctx/0's second incarnation, after the Down of its first")
}

// TestGoodbyeOfAReplacedIncarnationSparesItsSuccessor: ctx/0 restarts
// while its first incarnation still closes (a closing node revokes its
// lease first, and says goodbye only once its engine drained). The first
// incarnation leaves etcd, its successor says Hello, and then the first
// says goodbye naming why it exits. The link passes on the goodbye of an
// incarnation that left, for its reason: the generation node takes that
// incarnation down, but does not tell the application that ctx/0 is down
// and not coming back (OnPeerGoodbye, OnPeerDown), as a predecessor's
// Down or exit does not: its successor is up, and a request addressed to
// it moves. Two orders: the successor (same key, at another endpoint)
// said Hello before the Down, and the goodbye comes before its record
// (whose Up, same key, lets the first incarnation back at the link, which
// then rejects its goodbye itself); or the successor has a new key, and
// its record and Hello come after the Down. (Checked to fail: without the
// Hello's check in the node's goodbye handler, found in a review, the
// application heard OnPeerGoodbye with the reason and OnPeerDown, in
// both.)
func TestGoodbyeOfAReplacedIncarnationSparesItsSuccessor(t *testing.T) {
	t.Run("HelloBeforeTheDown", func(t *testing.T) { goodbyeOfAReplacedIncarnation(t, false, false) })
	t.Run("NewKeyAfterTheDown", func(t *testing.T) { goodbyeOfAReplacedIncarnation(t, true, false) })
	// Requests of the first incarnation first: every worker of gen/0 then
	// holds a control connection to ctx/0's first endpoint, which the
	// Down of the first incarnation, coming after the second's Hello,
	// leaves open (the engine keeps its workers' connections when a later
	// incarnation said Hello). The second incarnation listens elsewhere:
	// before, those connections never followed it, and the request to it
	// timed out ("RequestData never reached writer ctx/0": checked to
	// fail without zmq's Conn.followEndpointLocked).
	t.Run("HelloBeforeTheDownAfterRequests", func(t *testing.T) { goodbyeOfAReplacedIncarnation(t, false, true) })
}

// goodbyeOfAReplacedIncarnation: newKey, ctx/0's second incarnation
// comes with another key after the first one's Down (else with the same
// key, its Hello before that Down); talked, requests of the first
// incarnation ran before it was replaced.
func goodbyeOfAReplacedIncarnation(t *testing.T, newKey, talked bool) {
	url, cluster, dir := etcdURL(t), clusterName("node-replaced-bye"), t.TempDir()
	gk, ck := newKeys(t), newKeys(t)
	gc := etcdNode(t, url, cluster, dir, "gen", node.Peer{Instance: "ctx"})
	gc.SecretKey, gc.TransferTimeout = gk.secret, node.Duration(patience)
	var mu sync.Mutex
	var told []string
	tell := func(s string) { mu.Lock(); defer mu.Unlock(); told = append(told, s) }
	toldSoFar := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), told...) }
	gc.OnPeerGoodbye = func(instance string, rank int, reason string) {
		tell(fmt.Sprintf("OnPeerGoodbye(%s, %d, %q)", instance, rank, reason))
	}
	gc.OnPeerDown = func(instance string, rank int) { tell(fmt.Sprintf("OnPeerDown(%s, %d)", instance, rank)) }
	logs := logged(t, &gc)
	genN := open(t, gc)
	ep1 := "ipc://" + filepath.Join(dir, "ctx1.sock")
	cc := node.Config{Instance: "ctx", Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend, SendOnly: true,
		Bind: ep1, SecretKey: ck.secret, HeartbeatInterval: node.Duration(beat), TransferTimeout: node.Duration(patience),
		Peers: []node.Peer{{Instance: "gen", Endpoint: gc.Bind, PublicKey: gk.public}}}
	ctx1, err := node.Open(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	inc1 := ctx1.Engine().Hello().Incarnation
	rec := newRecord(ep1, ck)
	rec.Incarnation = inc1
	genN.Apply(discovery.Event{Kind: discovery.EventUp, Record: rec})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := genN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	// As many requests as workers, at least: WorkerFor spreads requests
	// over the workers.
	for i := 0; talked && i < 8; i++ {
		id := fmt.Sprintf("first-%d", i)
		rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "ctx"})
		if err != nil {
			t.Fatal(err)
		}
		sendAndVerify(t, ctx1, genN, rx, id, "a request of ctx/0's first incarnation")
	}
	down1 := discovery.Event{Kind: discovery.EventDown, Instance: "ctx", Incarnation: inc1, Reason: discovery.ReasonLeft}
	k2 := ck
	if newKey {
		// Nobody else is up under the name: the application hears it
		// left.
		genN.Apply(down1)
		k2 = newKeys(t)
	}
	cc2 := cc
	cc2.Bind, cc2.SecretKey = "ipc://"+filepath.Join(dir, "ctx2.sock"), k2.secret
	ctx2 := open(t, cc2)
	inc2 := ctx2.Engine().Hello().Incarnation
	up2 := newRecord(cc2.Bind, k2)
	up2.Incarnation = inc2
	if newKey {
		genN.Apply(discovery.Event{Kind: discovery.EventUp, Record: up2})
	}
	ctx0 := messages.PeerID{Instance: "ctx"}
	waitFor(t, patience, "the Hello of ctx/0's second incarnation", func() bool {
		h, err := genN.LinkHello(ctx0)
		return err == nil && h.Incarnation == inc2
	})
	if !newKey {
		genN.Apply(down1)
	}
	before := toldSoFar()
	if err := ctx1.CloseBecause(ctx, errors.New("its model is not the one configured")); err != nil {
		t.Fatal(err)
	}
	// The goodbye is drained (ctx/0's first incarnation started no
	// write): the link tells its proof after OnPeerGoodbye, on the same
	// goroutine, and the node logs it.
	drained := fmt.Sprintf(`"incarnation":%d,"requests":0,"message":"peer ctx/0 closed after draining its writes (goodbye)`, inc1)
	waitFor(t, patience, "the goodbye of ctx/0's first incarnation taken (its proof logged)", func() bool { return logs.Has(drained) })
	if got := toldSoFar()[len(before):]; len(got) != 0 {
		t.Fatalf("the application was told %v for the goodbye of ctx/0's first incarnation while its second is up; want nothing", got)
	}
	if !newKey {
		genN.Apply(discovery.Event{Kind: discovery.EventUp, Record: up2})
	}
	rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "ctx"})
	if err != nil {
		t.Fatal(err)
	}
	sendAndVerify(t, ctx2, genN, rx, "r", "a request addressed to ctx/0's second incarnation, after the goodbye of its first")
}

// TestReceiveFromARestartedWriterThatFellSilentIsNotWaitedFor: ctx/0's
// new incarnation said Hello, then fell silent (its process closed while
// its etcd record stays): a Receive is not held for a Hello, nor told the
// writer never spoke since its restart; it fails at once as for any
// writer that went down. (Checked to fail: without the found Hello's
// check in returning, Receive said "ctx/0 restarted ... has not said
// Hello".)
func TestReceiveFromARestartedWriterThatFellSilentIsNotWaitedFor(t *testing.T) {
	genN, gc, genPublic, logs := departedWriter(t, clusterName("node-returned-silent"), 0)
	// The departed incarnation's Hello is logged only if the node's
	// membership poll saw it before it left (it may not have: its request
	// moved and it closed within one tick), so count the lines from here.
	const hello = `"peer":"ctx/0","model":"tiny","message":"peer said Hello"`
	before := logs.Count(hello)
	k2 := newKeys(t)
	ep2 := "ipc://" + filepath.Join(t.TempDir(), "ctx2.sock")
	genN.Apply(discovery.Event{Kind: discovery.EventUp, Record: newRecord(ep2, k2)})
	cc2 := node.Config{Instance: "ctx", Layout: tiny(), PoolBytes: 1 << 20, Backend: shm.Backend, SendOnly: true,
		Bind: ep2, SecretKey: k2.secret, HeartbeatInterval: node.Duration(beat), TransferTimeout: node.Duration(patience),
		Peers: []node.Peer{{Instance: "gen", Endpoint: gc.Bind, PublicKey: genPublic}}}
	ctx2, err := node.Open(context.Background(), cc2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := genN.WaitPeers(ctx); err != nil {
		t.Fatal(err)
	}
	// The node took the Hello for the found incarnation's (as it logs).
	waitFor(t, patience, "the node's word that ctx/0's second incarnation said Hello", func() bool {
		return logs.Count(hello) > before
	})
	if err := ctx2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ctx0 := messages.PeerID{Instance: "ctx"}
	waitFor(t, patience, "ctx/0 declared down after its heartbeats", func() bool {
		_, err := genN.LinkHello(ctx0)
		return err != nil
	})
	rx, err := genN.Receive(ctx, kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "ctx"})
	if err != nil {
		t.Fatalf("Receive from a writer that spoke and fell silent: %v; want a handle failed as for a writer down", err)
	}
	select {
	case o := <-rx.Done():
		if o.Status != kvxfer.StatusFailed || !errors.Is(o.Err, kvxfer.ErrPeerGone) {
			t.Fatalf("request from a writer that fell silent: %s: %v, want FAILED with ErrPeerGone", o.Status, o.Err)
		}
	case <-time.After(patience):
		t.Fatalf("no outcome within %v", patience)
	}
}
