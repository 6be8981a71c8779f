package pidwatch

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// File names a file by device and inode, as /proc/<pid>/maps shows them:
// a file on disk or tmpfs, a POSIX shared-memory object, a System V
// segment (device 0:1, inode = shmid), a memfd. Two mappings of the same
// File share their pages.
type File struct {
	Major, Minor uint32
	Ino          uint64
}

func (f File) String() string { return fmt.Sprintf("%02x:%02x inode %d", f.Major, f.Minor, f.Ino) }

// ErrAnonymous: the address is in no mapping of a file (private or
// anonymous memory): no other process can map it, so no mapping can tie a
// process to it.
var ErrAnonymous = errors.New("pidwatch: the memory is not a shared mapping of a file")

// ErrExited: the process exited during (or before) the read of its maps:
// what was read cannot be trusted to be its.
var ErrExited = errors.New("pidwatch: the process exited")

// mapping is one line of /proc/<pid>/maps.
type mapping struct {
	start, end   uint64
	write, share bool
	file         File
}

// parseMaps calls fn for each line of a /proc/<pid>/maps text; fn returns
// false to stop.
func parseMaps(b []byte, fn func(m mapping) bool) error {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) == 0 {
			continue
		}
		// address perms offset dev inode [path]; the path may hold spaces.
		f := bytes.Fields(line)
		if len(f) < 5 {
			return fmt.Errorf("pidwatch: maps line %q: %d fields", line, len(f))
		}
		var m mapping
		lo, hi, ok := bytes.Cut(f[0], []byte{'-'})
		maj, min, ok2 := bytes.Cut(f[3], []byte{':'})
		if !ok || !ok2 || len(f[1]) != 4 {
			return fmt.Errorf("pidwatch: maps line %q: not understood", line)
		}
		var err error
		if m.start, err = strconv.ParseUint(string(lo), 16, 64); err == nil {
			m.end, err = strconv.ParseUint(string(hi), 16, 64)
		}
		var ma, mi uint64
		if err == nil {
			ma, err = strconv.ParseUint(string(maj), 16, 32)
		}
		if err == nil {
			mi, err = strconv.ParseUint(string(min), 16, 32)
		}
		if err == nil {
			m.file.Ino, err = strconv.ParseUint(string(f[4]), 10, 64)
		}
		if err != nil {
			return fmt.Errorf("pidwatch: maps line %q: %w", line, err)
		}
		m.file.Major, m.file.Minor = uint32(ma), uint32(mi)
		m.write, m.share = f[1][1] == 'w', f[1][3] == 's'
		if !fn(m) {
			return nil
		}
	}
	return nil
}

// BackingFile returns the file that this process maps shared at addr: the
// File another process must map to reach the same pages. ErrAnonymous
// when addr is in private or anonymous memory.
func BackingFile(addr uintptr) (File, error) {
	b, err := os.ReadFile(procRoot + "/self/maps")
	if err != nil {
		return File{}, fmt.Errorf("pidwatch: %w", err)
	}
	var out File
	found := false
	err = parseMaps(b, func(m mapping) bool {
		if uint64(addr) < m.start || uint64(addr) >= m.end {
			return true
		}
		found = true
		if m.share && m.file.Ino != 0 {
			out = m.file
		}
		return false
	})
	switch {
	case err != nil:
		return File{}, err
	case !found:
		return File{}, fmt.Errorf("%w: address %#x is not mapped", ErrAnonymous, addr)
	case out.Ino == 0:
		return File{}, fmt.Errorf("%w: address %#x", ErrAnonymous, addr)
	}
	return out, nil
}

// Proc is a process Watch watches, while it lives.
type Proc struct {
	pid uint32
	rc  syscall.RawConn
}

// Pid is the process's pid.
func (p *Proc) Pid() uint32 { return p.pid }

// MapsShared reports whether the process maps f shared and writable —
// whether it can write into the pages of f. It reads /proc/<pid>/maps and
// then checks, on the pidfd, that the process had not exited: a pid is
// not reused before its process has exited, so what was read is this
// process's. ErrExited when it had (nothing can be concluded); an error
// when its maps cannot be read (another user's process, procfs hidden).
func (p *Proc) MapsShared(f File) (bool, error) {
	if f.Ino == 0 {
		return false, nil // no file: nothing ties
	}
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/maps", procRoot, p.pid))
	if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ESRCH) {
		return false, fmt.Errorf("pidwatch: maps of %d: %w", p.pid, err)
	}
	alive := false
	cerr := p.rc.Control(func(fd uintptr) {
		for {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, perr := unix.Poll(fds, 0)
			if errors.Is(perr, unix.EINTR) {
				continue
			}
			alive = perr == nil && n == 0
			return
		}
	})
	if cerr != nil || !alive || err != nil {
		return false, fmt.Errorf("%w: pid %d", ErrExited, p.pid)
	}
	maps := false
	if err := parseMaps(b, func(m mapping) bool {
		maps = m.share && m.write && m.file == f
		return !maps
	}); err != nil {
		return false, err
	}
	return maps, nil
}
