package kvxfer_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// ExampleStart starts one engine rank from a model preset and reports what
// it holds.
func ExampleStart() {
	ctx := context.Background()
	e, err := kvxfer.Start(ctx, kvxfer.Config{Instance: "prefill", Model: "Llama-3.1-8B", PoolBytes: 256 << 20,
		Link: control.NewMemLink()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close(ctx)
	l := e.Layout()
	fmt.Println(l.Name, l.BytesPerToken()/1024, "KiB per token,", e.Pools().Stats()[0].Total, "blocks")

	// A bad value is refused at start, naming it.
	_, err = kvxfer.Start(ctx, kvxfer.Config{Model: "Llama-3.1-8B", Workers: -2})
	fmt.Println(err)
	// Output:
	// Llama-3.1-8B 128 KiB per token, 64 blocks
	// kvxfer: bad config: Workers = -2, must be ≥ 1
}

// pair starts a context and a generation engine of a small layout on one
// in-process control link.
func pair(ctx context.Context) (prefill, decode *kvxfer.Engine, layout kvcache.Layout) {
	layout = kvcache.Layout{Layers: 2, KVHeads: 2, HeadDim: 4, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(2)}
	link := control.NewMemLink()
	prefill, _ = kvxfer.Start(ctx, kvxfer.Config{Instance: "prefill", Layout: &layout, PoolBytes: 1 << 20, Link: link})
	decode, _ = kvxfer.Start(ctx, kvxfer.Config{Instance: "decode", Layout: &layout, PoolBytes: 1 << 20, Link: link})
	return prefill, decode, layout
}

// ExampleEngine_Send shows the context side: Send when prefill starts,
// Chunk after each chunk with a fence that fires once its KV is written,
// and free the source blocks after Done (every pin dropped by then). The
// generation side asks first here; the other order works too.
func ExampleEngine_Send() {
	ctx := context.Background()
	prefill, decode, layout := pair(ctx)
	defer prefill.Close(ctx)
	defer decode.Close(ctx)
	rx, _ := decode.Receive(ctx, kvxfer.ReceiveRequest{ID: "r", PromptLen: 64, Context: "prefill"})

	src, _ := prefill.Pools().Alloc([]int{layout.BlocksFor(64)})
	tx, _ := prefill.Send(context.Background(), kvxfer.SendRequest{ID: "r", PromptLen: 64, Payload: []byte("first token")})

	// A chunk that is not the last must end on a block boundary: one
	// that ends mid-block is refused, naming it; nothing is pinned, and
	// the request goes on.
	bad := kvcache.Chunk{Start: 0, End: 20, FirstBlock: 0}
	err := tx.Chunk(bad, []kvcache.BlockRun{{First: 0, IDs: src[0][:2]}}, nil)
	fmt.Println(errors.Is(err, kvxfer.ErrMisalignedChunk))

	chunks, _ := kvcache.Chunks(64, 32, layout.TokensPerBlock)
	for _, c := range chunks {
		b0, b1 := c.Blocks(layout.TokensPerBlock)
		fence := &kvxfer.ManualFence{}
		_ = tx.Chunk(c, []kvcache.BlockRun{{First: b0, IDs: src[0][b0:b1]}}, fence)
		fence.Fire(nil) // the chunk's KV is written
	}

	done := <-tx.Done()
	fmt.Println(done.Status, done.Bytes)
	_ = prefill.Pools().Free(src)
	out := <-rx.Done()
	_ = decode.FreeBlocks(out.Blocks)
	// Output:
	// true
	// DONE 4096
}

// ExampleEngine_Receive shows the generation side: Receive allocates the
// destination blocks and asks the context ranks for the KV; READY hands
// the blocks (and the context side's payload) to the caller.
func ExampleEngine_Receive() {
	ctx := context.Background()
	prefill, decode, layout := pair(ctx)
	defer prefill.Close(ctx)
	defer decode.Close(ctx)

	src, _ := prefill.Pools().Alloc([]int{layout.BlocksFor(40)})
	tx, _ := prefill.Send(context.Background(), kvxfer.SendRequest{ID: "r", PromptLen: 40, Payload: []byte("tok")})
	_ = tx.Chunk(kvcache.Chunk{Start: 0, End: 40, FirstBlock: 0, Last: true},
		[]kvcache.BlockRun{{First: 0, IDs: src[0]}}, nil) // nil fence: already written

	rx, err := decode.Receive(ctx, kvxfer.ReceiveRequest{ID: "r", PromptLen: 40, Context: "prefill"})
	if err != nil {
		fmt.Println(err)
		return
	}
	out := <-rx.Done()
	fmt.Println(out.Status, len(out.Blocks[0]), "blocks,", string(out.Payload))
	_ = decode.FreeBlocks(out.Blocks) // the caller's once READY
	<-tx.Done()
	_ = prefill.Pools().Free(src)
	// Output:
	// READY 3 blocks, tok
}
