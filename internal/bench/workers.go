package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma/faulty"
	"github.com/kvxfer/kvxfer/rdma/loopback"
)

// WorkersResult compares sender-worker counts on a backend whose every
// post costs the worker PostCost.
type WorkersResult struct {
	Peers    int
	Chunks   int
	PostCost time.Duration
	// OpsPerSec by worker count.
	OpsPerSec map[int]float64
}

// Workers runs one request of chunks one-token chunks from a TP1 context
// rank to `peers` generation ranks (TP=peers, heads split), once per worker
// count, on a faulty(loopback) backend that charges postCost per Post, and
// reports op throughput per worker count.
func Workers(ctx context.Context, peers, chunks int, postCost time.Duration, counts []int) (WorkersResult, error) {
	res := WorkersResult{Peers: peers, Chunks: chunks, PostCost: postCost, OpsPerSec: map[int]float64{}}
	l := kvcache.Layout{Name: "workers", Layers: 1, KVHeads: 4, HeadDim: 1, DTypeBytes: 1, TokensPerBlock: 1,
		Groups: kvcache.FullAttention(1)}
	for _, w := range counts {
		ops, el, err := runWorkers(ctx, l, peers, chunks, postCost, w)
		if err != nil {
			return res, fmt.Errorf("workers=%d: %w", w, err)
		}
		res.OpsPerSec[w] = float64(ops) / el.Seconds()
	}
	return res, nil
}

func runWorkers(ctx context.Context, l kvcache.Layout, peers, chunks int, postCost time.Duration, workers int) (int, time.Duration, error) {
	link := control.NewMemLink()
	net := loopback.NewNetwork()
	pool := uint64(chunks+8) * uint64(l.BlockBytes(0))
	ag := faulty.New(loopback.New(loopback.WithNetwork(net)), faulty.WithPostCost(postCost))
	ce, err := kvxfer.Start(ctx, kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: pool, Workers: workers,
		Link: link, Agent: ag, TransferTimeout: 10 * time.Minute})
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = ce.Close(ctx); _ = ag.Close() }()
	genPar := kvcache.Parallel{TP: peers, PP: 1}
	var gens []*kvxfer.Engine
	var agents []*loopback.Agent
	defer func() {
		for _, g := range gens {
			_ = g.Close(ctx)
		}
		for _, a := range agents {
			_ = a.Close()
		}
	}()
	for i := 0; i < peers; i++ {
		a := loopback.New(loopback.WithNetwork(net))
		agents = append(agents, a)
		g, err := kvxfer.Start(ctx, kvxfer.Config{Instance: "gen", Parallel: genPar, Rank: genPar.RankAt(i), Layout: &l,
			PoolBytes: pool, Workers: workers, Link: link, Agent: a, TransferTimeout: 10 * time.Minute})
		if err != nil {
			return 0, 0, err
		}
		gens = append(gens, g)
	}
	src, err := ce.Pools().Alloc([]int{chunks})
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = ce.Pools().Free(src) }()
	var rxs []*kvxfer.RxHandle
	for _, g := range gens {
		h, err := g.Receive(ctx, kvxfer.ReceiveRequest{ID: "w", PromptLen: chunks, Context: "ctx"})
		if err != nil {
			return 0, 0, err
		}
		rxs = append(rxs, h)
	}
	tx, err := ce.Send(context.Background(), kvxfer.SendRequest{ID: "w", PromptLen: chunks})
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	for i := 0; i < chunks; i++ {
		c := kvcache.Chunk{Start: i, End: i + 1, FirstBlock: i, Last: i == chunks-1}
		if err := tx.Chunk(c, []kvcache.BlockRun{{First: i, IDs: src[0][i : i+1]}}, nil); err != nil {
			return 0, 0, err
		}
	}
	to := <-tx.Done()
	el := time.Since(t0)
	var errs []error
	for i, h := range rxs {
		o := <-h.Done()
		if !o.OK {
			errs = append(errs, fmt.Errorf("rx %d: %s %v", i, o.Status, o.Err))
			continue
		}
		_ = gens[i].FreeBlocks(o.Blocks)
	}
	if !to.OK {
		errs = append(errs, fmt.Errorf("tx: %s %v", to.Status, to.Err))
	}
	return chunks * peers, el, errors.Join(errs...)
}
