package kvxfer_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// TestStaleStatsMatchTheMetric: Stats.FramesStale and
// kvxfer_frames_rejected_total{reason="stale"} count the same frames. The
// context engine gets a late RequestData of a request it finished, then
// two RequestData of the generation rank's earlier incarnation (one before
// its listener heard the new incarnation, one after); the generation
// engine gets the context engine's answer to the late one, a late Result
// of that finished request, and a Result of another epoch for a live
// request (its session ignores it). On each engine the two counts agree,
// and none of these frames is counted rejected.
func TestStaleStatsMatchTheMetric(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	start := func(inst string) *kvxfer.Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Parallel: tp1, Rank: tp1.RankAt(0),
			Layout: &l, PoolBytes: 4 << 20, Workers: 1, Link: link, TransferTimeout: 30 * time.Second,
			MetricsAddr: "127.0.0.1:0"})
		if err != nil {
			t.Fatalf("start %s: %v", inst, err)
		}
		return e
	}
	ctxE := start("ctx")
	gen1 := start("gen")
	c := &cluster{link: link, ctx: []*kvxfer.Engine{ctxE}, gen: []*kvxfer.Engine{gen1}, ctxPar: tp1, genPar: tp1}
	transfer(t, c, l, "done", 1, 64, 32, true)
	ctxPeer, genPeer := ctxE.Hello().From, gen1.Hello().From
	ctxInc, inc1 := ctxE.Hello().Incarnation, gen1.Hello().Incarnation
	toCtx, err := link.Dial(ctxPeer)
	if err != nil {
		t.Fatal(err)
	}
	toGen, err := link.Dial(genPeer)
	if err != nil {
		t.Fatal(err)
	}
	send := func(conn control.Conn, f messages.Frame) {
		t.Helper()
		if err := conn.Send(f); err != nil {
			t.Fatalf("send %T for %s: %v", f, f.Request(), err)
		}
	}
	requestData := func(id string, inc uint64) *messages.RequestData {
		groups := make([]messages.GroupDest, len(l.Groups))
		for g, grp := range l.Groups {
			first, end := kvcache.NeededRange(64, grp.Window, l.TokensPerBlock, 0)
			for b := first; b < end; b++ {
				groups[g].Blocks = append(groups[g].Blocks, int32(b))
			}
			groups[g].First = int32(first)
		}
		return &messages.RequestData{RequestID: id, Epoch: 5, From: genPeer,
			Incarnations: messages.Incarnations{FromIncarnation: inc, ToIncarnation: ctxInc},
			GenParallel:  messages.Parallel{TP: 1, PP: 1}, PromptLen: 64, Groups: groups,
			DeadlineUnixNano: time.Now().Add(time.Minute).UnixNano()}
	}
	// compare waits until e's metric has counted want stale frames, then
	// requires Stats to say the same.
	compare := func(e *kvxfer.Engine, name string, want float64) {
		t.Helper()
		var metric float64
		var st kvxfer.Stats
		deadline := time.Now().Add(10 * time.Second)
		for {
			metric = gather(t, e)["kvxfer_frames_rejected_total{reason=stale}"]
			st = e.Stats()
			if metric >= want && float64(st.FramesStale) == metric {
				break
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond) // poll with a deadline
		}
		if metric != want || float64(st.FramesStale) != metric || st.FramesRejected != 0 {
			t.Errorf("%s: kvxfer_frames_rejected_total{reason=\"stale\"} = %v (want %v), Stats.FramesStale = %d, Stats.FramesRejected = %d (want 0): both count the same stale frames",
				name, metric, want, st.FramesStale, st.FramesRejected)
		}
	}

	// A live request at gen1: its session ignores a Result of another
	// epoch.
	rx, err := gen1.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "live", PromptLen: 64, Context: "ctx",
		ContextParallel: tp1, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	send(toGen, &messages.Result{RequestID: "live", Epoch: 1 << 40, From: ctxPeer, Status: messages.StatusSuccess,
		Incarnations: messages.Incarnations{FromIncarnation: ctxInc, ToIncarnation: inc1}})
	tx, src := sendWhole(t, ctxE, l, "live", 2, 64)
	if o, to := waitOutcome(t, rx.Done()), waitOutcome(t, tx.Done()); !o.OK || !to.OK {
		t.Fatalf("live: rx %s %v, tx %s %v: want both done", o.Status, o.Err, to.Status, to.Err)
	} else {
		_ = gen1.FreeBlocks(o.Blocks)
	}
	_ = ctxE.Pools().Free(src)
	// A finished request's late frames: a RequestData at ctx (answered
	// FAILED: a stale Result at gen1) and a Result at gen1.
	send(toCtx, requestData("done", inc1))
	send(toGen, &messages.Result{RequestID: "done", Epoch: 1, From: ctxPeer, Status: messages.StatusSuccess,
		Incarnations: messages.Incarnations{FromIncarnation: ctxInc, ToIncarnation: inc1}})
	compare(gen1, "gen", 3)
	closeWithin(t, gen1, "gen1")

	// gen restarts; RequestData of its earlier incarnation reach ctx:
	// one while ctx's listener knows no later incarnation of it (ctx's
	// tx parent refuses it against the new Hello), one after a frame of
	// the new incarnation taught it (its listener drops it).
	gen2 := startOn(t, link, l, "gen")
	defer closeWithin(t, gen2, "gen2")
	defer closeWithin(t, ctxE, "ctx")
	send(toCtx, requestData("old-1", inc1))
	send(toCtx, &messages.Cancel{RequestID: "nothing", Epoch: 1, From: genPeer,
		Incarnations: messages.Incarnations{FromIncarnation: gen2.Hello().Incarnation, ToIncarnation: ctxInc}})
	send(toCtx, requestData("old-2", inc1))
	compare(ctxE, "ctx", 3)
}
