package testlog

import (
	"fmt"
	"sync"
	"testing"
)

func TestBufferConcurrentWriters(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 100 {
				fmt.Fprintf(&b, "w%d-%d;", i, j)
			}
		}()
	}
	wg.Wait()
	if n := b.Count(";"); n != 800 {
		t.Fatalf("%d writes kept, want 800", n)
	}
	if !b.Has("w7-99;") || b.Has("w8-0;") {
		t.Fatalf("Has disagrees with what was written: %q", b.String()[:40])
	}
}
