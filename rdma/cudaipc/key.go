package cudaipc

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/rdma"
)

// keyMagic starts every cudaipc region key. Version 1 ("CIK1") carried one
// allocation; a sender that knows only version 1 refuses this one by its
// length and magic rather than misreading it.
const keyMagic = "CIK2"

// keyLen is the length of every key.
const keyLen = len(keyMagic) + 16 + 4 + 16 + 16 + 8 + 4 + sha256.Size

// MaxAllocations bounds the allocations one registration spans (its key's
// count, and its control file's table): RegisterSpans refuses more, and a
// sender refuses a key that claims more.
const MaxAllocations = 4096

// regionKey is a parsed RemoteRegion.Key:
//
//	"CIK2" owner[16] pid[4] fileID[16] secret[16] len[8] count[4] digest[32]
//
// owner and pid name the registering agent; fileID its control file
// (Dir()/kvxfer-cudaipc-<pid>-<fileID>); secret the registration; len the
// region's length; count the number of allocations the region's bytes lie
// in (1..MaxAllocations), and digest the SHA-256 of the control file's
// table of those allocations (entryLen bytes each, see entry), so that the
// key names exactly one table. The table lives in the control file, not in
// the key: 4096 IPC handles of 64 bytes would not fit a Hello.
type regionKey struct {
	owner  [16]byte
	pid    int
	fileID [16]byte
	secret [16]byte
	length uint64
	count  int
	digest [sha256.Size]byte
}

func (k regionKey) encode() []byte {
	b := make([]byte, 0, keyLen)
	b = append(b, keyMagic...)
	b = append(b, k.owner[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(k.pid))
	b = append(b, k.fileID[:]...)
	b = append(b, k.secret[:]...)
	b = binary.BigEndian.AppendUint64(b, k.length)
	b = binary.BigEndian.AppendUint32(b, uint32(k.count))
	return append(b, k.digest[:]...)
}

// parseKey parses a key and checks what it can check alone (its length,
// magic, region length and allocation count); errors wrap rdma.ErrBadKey.
func parseKey(b []byte) (regionKey, error) {
	var k regionKey
	if len(b) != keyLen || string(b[:len(keyMagic)]) != keyMagic {
		if len(b) >= len(keyMagic) && string(b[:3]) == keyMagic[:3] && string(b[:len(keyMagic)]) != keyMagic {
			return k, fmt.Errorf("%w: %d-byte key of version %q: this sender reads %q keys only: run the same kvxfer version on both sides",
				rdma.ErrBadKey, len(b), b[:len(keyMagic)], keyMagic)
		}
		return k, fmt.Errorf("%w: %d-byte key %.8x…: not a %d-byte %q cudaipc key", rdma.ErrBadKey, len(b), b, keyLen, keyMagic)
	}
	b = b[len(keyMagic):]
	b = b[copy(k.owner[:], b):]
	k.pid = int(binary.BigEndian.Uint32(b))
	b = b[4:]
	b = b[copy(k.fileID[:], b):]
	b = b[copy(k.secret[:], b):]
	k.length = binary.BigEndian.Uint64(b)
	n := binary.BigEndian.Uint32(b[8:])
	copy(k.digest[:], b[12:])
	if n == 0 || n > MaxAllocations {
		return k, fmt.Errorf("%w: key claims %d allocations, want 1..%d", rdma.ErrBadKey, n, MaxAllocations)
	}
	if k.length == 0 {
		return k, fmt.Errorf("%w: key of a 0-byte region", rdma.ErrBadKey)
	}
	k.count = int(n)
	return k, nil
}

// entry is one allocation of a registration: region bytes [off, off+len)
// lie in the allocation handle names, at allocOff from its base.
type entry struct {
	handle   cuda.IPCHandle
	allocOff uint64
	off      uint64
	len      uint64
}

// entryLen is the size of an encoded entry:
//
//	handle[64] allocOff[8] off[8] len[8]
const entryLen = len(cuda.IPCHandle{}) + 8 + 8 + 8

// encodeTable encodes entries as the control file holds them.
func encodeTable(es []entry) []byte {
	b := make([]byte, 0, len(es)*entryLen)
	for _, e := range es {
		b = append(b, e.handle[:]...)
		b = binary.BigEndian.AppendUint64(b, e.allocOff)
		b = binary.BigEndian.AppendUint64(b, e.off)
		b = binary.BigEndian.AppendUint64(b, e.len)
	}
	return b
}

// parseTable parses and checks a table of k's region (b is the sender's
// own copy: the owner cannot change it under the checks). It checks that b
// is k's table (length, digest), and that its entries are non-empty,
// strictly ascending without overlap, inside the region, with allocation
// offsets that do not overflow, and of distinct allocations. It does not
// know the allocations' sizes: endpoint.open checks each entry against
// the driver's size once its handle is open. Errors wrap rdma.ErrBadKey.
func parseTable(k regionKey, b []byte) ([]entry, error) {
	if len(b) != k.count*entryLen {
		return nil, fmt.Errorf("%w: table of %d bytes, the key's %d allocations take %d", rdma.ErrBadKey, len(b), k.count, k.count*entryLen)
	}
	if sha256.Sum256(b) != k.digest {
		return nil, fmt.Errorf("%w: the control file's table of allocations is not the key's (digest differs)", rdma.ErrBadKey)
	}
	es := make([]entry, k.count)
	seen := make(map[cuda.IPCHandle]int, k.count)
	var end uint64
	for i := range es {
		e := &es[i]
		b = b[copy(e.handle[:], b):]
		e.allocOff = binary.BigEndian.Uint64(b)
		e.off = binary.BigEndian.Uint64(b[8:])
		e.len = binary.BigEndian.Uint64(b[16:])
		b = b[24:]
		switch {
		case e.len == 0:
			return nil, fmt.Errorf("%w: allocation %d of the key: 0 bytes", rdma.ErrBadKey, i)
		case e.off > k.length || e.len > k.length-e.off:
			return nil, fmt.Errorf("%w: allocation %d of the key: region bytes [%d, +%d) pass the end of the %d-byte region",
				rdma.ErrBadKey, i, e.off, e.len, k.length)
		case i > 0 && e.off < end:
			return nil, fmt.Errorf("%w: allocation %d of the key: region bytes [%d, +%d) overlap or precede allocation %d's, which end at %d",
				rdma.ErrBadKey, i, e.off, e.len, i-1, end)
		case e.allocOff+e.len < e.allocOff:
			return nil, fmt.Errorf("%w: allocation %d of the key: offset %d + length %d in its allocation overflow", rdma.ErrBadKey, i, e.allocOff, e.len)
		}
		if j, dup := seen[e.handle]; dup {
			return nil, fmt.Errorf("%w: allocations %d and %d of the key name one IPC handle %s", rdma.ErrBadKey, j, i, e.handle)
		}
		seen[e.handle] = i
		end = e.off + e.len
	}
	return es, nil
}

// mapped is one allocation of a region as a process reaches it: region
// bytes [off, off+len) start at ptr here. imp is the import that maps it
// (nil for memory of this process).
type mapped struct {
	off, len uint64
	ptr      cuda.DevicePtr
	imp      *imported
}

// find returns the entry of ms (ascending, disjoint) that holds
// [off, off+n), n > 0, or nil.
func find(ms []mapped, off, n uint64) *mapped {
	lo, hi := 0, len(ms)
	for lo < hi { // the first entry that ends past off
		m := int(uint(lo+hi) / 2)
		if ms[m].off+ms[m].len <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == len(ms) || off < ms[lo].off || n > ms[lo].off+ms[lo].len-off {
		return nil
	}
	return &ms[lo]
}
