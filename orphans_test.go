//go:build kvxfer_invariants

package kvxfer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// TestOrphanLimitRefusesNewRequests: a context rank holds at most
// MaxOrphanRequests sessions that a generation instance's RequestData
// opened before Send. Past the limit the generation side's new requests
// fail at once, naming the limit, while the ones held wait for Send; once
// Send adopts one, a new request is taken again.
func TestOrphanLimitRefusesNewRequests(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	start := func(inst string, orphans int) *kvxfer.Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 1 << 20,
			Workers: 1, Link: link, TransferTimeout: time.Minute, MaxOrphanRequests: orphans})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	ce, ge := start("ctx", 3), start("gen", 0)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ce.Close(ctx); err != nil {
			t.Errorf("close ctx: %v", err)
		}
		if err := ge.Close(ctx); err != nil {
			t.Errorf("close gen: %v", err)
		}
	}()
	receive := func(id string) *kvxfer.RxHandle {
		t.Helper()
		h, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "ctx"})
		if err != nil {
			t.Fatalf("receive %s: %v", id, err)
		}
		return h
	}
	// One sender worker per engine: the generation side's RequestData
	// leave in the order their sessions hand them over, and the context
	// side takes them in that order.
	log := &workerLog{}
	actors.ObserveWorkers(log.add)
	defer actors.ObserveWorkers(nil)
	sent := func(id string) bool {
		for _, ev := range log.snapshot() {
			if _, ok := ev.Frame.(*messages.RequestData); ok && ev.Request == id {
				return true
			}
		}
		return false
	}
	var held []*kvxfer.RxHandle
	for i := range 3 {
		id := fmt.Sprintf("held-%d", i)
		held = append(held, receive(id))
		waitFor(t, id+"'s RequestData sent", func() bool { return sent(id) })
	}
	for i := range 2 {
		h := receive(fmt.Sprintf("over-%d", i))
		o := waitOutcome(t, h.Done())
		if o.OK || o.Err == nil || !strings.Contains(o.Err.Error(), "orphan limit") {
			t.Fatalf("request over the limit: %s %v, want a failure naming the orphan limit", o.Status, o.Err)
		}
	}
	for _, h := range held {
		select {
		case o := <-h.Done():
			t.Fatalf("a request within the limit ended: %s %v", o.Status, o.Err)
		default:
		}
	}
	// Send adopts held-0: room for one more.
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "held-0", PromptLen: 32})
	if err != nil {
		t.Fatal(err)
	}
	tx.Cancel()
	rejected := ce.Stats().FramesRejected
	if rejected != 2 {
		t.Fatalf("context side rejected %d frames, want the 2 over the limit", rejected)
	}
	late := receive("late")
	waitFor(t, "late's RequestData sent", func() bool { return sent("late") })
	// held-1, held-2 and late fill the limit again: a probe after late is
	// refused, and its refusal proves that late was taken before it.
	probe := receive("probe")
	if o := waitOutcome(t, probe.Done()); o.OK || o.Err == nil || !strings.Contains(o.Err.Error(), "orphan limit") {
		t.Fatalf("probe over the limit: %s %v, want a failure naming the orphan limit", o.Status, o.Err)
	}
	if got := ce.Stats().FramesRejected; got != rejected+1 {
		t.Fatalf("context side rejected %d frames, want %d: late was refused after Send made room", got, rejected+1)
	}
	late.Cancel()
	for _, h := range held[1:] {
		h.Cancel()
	}
}
