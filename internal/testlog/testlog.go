// Package testlog is a log sink for tests: a buffer the code under test
// writes from its own goroutines (a logger, a child's standard error)
// while the test reads it.
package testlog

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"
)

// Buffer is an io.Writer safe for concurrent writers and readers.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Has reports whether s was written.
func (b *Buffer) Has(s string) bool { return strings.Contains(b.String(), s) }

// Count is how many times s was written.
func (b *Buffer) Count(s string) int { return strings.Count(b.String(), s) }

// OpenFDs is the number of this process's open file descriptors; t skips
// where they cannot be counted.
func OpenFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count open fds: %v", err)
	}
	return len(ents)
}
