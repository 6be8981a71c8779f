package kvxfer_test

import (
	"context"
	"fmt"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Example moves one 100-token request of a small layout from a context
// engine to a generation engine in one process: Start both, Receive on the
// generation side, Send and hand over chunks on the context side, wait for
// both outcomes, free the blocks.
func Example() {
	ctx := context.Background()
	layout := kvcache.Layout{Layers: 2, KVHeads: 2, HeadDim: 4, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(2)}
	link := control.NewMemLink() // in-process control plane; ZeroMQ between processes
	start := func(instance string) *kvxfer.Engine {
		e, err := kvxfer.Start(ctx, kvxfer.Config{Instance: instance, Layout: &layout, PoolBytes: 1 << 20, Link: link})
		if err != nil {
			panic(err)
		}
		return e
	}
	prefill, decode := start("prefill"), start("decode")
	defer prefill.Close(ctx)
	defer decode.Close(ctx)

	// Generation side: allocate destination blocks and ask for the KV.
	rx, err := decode.Receive(ctx, kvxfer.ReceiveRequest{ID: "req-1", PromptLen: 100, Context: "prefill"})
	if err != nil {
		panic(err)
	}

	// Context side: the serving framework owns the source blocks.
	src, _ := prefill.Pools().Alloc([]int{layout.BlocksFor(100)})
	tx, err := prefill.Send(context.Background(), kvxfer.SendRequest{ID: "req-1", PromptLen: 100})
	if err != nil {
		panic(err)
	}
	chunks, _ := kvcache.Chunks(100, 32, layout.TokensPerBlock)
	for _, c := range chunks {
		b0, b1 := c.Blocks(layout.TokensPerBlock)
		fence := &kvxfer.ManualFence{} // a CUDA event on a GPU
		_ = tx.Chunk(c, []kvcache.BlockRun{{First: b0, IDs: src[0][b0:b1]}}, fence)
		// ... prefill computes this chunk's KV into its blocks ...
		fence.Fire(nil)
	}

	out := <-rx.Done()
	fmt.Println("generation:", out.Status, out.Bytes, "bytes")
	_ = decode.FreeBlocks(out.Blocks) // the READY blocks are the caller's

	done := <-tx.Done() // after every pin dropped
	fmt.Println("context:", done.Status)
	_ = prefill.Pools().Free(src)
	// Output:
	// generation: READY 7168 bytes
	// context: DONE
}
