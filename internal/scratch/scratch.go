// Package scratch makes the private temporary directories of kvxfer's
// demos and local etcd (keys, sockets, etcd's data), and removes those that
// processes killed with SIGKILL left behind: a deferred os.RemoveAll never
// runs then, and the directories hold secret keys and, for etcd, its data.
//
// Each directory Dir makes holds an owner file naming its process (pid,
// start time, host as pidwatch.Self says it). Dir first removes every
// directory of the same prefix in the temporary directory that this user
// owns and whose owner file names a process of this host that no longer
// runs (or whose pid now belongs to a later process). A directory without
// a readable owner file (an older build's, one being made this instant) or
// of another host or pid namespace is left alone: nothing is removed
// without proof that its process is gone.
package scratch

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/messages"
)

// OwnerFile is the name of the file, in each directory Dir makes, that
// names the process it belongs to.
const OwnerFile = ".kvxfer-owner"

// Dir sweeps the leftovers of prefix (Sweep) and makes a new directory
// os.MkdirTemp("", prefix+"*") owned by this process. swept are the
// directories removed.
func Dir(prefix string) (dir string, swept []string, err error) {
	self, err := pidwatch.Self()
	if err != nil {
		return "", nil, fmt.Errorf("scratch: %w", err)
	}
	swept = Sweep(os.TempDir(), prefix, self)
	dir, err = os.MkdirTemp("", prefix+"*")
	if err != nil {
		return "", swept, err
	}
	if err := os.WriteFile(filepath.Join(dir, OwnerFile), []byte(format(self)), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", swept, fmt.Errorf("scratch: %w", err)
	}
	return dir, swept, nil
}

// Sweep removes the directories named prefix* in parent that this user
// owns and whose owner file names a process of self's host that is gone,
// and returns them. Errors leave a directory where it is.
func Sweep(parent, prefix string, self messages.ProcessID) (swept []string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return nil
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		if !mine(dir) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, OwnerFile))
		if err != nil {
			continue
		}
		owner, err := parse(string(b))
		if err != nil || owner.Host != self.Host || owner == self {
			continue
		}
		if !gone(owner) {
			continue
		}
		if os.RemoveAll(dir) == nil {
			swept = append(swept, dir)
		}
	}
	return swept
}

// mine reports whether dir is a directory (not a link) this user owns.
func mine(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}

// gone reports whether p no longer runs: no process has its pid, or the
// one that has it started at another time.
func gone(p messages.ProcessID) bool {
	st, err := pidwatch.StartTime(int(p.Pid))
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	return err == nil && st != p.StartTime
}

func format(p messages.ProcessID) string {
	return fmt.Sprintf("%d %d %s\n", p.Pid, p.StartTime, p.Host)
}

func parse(s string) (messages.ProcessID, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return messages.ProcessID{}, fmt.Errorf("scratch: owner %q: want pid, start time and host", s)
	}
	pid, err := strconv.ParseUint(f[0], 10, 32)
	if err != nil || pid == 0 {
		return messages.ProcessID{}, fmt.Errorf("scratch: owner %q: pid", s)
	}
	st, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return messages.ProcessID{}, fmt.Errorf("scratch: owner %q: start time", s)
	}
	return messages.ProcessID{Pid: uint32(pid), StartTime: st, Host: f[2]}, nil
}
