package core

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
)

// TestAllocQueue_InOrderNoOvertaking: requests start in arrival order
// while blocks last; a request that does not fit now waits at the head and
// a smaller one behind it does not overtake it; one that can never fit
// fails and does not block the queue; Remove and Clear take requests out.
func TestAllocQueue_InOrderNoOvertaking(t *testing.T) {
	free := 10
	tooBig := errors.New("larger than the pool")
	alloc := func(counts []int) ([][]kvcache.BlockID, error) {
		switch n := counts[0]; {
		case n > 100:
			return nil, fmt.Errorf("%w: %d blocks", tooBig, n)
		case n > free:
			return nil, fmt.Errorf("%w: %d > %d", kvcache.ErrOutOfBlocks, n, free)
		default:
			free -= n
			return [][]kvcache.BlockID{make([]kvcache.BlockID, n)}, nil
		}
	}
	var started, failed []string
	drain := func(q *AllocQueue[string]) {
		q.Drain(alloc, func(id string, _ [][]kvcache.BlockID) { started = append(started, id) },
			func(id string, err error) {
				if !errors.Is(err, tooBig) {
					t.Errorf("%s failed by %v", id, err)
				}
				failed = append(failed, id)
			})
	}
	var q AllocQueue[string]
	for _, r := range []struct {
		id string
		n  int
	}{{"a", 4}, {"huge", 1000}, {"b", 4}, {"c", 8}, {"d", 1}, {"e", 1}} {
		q.Push(r.id, []int{r.n}, r.id)
	}
	drain(&q)
	if !slices.Equal(started, []string{"a", "b"}) || !slices.Equal(failed, []string{"huge"}) || q.Len() != 3 {
		t.Fatalf("started %v failed %v queued %d; want a, b started, huge failed, c waiting with d and e behind it", started, failed, q.Len())
	}
	if v, ok := q.Remove("d"); !ok || v != "d" {
		t.Fatalf("Remove d: %q %v", v, ok)
	}
	if _, ok := q.Remove("a"); ok {
		t.Fatal("Remove of a started request")
	}
	free += 6 // enough for c alone
	drain(&q)
	if !slices.Equal(started, []string{"a", "b", "c"}) || q.Len() != 1 {
		t.Fatalf("after a free: started %v, queued %d", started, q.Len())
	}
	if got := q.Clear(); !slices.Equal(got, []string{"e"}) || q.Len() != 0 {
		t.Fatalf("Clear: %v, left %d", got, q.Len())
	}
}

// TestAllocQueue_QueuedOnlyWhileWaiting: Queued and Get know a request only
// while it waits: once started, failed, removed or cleared, a new Receive
// of the same id is not refused as queued.
//
// Guards, each removed by hand and seen to fail this test: Drain's and
// Remove's `delete(q.ids, ...)`, and Clear's `q.ids = nil`.
func TestAllocQueue_QueuedOnlyWhileWaiting(t *testing.T) {
	var q AllocQueue[string]
	for i, id := range []string{"a", "huge", "b", "c"} {
		q.Push(id, []int{i + 1}, id) // a needs 1 block, huge 2, b 3, c 4
	}
	for _, id := range []string{"a", "huge", "b", "c"} {
		if v, ok := q.Get(id); !q.Queued(id) || !ok || v != id {
			t.Fatalf("%s while queued: Queued %v, Get %q %v", id, q.Queued(id), v, ok)
		}
	}
	if v, ok := q.Remove("b"); !ok || v != "b" {
		t.Fatalf("Remove b: %q %v", v, ok)
	}
	// a starts, huge can never fit, c waits for blocks.
	q.Drain(func(counts []int) ([][]kvcache.BlockID, error) {
		switch counts[0] {
		case 1:
			return [][]kvcache.BlockID{{1}}, nil
		case 2:
			return nil, errors.New("larger than the pool")
		}
		return nil, kvcache.ErrOutOfBlocks
	}, func(string, [][]kvcache.BlockID) {}, func(string, error) {})
	for _, id := range []string{"a", "huge", "b"} {
		if _, ok := q.Get(id); q.Queued(id) || ok {
			t.Errorf("%s no longer waits: Queued %v, Get %v", id, q.Queued(id), ok)
		}
	}
	if !q.Queued("c") || q.Len() != 1 {
		t.Fatalf("c waits: Queued %v, Len %d", q.Queued("c"), q.Len())
	}
	q.Clear()
	if q.Queued("c") {
		t.Error("c queued after Clear")
	}
}

// TestAllocQueue_NothingNeededIsNotHeldBehindTheHead: a request that
// needs no block (every one a prefix hit) starts while the head waits for
// blocks: it takes nothing from the pool, so it cannot delay the head,
// and held behind it, it would wait for blocks it does not need — to its
// deadline when the head waits on the quarantine bound or on blocks a
// long decode holds. Requests that need blocks still wait behind the
// head, in order.
func TestAllocQueue_NothingNeededIsNotHeldBehindTheHead(t *testing.T) {
	free := 2
	alloc := func(counts []int) ([][]kvcache.BlockID, error) {
		n := counts[0] + counts[1]
		if n > free {
			return nil, fmt.Errorf("%w: %d > %d", kvcache.ErrOutOfBlocks, n, free)
		}
		free -= n
		return [][]kvcache.BlockID{make([]kvcache.BlockID, counts[0]), make([]kvcache.BlockID, counts[1])}, nil
	}
	var started []string
	drain := func(q *AllocQueue[string]) {
		q.Drain(alloc, func(id string, _ [][]kvcache.BlockID) { started = append(started, id) },
			func(id string, err error) { t.Errorf("%s failed: %v", id, err) })
	}
	var q AllocQueue[string]
	q.Push("big", []int{4, 0}, "big")
	q.Push("hit", []int{0, 0}, "hit") // every block a prefix hit
	q.Push("small", []int{1, 0}, "small")
	q.Push("hit2", []int{0, 0}, "hit2")
	drain(&q)
	if !slices.Equal(started, []string{"hit", "hit2"}) || q.Len() != 2 || q.Queued("hit") || !q.Queued("small") {
		t.Fatalf("started %v, %d queued (hit queued %v, small queued %v); want hit and hit2 started, big waiting with small behind it",
			started, q.Len(), q.Queued("hit"), q.Queued("small"))
	}
	free += 3 // enough for big and small
	drain(&q)
	if !slices.Equal(started, []string{"hit", "hit2", "big", "small"}) || q.Len() != 0 {
		t.Fatalf("after a free: started %v, %d queued", started, q.Len())
	}
}
