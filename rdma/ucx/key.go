package ucx

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/kvxfer/kvxfer/rdma"
)

// keyMagic starts every ucx region key.
const keyMagic = "UCK1"

const (
	macLen   = 16 // bytes of HMAC-SHA256 kept
	keyFixed = len(keyMagic) + 16 + 8 + 8 + 8 + 4 + macLen
	maxRkey  = 1 << 16 // a packed rkey is tens to hundreds of bytes
)

// regionKey is a parsed RemoteRegion.Key:
//
//	"UCK1" owner[16] reg u64 base u64 len u64 len(rkey) u32 rkey mac[16]
//
// base is the region's address in the owner's process, rkey the output of
// ucp_rkey_pack, and mac HMAC-SHA256 (truncated) of everything before it
// under the owner agent's secret, which peers learn when they link.
type regionKey struct {
	owner agentID
	reg   uint64
	base  uint64
	len   uint64
	rkey  []byte // aliases the parsed bytes
	mac   []byte
	body  []byte // the bytes the mac covers
}

func (k regionKey) encode(secret []byte) []byte {
	b := make([]byte, 0, keyFixed+len(k.rkey))
	b = append(b, keyMagic...)
	b = append(b, k.owner[:]...)
	b = binary.BigEndian.AppendUint64(b, k.reg)
	b = binary.BigEndian.AppendUint64(b, k.base)
	b = binary.BigEndian.AppendUint64(b, k.len)
	b = binary.BigEndian.AppendUint32(b, uint32(len(k.rkey)))
	b = append(b, k.rkey...)
	return append(b, keyMAC(secret, b)...)
}

func keyMAC(secret, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return m.Sum(nil)[:macLen]
}

// parseKey parses a key's structure; errors wrap rdma.ErrBadKey. The mac is
// checked by verify, with the owner's secret.
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
	k.mac = b[p+int(n):]
	return k, nil
}

// verify checks the key's mac under the owner's secret.
func (k regionKey) verify(secret []byte) error {
	if !hmac.Equal(k.mac, keyMAC(secret, k.body)) {
		return fmt.Errorf("%w: registration %d of agent %s: the key's signature does not match (altered or forged key)", rdma.ErrBadKey, k.reg, k.owner)
	}
	return nil
}
