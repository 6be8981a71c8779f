//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// forgeRig is three agents over tcp: a writer A linked to an owner B that
// registered a region, and C, another peer of B (linked to it, as every
// context rank writing to B is) that speaks for A.
type forgeRig struct {
	a, b, c *Agent
	dst     rdma.Registration
	src     rdma.Registration
	ab      rdma.Endpoint // A's endpoint to B
}

func newForgeRig(t *testing.T) *forgeRig {
	t.Setenv("UCX_TLS", "tcp")
	r := &forgeRig{}
	for _, p := range []**Agent{&r.a, &r.b, &r.c} {
		ag, err := New()
		if err != nil {
			t.Fatalf("ucx.New: %v", err)
		}
		t.Cleanup(func() { ag.Close() })
		*p = ag
	}
	region := func(ag *Agent) rdma.Registration {
		reg, err := kvcache.NewHostRegion(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reg.Close() })
		g, err := ag.Register(reg)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	r.dst, r.src = region(r.b), region(r.a)
	var err error
	if r.ab, err = r.a.Connect(r.b.Address()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ab.Close() })
	r.write(t) // the link A–B is up both ways
	cb, err := r.c.Connect(r.b.Address())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cb.Close() })
	return r
}

// write posts one 4 KiB write from A into B's region and waits for it.
func (r *forgeRig) write(t *testing.T) error {
	t.Helper()
	return postWait(t, r.ab, r.src, r.dst.Remote(), 4096)
}

// postWait posts one 4 KiB write on ep from src's first bytes to offset
// off of dst and returns Post's refusal or the batch's outcome.
func postWait(t *testing.T, ep rdma.Endpoint, src rdma.Registration, dst rdma.RemoteRegion, off uint64) error {
	t.Helper()
	done := make(chan error, 1)
	err := ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: []kvcache.Segment{{Src: 0, Dst: off, Len: 4096}},
		Done: func(err error) { done <- err }})
	if err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("a write did not complete within a minute")
		return nil
	}
}

// untouched fails the test if the first 4 KiB of r, which no registration
// covers (what), were written.
func untouched(t *testing.T, r *kvcache.Region, what string) {
	t.Helper()
	for i, b := range r.Bytes()[:4096] {
		if b != 0 {
			t.Fatalf("byte %d of %s was written", i, what)
		}
	}
}

// inject has C send b to B on its own link to B, as a hostile peer of B
// can (an active message on its control endpoint), and waits until B has
// taken it in: B's count of dropped messages moved, or B's view of its
// link to A did.
func (r *forgeRig) inject(t *testing.T, b []byte) {
	t.Helper()
	dropped, state := r.bView(t)
	r.c.w.do(func() {
		if !r.c.w.sendSealed(r.c.w.links[r.b.id], msgBye, b) {
			t.Error("C could not send")
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		d, s := r.bView(t)
		if d != dropped || s != state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("B took in nothing of C's message within a minute")
		}
		time.Sleep(time.Millisecond) // polling B's progress goroutine
	}
}

// bView is B's count of dropped control messages and its link to A's state.
func (r *forgeRig) bView(t *testing.T) (dropped int, state linkState) {
	r.b.w.do(func() {
		dropped = r.b.w.dropped
		if l := r.b.w.links[r.a.id]; l != nil {
			state = l.getState()
		}
	})
	return dropped, state
}

// TestForgedControlMessagesAreDropped: a peer of the owner (C) sends the
// owner control messages in the writer's name (A's id, which every peer of
// A knows from its address): a bye (it would fail B's link to A), a
// revoke, a restore of a deregistered region (a write into freed memory),
// a reply (it would end a revocation A never answered). Sealed under C's
// own link key, or under a key C made up, or unsealed, each is dropped:
// B's link to A stays up and A's writes go on. The same bye sealed under
// the A–B link key (which the test, holding both private keys, can
// derive) is taken: the path C's messages take reaches B's handler, so
// the drops are the MAC's doing.
func TestForgedControlMessagesAreDropped(t *testing.T) {
	r := newForgeRig(t)
	cKey := r.c.w.links[r.b.id].key // read after Connect: the link exists
	var madeUp [32]byte
	madeUp[0] = 1
	forged := []*message{
		{kind: msgBye, req: 77, from: r.a.id},
		{kind: msgRevoke, req: 78, from: r.a.id, reg: 1},
		{kind: msgRestore, req: 79, from: r.a.id, reg: 1},
		{kind: msgReply, req: 80, from: r.a.id, ok: true},
		{kind: msgWelcome, req: 81, from: r.a.id, addr: r.c.Address()},
	}
	for _, m := range forged {
		for _, b := range [][]byte{seal(&cKey, m.encode()), seal(&madeUp, m.encode()), m.encode()} {
			before, _ := r.bView(t)
			r.inject(t, b)
			dropped, state := r.bView(t)
			if state != linkUp || dropped != before+1 {
				t.Fatalf("forged %s: B's link to A is %s, dropped %d → %d; want up, one more dropped", m.kind, state, before, dropped)
			}
		}
	}
	// A forged hello in A's name: C's address (its own key) under A's id.
	h := &message{kind: msgHello, req: 82, from: r.a.id, addr: r.c.Address()}
	before, _ := r.bView(t)
	r.inject(t, seal(&cKey, h.encode()))
	if dropped, state := r.bView(t); state != linkUp || dropped != before+1 {
		t.Fatalf("forged hello: B's link to A is %s, dropped %d → %d", state, before, dropped)
	}
	if err := r.write(t); err != nil {
		t.Fatalf("A's write after the forgeries: %v", err)
	}

	// The control: A's bye, sealed as A seals it.
	abKey, err := linkKey(r.a.priv, r.b.pub)
	if err != nil {
		t.Fatal(err)
	}
	r.inject(t, seal(&abKey, (&message{kind: msgBye, req: 83, from: r.a.id}).encode()))
	if _, state := r.bView(t); state == linkUp {
		t.Fatal("a bye sealed under the A–B key left B's link to A up: the injection does not reach B's handler")
	}
}

// TestLinkKeyIsPairwise: both ends of a link derive one key, and no third
// agent's pair gives it.
func TestLinkKeyIsPairwise(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	var ags [3]*Agent
	for i := range ags {
		a, err := New()
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		ags[i] = a
	}
	key := func(x, y *Agent) [32]byte {
		k, err := linkKey(x.priv, y.pub)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	if key(ags[0], ags[1]) != key(ags[1], ags[0]) {
		t.Fatal("A and B derive different keys")
	}
	if key(ags[0], ags[1]) == key(ags[2], ags[1]) || key(ags[0], ags[1]) == key(ags[2], ags[0]) {
		t.Fatal("C derives the A–B key")
	}
	if _, err := linkKey(ags[0].priv, [pubLen]byte{}); err == nil {
		t.Error("a link key with the all-zero public key (a low-order point)")
	}
	if idOf(ags[0].pub, ags[0].spub) != ags[0].id {
		t.Error("an agent's id is not its key's")
	}
	if _, err := parseAddress(append([]byte(oldAddrMagic), make([]byte, 60)...)); !errors.Is(err, rdma.ErrBadAddress) {
		t.Errorf("an older kvxfer's address: %v, want ErrBadAddress", err)
	}
}

// TestSelfLinkKeyBoundedByOwnRegistration: on an endpoint to itself (a
// hostile peer can hand out this agent's own address as its own), a key of
// this agent's registration signed with its secret, which every peer of it
// learns from its hello, but naming memory outside the registration, is
// refused (rdma.ErrBadKey) and nothing lands there. Before, the self
// transport copied to the key's base: a write into this process's
// unregistered memory, or a SIGSEGV (found by review).
func TestSelfLinkKeyBoundedByOwnRegistration(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	srcR, err := kvcache.NewHostRegion(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer srcR.Close()
	victim, err := kvcache.NewHostRegion(1 << 16) // registered nowhere
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	src, err := w.Register(srcR)
	if err != nil {
		t.Fatal(err)
	}
	for i := range srcR.Bytes() {
		srcR.Bytes()[i] = 0xab
	}
	pk, err := parseKey(src.Remote().Key)
	if err != nil {
		t.Fatal(err)
	}
	self, err := w.Connect(w.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	for _, k := range []regionKey{
		{owner: w.id, reg: pk.reg, base: uint64(victim.Base), len: 4096, rkey: pk.rkey},       // outside it
		{owner: w.id, reg: pk.reg, base: pk.base + 4096, len: pk.len, rkey: pk.rkey},          // past its end
		{owner: w.id, reg: pk.reg + 100, base: uint64(victim.Base), len: 4096, rkey: pk.rkey}, // no such registration
	} {
		err := postWait(t, self, src, rdma.RemoteRegion{Key: k.encode(w.sign), Len: k.len}, 0)
		if !errors.Is(err, rdma.ErrBadKey) {
			t.Errorf("key of registration %d at [%#x, +%d): %v, want ErrBadKey", k.reg, k.base, k.len, err)
		}
	}
	untouched(t, victim, "memory no registration covers")
}

// TestKeyOnlyItsOwnerCanSign: P, a peer of owner V, mints a key in V's
// name (V's registration and packed rkey, a base in V's unregistered
// memory) and signs it itself, the best it can do: a writer W that is
// handed it (a hostile peer's Hello naming V's agent address and this key)
// refuses it with rdma.ErrBadKey, and nothing lands. Before, keys carried
// a MAC under a secret V sent every agent it linked with, and P's key
// landed W's write in V's unregistered memory, over tcp and the default
// transports alike (found by review).
func TestKeyOnlyItsOwnerCanSign(t *testing.T) {
	for _, tls := range []string{"tcp", ""} {
		t.Run("UCX_TLS="+tls, func(t *testing.T) {
			t.Setenv("UCX_TLS", tls) // restored afterwards
			if tls == "" {
				os.Unsetenv("UCX_TLS") // UCX's own choice
			}
			var ags [3]*Agent
			for i := range ags {
				a, err := New()
				if err != nil {
					t.Fatal(err)
				}
				defer a.Close()
				ags[i] = a
			}
			w, v, p := ags[0], ags[1], ags[2]
			region := func() *kvcache.Region {
				r, err := kvcache.NewHostRegion(1 << 16)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { r.Close() })
				return r
			}
			srcR, dstR, victim := region(), region(), region()
			src, err := w.Register(srcR)
			if err != nil {
				t.Fatal(err)
			}
			dst, err := v.Register(dstR)
			if err != nil {
				t.Fatal(err)
			}
			for i := range srcR.Bytes() {
				srcR.Bytes()[i] = 0xcd
			}
			pv, err := p.Connect(v.Address()) // P is a peer of V
			if err != nil {
				t.Fatal(err)
			}
			defer pv.Close()
			pk, err := parseKey(dst.Remote().Key)
			if err != nil {
				t.Fatal(err)
			}
			forged := regionKey{owner: v.id, reg: pk.reg, base: uint64(victim.Base), len: 4096, rkey: pk.rkey}.encode(p.sign)
			wv, err := w.Connect(v.Address())
			if err != nil {
				t.Fatal(err)
			}
			defer wv.Close()
			if err := postWait(t, wv, src, rdma.RemoteRegion{Key: forged, Len: 4096}, 0); !errors.Is(err, rdma.ErrBadKey) {
				t.Errorf("a key P signed in V's name: %v, want ErrBadKey", err)
			}
			untouched(t, victim, "V's unregistered memory")
		})
	}
}
