package core

import (
	"errors"
	"slices"

	"github.com/kvxfer/kvxfer/kvcache"
)

// AllocQueue is the rx parent's allocation queue: requests waiting for
// destination blocks, started in arrival order (a large request is not
// overtaken by small ones). Only a request that needs no block (each one
// a prefix hit) is not held behind a head that waits: it takes nothing
// the head waits for. It decides; the caller's alloc allocates. T is what
// the caller keeps per request.
type AllocQueue[T any] struct {
	items []queued[T]
	ids   map[string]bool // the queued requests
}

type queued[T any] struct {
	id     string
	counts []int
	v      T
}

// Push queues request id, needing counts[g] blocks of group g.
func (q *AllocQueue[T]) Push(id string, counts []int, v T) {
	q.items = append(q.items, queued[T]{id: id, counts: counts, v: v})
	if q.ids == nil {
		q.ids = map[string]bool{}
	}
	q.ids[id] = true
}

// Queued reports whether request id waits in the queue: a second Receive
// of it must be refused as surely as one of a started request.
func (q *AllocQueue[T]) Queued(id string) bool { return q.ids[id] }

// Get is request id's entry while it is queued.
func (q *AllocQueue[T]) Get(id string) (v T, ok bool) {
	if !q.ids[id] {
		return v, false
	}
	for _, it := range q.items {
		if it.id == id {
			return it.v, true
		}
	}
	return v, false
}

// Remove takes request id out of the queue (cancelled, timed out) and
// returns it; ok is false when it is not queued (started, or gone).
func (q *AllocQueue[T]) Remove(id string) (v T, ok bool) {
	for i, it := range q.items {
		if it.id == id {
			q.items = append(q.items[:i], q.items[i+1:]...)
			delete(q.ids, id)
			return it.v, true
		}
	}
	return v, false
}

// Clear empties the queue and returns what it held, in order.
func (q *AllocQueue[T]) Clear() []T {
	out := make([]T, len(q.items))
	for i, it := range q.items {
		out[i] = it.v
	}
	q.items, q.ids = nil, nil
	return out
}

// Len is the number of queued requests.
func (q *AllocQueue[T]) Len() int { return len(q.items) }

// Drain starts queued requests in order while alloc finds their blocks:
// start gets each with its blocks. A request alloc refuses with
// kvcache.ErrOutOfBlocks waits at the head (for blocks to be freed); one
// refused for any other reason can never fit and goes to fail, so that it
// does not block the queue. While the head waits, the requests behind it
// that need no block are started (or failed) all the same, in order: held
// there, they would wait for blocks they do not need — to their deadline,
// when the head waits for a proof that frees the quarantine.
func (q *AllocQueue[T]) Drain(alloc func(counts []int) ([][]kvcache.BlockID, error),
	start func(v T, blocks [][]kvcache.BlockID), fail func(v T, err error)) {
	for len(q.items) > 0 {
		it := q.items[0]
		blocks, err := alloc(it.counts)
		if errors.Is(err, kvcache.ErrOutOfBlocks) {
			q.drainNoBlocks(alloc, start, fail)
			return
		}
		q.items = q.items[1:]
		delete(q.ids, it.id)
		if err != nil {
			fail(it.v, err)
			continue
		}
		start(it.v, blocks)
	}
}

// drainNoBlocks is Drain behind a head that waits: it takes out the
// requests that need no block, in order, each as Drain would.
func (q *AllocQueue[T]) drainNoBlocks(alloc func(counts []int) ([][]kvcache.BlockID, error),
	start func(v T, blocks [][]kvcache.BlockID), fail func(v T, err error)) {
	for i := 1; i < len(q.items); {
		it := q.items[i]
		if slices.ContainsFunc(it.counts, func(n int) bool { return n != 0 }) {
			i++
			continue
		}
		blocks, err := alloc(it.counts)
		if errors.Is(err, kvcache.ErrOutOfBlocks) {
			i++
			continue
		}
		q.items = slices.Delete(q.items, i, i+1)
		delete(q.ids, it.id)
		if err != nil {
			fail(it.v, err)
			continue
		}
		start(it.v, blocks)
	}
}
