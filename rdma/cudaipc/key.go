package cudaipc

import (
	"encoding/binary"
	"fmt"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/rdma"
)

// keyMagic starts every cudaipc region key.
const keyMagic = "CIK1"

// keyLen is the length of every key.
const keyLen = len(keyMagic) + 16 + 4 + 16 + 16 + 64 + 8 + 8

// regionKey is a parsed RemoteRegion.Key:
//
//	"CIK1" owner[16] pid[4] fileID[16] secret[16] handle[64] offset[8] len[8]
//
// owner and pid name the registering agent; fileID its control file
// (Dir()/kvxfer-cudaipc-<pid>-<fileID>); secret the registration; handle
// the IPC handle of the device allocation that holds the region, at offset
// from its base, len bytes long.
type regionKey struct {
	owner  [16]byte
	pid    int
	fileID [16]byte
	secret [16]byte
	handle cuda.IPCHandle
	offset uint64
	length uint64
}

func (k regionKey) encode() []byte {
	b := make([]byte, 0, keyLen)
	b = append(b, keyMagic...)
	b = append(b, k.owner[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(k.pid))
	b = append(b, k.fileID[:]...)
	b = append(b, k.secret[:]...)
	b = append(b, k.handle[:]...)
	b = binary.BigEndian.AppendUint64(b, k.offset)
	return binary.BigEndian.AppendUint64(b, k.length)
}

// parseKey parses a key; errors wrap rdma.ErrBadKey.
func parseKey(b []byte) (regionKey, error) {
	var k regionKey
	if len(b) != keyLen || string(b[:len(keyMagic)]) != keyMagic {
		return k, fmt.Errorf("%w: %d-byte key %.8x…: not a %d-byte cudaipc key", rdma.ErrBadKey, len(b), b, keyLen)
	}
	b = b[len(keyMagic):]
	b = b[copy(k.owner[:], b):]
	k.pid = int(binary.BigEndian.Uint32(b))
	b = b[4:]
	b = b[copy(k.fileID[:], b):]
	b = b[copy(k.secret[:], b):]
	b = b[copy(k.handle[:], b):]
	k.offset = binary.BigEndian.Uint64(b)
	k.length = binary.BigEndian.Uint64(b[8:])
	return k, nil
}
