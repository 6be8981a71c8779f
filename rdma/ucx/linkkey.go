package ucx

import (
	"bytes"
	"crypto/ecdh"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
)

// Every control message between two agents (control.go) carries a MAC
// under their link key, which only the two of them can compute: X25519 of
// one's private key and the other's public key, which its address carries
// and its id is derived from (address.go). A message naming an agent it
// does not come from — a bye that fails a link, a restore that lets writes
// into a deregistered region, a reply that ends a revocation — is dropped:
// its author would need the named agent's private key, or the receiver's.
// Addresses come from the authenticated control plane (a CURVE peer's
// Hello, or etcd), so a key in an address is the key of the agent that
// peer runs.
//
// What the MAC does not stop: a message recorded on the wire between the
// two agents and replayed (the UCX wire is not confidential; see
// docs/threat-model.md).

// msgMACLen is the size of a control message's MAC.
const msgMACLen = 16

// linkKey derives the key of the link between the agent with private key
// priv and the agent whose public key is peer.
func linkKey(priv *ecdh.PrivateKey, peer [pubLen]byte) ([32]byte, error) {
	pk, err := ecdh.X25519().NewPublicKey(peer[:])
	if err != nil {
		return [32]byte{}, fmt.Errorf("peer public key: %w", err)
	}
	shared, err := priv.ECDH(pk)
	if err != nil {
		return [32]byte{}, fmt.Errorf("peer public key %x…: %w", peer[:4], err)
	}
	// Both ends derive the same key: the two public keys in one order.
	lo, hi := priv.PublicKey().Bytes(), peer[:]
	if bytes.Compare(lo, hi) > 0 {
		lo, hi = hi, lo
	}
	h := sha256.New()
	h.Write([]byte("kvxfer ucx link key\x00"))
	h.Write(shared)
	h.Write(lo)
	h.Write(hi)
	var k [32]byte
	copy(k[:], h.Sum(nil))
	return k, nil
}

// messageMAC is the MAC of a control message's body under a link key.
func messageMAC(key *[32]byte, body []byte) []byte {
	m := hmac.New(sha256.New, key[:])
	m.Write(body)
	return m.Sum(nil)[:msgMACLen]
}

// seal appends the body's MAC under key: the message as it travels.
func seal(key *[32]byte, body []byte) []byte {
	return append(body, messageMAC(key, body)...)
}

// unseal splits a received message into its body and MAC; false when it
// is too short to have one.
func unseal(b []byte) (body, mac []byte, ok bool) {
	if len(b) < msgMACLen {
		return nil, nil, false
	}
	return b[:len(b)-msgMACLen], b[len(b)-msgMACLen:], true
}

// sealedBy reports whether mac is body's MAC under key.
func sealedBy(key *[32]byte, body, mac []byte) bool {
	return hmac.Equal(mac, messageMAC(key, body))
}
