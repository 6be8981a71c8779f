// Package rdmatest is the conformance suite every rdma backend passes: Run
// checks, against a Factory that builds two connected agents, the contract
// written in package rdma's documentation — data integrity over random
// segment lists, exactly-once completion, Flush order, no write after Close,
// synchronous refusals naming the segment, busy regions, concurrent
// endpoints and agent lifecycle.
//
// Waits poll channels under a deadline; nothing sleeps. Run it under -race
// with goleak.VerifyTestMain in the backend's TestMain.
package rdmatest

import (
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// Pair is what a Factory builds: two agents of one backend, Sender
// connecting to Receiver, and how to allocate regions for each.
type Pair struct {
	// Sender connects and posts; Receiver registers destinations.
	Sender, Receiver rdma.Agent
	// NewDst allocates an n-byte host region that Receiver can register to
	// receive writes. The Factory frees it in a t.Cleanup; the suite closes
	// both agents (revoking every registration) in a cleanup that runs
	// before it.
	NewDst func(n uint64) (*kvcache.Region, error)
	// NewSrc allocates an n-byte host source region; nil means
	// kvcache.NewHostRegion.
	NewSrc func(n uint64) (*kvcache.Region, error)
}

// Factory builds a fresh Pair for one subtest.
type Factory func(t *testing.T) Pair

// Run runs the conformance suite against the backend f builds, one subtest
// per property.
func Run(t *testing.T, f Factory) {
	tests := []struct {
		name string
		fn   func(*testing.T, *env)
	}{
		{"Identity", testIdentity},
		{"Integrity", testIntegrity},
		{"EdgeBatches", testEdgeBatches},
		{"ExactlyOnce", testExactlyOnce},
		{"FlushOrder", testFlushOrder},
		{"CompletionsDeliver", testCompletionsDeliver},
		{"CloseStopsWrites", testCloseStopsWrites},
		{"OutOfRange", testOutOfRange},
		{"BadKey", testBadKey},
		{"SourceRegistration", testSourceRegistration},
		{"Unregistered", testUnregistered},
		{"DeregisterBusy", testDeregisterBusy},
		{"ConcurrentEndpoints", testConcurrentEndpoints},
		{"AgentClose", testAgentClose},
		{"PeerClosed", testPeerClosed},
		{"BadAddress", testBadAddress},
		{"RegisterDevice", testRegisterDevice},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newEnv(t, f))
		})
	}
}
