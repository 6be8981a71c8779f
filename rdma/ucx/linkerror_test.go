//go:build cgo && linux && !kvxfer_noucx

package ucx_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// The identities the receiver and the sender of these tests serve.
const (
	recvIdentity = "gen/0"
	sendIdentity = "ctx/0"
)

// linkedPair returns a receiver agent and a sender agent whose link is up
// both ways (the sender connected to the receiver). The sender's revoke
// and close timeouts are short: its bye to a receiver that failed the
// link goes unacknowledged. The receiver is the caller's to close; the
// sender is closed at cleanup (its Close's error says only that).
func linkedPair(t *testing.T) (r, s *ucx.Agent) {
	t.Helper()
	r, err := ucx.New(ucx.WithIdentity(recvIdentity))
	if err != nil {
		t.Fatal(err)
	}
	s, err = ucx.New(ucx.WithIdentity(sendIdentity), ucx.WithRevokeTimeout(200*time.Millisecond), ucx.WithCloseTimeout(200*time.Millisecond))
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Connect(r.Address()); err != nil {
		r.Close()
		t.Fatal(err)
	}
	return r, s
}

// agentID is the id an agent's errors name it by.
func agentID(a *ucx.Agent) string { return strings.TrimPrefix(a.String(), "ucx agent ") }

// alloc allocates and registers n bytes of a's own memory.
func alloc(t *testing.T, a *ucx.Agent, n uint64) (*kvcache.Region, rdma.Registration) {
	t.Helper()
	r, _, err := a.Alloc(n) // freed by the agent's Close
	if err != nil {
		t.Fatal(err)
	}
	reg, err := a.Register(r)
	if err != nil {
		t.Fatal(err)
	}
	return r, reg
}

// failLink has UCX's report that r's control endpoint to s failed reach
// r, as its error callback does.
func failLink(t *testing.T, r, s *ucx.Agent) {
	t.Helper()
	if !ucx.FailControlEndpoint(r, s.Address()) {
		t.Fatal("the receiver has no control endpoint to the sender")
	}
}

// wantBusy checks that a deregistration failed busy for want's reasons.
func wantBusy(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, rdma.ErrRegionBusy) {
		t.Errorf("%s: %v, want ErrRegionBusy", what, err)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v, want it to say %q", what, err, w)
		}
	}
}

// mapped fails the test when r is no longer mapped (msync fails with
// ENOMEM on a range that is not).
func mapped(t *testing.T, what string, r *kvcache.Region) {
	t.Helper()
	if err := unix.Msync(r.Bytes(), unix.MS_ASYNC); err != nil {
		t.Errorf("%s: msync: %v (unmapped while the peer may still write into it)", what, err)
	}
}

// TestEndpointErrorOnALiveLinkProvesNothing: an error UCX reports on the
// control endpoint of the link to a peer that runs on (here an injected
// UCS_ERR_ENDPOINT_TIMEOUT) concerns that endpoint of this agent alone;
// the peer writes on endpoints of its own. It fails the link for new
// work, but a deregistration then fails busy naming the peer (the
// registration stays mapped), for memory the agent allocated and for
// memory registered with ucp_mem_map alike, and Close returns
// rdma.ErrCloseUnproven naming the peer and leaves the memory it
// allocated mapped. Before the fix, the error was taken as proof that the
// peer was gone: both deregistrations unmapped and Close returned nil and
// unmapped the allocation.
func TestEndpointErrorOnALiveLinkProvesNothing(t *testing.T) {
	inMode(t, func(t *testing.T, tls string) {
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
		if _, err := r.Connect(s.Address()); !errors.Is(err, rdma.ErrPeerGone) {
			t.Errorf("Connect over the failed link: %v, want ErrPeerGone", err)
		}
		peer := agentID(s)
		wantBusy(t, "Deregister of allocated memory after an endpoint error", r.Deregister(regA), peer, "without proof")
		wantBusy(t, "Deregister of registered memory after an endpoint error", r.Deregister(regH), peer, "without proof")
		closed = true
		err = r.Close()
		if !errors.Is(err, rdma.ErrCloseUnproven) || !strings.Contains(err.Error(), peer) {
			t.Errorf("Close after an endpoint error on a live peer's link: %v, want ErrCloseUnproven naming agent %s", err, peer)
		}
		mapped(t, "the allocation after Close with a live peer's link failed on an endpoint error", ra)
	})
}

// TestByeAfterAnEndpointErrorIsProof: the link's control endpoint fails
// (an injected UCS_ERR_ENDPOINT_TIMEOUT: no proof, the peer runs on on
// endpoints of its own), then the peer closes gracefully: it closes its
// endpoints to this agent and says bye, on its own control endpoint. That
// bye is the proof the failure lacked, as a bye before it would have
// been: a deregistration then unmaps, for memory the agent allocated and
// for memory registered with ucp_mem_map, and Close returns nil. (Before
// the fix a bye after the failure was acknowledged but changed nothing:
// deregistrations stayed busy and Close returned ErrCloseUnproven.)
func TestByeAfterAnEndpointErrorIsProof(t *testing.T) {
	inMode(t, func(t *testing.T, tls string) {
		r, s := linkedPair(t)
		closed := false
		defer func() {
			if !closed {
				r.Close()
			}
		}()
		_, regA := alloc(t, r, 1<<20)
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
		// The sender's Close says bye and waits its revoke timeout for an
		// acknowledgement that cannot come (the receiver's control
		// endpoint is closed): its error says only that.
		_ = s.Close()
		for name, reg := range map[string]rdma.Registration{"allocated": regA, "registered": regH} {
			deadline := time.Now().Add(rdmatest.WaitLimit)
			for {
				err := r.Deregister(reg) // a busy one leaves it registered
				if err == nil {
					break
				}
				if !errors.Is(err, rdma.ErrRegionBusy) || time.Now().After(deadline) {
					t.Fatalf("Deregister of %s memory after the peer's bye: %v, want nil", name, err)
				}
				time.Sleep(10 * time.Millisecond) // poll with a deadline: the bye is on its way
			}
		}
		closed = true
		if err := r.Close(); err != nil {
			t.Errorf("Close after the peer's bye: %v, want nil", err)
		}
	})
}

// TestPeerExitReleasesAllocatedMemory: the proof that the peer's process
// exited (Agent.PeerExited, as a node's pidfd gives it) releases what an
// endpoint error kept: memory the agent allocated (Alloc) deregisters,
// and Close returns nil and unmaps it. A proof for another identity than
// the link's hello named releases nothing. Before the fix there was no
// way for the proof to reach the agent (and the endpoint error was taken
// as proof itself).
func TestPeerExitReleasesAllocatedMemory(t *testing.T) {
	inMode(t, func(t *testing.T, tls string) {
		r, s := linkedPair(t)
		closed := false
		defer func() {
			if !closed {
				r.Close()
			}
		}()
		_, reg1 := alloc(t, r, 1<<20)
		ra2, _ := alloc(t, r, 1<<20)
		failLink(t, r, s)
		peer := agentID(s)
		if err := r.PeerExited(s.Address(), "ctx/1", "test"); !errors.Is(err, rdma.ErrBadAddress) {
			t.Errorf("PeerExited for another identity than the link's: %v, want ErrBadAddress", err)
		}
		wantBusy(t, "Deregister after a proof for another identity", r.Deregister(reg1), peer, "without proof")
		if err := r.PeerExited(s.Address(), sendIdentity, "the test says so"); err != nil {
			t.Fatalf("PeerExited: %v", err)
		}
		if err := r.Deregister(reg1); err != nil {
			t.Errorf("Deregister of allocated memory after the peer's exit was proven: %v, want nil", err)
		}
		closed = true
		if err := r.Close(); err != nil {
			t.Errorf("Close after the peer's exit was proven, only allocated memory registered: %v, want nil", err)
		}
		if err := unix.Msync(ra2.Bytes(), unix.MS_ASYNC); err == nil {
			t.Error("the allocation is still mapped after a Close that returned nil")
		}
	})
}

// TestPeerExitIsNoProofForRegisteredMemory: into memory registered with
// ucp_mem_map UCX carries a peer's puts as active messages that this
// agent's worker applies as it progresses, after the peer's exit too: the
// proof releases only memory the agent allocated. A deregistration of
// registered memory stays busy, naming the peer and ucp_mem_map, and
// Close, with it still registered, returns rdma.ErrCloseUnproven.
func TestPeerExitIsNoProofForRegisteredMemory(t *testing.T) {
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
	if err := r.PeerExited(s.Address(), sendIdentity, "the test says so"); err != nil {
		t.Fatalf("PeerExited: %v", err)
	}
	peer := agentID(s)
	wantBusy(t, "Deregister of registered memory after the peer's exit", r.Deregister(regH), peer, "ucp_mem_map")
	if err := r.Deregister(regA); err != nil {
		t.Errorf("Deregister of allocated memory after the peer's exit: %v, want nil", err)
	}
	closed = true
	err = r.Close()
	if !errors.Is(err, rdma.ErrCloseUnproven) || !strings.Contains(err.Error(), "ucp_mem_map") {
		t.Errorf("Close with registered memory after the peer's exit: %v, want ErrCloseUnproven naming ucp_mem_map", err)
	}
	mapped(t, "allocated memory after a Close that kept the memory", ra)
}

// TestPeerExitOnAnUpLinkFailsIt: a proof of the peer's exit while its
// link is up (no endpoint error yet) fails the link at once (Connect to
// it fails with rdma.ErrPeerGone) rather than have a deregistration wait
// for an answer that cannot come; allocated memory deregisters and Close
// returns nil.
func TestPeerExitOnAnUpLinkFailsIt(t *testing.T) {
	r, s := linkedPair(t)
	closed := false
	defer func() {
		if !closed {
			r.Close()
		}
	}()
	_, reg := alloc(t, r, 1<<20)
	if err := r.PeerExited(s.Address(), sendIdentity, "the test says so"); err != nil {
		t.Fatalf("PeerExited: %v", err)
	}
	if _, err := r.Connect(s.Address()); !errors.Is(err, rdma.ErrPeerGone) || !strings.Contains(err.Error(), "the test says so") {
		t.Errorf("Connect to a peer whose exit was proven: %v, want ErrPeerGone naming the proof", err)
	}
	if err := r.Deregister(reg); err != nil {
		t.Errorf("Deregister of allocated memory after the peer's exit: %v, want nil", err)
	}
	closed = true
	if err := r.Close(); err != nil {
		t.Errorf("Close after the peer's exit: %v, want nil", err)
	}
}

// TestBatchesCutByAnEndpointErrorAreUnproven: this agent's own batches on
// the wire to a peer whose link fails on an error UCX reports on the
// control endpoint are cut by the forced close of their endpoint. Over
// tcp a peer that runs on (here stopped, SIGSTOP, so that they stay on
// the wire) may still apply what reached it once it runs again: each
// such batch fails with rdma.ErrPeerGone and rdma.ErrCloseUnproven, and
// the endpoint's Close returns rdma.ErrCloseUnproven, as for writes cut
// by the close timeout. Before the fix they failed with ErrPeerGone
// alone (proof that nothing of them lands) and Close returned nil.
func TestBatchesCutByAnEndpointErrorAreUnproven(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("parent only")
	}
	t.Setenv("UCX_TLS", "tcp")
	usable(t, "tcp")
	child := startChild(t, false)
	rem := parseReady(t, child.Expect(t, readyPrefix))
	n := rem.dst.Len
	s, err := ucx.New(ucx.WithCloseTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src, err := kvcache.NewHostRegion(n)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	sreg, err := s.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := s.Connect(rem.addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 8)
	post := func() {
		t.Helper()
		if err := ep.Post(rdma.Batch{Src: sreg, Dst: rem.dst, Segments: []kvcache.Segment{{Len: n}},
			Done: func(err error) { done <- err }}); err != nil {
			t.Fatal(err)
		}
	}
	post() // wires the endpoint up before the receiver stops
	if err := rdmatest.Recv(t, done, "a batch into the running receiver"); err != nil {
		t.Fatal(err)
	}
	child.Stop(t)
	defer child.Reap(t)
	defer child.Process().Kill()
	const batches = 8 // 64 MiB: more than the sockets hold
	for range batches {
		post()
	}
	deadline := time.Now().Add(rdmatest.WaitLimit)
	for !ucx.OnTheWire(ep) {
		if time.Now().After(deadline) {
			t.Fatalf("batches not handed to UCX within %v", rdmatest.WaitLimit)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	if !ucx.FailControlEndpoint(s, rem.addr) {
		t.Fatal("no control endpoint to the receiver")
	}
	for range batches {
		if err := rdmatest.Recv(t, done, "Done of a batch cut by the link's failure"); !errors.Is(err, rdma.ErrPeerGone) || !errors.Is(err, rdma.ErrCloseUnproven) {
			t.Errorf("a batch cut by an endpoint error on its link: Done(%v), want ErrPeerGone and ErrCloseUnproven", err)
		}
	}
	if err := ep.Close(); !errors.Is(err, rdma.ErrCloseUnproven) {
		t.Errorf("Close of an endpoint whose batches an endpoint error on its link cut: %v, want ErrCloseUnproven", err)
	}
}

// TestSourceRegistrationOwesNoProof: memory registered with
// RegisterSource (a send-only rank's pool, which only this agent's
// batches read) has no key to give a peer, so a link failed without
// proof bears on nothing of it: after an endpoint error on a live peer's
// link (which keeps writable memory, TestEndpointErrorOnALiveLinkProvesNothing)
// its Deregister unmaps it at once, asking no peer, and Close returns nil
// with another source registration still mapped. Before RegisterSource a
// send-only rank registered its pool as writable memory and its Close
// returned ErrCloseUnproven after any peer's link failed so.
func TestSourceRegistrationOwesNoProof(t *testing.T) {
	inMode(t, func(t *testing.T, tls string) {
		r, s := linkedPair(t)
		closed := false
		defer func() {
			if !closed {
				r.Close()
			}
		}()
		var regs []rdma.Registration
		for range 2 {
			rh, err := kvcache.NewHostRegion(1 << 20)
			if err != nil {
				t.Fatal(err)
			}
			defer rh.Close()
			reg, err := r.RegisterSource(rh)
			if err != nil {
				t.Fatal(err)
			}
			if k := reg.Remote().Key; len(k) != 0 || reg.Remote().Len != rh.Len {
				t.Fatalf("source registration's Remote: key of %d bytes, length %d; want no key, length %d", len(k), reg.Remote().Len, rh.Len)
			}
			regs = append(regs, reg)
		}
		failLink(t, r, s)
		if err := r.Deregister(regs[0]); err != nil {
			t.Errorf("Deregister of a source registration after an endpoint error: %v, want nil", err)
		}
		closed = true
		if err := r.Close(); err != nil {
			t.Errorf("Close with a source registration after an endpoint error: %v, want nil", err)
		}
	})
}

// TestSourceRegistrationIsNoDestination: a batch naming a source
// registration's Remote (no key) as its destination is refused at Post
// with rdma.ErrBadKey, and Done is not called.
func TestSourceRegistrationIsNoDestination(t *testing.T) {
	r, s := linkedPair(t)
	defer r.Close()
	rh, err := kvcache.NewHostRegion(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer rh.Close()
	dst, err := r.RegisterSource(rh)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := kvcache.NewHostRegion(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	src, err := s.RegisterSource(sh)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := s.Connect(r.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	err = ep.Post(rdma.Batch{Src: src, Dst: dst.Remote(), Segments: []kvcache.Segment{{Len: 64}},
		Done: func(err error) { t.Errorf("Done(%v) of a refused batch", err) }})
	if !errors.Is(err, rdma.ErrBadKey) {
		t.Errorf("Post into a source registration: %v, want ErrBadKey", err)
	}
}
