package shm

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
)

// mapping is a sender's map of a peer's region file.
type mapping struct {
	fileID [16]byte
	name   string // the file's base name
	path   string
	mem    []byte // header page, then data
	hdr    *header
	data   []byte
	// peer is mem as the owner's memory: a fault in it (the owner
	// truncated the file) fails the batch and marks the mapping gone.
	peer *copier.PeerMemory
	// slot is this mapping's writer slot in the header (nil: none free):
	// it counts the batches of this endpoint into the file, beside the
	// lease, so that the owner can release them if this process dies.
	slot *copier.WriterSlot
}

// openMapping maps the file that k names and checks that it is the region k
// was issued for. Errors wrap rdma.ErrBadKey.
func openMapping(k regionKey) (*mapping, error) {
	name := string(k.name)
	if err := checkName(name); err != nil {
		return nil, fmt.Errorf("%w: %v", rdma.ErrBadKey, err)
	}
	path := filepath.Join(Dir(), name)
	f, err := os.OpenFile(path, os.O_RDWR|openNoFollow, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", rdma.ErrBadKey, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", rdma.ErrBadKey, err)
	}
	size := fi.Size()
	if !fi.Mode().IsRegular() || size <= headerSize || size > math.MaxInt {
		return nil, fmt.Errorf("%w: %s (%v, %d bytes) is not a region file", rdma.ErrBadKey, path, fi.Mode(), size)
	}
	// Read the header before mapping: the mapping populates every page of
	// the file, so a file the key names by mistake (not a region file, or
	// another region's) must be refused before it costs its size in memory.
	if err := checkHeader(f, path, size, k); err != nil {
		return nil, err
	}
	mem, err := mapFile(f, int(size))
	if err != nil {
		return nil, fmt.Errorf("%w: map %s: %v", rdma.ErrBadKey, path, err)
	}
	h := headerOf(mem)
	// The owner may have truncated the file since the Stat: reading the
	// header would then fault.
	if addr, faulted := copier.CatchFault(func() {
		switch {
		case string(h.magic[:]) != fileMagic || h.dataOff != headerSize || h.dataLen != uint64(size)-headerSize:
			err = notRegionFile(path, h.magic[:], h.dataOff, h.dataLen)
		case h.fileID != k.fileID:
			err = fmt.Errorf("%w: stale key: %s holds region %s, the key names region %s", rdma.ErrBadKey, path,
				hex.EncodeToString(h.fileID[:]), hex.EncodeToString(k.fileID[:]))
		}
	}); faulted {
		err = fmt.Errorf("%w: region file %s faulted at %#x reading its header: truncated under us", rdma.ErrPeerGone, path, addr)
	}
	if err != nil {
		unmapFile(mem)
		return nil, err
	}
	m := &mapping{fileID: k.fileID, name: name, path: path, mem: mem, hdr: h, data: mem[headerSize:size:size],
		peer: copier.NewPeerMemory("region file "+path, mem)}
	m.claimSlot()
	return m, nil
}

// notRegionFile is the error for a file whose header is not a region
// file's of this build's layout; a region file of another layout version
// is named as such.
func notRegionFile(path string, magic []byte, dataOff, dataLen uint64) error {
	if string(magic) != fileMagic && strings.HasPrefix(string(magic), fileMagicPrefix) {
		return fmt.Errorf("%w: %s is a region file of layout version %q, this build reads version %q: the receiver runs another kvxfer build",
			rdma.ErrBadKey, path, magic[len(fileMagicPrefix):], fileMagic[len(fileMagicPrefix):])
	}
	return fmt.Errorf("%w: %s is not a region file (magic %q, data at %d, %d bytes)", rdma.ErrBadKey, path, magic, dataOff, dataLen)
}

// claimSlot claims a writer slot in the header for this mapping (see
// copier.WriterSlot), so that, should this process die with batches into
// the file in flight, the owner can release them. Without a free slot, or
// an identity, the mapping counts in the lease only.
func (m *mapping) claimSlot() {
	id, err := copier.Self()
	if err != nil {
		return
	}
	if addr, faulted := copier.CatchFault(func() { m.slot = copier.ClaimSlot(m.hdr.writers[:], id) }); faulted {
		m.peer.MarkFaulted(addr) // acquire reports it
	}
}

// checkHeader reads the fields of f's header that say what the file is
// (pread, no mapping) and refuses a file that is not the region file the
// key names, as openMapping does again on the mapping.
func checkHeader(f *os.File, path string, size int64, k regionKey) error {
	var b [40]byte // magic, dataOff, dataLen, fileID: the header's first fields
	if _, err := f.ReadAt(b[:], 0); err != nil {
		return fmt.Errorf("%w: read %s: %v", rdma.ErrBadKey, path, err)
	}
	magic, dataOff, dataLen := b[:8], binary.NativeEndian.Uint64(b[8:16]), binary.NativeEndian.Uint64(b[16:24])
	switch {
	case string(magic) != fileMagic || dataOff != headerSize || dataLen != uint64(size)-headerSize:
		return notRegionFile(path, magic, dataOff, dataLen)
	case [16]byte(b[24:40]) != k.fileID:
		return fmt.Errorf("%w: stale key: %s holds region %s, the key names region %s", rdma.ErrBadKey, path,
			hex.EncodeToString(b[24:40]), hex.EncodeToString(k.fileID[:]))
	}
	return nil
}

// acquire takes the file's lease for a batch and checks that the key's
// owner and secret are the current registration's. The header is the
// owner's memory: a fault reading it (the owner truncated the file) marks
// the mapping gone, and every later acquire fails with rdma.ErrPeerGone.
func (m *mapping) acquire(k regionKey) error {
	if err := m.peer.Err(); err != nil {
		return err
	}
	var err error
	if addr, faulted := copier.CatchFault(func() { err = acquireLease(m, k) }); faulted {
		m.peer.MarkFaulted(addr)
		return m.peer.Err()
	}
	return err
}

// unacquire releases a lease acquire took, for a batch that was not
// accepted after all.
func (m *mapping) unacquire() {
	if addr, faulted := copier.CatchFault(func() { m.slot.Release(&m.hdr.lease) }); faulted {
		m.peer.MarkFaulted(addr)
	}
}

// close gives the writer slot back (when nothing is counted in it: every
// batch of the endpoint has completed, as it has once its copier stopped)
// and unmaps the file.
func (m *mapping) close() error {
	if m.slot != nil && m.peer.Err() == nil {
		copier.CatchFault(func() { m.slot.Free() }) // a fault: the owner truncated the file, slots and all
	}
	return unmapFile(m.mem)
}
