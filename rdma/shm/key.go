package shm

import (
	"encoding/binary"
	"fmt"

	"github.com/kvxfer/kvxfer/rdma"
)

// keyMagic starts every shm region key.
const keyMagic = "SHK1"

// Key kinds: a shared file that peers can write, or private memory that only
// its own agent can use as a source.
const (
	kindFile    byte = 'F'
	kindPrivate byte = 'P'
)

// regionKey is a parsed RemoteRegion.Key:
//
//	"SHK1" kind owner[16] then, for kindFile: fileID[16] secret[16] nameLen name
//	                       or, for kindPrivate: registration id (8 bytes)
type regionKey struct {
	kind   byte
	owner  [16]byte
	fileID [16]byte
	secret [16]byte
	name   []byte // the file's base name; aliases the key's bytes
	reg    uint64
}

func (k regionKey) encode() []byte {
	b := make([]byte, 0, len(keyMagic)+1+16+16+16+1+len(k.name))
	b = append(b, keyMagic...)
	b = append(b, k.kind)
	b = append(b, k.owner[:]...)
	if k.kind == kindPrivate {
		return binary.BigEndian.AppendUint64(b, k.reg)
	}
	b = append(b, k.fileID[:]...)
	b = append(b, k.secret[:]...)
	b = append(b, byte(len(k.name)))
	return append(b, k.name...)
}

// parseKey parses a key; errors wrap rdma.ErrBadKey.
func parseKey(b []byte) (regionKey, error) {
	var k regionKey
	bad := func(why string) (regionKey, error) {
		return regionKey{}, fmt.Errorf("%w: %d-byte key %.8x…: %s", rdma.ErrBadKey, len(b), b, why)
	}
	fixed := len(keyMagic) + 1 + 16
	if len(b) < fixed || string(b[:len(keyMagic)]) != keyMagic {
		return bad("not an shm key")
	}
	k.kind = b[len(keyMagic)]
	copy(k.owner[:], b[len(keyMagic)+1:])
	rest := b[fixed:]
	switch k.kind {
	case kindPrivate:
		if len(rest) != 8 {
			return bad("truncated private-region key")
		}
		k.reg = binary.BigEndian.Uint64(rest)
	case kindFile:
		if len(rest) < 33 || len(rest) != 33+int(rest[32]) {
			return bad("truncated shared-region key")
		}
		copy(k.fileID[:], rest)
		copy(k.secret[:], rest[16:])
		k.name = rest[33:] // checked by openMapping before it names a file
	default:
		return bad(fmt.Sprintf("unknown region kind %q", k.kind))
	}
	return k, nil
}
