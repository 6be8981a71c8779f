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

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
	"github.com/kvxfer/kvxfer/rdma/internal/host"
)

// controlSize is the size of a control file: one page.
const controlSize = 4096

// controlMagic starts every control file.
const controlMagic = "KVXCIPC1"

// control is the layout of a registration's control file, shared by the
// registering process and every process that writes into the region. The
// descriptor (magic … length) is written once, before the secret is
// published; the rest changes while other processes read it and is
// accessed atomically only.
type control struct {
	magic  [8]byte
	fileID [16]byte
	handle cuda.IPCHandle
	offset uint64
	length uint64
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
// for: same file, allocation, offset and length.
func (c *control) describes(k regionKey) bool {
	return string(c.magic[:]) == controlMagic && c.fileID == k.fileID && c.handle == k.handle &&
		c.offset == k.offset && c.length == k.length
}

// Dir holds control files: /dev/shm where it is a directory, else
// os.TempDir(). Every process of a host computes the same Dir.
func Dir() string { return host.Dir() }

// controlPath names the control file of fileID registered by process pid.
func controlPath(pid int, fileID [16]byte) string {
	return filepath.Join(Dir(), fmt.Sprintf("kvxfer-cudaipc-%d-%s", pid, hex.EncodeToString(fileID[:])))
}

// controlMap is one process's mapping of a control file.
type controlMap struct {
	path string
	mem  []byte
	c    *control
}

// createControl creates and maps a new control file (mode 0600).
func createControl(path string) (*controlMap, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Truncate(controlSize); err != nil {
		os.Remove(path)
		return nil, err
	}
	m, err := mapControl(f, path)
	if err != nil {
		os.Remove(path)
	}
	return m, err
}

// openControl maps the control file k names, as a peer. Errors wrap
// rdma.ErrBadKey.
func openControl(k regionKey) (*controlMap, error) {
	path := controlPath(k.pid, k.fileID)
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: region not registered (deregistered, or its agent closed): %v", rdma.ErrBadKey, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != controlSize {
		return nil, fmt.Errorf("%w: %s is not a control file", rdma.ErrBadKey, path)
	}
	m, err := mapControl(f, path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", rdma.ErrBadKey, err)
	}
	if !m.c.describes(k) {
		m.close()
		return nil, fmt.Errorf("%w: %s does not describe the key's region", rdma.ErrBadKey, path)
	}
	return m, nil
}

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
