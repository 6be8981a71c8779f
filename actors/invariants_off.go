//go:build !kvxfer_invariants

package actors

// mutWholePlanForParts is off in a default build (see invariants_on.go).
func mutWholePlanForParts() bool { return false }
