package shm

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/copier"
)

// testHookBeforeHold, when set (tests), runs after a region file is
// created and before its maker holds it.
var testHookBeforeHold func(path string)

// maxNameLen bounds a region file's base name (it travels in every key).
const maxNameLen = 200

// sharedFile is a region file created by this process with NewRegion.
type sharedFile struct {
	name   string
	path   string
	mem    []byte // the whole mapping: header page, then data
	hdr    *header
	region *kvcache.Region
	// dataLen is the bytes after the header that writers address: the
	// region, then a RevocableRegion's spare reserve.
	dataLen uint64

	// guarded by files.mu
	registered bool
	closed     bool
	unlinked   bool // its name removed (Unlink), its mapping kept
}

// files maps the regions NewRegion returned to their files, so Register can
// tell a shared region from private memory.
var files = struct {
	mu sync.Mutex
	m  map[*kvcache.Region]*sharedFile
}{m: make(map[*kvcache.Region]*sharedFile)}

// NewRegion creates the shared-memory file Dir()/name (mode 0600; it must not
// exist), sized for n bytes of data after the header page, maps it and
// returns its data as a host region that this package's agents can register
// to receive writes from other processes. An empty name picks a unique one.
//
// The io.Closer revokes the file for every sender, unmaps it and removes it;
// it fails with rdma.ErrRegionBusy while the region is registered. After it
// the region's memory must not be touched.
func NewRegion(name string, n uint64) (*kvcache.Region, io.Closer, error) {
	sf, f, err := newSharedFile(name, n, 0)
	if err != nil {
		return nil, nil, err
	}
	f.Close()
	return sf.region, regionCloser{sf}, nil
}

// newSharedFile creates and maps the region file: the header page, n bytes
// of data (the region), then spare bytes that only a RevocableRegion maps
// into its view. Writers address the n+spare bytes after the header. The
// open file is returned too; the caller closes it.
func newSharedFile(name string, n, spare uint64) (*sharedFile, *os.File, error) {
	if name == "" {
		var r [8]byte
		rand.Read(r[:])
		name = fmt.Sprintf("kvxfer-%d-%s", os.Getpid(), hex.EncodeToString(r[:]))
	}
	if err := checkName(name); err != nil {
		return nil, nil, fmt.Errorf("shm: new region: %w", err)
	}
	if n == 0 || n > math.MaxInt-headerSize || spare > math.MaxInt-headerSize-n {
		return nil, nil, fmt.Errorf("shm: new region %q: %w: length %d + spare %d (want 1…%d in all)", name, kvcache.ErrBadRegion, n, spare, uint64(math.MaxInt-headerSize))
	}
	path := filepath.Join(Dir(), name)
	f, err := createHeld(path)
	if err != nil {
		return nil, nil, fmt.Errorf("shm: new region: %w", err)
	}
	data := n + spare
	size := int(data) + headerSize
	mem, err := func() ([]byte, error) {
		if err := f.Truncate(int64(size)); err != nil {
			return nil, err
		}
		if err := reserveFile(f, size); err != nil {
			return nil, err
		}
		return mapFile(f, size)
	}()
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, nil, fmt.Errorf("shm: new region %s (%d bytes): %w", path, data, err)
	}
	h := headerOf(mem)
	copy(h.magic[:], fileMagic)
	h.dataOff = headerSize
	h.dataLen = data
	rand.Read(h.fileID[:])
	h.lease.Reset(true) // not registered yet

	end := headerSize + int(n)
	region, err := kvcache.HostBytesRegion(mem[headerSize:end:end])
	if err != nil { // cannot happen: n > 0
		unmapFile(mem)
		f.Close()
		os.Remove(path)
		return nil, nil, fmt.Errorf("shm: new region %s: %w", path, err)
	}
	sf := &sharedFile{name: name, path: path, mem: mem, hdr: h, region: region, dataLen: data}
	files.mu.Lock()
	files.m[region] = sf
	files.mu.Unlock()
	return sf, f, nil
}

// createHeld creates the region file at path and holds it (holdFile:
// while this process maps it) before anything else, sizing and reserving
// it included: a sweep of stale files by a process of another pid
// namespace, to which this process's pid in the name says nothing, sees
// it held from the start. A sweep that found it unheld in the instant
// between its creation and the lock removes it under its own lock
// (RemoveUnheld), so the lock comes after the removal, which is noticed
// (the file is unlinked): the file is made again.
func createHeld(path string) (*os.File, error) {
	for try := 1; ; try++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|openNoFollow, 0o600)
		if err != nil {
			return nil, err
		}
		if testHookBeforeHold != nil {
			testHookBeforeHold(path)
		}
		linked, err := holdFile(f)
		if err == nil && linked {
			return f, nil
		}
		f.Close()
		if err != nil {
			os.Remove(path)
			return nil, err
		}
		if try == 3 {
			return nil, fmt.Errorf("%s: created %d times, and each time removed (a sweep of stale files) before this process held it", path, try)
		}
	}
}

// reclaim releases the batches that writers proven dead left in flight in
// f's lease, and frees their slots (copier.ReclaimDead): called by the
// owner where it waits for batches to end (Deregister) and where it
// registers the file (freeing slots for new writers). Called with files.mu
// held (one reclaim at a time), on a file not closed: the header is this
// process's own mapping, read unguarded as everywhere on the owner's side.
func (f *sharedFile) reclaim() reclaimed {
	return reclaimed(copier.ReclaimDead(f.hdr.writers[:], &f.hdr.lease, copier.ProvenDead))
}

// reclaimed is what a reclaim did, as a busy error's suffix.
type reclaimed copier.Reclaimed

func (r reclaimed) String() string {
	if r.Slots == 0 {
		return fmt.Sprintf(" (no writer proven dead; %d with a slot alive or not proven dead)", r.Held)
	}
	return fmt.Sprintf(" (%d released of %d writers proven dead; %d with a slot alive or not proven dead)", r.Batches, r.Slots, r.Held)
}

// Held reports whether the region file name in Dir() is held by a live
// process that made it with NewRegion or NewRevocableRegion: the maker
// holds a lock on it for as long as it maps the file, and a process's
// death drops it. A process of another pid namespace sharing Dir() holds
// it too, where its pid in the file's name says nothing here. Files of
// builds before the lock are never held.
func Held(name string) (bool, error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	return fileHeld(filepath.Join(Dir(), name))
}

// RemoveUnheld removes the region file name in Dir() unless a process
// holds it (Held), and reports whether it did. It removes the file while
// it holds the file's lock itself, so that a maker that created the file
// an instant before (and has not held it yet) finds it removed once it
// holds it, and makes it again, rather than go on with a file no writer
// can open. A file gone already is an error wrapping os.ErrNotExist.
func RemoveUnheld(name string) (bool, error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	return removeUnheld(filepath.Join(Dir(), name))
}

// checkName accepts a plain file name.
func checkName(name string) error {
	if name == "" || len(name) > maxNameLen || name == "." || name == ".." ||
		strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%w: region file name %q is not a plain name of 1…%d bytes", kvcache.ErrBadRegion, name, maxNameLen)
	}
	return nil
}

// lookupFile returns the shared file behind r, or nil for other memory.
func lookupFile(r *kvcache.Region) *sharedFile {
	files.mu.Lock()
	defer files.mu.Unlock()
	return files.m[r]
}

// regionCloser is the io.Closer NewRegion returns.
type regionCloser struct{ f *sharedFile }

// Unlink removes the region file's name and leaves its mapping as it is:
// for an owner that cannot close the region (a write may still land) but
// is going away. Peers that mapped it keep their mapping; none can map it
// again. Close after it does the rest. Idempotent.
func (c regionCloser) Unlink() error {
	f := c.f
	files.mu.Lock()
	defer files.mu.Unlock()
	if f.closed || f.unlinked {
		return nil
	}
	f.unlinked = true
	if err := os.Remove(f.path); err != nil {
		return fmt.Errorf("shm: unlink region %s: %w", f.path, err)
	}
	return nil
}

// Close revokes, unmaps and removes the region file. Idempotent.
func (c regionCloser) Close() error {
	f := c.f
	files.mu.Lock()
	defer files.mu.Unlock()
	if f.closed {
		return nil
	}
	if f.registered {
		return fmt.Errorf("shm: close region %s: %w: still registered (deregister it or close its agent first)", f.path, rdma.ErrRegionBusy)
	}
	f.closed = true
	delete(files.m, f.region)
	f.hdr.lease.ForceRetire(true) // senders holding a mapping see the owner gone
	f.hdr = nil
	uerr := unmapFile(f.mem)
	f.mem = nil
	var rerr error
	if !f.unlinked {
		rerr = os.Remove(f.path)
	}
	if uerr != nil {
		return fmt.Errorf("shm: close region %s: %w", f.path, uerr)
	}
	if rerr != nil {
		return fmt.Errorf("shm: close region: %w", rerr)
	}
	return nil
}
