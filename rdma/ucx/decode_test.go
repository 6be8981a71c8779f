package ucx

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/rdma"
)

func testKey() (regionKey, ed25519.PrivateKey, [pubLen]byte) {
	k := regionKey{owner: agentID{1, 2, 3}, reg: 7, base: 0x7f0000001000, len: 1 << 20, rkey: bytes.Repeat([]byte{0xab}, 40)}
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
	var pub [pubLen]byte
	copy(pub[:], priv.Public().(ed25519.PublicKey))
	return k, priv, pub
}

func TestKeyRoundTrip(t *testing.T) {
	k, priv, pub := testKey()
	b := k.encode(priv)
	got, err := parseKey(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.owner != k.owner || got.reg != k.reg || got.base != k.base || got.len != k.len || !bytes.Equal(got.rkey, k.rkey) {
		t.Fatalf("parsed %+v, want %+v", got, k)
	}
	if err := got.verify(pub); err != nil {
		t.Fatal(err)
	}
	for i := range b { // every byte is covered by the structure or the mac
		c := bytes.Clone(b)
		c[i] ^= 1
		if p, err := parseKey(c); err == nil && p.verify(pub) == nil {
			t.Errorf("key with byte %d flipped verified", i)
		}
	}
	if err := got.verify([pubLen]byte{1}); !errors.Is(err, rdma.ErrBadKey) {
		t.Errorf("verify with another agent's key: %v", err)
	}
}

func TestAddressRoundTrip(t *testing.T) {
	a := newAddress([pubLen]byte{9}, [pubLen]byte{8}, validAddress(t))
	b := a.encode()
	got, err := parseAddress(b)
	if err != nil || got.id != a.id || got.pub != a.pub || got.spub != a.spub || !bytes.Equal(got.worker, a.worker) {
		t.Fatalf("parseAddress = %+v, %v", got, err)
	}
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x10
		if _, err := parseAddress(c); err == nil {
			t.Errorf("address with byte %d flipped parsed", i)
		}
	}
}

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range []*message{
		{kind: msgHello, req: 1, from: agentID{1}, addr: []byte("addr"), ident: []byte("gen/0"), nextReg: 5, live: []uint64{1, 3}},
		{kind: msgWelcome, req: 2, from: agentID{1}, addr: []byte{}, live: []uint64{}},
		{kind: msgRevoke, req: 3, reg: 9},
		{kind: msgRestore, req: 4, reg: 9},
		{kind: msgReply, req: 5, ok: true},
		{kind: msgBye, req: 6},
		{kind: msgByeAck, req: 6},
	} {
		b := m.encode()
		got, err := decodeMessage(b)
		if err != nil {
			t.Fatalf("%s: %v", m.kind, err)
		}
		if !bytes.Equal(got.encode(), b) {
			t.Errorf("%s: re-encoded differently", m.kind)
		}
		if _, err := decodeMessage(append(bytes.Clone(b), 0)); err == nil {
			t.Errorf("%s with a trailing byte decoded", m.kind)
		}
	}
}

// Fuzz every decoder: whatever the input, no panic, and what decodes
// re-encodes to the same bytes.

func FuzzParseKey(f *testing.F) {
	k, priv, pub := testKey()
	f.Add(k.encode(priv))
	f.Add([]byte("UCK2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := parseKey(b)
		if err != nil {
			return
		}
		if !bytes.Equal(k.body, b[:len(k.body)]) || len(k.body)+sigLen != len(b) {
			t.Fatalf("parsed key does not cover the input")
		}
		_ = k.verify(pub)
	})
}

func FuzzParseAddress(f *testing.F) {
	f.Add(newAddress([pubLen]byte{1}, [pubLen]byte{2}, validAddress(f)).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := parseAddress(b)
		if err != nil {
			return
		}
		if !bytes.Equal(a.encode(), b) {
			t.Fatalf("address re-encodes differently")
		}
	})
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add((&message{kind: msgHello, addr: []byte("a"), ident: []byte("i"), live: []uint64{1}}).encode())
	f.Add((&message{kind: msgReply, ok: true}).encode())
	f.Add((&message{kind: msgRevoke, reg: 2}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(b)
		if err != nil {
			return
		}
		if !bytes.Equal(m.encode(), b) {
			t.Fatalf("message re-encodes differently")
		}
	})
}
