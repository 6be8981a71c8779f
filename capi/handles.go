package capi

import (
	"strings"
	"sync"
)

// table is the process-wide handle table: integers to engines, requests
// and fences. Handle 0 is never issued; handles are never reused.
var table = struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]any
}{m: make(map[uint64]any)}

func put(v any) uint64 {
	table.mu.Lock()
	defer table.mu.Unlock()
	table.next++
	table.m[table.next] = v
	return table.next
}

func drop(h uint64) {
	table.mu.Lock()
	delete(table.m, h)
	table.mu.Unlock()
}

// lookup returns the object of handle h when it is a T, else an error
// naming the handle and what it is.
func lookup[T any](h uint64, kind string) (T, error) {
	table.mu.Lock()
	v, ok := table.m[h]
	table.mu.Unlock()
	var zero T
	if !ok {
		return zero, errorf(ErrBadHandle, "%s handle %d: no such handle (never issued, released or closed)", kind, h)
	}
	t, ok := v.(T)
	if !ok {
		k := kindOf(v)
		article := "a"
		if strings.IndexByte("aeiou", k[0]) >= 0 {
			article = "an"
		}
		return zero, errorf(ErrBadHandle, "%s handle %d is %s %s handle", kind, h, article, k)
	}
	return t, nil
}

func kindOf(v any) string {
	switch v.(type) {
	case *Engine:
		return "engine"
	case *Request:
		return "request"
	case *fence:
		return "fence"
	}
	return "unknown"
}

// HandleCount is the number of live handles of every kind.
func HandleCount() int {
	table.mu.Lock()
	defer table.mu.Unlock()
	return len(table.m)
}
