//go:build !kvxfer_invariants

package actors

import "github.com/kvxfer/kvxfer/messages"

// mutWholePlanForParts is off in a default build (see invariants_on.go).
func mutWholePlanForParts() bool { return false }

// panicOnEffect is off in a default build (see invariants_on.go).
func panicOnEffect(string, Effect) bool { return false }

// panicOnStep is off in a default build (see invariants_on.go).
func panicOnStep(string, any) bool { return false }

// panicOnRoute is off in a default build (see invariants_on.go).
func panicOnRoute(messages.Frame) bool { return false }

// panicOnStream is off in a default build (see invariants_on.go).
func panicOnStream(Effect) bool { return false }

// panicOnFrameSent is off in a default build (see invariants_on.go).
func panicOnFrameSent(SendFrame) bool { return false }
