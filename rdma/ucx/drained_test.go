//go:build cgo && linux && !kvxfer_noucx

package ucx_test

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// TestPeerDrainedReleasesWhatALinkFailureKept: the peer's drained
// goodbye (Agent.PeerDrained: its engine read its last frame and every
// write it started is over, as a node hands it on) is proof for all of
// this agent's memory, as the peer's bye is: after an endpoint error left
// the link failed without proof, memory the agent allocated and memory
// registered with ucp_mem_map deregister, and Close returns nil and
// unmaps the allocation. A proof for another identity than the link's
// hello named releases nothing. Before, the agent took only a process
// exit (PeerExited), which does not cover registered memory, and a
// drained goodbye released nothing here. (Checked to fail with
// peerDrained recording nothing: both deregistrations stayed busy and
// Close returned ErrCloseUnproven.)
func TestPeerDrainedReleasesWhatALinkFailureKept(t *testing.T) {
	r, s := linkedPair(t)
	closed := false
	defer func() {
		if !closed {
			r.Close()
		}
	}()
	ra, regA := alloc(t, r, 1<<20)
	rh, err := kvcache.NewHostRegion(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer rh.Close()
	regH, err := r.Register(rh)
	if err != nil {
		t.Fatal(err)
	}
	failLink(t, r, s)
	peer := agentID(s)
	if err := r.PeerDrained(s.Address(), "ctx/1", "test"); !errors.Is(err, rdma.ErrBadAddress) {
		t.Errorf("PeerDrained for another identity than the link's: %v, want ErrBadAddress", err)
	}
	wantBusy(t, "Deregister after a drained proof for another identity", r.Deregister(regH), peer, "without proof")
	if err := r.PeerDrained(s.Address(), sendIdentity, "the test says it drained"); err != nil {
		t.Fatalf("PeerDrained: %v", err)
	}
	if err := r.Deregister(regH); err != nil {
		t.Errorf("Deregister of registered memory after the peer's drained goodbye: %v, want nil", err)
	}
	if err := r.Deregister(regA); err != nil {
		t.Errorf("Deregister of allocated memory after the peer's drained goodbye: %v, want nil", err)
	}
	closed = true
	if err := r.Close(); err != nil {
		t.Errorf("Close after the peer's drained goodbye: %v, want nil", err)
	}
	if err := unix.Msync(ra.Bytes(), unix.MS_ASYNC); err == nil {
		t.Error("the allocation is still mapped after a Close that returned nil")
	}
}

// TestPeerDrainedBeforeTheLinkFails: a drained goodbye that comes while
// the link is up leaves it up (Connect to the peer works: its agent may
// still say its bye), and a failure of the link that comes after it
// leaves nothing unproven: the peer's writes were over before. Allocated
// memory deregisters and Close returns nil.
func TestPeerDrainedBeforeTheLinkFails(t *testing.T) {
	r, s := linkedPair(t)
	closed := false
	defer func() {
		if !closed {
			r.Close()
		}
	}()
	_, reg := alloc(t, r, 1<<20)
	if err := r.PeerDrained(s.Address(), sendIdentity, "the test says it drained"); err != nil {
		t.Fatalf("PeerDrained: %v", err)
	}
	ep, err := r.Connect(s.Address())
	if err != nil {
		t.Fatalf("Connect to a peer that drained, its link up: %v, want the link still up", err)
	}
	if err := ep.Close(); err != nil {
		t.Fatalf("closing the endpoint: %v", err)
	}
	failLink(t, r, s)
	if err := r.Deregister(reg); err != nil {
		t.Errorf("Deregister after the link failed, the peer drained before: %v, want nil", err)
	}
	closed = true
	if err := r.Close(); err != nil {
		t.Errorf("Close after the link failed, the peer drained before: %v, want nil", err)
	}
}
