package node_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// TestBlockAfterNodeClose: once Node.Close has unmapped the pool (a shm
// file, a UCX allocation), Engine.Block is nil and Pools().Alloc fails
// with ErrClosed. Before, Block returned a slice of the unmapped memory
// (reading it was a SIGSEGV) and Alloc handed out blocks of it. (Checked
// to fail: without the node's MarkClosed, Block returns the whole block.)
func TestBlockAfterNodeClose(t *testing.T) {
	backends := []string{shm.Backend}
	if ucx.Available {
		backends = append(backends, ucx.Backend)
	}
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			_, gc := pair(t, b)
			n, err := node.Open(context.Background(), gc)
			if err != nil {
				t.Fatal(err)
			}
			e := n.Engine()
			if len(e.Block(0, 0)) == 0 {
				t.Fatal("Block(0, 0) of a live node is empty")
			}
			if err := n.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if blk := e.Block(0, 0); blk != nil {
				t.Fatalf("Block after Close: %d bytes of unmapped pool memory, want nil", len(blk))
			}
			if _, err := e.Pools().Alloc([]int{1}); !errors.Is(err, actors.ErrClosed) {
				t.Fatalf("Alloc after Close: %v, want ErrClosed", err)
			}
		})
	}
}

// TestWaitPeersAfterClose: WaitPeers after Close returns at once, with a
// background context too, an error wrapping kvxfer.ErrClosed; so does a
// wait started beside Close (under way when Close begins, or not yet).
// Before, it waited out its context and then blamed the silent peer
// (ErrPeerSilent), or with a background context never returned. (Checked
// to fail: without the closing checks, the first wait ends at its
// deadline with ErrPeerSilent.)
func TestWaitPeersAfterClose(t *testing.T) {
	_, gc := pair(t, shm.Backend) // no ctx node runs: its peer stays silent
	n, err := node.Open(context.Background(), gc)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	wctx, cancel := context.WithTimeout(context.Background(), 4*beat)
	defer cancel()
	go func() { waiting <- n.WaitPeers(wctx) }()
	if err := n.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, kvxfer.ErrClosed) {
			t.Fatalf("WaitPeers beside Close: %v, want ErrClosed", err)
		}
	case <-time.After(patience):
		t.Fatal("WaitPeers beside Close did not return")
	}
	done := make(chan error, 1)
	go func() { done <- n.WaitPeers(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, kvxfer.ErrClosed) || !strings.Contains(err.Error(), "gen/0") {
			t.Fatalf("WaitPeers after Close: %v, want ErrClosed naming gen/0", err)
		}
	case <-time.After(patience):
		t.Fatal("WaitPeers after Close with a background context did not return")
	}
}
