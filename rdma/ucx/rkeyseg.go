//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"fmt"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/rdma"
)

// probeSegments checks the shared-memory segments a validated packed rkey
// names against the kernel's objects, doing what UCX 1.13 does when it
// attaches them (uct_sysv_rkey_unpack, uct_posix_rkey_unpack): a segment
// UCX would fail to attach sends ucp_ep_rkey_unpack down its crashing
// error path (rkey.go), so it is refused here first. It returns each
// segment's bound, for within:
//
//   - sysv: shmat(shmid, NULL, 0) as UCX, and the segment's size from
//     shmctl(IPC_STAT) (the packed part has no length). The attachment is
//     held until release: a segment cannot be destroyed while attached,
//     so the owner cannot remove it between this check and UCX's shmat.
//   - posix: the file UCX opens (/proc/PID/fd/FD, /dev/shm/ucx_shm_posix_ID
//     or DIR/ucx_shm_posix_ID) must be a regular file, open read-write and
//     map as UCX maps it (MAP_SHARED, the part's length rounded up to
//     pages); the bound is the part's length or the file's size, the
//     smaller (a mapping past the end of its file faults with SIGBUS where
//     it is written).
//
// Call release after ucp_ep_rkey_unpack, whatever it returned. Errors wrap
// rdma.ErrBadKey and errBadRkey.
//
// What this cannot close: the owner of a posix segment can still shrink
// its file (ftruncate) after the writer mapped it, and the writer's next
// copy there faults (SIGBUS); it can swap or close the file named by the
// path between this check and UCX's open (microseconds, on the progress
// goroutine), or change a sysv segment's permissions in that window,
// which sends UCX down the error path after all.
func (pk packedRkey) probeSegments() (bounds []segBound, release func(), err error) {
	var held [][]byte
	release = func() {
		for _, b := range held {
			unix.SysvShmDetach(b)
		}
		held = nil
	}
	for _, s := range pk.segments() {
		var size uint64
		switch s.kind {
		case mdSysv:
			b, err := unix.SysvShmAttach(int(s.shmid), 0, 0)
			if err != nil {
				release()
				return nil, func() {}, s.refuse("shmat: %v", err)
			}
			held = append(held, b)
			size = uint64(len(b))
		case mdPosix:
			fsize, err := probePosix(s)
			if err != nil {
				release()
				return nil, func() {}, err
			}
			size = min(s.len, fsize)
		}
		bounds = append(bounds, segBound{s, size})
	}
	return bounds, release, nil
}

// localAgents are the ids of this process's agents, from New to Close:
// only their keys may name a segment of this process's own (notOwn).
var localAgents struct {
	sync.Mutex
	ids map[agentID]struct{}
}

func addLocalAgent(id agentID) {
	localAgents.Lock()
	defer localAgents.Unlock()
	if localAgents.ids == nil {
		localAgents.ids = make(map[agentID]struct{})
	}
	localAgents.ids[id] = struct{}{}
}

func removeLocalAgent(id agentID) {
	localAgents.Lock()
	defer localAgents.Unlock()
	delete(localAgents.ids, id)
}

func isLocalAgent(id agentID) bool {
	localAgents.Lock()
	defer localAgents.Unlock()
	_, ok := localAgents.ids[id]
	return ok
}

// notOwn refuses the key of a peer outside this process whose packed
// rkey names a shared-memory segment of this process's own: its sysv
// shmid and the /proc/PID/fd/FD of its posix files are known to every
// process of the user, and the writer would map that segment and copy
// its write into its own memory (its pool, another request's pages, or
// the FIFO segments of UCX's own worker, whose corruption crashes it).
// Own means, for sysv, a segment this process created (shmctl's creator
// pid; probeSegments holds an attachment, so it is still the segment UCX
// attaches); for posix, a file this process holds open, as it holds its
// UCX segments in procfs mode (UCX's default), whatever path names it
// (/proc/PID/fd/FD of this process, or of another that opened the file
// through it). Not seen: a posix segment of this process made with
// UCX_POSIX_USE_PROC_LINK=n, whose file it maps but does not hold open.
// Call it after probeSegments succeeded. Errors wrap rdma.ErrBadKey and
// errBadRkey.
func (pk packedRkey) notOwn() error {
	for _, s := range pk.segments() {
		switch s.kind {
		case mdSysv:
			var ds unix.SysvShmDesc
			if _, err := unix.SysvShmCtl(int(s.shmid), unix.IPC_STAT, &ds); err != nil {
				return s.refuse("shmctl: %v", err)
			}
			if int(ds.Cpid) == os.Getpid() {
				return s.ownRefusal(fmt.Sprintf("created by this process (pid %d)", ds.Cpid))
			}
		case mdPosix:
			var st unix.Stat_t
			if err := unix.Stat(s.path, &st); err != nil {
				return s.refuse("stat: %v", err)
			}
			fd, err := heldOpen(st.Dev, st.Ino)
			if err != nil {
				return s.refuse("cannot tell whether its file is this process's own: %v", err)
			}
			if fd >= 0 {
				return s.ownRefusal(fmt.Sprintf("its file is open in this process (fd %d)", fd))
			}
		}
	}
	return nil
}

func (s *shmSegment) ownRefusal(why string) error {
	return fmt.Errorf("%w: %w: %s is this process's own memory, %s: refused, as the key comes from an agent in another process (a put copies into the segment the key names; only an agent of this process may hand out keys to its segments)", rdma.ErrBadKey, errBadRkey, s, why)
}

// heldOpen is an fd of this process open on the regular file dev/ino, or
// -1.
func heldOpen(dev, ino uint64) (int, error) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return -1, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return -1, err
	}
	for _, n := range names {
		var st unix.Stat_t
		if unix.Fstatat(int(d.Fd()), n, &st, 0) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Dev == dev && st.Ino == ino {
			fd, _ := strconv.Atoi(n)
			return fd, nil
		}
	}
	return -1, nil
}

// rkeyChecks turns checkPackedRkey and the segment probe on the agent's
// paths off when false: tests do so, in a child process, to show what UCX
// does with the keys they refuse.
var rkeyChecks = true

// checkPackedRkey validates a peer's packed rkey against its memory
// domains (peer: nil when its address did not validate) and checks the
// key's region [base, base+n) against the bounds the packed bytes carry.
func checkPackedRkey(peer *peerMDs, rkey []byte, base, n uint64) (packedRkey, error) {
	if !rkeyChecks {
		return packedRkey{}, nil
	}
	if peer == nil {
		return packedRkey{}, fmt.Errorf("%w: %w: the peer's worker address did not validate", rdma.ErrBadKey, errBadRkey)
	}
	pk, err := validateRkey(rkey, peer)
	if err != nil {
		return pk, err
	}
	return pk, pk.checkBounds(base, n)
}

func (s *shmSegment) refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s: %s (UCX would not attach it)", rdma.ErrBadKey, errBadRkey, s, fmt.Sprintf(format, args...))
}

// maxPosixMap bounds the mapping probePosix makes: more than any host has.
const maxPosixMap = 1 << 50

// probePosix opens and maps a posix segment's file as UCX would, and
// returns the file's size.
func probePosix(s *shmSegment) (uint64, error) {
	var st unix.Stat_t
	// Stat first: what UCX opens is the peer's choice, and opening a device
	// or a FIFO may do more than fail.
	if err := unix.Stat(s.path, &st); err != nil {
		return 0, s.refuse("stat: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, s.refuse("not a regular file (mode %#o)", st.Mode)
	}
	fd, err := unix.Open(s.path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0, s.refuse("open: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, s.refuse("fstat: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size <= 0 {
		return 0, s.refuse("not a regular file with data (mode %#o, %d bytes)", st.Mode, st.Size)
	}
	page := uint64(os.Getpagesize())
	if s.len > maxPosixMap {
		return 0, s.refuse("a mapping of %d bytes", s.len)
	}
	m, err := unix.Mmap(fd, 0, int((s.len+page-1)&^(page-1)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, s.refuse("mmap: %v", err)
	}
	unix.Munmap(m)
	return uint64(st.Size), nil
}
