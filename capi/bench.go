package capi

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// BenchGo drives iters transfers of promptLen tokens in chunks of
// chunkTokens from src to dst through the same Engine and Request calls the
// C ABI makes (Receive, Send, Chunk with a fence then FenceReady, waiting
// for both events, FreeBlocks of the READY request), without the C boundary: the
// baseline of a transfer driven from Python. It returns the wall time and
// the bytes moved.
func BenchGo(src, dst *Engine, promptLen, chunkTokens, iters int) (time.Duration, uint64, error) {
	return benchGo(src, dst, promptLen, chunkTokens, iters, nil)
}

// Phases is where BenchGo's time went, summed over its requests (the
// breakdown bench_kvxfer.py prints for the Python-driven loop).
type Phases struct {
	Receive, Send, Chunk, Ready, WaitDone, WaitReady, Free, Release time.Duration
}

func benchGo(src, dst *Engine, promptLen, chunkTokens, iters int, ph *Phases) (time.Duration, uint64, error) {
	if ph == nil {
		ph = &Phases{}
	}
	if src == dst {
		// One engine would receive from itself: its request waits a minute
		// for a context side that never answers.
		return 0, 0, errorf(ErrInvalidArgument, "bench: source and destination are the same engine %d: open two", src.h)
	}
	l := src.layout
	groups := len(l.Groups)
	// Checked with no prompt first (chunk size, tokens per block), then
	// planned only once the source blocks are allocated: the pool bounds
	// the prompt, and so the chunks listed, where a prompt of INT32_MAX
	// tokens would list gigabytes of them before the pool refused it.
	if promptLen < 0 {
		return 0, 0, errorf(ErrInvalidArgument, "bench: prompt_len = %d is negative", promptLen)
	}
	if iters < 0 {
		// A loop of no iteration would report 0 bytes in 0 s as a success.
		return 0, 0, errorf(ErrInvalidArgument, "bench: iters = %d is negative (0 or more transfers)", iters)
	}
	if _, err := kvcache.Chunks(0, chunkTokens, l.TokensPerBlock); err != nil {
		return 0, 0, errorf(ErrInvalidArgument, "bench: %v", err)
	}
	srcIDs := make([][]kvcache.BlockID, groups)
	defer func() {
		for g := range groups {
			if len(srcIDs[g]) > 0 {
				_ = src.FreeBlocks(g, srcIDs[g])
			}
		}
	}()
	for g := range groups {
		ids, err := src.AllocBlocks(g, l.BlocksFor(promptLen))
		if err != nil {
			return 0, 0, err
		}
		srcIDs[g] = ids
	}
	chunks, err := kvcache.Chunks(promptLen, chunkTokens, l.TokensPerBlock)
	if err != nil {
		return 0, 0, errorf(ErrInvalidArgument, "bench: %v", err)
	}
	var moved uint64
	evs := make([]Event, 4)
	start := time.Now()
	for range iters {
		id := fmt.Sprintf("bench-go-%d-%d", src.h, benchSeq.Add(1))
		t0 := time.Now()
		rx, _, err := dst.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: promptLen,
			Context: src.instance}})
		if err != nil {
			return 0, 0, err
		}
		t1 := time.Now()
		tx, _, err := src.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: promptLen}})
		if err != nil {
			return 0, 0, err
		}
		ph.Receive += t1.Sub(t0)
		ph.Send += time.Since(t1)
		for _, c := range chunks {
			t0 := time.Now()
			f, err := tx.Chunk(c.Start, c.End, c.Last, c.Runs(l.TokensPerBlock, srcIDs), true)
			if err != nil {
				return 0, 0, err
			}
			t1 := time.Now()
			if err := FenceReady(f); err != nil {
				return 0, 0, err
			}
			ph.Chunk += t1.Sub(t0)
			ph.Ready += time.Since(t1)
		}
		t0 = time.Now()
		if err := waitEvents(src, evs, tx.h); err != nil {
			return 0, 0, err
		}
		t1 = time.Now()
		if err := waitEvents(dst, evs, rx.h); err != nil {
			return 0, 0, err
		}
		t2 := time.Now()
		ph.WaitDone += t1.Sub(t0)
		ph.WaitReady += t2.Sub(t1)
		o, _ := rx.Outcome()
		if o.Status != kvxfer.StatusReady {
			return 0, 0, fmt.Errorf("bench: request %s: %s %v", id, o.Status, o.Err)
		}
		moved += o.Bytes
		if err := rx.FreeBlocks(); err != nil {
			return 0, 0, err
		}
		t3 := time.Now()
		_ = tx.Release()
		_ = rx.Release()
		ph.Free += t3.Sub(t2)
		ph.Release += time.Since(t3)
	}
	return time.Since(start), moved, nil
}

// benchSeq numbers BenchGo's requests: ids are never reused in a process.
var benchSeq atomic.Uint64

// waitEvents polls e until request h's event arrives (other events are
// dropped: the bench owns the engine).
func waitEvents(e *Engine, evs []Event, h uint64) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		n := e.Poll(evs, time.Second)
		for _, ev := range evs[:n] {
			if ev.Request == h {
				return nil
			}
		}
	}
	return fmt.Errorf("bench: no event for request %d in a minute", h)
}
