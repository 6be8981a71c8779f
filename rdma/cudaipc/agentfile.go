package cudaipc

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/internal/host"
)

// agentMagic starts every agent file.
const agentMagic = "KVXCIPA1"

// MaxIdentity bounds the identity an agent states (WithIdentity).
const MaxIdentity = 256

// maxHost bounds the host name in an agent file (pidwatch.Host: a boot id
// and a pid namespace).
const maxHost = 256

// maxAgentFile bounds an agent file's size.
const maxAgentFile = len(agentMagic) + 4 + 16 + 8 + 2 + maxHost + 2 + MaxIdentity

// agentFile is what an agent states about itself in its agent file
// (Dir()/kvxfer-cudaipc-agent-<pid>-<nonce>, mode 0600, created
// exclusively by the agent's process at New, removed at Close):
//
//	"KVXCIPA1" pid[4] nonce[16] start[8] hostLen[2] host idLen[2] identity
//
// pid and nonce are the agent's address; start is its process's start time
// (pidwatch.StartTime) and host its host and pid namespace
// (pidwatch.Host), so that a writer can tell the process at pid here from
// another that had the pid before, or has it in another namespace;
// identity is whom the agent serves (WithIdentity; may be empty).
type agentFile struct {
	addr     address
	start    uint64
	host     string
	identity string
}

// agentPath names the agent file of the agent at a.
func agentPath(a address) string {
	return filepath.Join(Dir(), fmt.Sprintf("kvxfer-cudaipc-agent-%d-%s", a.pid, hex.EncodeToString(a.nonce[:])))
}

func (f agentFile) encode() []byte {
	b := make([]byte, 0, maxAgentFile)
	b = append(b, agentMagic...)
	b = binary.BigEndian.AppendUint32(b, uint32(f.addr.pid))
	b = append(b, f.addr.nonce[:]...)
	b = binary.BigEndian.AppendUint64(b, f.start)
	b = binary.BigEndian.AppendUint16(b, uint16(len(f.host)))
	b = append(b, f.host...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(f.identity)))
	return append(b, f.identity...)
}

func parseAgentFile(b []byte) (agentFile, error) {
	var f agentFile
	const fixed = len(agentMagic) + 4 + 16 + 8 + 2
	if len(b) < fixed || string(b[:len(agentMagic)]) != agentMagic {
		if len(b) >= len(agentMagic) && string(b[:len(agentMagic)-1]) == agentMagic[:len(agentMagic)-1] {
			return f, fmt.Errorf("agent file of version %q, this writer reads %q: run the same kvxfer version on both sides", b[:len(agentMagic)], agentMagic)
		}
		return f, fmt.Errorf("%d bytes that are not a %q agent file", len(b), agentMagic)
	}
	b = b[len(agentMagic):]
	f.addr.pid = int(binary.BigEndian.Uint32(b))
	copy(f.addr.nonce[:], b[4:20])
	f.start = binary.BigEndian.Uint64(b[20:])
	n := int(binary.BigEndian.Uint16(b[28:]))
	b = b[30:]
	if n > maxHost || n+2 > len(b) {
		return f, fmt.Errorf("agent file: host of %d bytes in %d", n, len(b))
	}
	f.host = string(b[:n])
	b = b[n:]
	n = int(binary.BigEndian.Uint16(b))
	b = b[2:]
	if n > MaxIdentity || n != len(b) {
		return f, fmt.Errorf("agent file: identity of %d bytes, %d follow", n, len(b))
	}
	f.identity = string(b)
	return f, nil
}

// createAgentFile states an agent's address, process and identity in a
// new agent file (mode 0600, created exclusively: never one of another
// process's).
func createAgentFile(f agentFile) (string, error) {
	path := agentPath(f.addr)
	fd, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", err
	}
	_, err = fd.Write(f.encode())
	if err = errors.Join(err, fd.Close()); err != nil {
		os.Remove(path)
		return "", err
	}
	return path, nil
}

// readAgentFile reads and checks the agent file of the agent at a, as a
// writer about to connect to it: the file must be a regular file of this
// process's user, name a itself (pid and nonce), this host and pid
// namespace, and the start time of the process now at a.pid. It returns
// the identity the agent states and a pidfd of the agent's process (nil
// on a kernel without pidfd_open), opened before the start time is
// checked, so that it refers to that process and no later one with its
// pid: it becomes readable once the process has exited, zombie or reaped.
// Errors wrap rdma.ErrPeerGone when the
// agent cannot be found here (no such process, no file, another host or
// pid namespace, a process that is not the agent's), else
// rdma.ErrBadAddress; they name the file.
func readAgentFile(a address) (identity string, proc *os.File, err error) {
	proc, err = openProcess(a.pid)
	if err != nil {
		return "", nil, err
	}
	defer func() {
		if err != nil && proc != nil {
			proc.Close()
			proc = nil
		}
	}()
	path := agentPath(a)
	// O_NONBLOCK: a FIFO in its place must not hang Connect.
	fd, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil, fmt.Errorf("%w: no agent file %s: the agent closed, runs on another host or pid namespace (process %d here is another), or is of a kvxfer version before agent files: run both ranks on one host, with one kvxfer version", rdma.ErrPeerGone, path, a.pid)
		}
		return "", nil, fmt.Errorf("%w: agent file %s: %v", rdma.ErrBadAddress, path, err)
	}
	defer fd.Close()
	fi, err := fd.Stat()
	if err != nil {
		return "", nil, fmt.Errorf("%w: agent file %s: %v", rdma.ErrBadAddress, path, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() > int64(maxAgentFile) {
		return "", nil, fmt.Errorf("%w: agent file %s is not a regular file of at most %d bytes (%s, %d bytes)", rdma.ErrBadAddress, path, maxAgentFile, fi.Mode(), fi.Size())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return "", nil, fmt.Errorf("%w: agent file %s belongs to uid %d, this process runs as uid %d: cudaipc connects to agents of its own user only (run both ranks as one user)",
			rdma.ErrBadAddress, path, st.Uid, os.Getuid())
	}
	b, err := io.ReadAll(io.LimitReader(fd, int64(maxAgentFile)+1))
	if err != nil {
		return "", nil, fmt.Errorf("%w: agent file %s: %v", rdma.ErrBadAddress, path, err)
	}
	f, err := parseAgentFile(b)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %s: %v", rdma.ErrBadAddress, path, err)
	}
	if f.addr != a {
		return "", nil, fmt.Errorf("%w: agent file %s states the agent %s, not %s: a file named for one agent must describe it (another process wrote it): restart the peer", rdma.ErrBadAddress, path, f.addr, a)
	}
	if h, err := thisHost(); err == nil && f.host != h {
		return "", nil, fmt.Errorf("%w: agent file %s: the agent runs on host %q, this process on %q: cudaipc reaches agents of one host and pid namespace only: run both ranks on one host in one pid namespace, or connect them with backend \"ucx\"", rdma.ErrPeerGone, path, f.host, h)
	}
	st, err := pidwatch.StartTime(a.pid)
	if err != nil {
		return "", nil, fmt.Errorf("%w: agent file %s: process %d: %v", rdma.ErrPeerGone, path, a.pid, err)
	}
	if st != f.start {
		return "", nil, fmt.Errorf("%w: agent file %s: process %d here started at %d, the agent's at %d: it is another process (the agent's exited and its pid was reused)", rdma.ErrPeerGone, path, a.pid, st, f.start)
	}
	return f.identity, proc, nil
}

// openProcess opens a pidfd of process pid (flags 0: poll needs no
// O_NONBLOCK, which kernels before 5.10 refuse). Where pidfd_open is
// missing or not allowed (a kernel before 5.3: ENOSYS; a seccomp profile:
// EPERM; EINVAL) it returns nil, and the caller falls back on
// host.ProcessGone. No such process is rdma.ErrPeerGone; another error
// (EMFILE: this process is out of descriptors) is returned as it is.
func openProcess(pid int) (*os.File, error) {
	fd, err := pidfdOpen(pid, 0)
	switch {
	case err == nil:
		return os.NewFile(uintptr(fd), fmt.Sprintf("pidfd %d", pid)), nil
	case errors.Is(err, unix.ESRCH):
		return nil, fmt.Errorf("%w: no process %d", rdma.ErrPeerGone, pid)
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES), errors.Is(err, unix.EINVAL):
		if host.ProcessGone(pid) {
			return nil, fmt.Errorf("%w: no process %d", rdma.ErrPeerGone, pid)
		}
		return nil, nil
	}
	return nil, fmt.Errorf("process %d: pidfd_open: %w", pid, err)
}

// exited reports whether the process of pidfd proc has exited (its pidfd
// is readable): a zombie has, and so has a process whose pid now names
// another.
func exited(proc *os.File) bool {
	fds := []unix.PollFd{{Fd: int32(proc.Fd()), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n > 0
	}
}

// thisHost is pidwatch.Host, read once.
var thisHost = sync.OnceValues(pidwatch.Host)

// agents are this process's open agents, by nonce: an endpoint to an
// agent of this process takes its identity from here.
var agents = struct {
	mu sync.Mutex
	m  map[[16]byte]*Agent
}{m: make(map[[16]byte]*Agent)}

// localIdentity returns the identity of the agent of this process at a.
func localIdentity(a address) (string, error) {
	agents.mu.Lock()
	defer agents.mu.Unlock()
	if l := agents.m[a.nonce]; l != nil && !l.closed.Load() {
		return l.identity, nil
	}
	return "", fmt.Errorf("%w: no agent %s in this process (it closed)", rdma.ErrPeerGone, a)
}

// closeProc closes a pidfd of openProcess (nil: none).
func closeProc(proc *os.File) {
	if proc != nil {
		proc.Close()
	}
}

// pidfdOpen is unix.PidfdOpen (a test makes it fail as a kernel would).
var pidfdOpen = unix.PidfdOpen
