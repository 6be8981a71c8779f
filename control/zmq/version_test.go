package zmq

import (
	"errors"
	"strings"
	"testing"

	zmq4 "github.com/pebbe/zmq4"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// frameOfVersion is an envelope of protocol version v: Decode refuses it
// at the version, whatever a body of that version would hold.
func frameOfVersion(v uint32) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), uint64(v))
}

// dialCurve is a bare DEALER that authenticates with k against a server
// whose public key is server.
func dialCurve(t testing.TB, endpoint, server string, k keypair) *rawDealer {
	t.Helper()
	return dialRaw(t, endpoint, func(s *zmq4.Socket) error {
		return errors.Join(s.SetCurveServerkey(server), s.SetCurvePublickey(k.public), s.SetCurveSecretkey(k.secret))
	})
}

// A peer whose frames are of another protocol version is named: each
// frame is rejected under "version", and the link's Hello for the peers
// its CURVE key may speak for says which version it speaks (wrapping
// messages.ErrVersion beside control.ErrPeerGone), so that a request to
// it fails at once instead of at its deadline. A peer the key may not
// speak for is not named; a valid Hello from the key forgets the version.
// (Checked to fail: with otherVersion not recording the key, Hello(gen/3)
// says only "has not said Hello"; with hello not forgetting it, Hello(gen/3)
// still names version 2 after the key's valid Hello.)
func TestOtherVersionNamedByHello(t *testing.T) {
	ka, kb := newKeys(t), newKeys(t)
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret,
		Identities: []Identity{{PublicKey: kb.public, Instance: "gen"}}}})
	raw := dialCurve(t, a.link.Endpoint(), ka.public, kb)
	defer raw.close()
	raw.send(t, frameOfVersion(2))
	raw.send(t, frameOfVersion(2))
	waitFor(t, patience, "both frames rejected", func() bool { return a.link.Rejected() >= 2 })
	if got := a.link.FramesRejected(); got["version"] != 2 || a.link.Rejected() != 2 {
		t.Fatalf("rejections %v, want 2 under version", got)
	}
	_, err := a.link.Hello(pid("gen", 3))
	var pv *PeerVersionError
	if !errors.As(err, &pv) || pv.Version != 2 || pv.Key != kb.public || !errors.Is(err, messages.ErrVersion) || !errors.Is(err, control.ErrPeerGone) ||
		!strings.Contains(err.Error(), "control protocol version 2 (CURVE key "+kb.public+"), this engine speaks 1") {
		t.Fatalf("Hello(gen/3) = %v, want ErrPeerGone and ErrVersion naming version 2 and the key", err)
	}
	if _, err := a.link.Hello(pid("other", 0)); err == nil || errors.Is(err, messages.ErrVersion) {
		t.Fatalf("Hello(other/0), a peer the key may not speak for: %v, want only ErrPeerGone", err)
	}
	if n := a.in.len(); n != 0 {
		t.Fatalf("delivered %d frames of another version", n)
	}
	if v := a.link.OtherVersionUnnamed(); v != 0 {
		t.Fatalf("OtherVersionUnnamed() = %d after frames with a CURVE key, want 0", v)
	}

	// The peer is upgraded: the same key says Hello in our version.
	b := listen(t, pid("gen", 0), Config{Curve: Curve{Secret: kb.secret}})
	introduce(t, b, a)
	conn, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, patience, "gen/0's Hello", func() bool { _, err := a.link.Hello(b.id); return err == nil })
	if _, err := a.link.Hello(pid("gen", 3)); err == nil || errors.Is(err, messages.ErrVersion) {
		t.Fatalf("Hello(gen/3) after the key said Hello in version 1: %v, want only ErrPeerGone", err)
	}
}

// Over an insecure link frames of another version cannot be tied to a
// peer: they are rejected under "version" and only OtherVersionUnnamed
// says they came. (Checked to fail: without otherVersion's Store it stays
// 0.)
func TestOtherVersionInsecureUnnamed(t *testing.T) {
	a := listen(t, pid("ctx", 0), Config{Insecure: true})
	if v := a.link.OtherVersionUnnamed(); v != 0 {
		t.Fatalf("OtherVersionUnnamed() = %d before any frame, want 0", v)
	}
	raw := dialRaw(t, a.link.Endpoint())
	defer raw.close()
	raw.send(t, frameOfVersion(3))
	waitFor(t, patience, "the frame rejected", func() bool { return a.link.FramesRejected()["version"] == 1 })
	if v := a.link.OtherVersionUnnamed(); v != 3 {
		t.Fatalf("OtherVersionUnnamed() = %d, want 3", v)
	}
	if _, err := a.link.Hello(pid("gen", 0)); errors.Is(err, messages.ErrVersion) {
		t.Fatalf("Hello(gen/0) over an insecure link = %v: no key says the frames were gen/0's", err)
	}
}
