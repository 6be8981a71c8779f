//go:build kvxfer_invariants

package kvxfer_test

import (
	"testing"

	"github.com/kvxfer/kvxfer"
)

// TestZeroCrashHooks: the chaos hooks of an Engine or handle that Start,
// Send or Receive did not return do nothing, instead of a nil-pointer
// panic.
func TestZeroCrashHooks(t *testing.T) {
	var zero kvxfer.Engine
	var none *kvxfer.Engine
	for _, e := range []*kvxfer.Engine{&zero, none} {
		calm(t, "CrashWorker", func() { e.CrashWorker(0) })
		calm(t, "CrashParent", func() { e.CrashParent("tx") })
	}
	for _, h := range []*kvxfer.TxHandle{nil, {}} {
		calm(t, "TxHandle.Crash", func() { h.Crash() })
	}
	for _, h := range []*kvxfer.RxHandle{nil, {}} {
		calm(t, "RxHandle.Crash", func() { h.Crash() })
	}
}
