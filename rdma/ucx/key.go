package ucx

import (
	"crypto/ed25519"
	"encoding/binary"
	"fmt"

	"github.com/kvxfer/kvxfer/rdma"
)

// keyMagic starts every ucx region key.
const keyMagic = "UCK2"

const (
	sigLen   = ed25519.SignatureSize
	keyFixed = len(keyMagic) + 16 + 8 + 8 + 8 + 4 + sigLen
	maxRkey  = 1 << 16 // a packed rkey is tens to hundreds of bytes
)

// regionKey is a parsed RemoteRegion.Key:
//
//	"UCK2" owner[16] reg u64 base u64 len u64 len(rkey) u32 rkey sig[64]
//
// base is the region's address in the owner's process, rkey the output of
// ucp_rkey_pack, and sig the owner agent's Ed25519 signature of everything
// before it, which a writer checks with the public key in the owner's
// address (verify). Only the owner can sign: a peer of it cannot mint a
// key in its name with another base or length (before, the key carried a
// MAC under a secret every peer of the owner learnt from its hello).
type regionKey struct {
	owner agentID
	reg   uint64
	base  uint64
	len   uint64
	rkey  []byte // aliases the parsed bytes
	sig   []byte
	body  []byte // the bytes sig signs
}

func (k regionKey) encode(priv ed25519.PrivateKey) []byte {
	b := make([]byte, 0, keyFixed+len(k.rkey))
	b = append(b, keyMagic...)
	b = append(b, k.owner[:]...)
	b = binary.BigEndian.AppendUint64(b, k.reg)
	b = binary.BigEndian.AppendUint64(b, k.base)
	b = binary.BigEndian.AppendUint64(b, k.len)
	b = binary.BigEndian.AppendUint32(b, uint32(len(k.rkey)))
	b = append(b, k.rkey...)
	return append(b, ed25519.Sign(priv, b)...)
}

// parseKey parses a key's structure; errors wrap rdma.ErrBadKey. The
// signature is checked by verify, with the owner's public key.
func parseKey(b []byte) (regionKey, error) {
	bad := func(why string) (regionKey, error) {
		return regionKey{}, fmt.Errorf("%w: %d-byte key %.8x…: %s", rdma.ErrBadKey, len(b), b, why)
	}
	if len(b) < keyFixed || string(b[:len(keyMagic)]) != keyMagic {
		return bad("not a ucx region key")
	}
	var k regionKey
	p := len(keyMagic)
	copy(k.owner[:], b[p:])
	p += 16
	k.reg = binary.BigEndian.Uint64(b[p:])
	k.base = binary.BigEndian.Uint64(b[p+8:])
	k.len = binary.BigEndian.Uint64(b[p+16:])
	n := binary.BigEndian.Uint32(b[p+24:])
	p += 28
	if n == 0 || n > maxRkey || uint64(n) != uint64(len(b)-keyFixed) {
		return bad(fmt.Sprintf("packed rkey of %d bytes in %d", n, len(b)-keyFixed))
	}
	if k.base+k.len < k.base {
		return bad(fmt.Sprintf("region [%#x, +%d) wraps around", k.base, k.len))
	}
	k.rkey = b[p : p+int(n)]
	k.body = b[:p+int(n)]
	k.sig = b[p+int(n):]
	return k, nil
}

// verify checks the key's signature with the owner's Ed25519 public key.
func (k regionKey) verify(spub [pubLen]byte) error {
	if !ed25519.Verify(ed25519.PublicKey(spub[:]), k.body, k.sig) {
		return fmt.Errorf("%w: registration %d of agent %s: the key's signature does not match (altered or forged key)", rdma.ErrBadKey, k.reg, k.owner)
	}
	return nil
}
