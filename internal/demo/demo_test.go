package demo

import (
	"context"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSmallDemo runs the demo workload scaled down: both modes must verify
// every byte and leak no block.
func TestSmallDemo(t *testing.T) {
	o := Options{Model: "Llama-3.1-8B", Requests: 4, MinTokens: 64, MaxTokens: 300, ChunkTokens: 64,
		PoolBytes: 64 << 20, Compute: 0, Workers: 2, Concurrency: 2, Seed: 7, TokensPerBlock: 16}
	rep, err := Run(context.Background(), o, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("report not OK: %+v", rep.Rows)
	}
	for _, row := range rep.Rows {
		if row.Bytes == 0 || row.BytesVerified != row.Bytes {
			t.Fatalf("%s: bytes %d verified %d", row.Mode, row.Bytes, row.BytesVerified)
		}
	}
}

func TestCheckBlockDetectsCorruption(t *testing.T) {
	b := make([]byte, 4096)
	FillBlock(b, 1, 0, 3)
	if !CheckBlock(b, 1, 0, 3) {
		t.Fatal("fresh block does not check")
	}
	if CheckBlock(b, 1, 0, 4) {
		t.Fatal("block of another index checks")
	}
	b[4095] ^= 1
	if CheckBlock(b, 1, 0, 3) {
		t.Fatal("flipped bit not detected")
	}
}
