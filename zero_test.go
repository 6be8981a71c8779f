package kvxfer_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// calm runs f, turning a panic into a test error naming what panicked.
func calm(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s panicked: %v", what, r)
		}
	}()
	f()
}

// notStarted checks that err wraps ErrNotStarted and names method.
func notStarted(t *testing.T, method string, err error) {
	t.Helper()
	if !errors.Is(err, kvxfer.ErrNotStarted) || !strings.Contains(err.Error(), method) {
		t.Errorf("%s: %v, want ErrNotStarted naming %s", method, err, method)
	}
}

// TestZeroEngineRefusesCalls: every exported method of an Engine that
// Start did not return (the zero Engine, a nil *Engine) returns an error
// wrapping ErrNotStarted and naming the method, or its documented zero
// result, instead of a nil-pointer panic.
func TestZeroEngineRefusesCalls(t *testing.T) {
	var zero kvxfer.Engine
	var none *kvxfer.Engine
	ctx := context.Background()
	peer := messages.PeerID{Instance: "ctx"}
	for _, e := range []*kvxfer.Engine{&zero, none} {
		name := "zero Engine"
		if e == nil {
			name = "nil *Engine"
		}
		t.Run(name, func(t *testing.T) {
			calm(t, "Send", func() {
				h, err := e.Send(ctx, kvxfer.SendRequest{ID: "r", PromptLen: 16})
				notStarted(t, "Engine.Send", err)
				if h != nil {
					t.Errorf("Send returned a handle")
				}
			})
			calm(t, "Receive", func() {
				h, err := e.Receive(ctx, kvxfer.ReceiveRequest{ID: "r", PromptLen: 16, Context: "ctx"})
				notStarted(t, "Engine.Receive", err)
				if h != nil {
					t.Errorf("Receive returned a handle")
				}
			})
			calm(t, "FreeBlocks", func() { notStarted(t, "Engine.FreeBlocks", e.FreeBlocks([][]kvcache.BlockID{{0}})) })
			calm(t, "PeerMapFrom", func() {
				pm, err := e.PeerMapFrom(kvcache.Parallel{TP: 1, PP: 1})
				notStarted(t, "Engine.PeerMapFrom", err)
				if pm != nil {
					t.Errorf("PeerMapFrom returned a map")
				}
			})
			calm(t, "WritersFrom", func() {
				w, err := e.WritersFrom(kvcache.Parallel{TP: 1, PP: 1})
				notStarted(t, "Engine.WritersFrom", err)
				if w != nil {
					t.Errorf("WritersFrom returned ranks")
				}
			})
			calm(t, "CheckPeer", func() { notStarted(t, "Engine.CheckPeer", e.CheckPeer(&messages.Hello{})) })
			calm(t, "WriterExited", func() {
				n, err := e.WriterExited(peer, 1, "exited")
				notStarted(t, "Engine.WriterExited", err)
				if n != 0 {
					t.Errorf("WriterExited: %d requests", n)
				}
			})
			calm(t, "WriterRequests", func() {
				n, err := e.WriterRequests(peer, 0)
				notStarted(t, "Engine.WriterRequests", err)
				if n != 0 {
					t.Errorf("WriterRequests: %d requests", n)
				}
			})
			calm(t, "PeerDown", func() { e.PeerDown(peer) })
			calm(t, "PeerDownBecause", func() { e.PeerDownBecause(peer, "is gone") })
			calm(t, "PeerAlive", func() { e.PeerAlive(peer) })
			calm(t, "Layout", func() {
				if l := e.Layout(); l.Layers != 0 || l.Groups != nil {
					t.Errorf("Layout: %+v, want the zero Layout", l)
				}
			})
			calm(t, "Shape", func() {
				if s := e.Shape(); s.Layers != nil {
					t.Errorf("Shape: %+v, want the zero Shape", s)
				}
			})
			calm(t, "Pools", func() {
				if e.Pools() != nil {
					t.Errorf("Pools is not nil")
				}
			})
			calm(t, "Block", func() {
				if e.Block(0, 0) != nil {
					t.Errorf("Block is not nil")
				}
			})
			calm(t, "BlockTensor", func() {
				if e.BlockTensor(0, 0, 0, 0) != nil {
					t.Errorf("BlockTensor is not nil")
				}
			})
			calm(t, "Memory", func() {
				if e.Memory(0) != nil {
					t.Errorf("Memory is not nil")
				}
			})
			calm(t, "Region", func() {
				if e.Region() != nil {
					t.Errorf("Region is not nil")
				}
			})
			calm(t, "Hello", func() {
				if e.Hello() != nil {
					t.Errorf("Hello is not nil")
				}
			})
			calm(t, "Stats", func() {
				if s := e.Stats(); s != (kvxfer.Stats{}) {
					t.Errorf("Stats: %+v, want zero", s)
				}
			})
			calm(t, "Metrics", func() {
				if e.Metrics() != nil {
					t.Errorf("Metrics is not nil")
				}
			})
			calm(t, "MetricsAddr", func() {
				if a := e.MetricsAddr(); a != "" {
					t.Errorf("MetricsAddr: %q", a)
				}
			})
			calm(t, "Close", func() { notStarted(t, "Engine.Close", e.Close(ctx)) })
		})
	}
}

// TestZeroHandlesRefuseCalls: every exported method of a TxHandle or
// RxHandle that Send or Receive did not return (nil, or the zero value)
// returns an error wrapping ErrNotStarted and naming the method, or its
// documented zero result (Done delivers a FAILED outcome wrapping
// ErrNotStarted; Released and Finished are closed; Cancel does nothing),
// instead of a nil-pointer panic or a channel that never fires.
func TestZeroHandlesRefuseCalls(t *testing.T) {
	c := kvcache.Chunk{Start: 0, End: 16, Last: true}
	checkDone := func(t *testing.T, method string, ch <-chan kvxfer.Outcome) {
		t.Helper()
		select {
		case o := <-ch:
			if o.Status != kvxfer.StatusFailed || o.OK {
				t.Errorf("%s: outcome %v (ok %v), want FAILED", method, o.Status, o.OK)
			}
			notStarted(t, method, o.Err)
		default:
			t.Errorf("%s: no outcome ready", method)
		}
	}
	closed := func(t *testing.T, method string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		default:
			t.Errorf("%s: not closed", method)
		}
	}
	for _, h := range []*kvxfer.TxHandle{nil, {}} {
		t.Run("TxHandle", func(t *testing.T) {
			calm(t, "Chunk", func() { notStarted(t, "TxHandle.Chunk", h.Chunk(c, nil, nil)) })
			calm(t, "SetPayload", func() { notStarted(t, "TxHandle.SetPayload", h.SetPayload([]byte("p"))) })
			calm(t, "Err", func() { notStarted(t, "TxHandle.Err", h.Err()) })
			calm(t, "Cancel", func() { h.Cancel() })
			calm(t, "Done", func() { checkDone(t, "TxHandle.Done", h.Done()) })
		})
	}
	for _, h := range []*kvxfer.RxHandle{nil, {}} {
		t.Run("RxHandle", func(t *testing.T) {
			calm(t, "Cancel", func() { h.Cancel() })
			calm(t, "Done", func() { checkDone(t, "RxHandle.Done", h.Done()) })
			calm(t, "Released", func() { closed(t, "RxHandle.Released", h.Released()) })
			calm(t, "Finished", func() { closed(t, "RxHandle.Finished", h.Finished()) })
		})
	}
}
