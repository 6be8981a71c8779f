//go:build !kvxfer_invariants

package actors

// observeWorker does nothing in a default build (observe_on.go).
func observeWorker(int, any) {}
