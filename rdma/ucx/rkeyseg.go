//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"fmt"
	"os"

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
