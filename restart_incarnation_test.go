package kvxfer_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// startOn starts a TP1 engine named inst on link (a new incarnation each call).
func startOn(t *testing.T, link control.Link, l kvcache.Layout, inst string) *kvxfer.Engine {
	t.Helper()
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Parallel: tp1, Rank: tp1.RankAt(0),
		Layout: &l, PoolBytes: 4 << 20, Workers: 1, Link: link, TransferTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("start %s: %v", inst, err)
	}
	return e
}

// sendWhole runs the context side of request id on e: Send, one chunk of
// the whole prompt, its source filled with the pattern of req.
func sendWhole(t *testing.T, e *kvxfer.Engine, l kvcache.Layout, id string, req, promptLen int) (*kvxfer.TxHandle, [][]kvcache.BlockID) {
	t.Helper()
	nblk := l.BlocksFor(promptLen)
	src, err := e.Pools().Alloc([]int{nblk, nblk})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: promptLen, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ch := kvcache.Chunk{Start: 0, End: promptLen, FirstBlock: 0, Last: true}
	f := &kvxfer.ManualFence{}
	if err := tx.Chunk(ch, ch.Runs(l.TokensPerBlock, src), f); err != nil {
		t.Fatal(err)
	}
	for g := range l.Groups {
		for b := range nblk {
			fill(e, l, g, src[g][b], b, req)
		}
	}
	f.Fire(nil)
	return tx, src
}

// TestRequestResentAcrossWriterRestart: a generation request started
// while its writer was restarting (the old incarnation closed, the new
// one not yet listening) has its RequestData refused by the link and
// re-sent with backoff. The re-send that finally goes through reaches the
// new incarnation, but it is still addressed to the old one (fixed at
// Start), so the new incarnation drops it: the request never gets an
// answer and fails at its deadline with its blocks quarantined, although
// no RequestData ever reached the old incarnation.
func TestRequestResentAcrossWriterRestart(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	gen := startOn(t, link, l, "gen")
	ctx1 := startOn(t, link, l, "ctx")
	c := &cluster{link: link, ctx: []*kvxfer.Engine{ctx1}, gen: []*kvxfer.Engine{gen}, ctxPar: tp1, genPar: tp1}
	transfer(t, c, l, "before", 1, 64, 32, true) // gen learns ctx1's incarnation
	closeWithin(t, ctx1, "ctx1")

	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "across", PromptLen: 64, Context: "ctx",
		ContextParallel: tp1, Timeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for gen.Stats().FramesUnsent == 0 { // its RequestData was refused: no ctx listens
		if time.Now().After(deadline) {
			t.Fatal("the RequestData was never refused")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	ctx2 := startOn(t, link, l, "ctx")
	tx, src := sendWhole(t, ctx2, l, "across", 2, 64)
	endAcrossRestart(t, l, gen, ctx2, rx, tx, src)
}

// TestLateRequestDataOfOldIncarnationNotResolvedAgainstNewHello: a
// RequestData the old incarnation of a generation rank sent before it
// died (delayed in the control plane: a full mailbox, a zmq queue) reaches
// the context rank after the rank restarted. The context side resolves it
// against the Hello the link holds now - the new incarnation's - and
// writes the request into the new incarnation's pool, at block ids the new
// incarnation never gave it (here: blocks it holds for its own use). Its
// Result is addressed to the old incarnation, which the new one drops: the
// corruption is silent on both sides, and the context side reports DONE.
func TestLateRequestDataOfOldIncarnationNotResolvedAgainstNewHello(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	ctxE := startOn(t, link, l, "ctx")
	gen1 := startOn(t, link, l, "gen")
	c := &cluster{link: link, ctx: []*kvxfer.Engine{ctxE}, gen: []*kvxfer.Engine{gen1}, ctxPar: tp1, genPar: tp1}
	transfer(t, c, l, "warm", 1, 64, 32, true) // ctx hears gen1's incarnation
	inc1 := gen1.Hello().Incarnation
	closeWithin(t, gen1, "gen1")

	gen2 := startOn(t, link, l, "gen") // the restart: a new pool
	defer closeWithin(t, gen2, "gen2")
	defer closeWithin(t, ctxE, "ctx")
	held := holdFreeBlocks(t, gen2) // gen2's own data, in every free block
	for g := range held {
		for _, id := range held[g] {
			for i := range gen2.Block(g, id) {
				gen2.Block(g, id)[i] = 0xEE
			}
		}
	}
	// The context side's prefill of "late" runs; gen1's RequestData for it
	// arrives now, naming blocks of gen1's pool (ids gen2 holds).
	tx, src := sendWhole(t, ctxE, l, "late", 3, 64)
	groups := make([]messages.GroupDest, len(l.Groups))
	for g, grp := range l.Groups {
		first, end := kvcache.NeededRange(64, grp.Window, l.TokensPerBlock, 0)
		for i := 0; i < end-first; i++ {
			groups[g].Blocks = append(groups[g].Blocks, int32(held[g][i]))
		}
		groups[g].First = int32(first)
	}
	conn, err := link.Dial(ctxE.Hello().From)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Send(&messages.RequestData{RequestID: "late", Epoch: 77, From: gen2.Hello().From,
		Incarnations: messages.Incarnations{FromIncarnation: inc1, ToIncarnation: ctxE.Hello().Incarnation},
		GenParallel:  messages.Parallel{TP: 1, PP: 1}, PromptLen: 64, Groups: groups,
		DeadlineUnixNano: time.Now().Add(time.Minute).UnixNano()}); err != nil {
		t.Fatal(err)
	}
	o := waitOutcome(t, tx.Done())
	_ = ctxE.Pools().Free(src)
	changed := 0
	for g := range held {
		for _, id := range held[g] {
			if !bytes.Equal(gen2.Block(g, id), bytes.Repeat([]byte{0xEE}, len(gen2.Block(g, id)))) {
				changed++
			}
		}
	}
	if changed > 0 || o.OK {
		t.Errorf("a RequestData of gen's incarnation %d (gen is now incarnation %d) was served into the new incarnation's pool: %d of its blocks overwritten; the context side's Send ended %s %v",
			inc1, gen2.Hello().Incarnation, changed, o.Status, o.Err)
	}
	_ = gen2.FreeBlocks(held)
}

// TestOldIncarnationsProofIsNotDropped: context rank ctx's incarnation 1
// stalls (a partition, SIGSTOP) while generation request r1 waits for it;
// the orchestrator starts incarnation 2 under the same name, which serves
// r2. r1 fails at its deadline, its blocks quarantined until a proof from
// incarnation 1. Incarnation 1 resumes and sends that proof (its CancelAck
// for r1, addressed to this generation rank), but the generation listener
// refuses every frame of an incarnation older than one already heard
// (IncarnationTable.Admit), so the proof never reaches r1's session, which
// alone checks the writer's incarnation: r1's blocks stay quarantined for
// good (and the engine's Close fails on its session).
func TestOldIncarnationsProofIsNotDropped(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	gen := startOn(t, link, l, "gen")
	ctxID := messages.PeerID{Instance: "ctx"}
	// Incarnation 1 of ctx: a fake rank that records what it is sent.
	got := make(chan messages.Frame, 64)
	lis, err := link.Listen(&messages.Hello{From: ctxID, Incarnation: 1, LayoutHash: gen.Hello().LayoutHash,
		Parallel: messages.Parallel{TP: 1, PP: 1}}, func(f messages.Frame) { got <- f })
	if err != nil {
		t.Fatal(err)
	}
	rx1, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "r1", PromptLen: 64, Context: "ctx",
		ContextParallel: tp1, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var rd *messages.RequestData
	for rd == nil {
		select {
		case f := <-got:
			rd, _ = f.(*messages.RequestData)
		case <-time.After(10 * time.Second):
			t.Fatal("no RequestData for r1")
		}
	}
	if rd.ToIncarnation != 1 {
		t.Fatalf("r1 addressed to incarnation %d, want 1", rd.ToIncarnation)
	}
	_ = lis.Close() // incarnation 1 stalls, out of reach; incarnation 2 takes the name
	ctx2 := startOn(t, link, l, "ctx")
	c := &cluster{link: link, ctx: []*kvxfer.Engine{ctx2}, gen: []*kvxfer.Engine{gen}, ctxPar: tp1, genPar: tp1}
	transfer(t, c, l, "r2", 2, 64, 32, true)
	o := waitOutcome(t, rx1.Done())
	if o.OK {
		t.Fatalf("r1 %s", o.Status)
	}
	if q := gen.Pools().Quarantined(); q == 0 {
		t.Fatalf("r1 (%s) quarantined nothing: the test sees nothing", o.Status)
	}
	// Incarnation 1 resumes: nothing of it writes r1, it says so.
	conn, err := link.Dial(gen.Hello().From)
	if err != nil {
		t.Fatal(err)
	}
	stale := gen.Stats().FramesStale
	if err := conn.Send(&messages.CancelAck{RequestID: "r1", Epoch: rd.Epoch, From: ctxID,
		Incarnations: messages.Incarnations{FromIncarnation: 1, ToIncarnation: rd.FromIncarnation}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for gen.Pools().Quarantined() != 0 {
		if time.Now().After(deadline) {
			t.Errorf("%d blocks of r1 still quarantined 5 s after incarnation 1's CancelAck for it (frames dropped as stale: %d more)",
				gen.Pools().Quarantined(), gen.Stats().FramesStale-stale)
			break
		}
		time.Sleep(5 * time.Millisecond) // poll with a deadline
	}
	closeWithin(t, ctx2, "ctx2")
	closeWithin(t, gen, "gen")
}

// TestReplayReaddressed: the trace of a generation engine whose request
// was re-addressed to a restarted writer's new incarnation (RxAddress, the
// table's Readdress) replays identically and exports.
func TestReplayReaddressed(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	dir := t.TempDir()
	gen, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Parallel: tp1, Rank: tp1.RankAt(0),
		Layout: &l, PoolBytes: 4 << 20, Workers: 1, Link: link, TransferTimeout: 30 * time.Second,
		TracePath: filepath.Join(dir, "gen-0.jsonl")})
	if err != nil {
		t.Fatal(err)
	}
	ctx1 := startOn(t, link, l, "ctx")
	c := &cluster{link: link, ctx: []*kvxfer.Engine{ctx1}, gen: []*kvxfer.Engine{gen}, ctxPar: tp1, genPar: tp1}
	transfer(t, c, l, "before", 1, 64, 32, true)
	closeWithin(t, ctx1, "ctx1")
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "across", PromptLen: 64, Context: "ctx", ContextParallel: tp1})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for gen.Stats().FramesUnsent == 0 { // refused: no ctx listens
		if time.Now().After(deadline) {
			t.Fatal("the RequestData was never refused")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	ctx2 := startOn(t, link, l, "ctx")
	_, src := sendWhole(t, ctx2, l, "across", 2, 64)
	o := waitOutcome(t, rx.Done())
	if !o.OK {
		t.Fatalf("across: %s %v", o.Status, o.Err)
	}
	verify(t, gen, l, 64, o.Blocks, 2)
	_ = gen.FreeBlocks(o.Blocks)
	_ = ctx2.Pools().Free(src)
	closeWithin(t, ctx2, "ctx2")
	closeWithin(t, gen, "gen")
	replayAndExport(t, dir)
	b, err := os.ReadFile(filepath.Join(dir, "gen-0.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"type":"RxAddress"`, `"Readdress"`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the trace has no %s: the request was not re-addressed, the test sees nothing", want)
		}
	}
}

// lagLink is the generation rank's view of a MemLink that lags behind a
// writer's restart: while lagging, it knows no Hello of the context peers
// (the old incarnation said goodbye, the new one's Hello has not come),
// although a new incarnation listening there takes every frame sent to it.
type lagLink struct {
	*control.MemLink
	lagging atomic.Bool
}

func (l *lagLink) Hello(peer messages.PeerID) (*messages.Hello, error) {
	if l.lagging.Load() && peer.Instance == "ctx" {
		return nil, fmt.Errorf("%w: %s said goodbye", control.ErrPeerGone, peer)
	}
	return l.MemLink.Hello(peer)
}

// TestRequestDataWaitsForRestartedWritersHello: the interleaving behind
// the occasional failure of TestRequestResentAcrossWriterRestart, forced.
// The writer restarted; its new incarnation takes frames, but its Hello
// has not reached the generation rank, which knows none for it. The
// request's RequestData, addressed to the old incarnation (the one the
// rank last heard), used to leave then: the new incarnation dropped it as
// stale, nothing sent it again, and the request failed at its deadline
// with its blocks quarantined. It waits for a Hello now (counted unsent),
// and once the new incarnation's is read it is re-addressed and sent.
// Checked: fails without the fix in core.Addressing.
func TestRequestDataWaitsForRestartedWritersHello(t *testing.T) {
	l := smallLayout()
	mem := control.NewMemLink()
	lag := &lagLink{MemLink: mem}
	gen := startOn(t, lag, l, "gen")
	ctx1 := startOn(t, mem, l, "ctx")
	c := &cluster{link: mem, ctx: []*kvxfer.Engine{ctx1}, gen: []*kvxfer.Engine{gen}, ctxPar: tp1, genPar: tp1}
	transfer(t, c, l, "before", 1, 64, 32, true) // gen learns ctx1's incarnation
	closeWithin(t, ctx1, "ctx1")
	lag.lagging.Store(true)
	ctx2 := startOn(t, mem, l, "ctx") // takes frames at once
	tx, src := sendWhole(t, ctx2, l, "across", 2, 64)

	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "across", PromptLen: 64, Context: "ctx",
		ContextParallel: tp1, Timeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	// The RequestData was checked against the Hello while none was known:
	// it waited (unsent), or it left and ctx2 dropped it.
	for gen.Stats().FramesUnsent == 0 && ctx2.Stats().FramesStale == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the RequestData was never checked")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	lag.lagging.Store(false) // ctx2's Hello arrives
	endAcrossRestart(t, l, gen, ctx2, rx, tx, src)
}

// staleLink is the generation rank's view of a MemLink across a writer's
// crash and restart over zmq: while it holds a Hello of the context peer,
// it returns that one (the old incarnation's, taken as live: no heartbeat
// missed yet) whatever the peer's listener is now, although a new
// incarnation listening there takes every frame sent to it. As over zmq,
// where a connection's Hello precedes its frames, the first frame that
// reaches this rank from another incarnation of the peer ends the hold:
// the Hello read from then on is the new incarnation's.
type staleLink struct {
	*control.MemLink
	held atomic.Pointer[messages.Hello]
}

func (l *staleLink) Hello(peer messages.PeerID) (*messages.Hello, error) {
	if h := l.held.Load(); h != nil && peer == h.From {
		return h, nil
	}
	return l.MemLink.Hello(peer)
}

func (l *staleLink) Listen(self *messages.Hello, deliver func(messages.Frame)) (control.Listener, error) {
	return l.MemLink.Listen(self, func(f messages.Frame) {
		if h := l.held.Load(); h != nil && f.Sender() == h.From {
			if in, ok := f.(messages.Incarnated); ok && in.Incarnation().FromIncarnation != h.Incarnation {
				l.held.Store(nil)
			}
		}
		deliver(f)
	})
}

// TestMisaddressedRequestDataReaddressed: the zmq crash-restart window.
// The writer ctx1 crashed without a goodbye and ctx2 restarted on its
// endpoint; the generation rank still holds ctx1's Hello as live, so
// the request's RequestData leaves addressed to ctx1 (core.Addressing
// lets it go: a Hello names its incarnation), and ctx2, which takes
// frames there before its Hello is read on the generation side, drops it
// as addressed to its predecessor. The session took it as delivered and
// never sent it again: the request failed at its deadline (or on ctx1's
// exit proof), its blocks quarantined meanwhile. ctx2 now answers
// Misaddressed (the generation rank's Hello says FeatureMisaddressed),
// and the generation side addresses the request to ctx2 and sends it
// again: READY, with ctx2's data.
//
// Checked: without the answer (the tx parent's onMisaddressed returning
// at once) it fails: TIMED_OUT, the blocks quarantined, ctx2 having
// dropped the frame as stale.
//
// "unheard": ctx2 has not heard the generation rank's Hello when the
// frame comes (over zmq: the generation rank's connection reconnected to
// it unbound, zmq's listener.misaddressed), so only the RequestData's own
// Features say the generation rank takes the answer. Checked: without
// them (RxTable.Start) "unheard" fails the same way.
func TestMisaddressedRequestDataReaddressed(t *testing.T) {
	for _, unheard := range []bool{false, true} {
		t.Run(fmt.Sprintf("unheard=%v", unheard), func(t *testing.T) { testMisaddressedRequestDataReaddressed(t, unheard) })
	}
}

// deafLink is a context rank's view of a MemLink that knows no Hello of
// the generation peers while deaf; the first Misaddressed it sends ends
// that (over zmq, the generation rank's connection says Hello again
// before its next frame once its link hears this rank's Hello, which
// precedes the answer on this rank's connection).
type deafLink struct {
	*control.MemLink
	deaf atomic.Bool
}

func (l *deafLink) Hello(peer messages.PeerID) (*messages.Hello, error) {
	if l.deaf.Load() && peer.Instance == "gen" {
		return nil, fmt.Errorf("%w: %s not heard yet", control.ErrPeerGone, peer)
	}
	return l.MemLink.Hello(peer)
}

func (l *deafLink) Dial(peer messages.PeerID) (control.Conn, error) {
	c, err := l.MemLink.Dial(peer)
	return &hearingConn{Conn: c, l: l}, err
}

type hearingConn struct {
	control.Conn
	l *deafLink
}

func (c *hearingConn) Send(f messages.Frame) error {
	if _, ok := f.(*messages.Misaddressed); ok {
		c.l.deaf.Store(false)
	}
	return c.Conn.Send(f)
}

func testMisaddressedRequestDataReaddressed(t *testing.T, unheard bool) {
	l := smallLayout()
	mem := control.NewMemLink()
	stale := &staleLink{MemLink: mem}
	gen := startOn(t, stale, l, "gen")
	ctx1 := startOn(t, mem, l, "ctx")
	c := &cluster{link: mem, ctx: []*kvxfer.Engine{ctx1}, gen: []*kvxfer.Engine{gen}, ctxPar: tp1, genPar: tp1}
	transfer(t, c, l, "before", 1, 64, 32, true) // gen learns ctx1's incarnation
	peer := messages.PeerID{Instance: "ctx", Rank: 0}
	h1, err := mem.Hello(peer)
	if err != nil {
		t.Fatal(err)
	}
	stale.held.Store(h1) // ctx1's Hello, as live
	closeWithin(t, ctx1, "ctx1")
	var ctxLink control.Link = mem
	if unheard {
		deaf := &deafLink{MemLink: mem}
		deaf.deaf.Store(true)
		ctxLink = deaf
	}
	ctx2 := startOn(t, ctxLink, l, "ctx") // takes frames at once
	if h2, err := mem.Hello(peer); err != nil || h2.Incarnation == h1.Incarnation {
		t.Fatalf("ctx2's Hello %v (%v): want another incarnation than ctx1's %d", h2, err, h1.Incarnation)
	}
	tx, src := sendWhole(t, ctx2, l, "across", 2, 64)

	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "across", PromptLen: 64, Context: "ctx",
		ContextParallel: tp1, Timeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	endAcrossRestart(t, l, gen, ctx2, rx, tx, src, func() {
		if ctx2.Stats().FramesStale == 0 {
			t.Errorf("the window was not hit: ctx2 dropped no frame addressed to ctx1")
		}
	})
}

// TestMisaddressedForgedChangesNothing: Misaddressed frames that answer
// no RequestData copy of a live request — for a request not started
// here, garbled (no incarnation it was addressed to), addressed to
// another incarnation of the generation rank, from a peer that is no
// writer of the request, about a copy addressed to an incarnation the
// request is not addressed to — are counted (stale, rejected) and change
// nothing: the request still completes READY with its writer's data, and
// nothing was freed or re-sent meanwhile.
func TestMisaddressedForgedChangesNothing(t *testing.T) {
	l := smallLayout()
	mem := control.NewMemLink()
	gen := startOn(t, mem, l, "gen")
	ctx := startOn(t, mem, l, "ctx")
	genInc, ctxInc := gen.Hello().Incarnation, ctx.Hello().Incarnation
	peer := messages.PeerID{Instance: "ctx", Rank: 0}
	rx, err := gen.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "live", PromptLen: 64, Context: "ctx",
		ContextParallel: tp1, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := mem.Dial(gen.Hello().From)
	if err != nil {
		t.Fatal(err)
	}
	mis := func(req string, from messages.PeerID, addressed, by, to uint64) *messages.Misaddressed {
		return &messages.Misaddressed{RequestID: req, Epoch: 1, From: from, Addressed: addressed,
			Incarnations: messages.Incarnations{FromIncarnation: by, ToIncarnation: to}}
	}
	before := gen.Stats()
	for _, f := range []*messages.Misaddressed{
		mis("nope", peer, ctxInc-1, ctxInc, genInc),                                        // stale: no such request
		mis("live", peer, 0, ctxInc, genInc),                                               // rejected: invalid
		mis("live", peer, ctxInc-1, ctxInc, genInc-1),                                      // stale: to another incarnation of gen
		mis("live", messages.PeerID{Instance: "other", Rank: 0}, ctxInc-1, ctxInc, genInc), // rejected: not a writer
		mis("live", peer, ctxInc-1, ctxInc, genInc),                                        // the session's: addressed to ctxInc, not ctxInc-1
	} {
		if err := conn.Send(f); err != nil {
			t.Fatal(err)
		}
	}
	// The listener counts two at once, the rx parent two as it routes,
	// the session one (stale: it changes nothing).
	counted := func() (stale, rejected int64) {
		after := gen.Stats()
		return after.FramesStale - before.FramesStale, after.FramesRejected - before.FramesRejected
	}
	deadline := time.Now().Add(10 * time.Second)
	for s, r := counted(); s < 3 || r < 2; s, r = counted() {
		if time.Now().After(deadline) {
			t.Fatalf("forged Misaddressed: %d counted stale, %d rejected; want 3 and 2", s, r)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	tx, src := sendWhole(t, ctx, l, "live", 3, 64)
	o := waitOutcome(t, rx.Done())
	to := waitOutcome(t, tx.Done())
	_ = ctx.Pools().Free(src)
	if !o.OK || !to.OK {
		t.Fatalf("rx %s %v, tx %s %v: want both done", o.Status, o.Err, to.Status, to.Err)
	}
	verify(t, gen, l, 64, o.Blocks, 3)
	_ = gen.FreeBlocks(o.Blocks)
	if s, r := counted(); s != 3 || r != 2 {
		t.Errorf("forged Misaddressed: %d counted stale, %d rejected; want 3 and 2", s, r)
	}
	if q := gen.Pools().Quarantined(); q != 0 {
		t.Errorf("gen quarantines %d blocks", q)
	}
	closeWithin(t, ctx, "ctx")
	closeWithin(t, gen, "gen")
}

// endAcrossRestart waits for a request sent across a writer's restart (rx
// at gen, tx at the new incarnation ctx2), frees tx's source blocks, runs
// check (if any), requires rx READY with tx's bytes, and closes both.
func endAcrossRestart(t *testing.T, l kvcache.Layout, gen, ctx2 *kvxfer.Engine, rx *kvxfer.RxHandle, tx *kvxfer.TxHandle, src [][]kvcache.BlockID, check ...func()) {
	t.Helper()
	o := waitOutcome(t, rx.Done())
	to := waitOutcome(t, tx.Done())
	_ = ctx2.Pools().Free(src)
	for _, c := range check {
		c()
	}
	if !o.OK {
		t.Errorf("rx: %s %v (ctx2's Send: %s %v); gen quarantines %d blocks, ctx2 dropped %d stale frames",
			o.Status, o.Err, to.Status, to.Err, gen.Pools().Quarantined(), ctx2.Stats().FramesStale)
	} else {
		verify(t, gen, l, 64, o.Blocks, 2)
		_ = gen.FreeBlocks(o.Blocks)
	}
	closeWithin(t, ctx2, "ctx2")
	closeWithin(t, gen, "gen")
}
