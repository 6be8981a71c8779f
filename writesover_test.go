package kvxfer_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestWritesOverAfterACleanClose: a context engine whose writes all
// completed says, once its Close has drained, that every write it started
// is over (Engine.WritesOver, what a node's drained goodbye says); not
// before its Close, and never for an engine Start did not return. The
// cases where it must not say so — a write cut without proof, Close
// undrained — are in checkSourcesReleasedEnd.
func TestWritesOverAfterACleanClose(t *testing.T) {
	l := smallLayout()
	c := startCluster(t, l, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, 2)
	transfer(t, c, l, "over", 1, 100, 32, true)
	ce := c.ctx[0]
	if ce.WritesOver() {
		t.Fatal("WritesOver before Close: true, want false (the engine may still start writes)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ce.Close(ctx); err != nil {
		t.Fatalf("context engine Close: %v", err)
	}
	if !ce.WritesOver() {
		t.Fatal("WritesOver after a clean Close: false, want true (its one write completed)")
	}
	if (&kvxfer.Engine{}).WritesOver() {
		t.Fatal("WritesOver of an Engine Start did not return: true")
	}
}
