package cudaipc

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
	"github.com/kvxfer/kvxfer/rdma/internal/host"
)

// controlSize is the size of a control file's header: one page. The
// table of the registration's allocations follows it (tableSize).
const controlSize = 4096

// controlMagic starts every control file. Version 1 ("KVXCIPC1") held one
// allocation in its header.
const controlMagic = "KVXCIPC2"

// tableSize is the space the table of count allocations takes in a
// control file: whole pages.
func tableSize(count int) int {
	return (count*entryLen + controlSize - 1) / controlSize * controlSize
}

// control is the layout of a registration's control file header, shared
// by the registering process and every process that writes into the
// region. The descriptor (magic … digest) and the table behind the header
// are written once, before the secret is published; the rest changes while
// other processes read it and is accessed atomically only.
type control struct {
	magic  [8]byte
	fileID [16]byte
	length uint64
	count  uint64
	digest [32]byte
	lease  copier.Lease
	secret [2]atomic.Uint64 // of the registration; zero once revoked
	owner  [2]atomic.Uint64 // nonce of the registering agent
}

// Compile-time check: the control block fits its page.
var _ [controlSize - unsafe.Sizeof(control{})]byte

func words(b [16]byte) [2]uint64 {
	return [2]uint64{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])}
}

func (c *control) setSecret(s [16]byte) {
	w := words(s)
	c.secret[0].Store(w[0])
	c.secret[1].Store(w[1])
}

func (c *control) secretIs(s [16]byte) bool {
	w := words(s)
	return c.secret[0].Load() == w[0] && c.secret[1].Load() == w[1]
}

func (c *control) setOwner(n [16]byte) {
	w := words(n)
	c.owner[0].Store(w[0])
	c.owner[1].Store(w[1])
}

func (c *control) ownerIs(n [16]byte) bool {
	w := words(n)
	return c.owner[0].Load() == w[0] && c.owner[1].Load() == w[1]
}

// describes reports whether the control block is the one k was issued
// for: same file, region length, allocation count and table digest.
func (c *control) describes(k regionKey) bool {
	return string(c.magic[:]) == controlMagic && c.fileID == k.fileID && c.length == k.length &&
		c.count == uint64(k.count) && c.digest == k.digest
}

// Dir holds control files: /dev/shm where it is a directory, else
// os.TempDir(). Every process of a host computes the same Dir.
func Dir() string { return host.Dir() }

// controlPath names the control file of fileID registered by process pid.
func controlPath(pid int, fileID [16]byte) string {
	return filepath.Join(Dir(), fmt.Sprintf("kvxfer-cudaipc-%d-%s", pid, hex.EncodeToString(fileID[:])))
}

// controlMap is one process's mapping of a control file's header.
type controlMap struct {
	path string
	mem  []byte
	c    *control
	// peer guards the mapping: a peer's control file can be truncated
	// under it by its owner, and this agent's own by any peer that opened
	// it through a key (peers map it read-write for the lease): every
	// access to the header goes through guard.
	peer *copier.PeerMemory
}

// guard runs f, which reads or writes m's header. A memory fault (the
// file truncated under the mapping: SIGBUS) fails f's caller with
// rdma.ErrPeerGone instead of killing this process, and every later access
// fails the same way without touching the mapping.
func (m *controlMap) guard(f func()) error {
	if m.peer == nil {
		f()
		return nil
	}
	if err := m.peer.Err(); err != nil {
		return err
	}
	if addr, faulted := copier.CatchFault(f); faulted {
		m.peer.MarkFaulted(addr)
		return m.peer.Err()
	}
	return nil
}

// createControl creates and maps a new control file (mode 0600) for a
// table of count allocations, and writes table behind its header.
func createControl(path string, count int, table []byte) (*controlMap, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Truncate(int64(controlSize + tableSize(count))); err != nil {
		os.Remove(path)
		return nil, err
	}
	if _, err := f.WriteAt(table, controlSize); err != nil {
		os.Remove(path)
		return nil, err
	}
	m, err := mapControl(f, path)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	m.peer = copier.NewPeerMemory("this agent's control file "+path+" (a peer that opened it through its key truncated it?)", m.mem)
	return m, nil
}

// openControl maps the control file k names, as a peer, and reads its
// table of allocations into this process's memory, checked against k
// (parseTable). Errors wrap rdma.ErrBadKey.
func openControl(k regionKey) (*controlMap, []entry, error) {
	path := controlPath(k.pid, k.fileID)
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: region not registered (deregistered, or its agent closed): %v", rdma.ErrBadKey, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if size := int64(controlSize + tableSize(k.count)); err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
		return nil, nil, fmt.Errorf("%w: %s is not the control file of a region of %d allocations (%d bytes)", rdma.ErrBadKey, path, k.count, size)
	}
	m, err := mapControl(f, path)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", rdma.ErrBadKey, err)
	}
	m.peer = copier.NewPeerMemory("control file "+path, m.mem)
	var ok bool
	if err := m.guard(func() { ok = m.c.describes(k) }); err != nil {
		m.close()
		return nil, nil, err
	}
	if !ok {
		m.close()
		return nil, nil, fmt.Errorf("%w: %s does not describe the key's region", rdma.ErrBadKey, path)
	}
	table := make([]byte, k.count*entryLen)
	if _, err := f.ReadAt(table, controlSize); err != nil {
		m.close()
		return nil, nil, fmt.Errorf("%w: read the table of %s: %v", rdma.ErrBadKey, path, err)
	}
	es, err := parseTable(k, table)
	if err != nil {
		m.close()
		return nil, nil, fmt.Errorf("%w (%s)", err, path)
	}
	return m, es, nil
}

// mapControl maps the header of a control file.
func mapControl(f *os.File, path string) (*controlMap, error) {
	mem, err := syscall.Mmap(int(f.Fd()), 0, controlSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, os.NewSyscallError("mmap", err))
	}
	return &controlMap{path: path, mem: mem, c: (*control)(unsafe.Pointer(&mem[0]))}, nil
}

func (m *controlMap) close() error {
	return os.NewSyscallError("munmap", syscall.Munmap(m.mem))
}
