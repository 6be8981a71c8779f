package node

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvxfer/kvxfer/rdma"
)

// closingAgent is an rdma.Agent whose Close returns err; nothing else of
// it is called.
type closingAgent struct {
	rdma.Agent
	err error
}

func (a closingAgent) Close() error { return a.err }

// recordingPool is a pool's closer that records what was done to it.
type recordingPool struct{ closed, unlinked bool }

func (p *recordingPool) Close() error  { p.closed = true; return nil }
func (p *recordingPool) Unlink() error { p.unlinked = true; return nil }

// TestCloseDataKeepsThePoolWhenTheAgentCannotProve: a node's pool is
// unmapped only after its agent's Close proved that no write will land in
// it; an agent that says a write may still land (rdma.ErrCloseUnproven: a
// batch of another agent still copying into it, one cut on the wire) or
// fails otherwise leaves it mapped, its name unlinked. (Checked to fail:
// closeData unmapped the pool whatever the agent's Close said.)
func TestCloseDataKeepsThePoolWhenTheAgentCannotProve(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		unmapped bool
	}{
		{"proven", nil, true},
		{"unproven", fmt.Errorf("agent: close: %w: a batch still copies into registration 1", rdma.ErrCloseUnproven), false},
		{"failed", errors.New("agent: close failed"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := &recordingPool{}
			n := &Node{agent: closingAgent{err: tc.err}, pool: pool}
			err := n.closeData()
			if !errors.Is(err, tc.err) {
				t.Fatalf("closeData = %v, want the agent's %v", err, tc.err)
			}
			if pool.closed != tc.unmapped {
				t.Errorf("pool unmapped = %v, want %v (agent's Close: %v)", pool.closed, tc.unmapped, tc.err)
			}
			if !tc.unmapped && !pool.unlinked {
				t.Errorf("the kept pool's name was not unlinked")
			}
		})
	}
}
