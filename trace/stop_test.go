package trace_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/rs/zerolog"
)

// lockedBuffer is a log sink safe for the engine's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// An engine whose trace file cannot be written says so in its log while it
// runs (the periodic flush fails), not only in Close's error: a trace that
// silently stops is found only when it is needed.
func TestEngineLogsATraceThatStopped(t *testing.T) {
	var logs lockedBuffer
	log := zerolog.New(&logs)
	l := smallLayout()
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Parallel: kvcache.Parallel{TP: 1, PP: 1},
		Layout: &l, PoolBytes: 4 << 20, Workers: 1, Link: control.NewMemLink(), Logger: &log,
		TracePath: "/dev/full"}) // every write fails: no space left on device
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "/dev/full") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning about the trace within 30s; log:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := logs.String(); !strings.Contains(s, "write failed") || !strings.Contains(s, `"level":"warn"`) {
		t.Fatalf("warning does not name the failed write: %s", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Close(ctx); err == nil || !strings.Contains(err.Error(), "/dev/full") {
		t.Fatalf("Close: %v, want the trace's write error", err)
	}
}
