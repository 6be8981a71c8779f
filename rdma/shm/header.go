package shm

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/kvxfer/kvxfer/rdma/internal/copier"
)

// headerSize is the header page at the start of every region file; the
// region's data follows it.
const headerSize = 4096

// fileMagic starts every region file; its last two bytes are the layout
// version. fileMagicPrefix is the part every version shares.
//
// Version 01 files have no writer slots, but their bytes at writersOff and
// after were zero and unused, as a free slot is: the slots came without a
// new version. An older writer counts in the lease only (as a writer that
// found no free slot does), and an older owner never reclaims (as before):
// neither misreads the other.
const (
	fileMagic       = "KVXSHM01"
	fileMagicPrefix = "KVXSHM"
)

// header is the layout of a region file's first page. Fields written once at
// creation (magic … fileID) are plain; the rest change while other processes
// read them and are accessed atomically only.
type header struct {
	magic   [8]byte
	dataOff uint64
	dataLen uint64
	fileID  [16]byte
	lease   copier.Lease
	secret  [2]atomic.Uint64 // of the current registration; zero when none
	owner   [2]atomic.Uint64 // nonce of the registering agent
	_       [writersOff - 80]byte
	// writers are the writer processes' slots beside lease, so that the
	// owner can release the batches a dead writer left in flight
	// (copier.WriterSlot, "Writer slots"): claimed by a sender's mapping
	// of the file, reclaimed by the owner.
	writers [writerSlots]copier.WriterSlot
}

// writersOff is the writer slots' offset in the header; they fill the rest
// of the page.
const (
	writersOff  = 256
	writerSlots = (headerSize - writersOff) / int(unsafe.Sizeof(copier.WriterSlot{}))
)

// Compile-time checks: the header fits its page; the slots are where
// writersOff says, after the fields above (80 bytes), one per cache line.
var (
	_ [headerSize - unsafe.Sizeof(header{})]byte
	_ [unsafe.Offsetof(header{}.owner) + unsafe.Sizeof(header{}.owner) - 80]byte
	_ [80 - unsafe.Offsetof(header{}.owner) - unsafe.Sizeof(header{}.owner)]byte
	_ [unsafe.Offsetof(header{}.writers) - writersOff]byte
	_ [writersOff - unsafe.Offsetof(header{}.writers)]byte
	_ [unsafe.Sizeof(copier.WriterSlot{}) - 64]byte
	_ [64 - unsafe.Sizeof(copier.WriterSlot{})]byte
)

// Compile-time checks: checkHeader reads magic, dataOff, dataLen and
// fileID at these offsets.
var (
	_ [unsafe.Offsetof(header{}.dataOff) - 8]byte
	_ [8 - unsafe.Offsetof(header{}.dataOff)]byte
	_ [unsafe.Offsetof(header{}.dataLen) - 16]byte
	_ [16 - unsafe.Offsetof(header{}.dataLen)]byte
	_ [unsafe.Offsetof(header{}.fileID) - 24]byte
	_ [24 - unsafe.Offsetof(header{}.fileID)]byte
)

// headerOf returns the header at the start of a mapping of at least
// headerSize bytes (page-aligned, so every field is aligned).
func headerOf(mem []byte) *header {
	return (*header)(unsafe.Pointer(&mem[0]))
}

// words splits 16 bytes into the two words the header stores.
func words(b [16]byte) [2]uint64 {
	return [2]uint64{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])}
}

func (h *header) setSecret(s [16]byte) {
	w := words(s)
	h.secret[0].Store(w[0])
	h.secret[1].Store(w[1])
}

func (h *header) secretIs(s [16]byte) bool {
	w := words(s)
	return h.secret[0].Load() == w[0] && h.secret[1].Load() == w[1]
}

func (h *header) setOwner(n [16]byte) {
	w := words(n)
	h.owner[0].Store(w[0])
	h.owner[1].Store(w[1])
}

func (h *header) ownerIs(n [16]byte) bool {
	w := words(n)
	return h.owner[0].Load() == w[0] && h.owner[1].Load() == w[1]
}
