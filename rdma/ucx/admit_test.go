//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/rdma"
)

// TestAdmission: an agent with WithAdmission links only with agents whose
// address its admit accepts: another agent's Connect gets no answer (its
// handshake times out) and leaves no link behind; once admitted, the
// same agent links.
func TestAdmission(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	var vouched []byte
	owner, err := New(WithAdmission(func(addr []byte) bool { return vouched != nil && bytes.Equal(addr, vouched) }))
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	stranger, err := New(WithHandshakeTimeout(500 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	if ep, err := stranger.Connect(owner.Address()); !errors.Is(err, rdma.ErrPeerGone) {
		if ep != nil {
			ep.Close()
		}
		t.Fatalf("Connect of an agent nobody vouched for: %v, want ErrPeerGone (no answer to its hello)", err)
	}
	var links, unadmitted int
	owner.w.do(func() { links, unadmitted = len(owner.w.links), owner.w.unadmitted })
	if links != 0 || unadmitted == 0 {
		t.Fatalf("owner: %d links, %d hellos unadmitted; want none, at least one", links, unadmitted)
	}

	// Once vouched for, the same agent links: its failed link is not
	// kept (before, every later Connect failed with the old error; found
	// by review). The admit func runs on the owner's progress goroutine:
	// set what it reads there.
	owner.w.do(func() { vouched = stranger.Address() })
	ep, err := stranger.Connect(owner.Address())
	if err != nil {
		t.Fatalf("Connect of an agent vouched for after its first hello was dropped: %v", err)
	}
	ep.Close()
}

// TestPeerIdentity: an endpoint reports whom the agent it reaches serves
// (WithIdentity), as that agent's welcome said; "" for an agent given none.
func TestPeerIdentity(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	named, err := New(WithIdentity("gen/3"))
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close()
	anon, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	writer, err := New(WithIdentity("ctx/0"))
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	for _, c := range []struct {
		to   *Agent
		want string
	}{{named, "gen/3"}, {anon, ""}} {
		ep, err := writer.Connect(c.to.Address())
		if err != nil {
			t.Fatal(err)
		}
		got := ep.(rdma.IdentifiedEndpoint).PeerIdentity()
		ep.Close()
		if got != c.want {
			t.Errorf("PeerIdentity = %q, want %q", got, c.want)
		}
	}
}
