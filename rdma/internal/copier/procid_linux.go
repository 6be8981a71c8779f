package copier

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// Self is this process's ProcessID, read from /proc once; an error when
// /proc cannot name it (the process then claims no writer slot).
func Self() (ProcessID, error) { return procOnce().self, procOnce().selfErr }

// ProvenDead reports whether the process id is proven dead, as this process
// sees it: true only when id is in this process's pid and time namespaces,
// /proc is the procfs of that pid namespace, and either no process has the
// pid (kill(pid, 0) fails with ESRCH), or the process that has it started
// at another time (the pid was reused: id was reaped), or it is a zombie
// none of whose threads still runs. Anything else — another namespace, a
// /proc it cannot read or trust, a stopped or running process — is not a
// proof, and ProvenDead is false.
//
// A dead process cannot write: its memory mappings went with its last
// thread. (A child it forked keeps copies of its mappings, but not the
// copier's goroutine that writes batches.)
func ProvenDead(id ProcessID) bool { return procOnce().provenDead(id) }

var procOnce = sync.OnceValue(func() *procView { return newProcView("/proc", os.Getpid(), killGone) })

// killGone reports whether no process has pid in this process's pid
// namespace (kill(2) looks pids up there, whatever /proc shows).
func killGone(pid uint32) bool {
	return pid <= 1<<31-1 && errors.Is(syscall.Kill(int(pid), 0), syscall.ESRCH)
}

// procView is what a process can tell of others through the procfs at root.
type procView struct {
	root    string
	self    ProcessID
	selfErr error // self could not be read
	// judgeErr says why this process cannot prove deaths; nil when it can.
	judgeErr error
	gone     func(pid uint32) bool
}

// newProcView reads the identity of the process pid (pid in its own
// namespace) from root/self, and whether root is the procfs of its pid
// namespace: the NSpid line of root/self/status lists the process's pids
// from root's namespace down to its own, so it has one entry, pid, only
// when they are the same namespace. (A procfs of an ancestor namespace
// would show other processes at the pids ProvenDead looks up.)
func newProcView(root string, pid int, gone func(uint32) bool) *procView {
	v := &procView{root: root, gone: gone}
	v.self, v.selfErr = readSelf(root, pid)
	switch {
	case v.selfErr != nil:
		v.judgeErr = v.selfErr
	default:
		v.judgeErr = checkOwnProcfs(root, pid)
	}
	return v
}

func readSelf(root string, pid int) (ProcessID, error) {
	if pid <= 0 || pid > 1<<31-1 {
		return ProcessID{}, fmt.Errorf("pid %d", pid)
	}
	b, err := os.ReadFile(filepath.Join(root, "self", "stat"))
	if err != nil {
		return ProcessID{}, err
	}
	st, err := parseStat(b)
	if err != nil {
		return ProcessID{}, fmt.Errorf("%s/self/stat: %w", root, err)
	}
	id := ProcessID{PID: uint32(pid), Start: st.start}
	var ns syscall.Stat_t
	if err := syscall.Stat(filepath.Join(root, "self", "ns", "pid"), &ns); err != nil {
		return ProcessID{}, &fs.PathError{Op: "stat", Path: filepath.Join(root, "self", "ns", "pid"), Err: err}
	}
	id.PIDNS, id.NSDev = ns.Ino, ns.Dev
	switch err := syscall.Stat(filepath.Join(root, "self", "ns", "time"), &ns); {
	case err == nil && ns.Dev == id.NSDev:
		id.TimeNS = ns.Ino
	case err == nil:
		return ProcessID{}, fmt.Errorf("%s/self/ns: pid and time namespaces on devices %d and %d", root, id.NSDev, ns.Dev)
	case errors.Is(err, syscall.ENOENT):
		// A kernel without time namespaces: every process reads the
		// same start times.
	default:
		return ProcessID{}, &fs.PathError{Op: "stat", Path: filepath.Join(root, "self", "ns", "time"), Err: err}
	}
	return id, nil
}

// checkOwnProcfs checks that root is the procfs of the pid namespace of the
// process pid (see newProcView).
func checkOwnProcfs(root string, pid int) error {
	b, err := os.ReadFile(filepath.Join(root, "self", "status"))
	if err != nil {
		return err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("NSpid:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 1 || string(f[0]) != strconv.Itoa(pid) {
			return fmt.Errorf("%s is not the procfs of this process's pid namespace (NSpid %q, pid %d)", root, rest, pid)
		}
		return nil
	}
	return fmt.Errorf("%s/self/status has no NSpid line: cannot tell whose procfs it is", root)
}

func (v *procView) provenDead(id ProcessID) bool {
	if v.judgeErr != nil || id.PID == 0 || !id.sameNamespaces(v.self) {
		return false
	}
	if v.gone(id.PID) {
		return true // no process has the pid: id was reaped
	}
	dir := filepath.Join(v.root, strconv.FormatUint(uint64(id.PID), 10))
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		// Reaped since (ENOENT, ESRCH), or hidden from us (hidepid):
		// only kill's answer is proof.
		return v.gone(id.PID)
	}
	st, err := parseStat(b)
	if err != nil || st.pid != id.PID {
		return false
	}
	if st.start != id.Start {
		return true // another process has the pid: id was reaped
	}
	if !st.dead() {
		return false // running, sleeping, stopped…: alive
	}
	// A zombie thread-group leader: the process is dead once no thread of
	// it runs (a leader that exited before its other threads is a zombie
	// while they run on).
	tasks, err := os.ReadDir(filepath.Join(dir, "task"))
	if err != nil {
		return v.gone(id.PID)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, "task", task.Name(), "stat"))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // the thread is gone since
		}
		if err != nil {
			return false
		}
		if t, err := parseStat(b); err != nil || !t.dead() {
			return false
		}
	}
	return true
}

// procStat is what provenDead reads of /proc/<pid>/stat.
type procStat struct {
	pid   uint32
	state byte
	start uint64 // field 22
}

func (s procStat) dead() bool { return s.state == 'Z' || s.state == 'X' }

// parseStat parses "pid (comm) state ppid … starttime …"; comm may hold
// spaces and parentheses, so the fields after it start after the last ')'.
func parseStat(b []byte) (procStat, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return procStat{}, fmt.Errorf("malformed stat %.40q", b)
	}
	pid, err := strconv.ParseUint(string(bytes.TrimSpace(b[:open])), 10, 32)
	if err != nil {
		return procStat{}, fmt.Errorf("malformed stat %.40q: pid: %v", b, err)
	}
	f := bytes.Fields(b[end+1:]) // f[0] is field 3 (state), f[i] field i+3
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("malformed stat %.40q: %d fields after comm", b, len(f))
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("malformed stat %.40q: start time: %v", b, err)
	}
	return procStat{pid: uint32(pid), state: f[0][0], start: start}, nil
}
