package node_test

import (
	"context"
	"errors"
	"testing"

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
