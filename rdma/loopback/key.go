package loopback

import (
	"encoding/binary"
	"fmt"

	"github.com/kvxfer/kvxfer/rdma"
)

// keyMagic starts every loopback region key.
const keyMagic = "LBK1"

// keyLen is magic, agent id, registration id, secret.
const keyLen = len(keyMagic) + 8 + 8 + 16

// regionKey is a parsed RemoteRegion.Key.
type regionKey struct {
	agent  uint64
	reg    uint64
	secret [16]byte
}

func (k regionKey) encode() []byte {
	b := make([]byte, 0, keyLen)
	b = append(b, keyMagic...)
	b = binary.BigEndian.AppendUint64(b, k.agent)
	b = binary.BigEndian.AppendUint64(b, k.reg)
	return append(b, k.secret[:]...)
}

// parseKey parses a key; errors wrap rdma.ErrBadKey.
func parseKey(b []byte) (regionKey, error) {
	var k regionKey
	if len(b) != keyLen || string(b[:len(keyMagic)]) != keyMagic {
		return k, fmt.Errorf("%w: %d-byte key %.8x… is not a loopback key", rdma.ErrBadKey, len(b), b)
	}
	b = b[len(keyMagic):]
	k.agent = binary.BigEndian.Uint64(b)
	k.reg = binary.BigEndian.Uint64(b[8:])
	copy(k.secret[:], b[16:])
	return k, nil
}
