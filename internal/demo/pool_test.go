package demo

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
)

// testDeadline bounds the tests of this file that once hung: a regression
// fails with a deadline error instead of hanging the test binary. It is not
// a speed assertion; each run here fails before its first transfer.
const testDeadline = 2 * time.Minute

// TestRunRefusesPoolTooSmall is `kvxfer demo --pool 16MiB --requests 1
// --timeout 5s`: the one prompt (8192 tokens, 256 blocks) cannot fit in a
// 16MiB pool (4 blocks of Llama-3.1-8B), so Run fails at once, naming the
// numbers and the --pool that fits. Checked to fail before the fix: Run
// waited on the admission semaphore (Acquire(256) of a 4-block semaphore)
// until this test's deadline and returned "context deadline exceeded".
func TestRunRefusesPoolTooSmall(t *testing.T) {
	o := DefaultOptions()
	o.PoolBytes, o.Requests, o.Timeout = 16<<20, 1, 5*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	_, err := Run(ctx, o, nil)
	if !errors.Is(err, kvcache.ErrPoolTooSmall) {
		t.Fatalf("Run with a 16MiB pool = %v, want kvcache.ErrPoolTooSmall", err)
	}
	const want = "demo: --pool = 16MiB is too small: request 0 (8192 tokens of Llama-3.1-8B), layer group 0: " +
		"kvcache: pool too small: need 256 blocks of 4MiB (1GiB), the pool holds 4 (16MiB); use --pool ≥ 1GiB"
	if err.Error() != want {
		t.Errorf("Run error\n got %q\nwant %q", err, want)
	}
}

// TestRunModeRefusesPromptLargerThanPool drives one mode past Check, as if
// the engines carved their pools otherwise than Check computes: the mode
// must still refuse the prompt before the first request instead of waiting
// on the admission semaphore, and close both engines (goleak checks). Checked
// to fail before the fix: runMode blocked in semaphore Acquire until this
// test's deadline.
func TestRunModeRefusesPromptLargerThanPool(t *testing.T) {
	o := DefaultOptions()
	o.PoolBytes = 16 << 20
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	_, err := runMode(ctx, o, Mode{Name: "pipelined", Pipelined: true}, []int{512, 8192}, nil)
	if !errors.Is(err, kvcache.ErrPoolTooSmall) || ctx.Err() != nil {
		t.Fatalf("runMode of an 8192-token prompt in a 16MiB pool = %v (ctx %v), want kvcache.ErrPoolTooSmall", err, ctx.Err())
	}
	const want = "demo: request 1 (8192 tokens of Llama-3.1-8B), context pool, layer group 0: " +
		"kvcache: pool too small: need 256 blocks of 4MiB (1GiB), the pool holds 4 (16MiB)"
	if err.Error() != want {
		t.Errorf("runMode error\n got %q\nwant %q", err, want)
	}
}
