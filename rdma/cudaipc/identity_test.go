package cudaipc_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
)

// TestIdentity: an endpoint reports whom the agent it reaches serves, as
// that agent was given it (cudaipc.WithIdentity), "" when it was given
// none — for an agent of this process too; an agent of another process is
// found by its agent file, and a file that does not describe the address
// (another nonce, another pid), states another start time (the pid is
// another process's) or host, belongs to another user, or is missing, is
// refused at Connect, naming the file. The file goes with Close.
// (TestCrossProcess checks the
// identity through a real agent's file in another process.) (Checked to
// fail: with the endpoint not reporting the identity, with Connect reading
// no agent file, and with each of the file's checks removed in turn.)
func TestIdentity(t *testing.T) {
	requireGPU(t)
	w := agent(t)
	for _, id := range []string{"gen/3", ""} {
		var opts []cudaipc.Option
		if id != "" {
			opts = append(opts, cudaipc.WithIdentity(id))
		}
		peer := agent(t, opts...)
		for _, from := range []*cudaipc.Agent{w, peer} { // another agent of this process, and the agent itself
			ep, err := from.Connect(peer.Address())
			if err != nil {
				t.Fatal(err)
			}
			if got := ep.(rdma.IdentifiedEndpoint).PeerIdentity(); got != id {
				t.Errorf("endpoint of %s to an agent of this process given identity %q reports %q", from, id, got)
			}
			ep.Close()
		}
	}
	// The agent file exists while the agent is open, mode 0600, and goes
	// with Close; an endpoint to the closed agent is refused.
	closing, err := cudaipc.New(cudaipc.WithIdentity("gen/4"))
	if err != nil {
		t.Fatal(err)
	}
	path := cudaipc.AgentPath(closing.Address())
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("agent file %s of an open agent: %v, %v; want mode 0600", path, fi, err)
	}
	if err := closing.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("agent file %s after Close: %v, want removed", path, err)
	}
	if ep, err := w.Connect(closing.Address()); !errors.Is(err, rdma.ErrPeerGone) {
		if err == nil {
			ep.Close()
		}
		t.Errorf("Connect to a closed agent of this process: %v, want rdma.ErrPeerGone", err)
	}
	if _, err := cudaipc.New(cudaipc.WithIdentity(strings.Repeat("x", cudaipc.MaxIdentity+1))); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("New with an identity of %d bytes: %v, want refused", cudaipc.MaxIdentity+1, err)
	}

	// A live process of this host that is not this one, to name in
	// addresses (its agent files are written here, by this test).
	other := exec.Command("cat")
	stdin, err := other.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = other.Wait()
	}()
	pid := other.Process.Pid

	for _, c := range []struct {
		name string
		edit func(*cudaipc.AgentFile) // nil: no file
		uid  int                      // >0: the file belongs to this uid
		want error                    // nil: Connect succeeds
		says []string
	}{
		{"true", func(*cudaipc.AgentFile) {}, 0, nil, nil},
		{"another nonce", func(f *cudaipc.AgentFile) { f.Nonce[0] ^= 1 }, 0, rdma.ErrBadAddress, []string{"states the agent"}},
		{"another pid", func(f *cudaipc.AgentFile) { f.Pid = os.Getpid() }, 0, rdma.ErrBadAddress, []string{"states the agent"}},
		{"missing", nil, 0, rdma.ErrPeerGone, []string{"no agent file"}},
		{"another start time", func(f *cudaipc.AgentFile) { f.Start++ }, 0, rdma.ErrPeerGone, []string{"is another process"}},
		{"another host", func(f *cudaipc.AgentFile) { f.Host = "elsewhere/pid:[1]" }, 0, rdma.ErrPeerGone, []string{"elsewhere", `backend "ucx"`}},
		{"another user", func(*cudaipc.AgentFile) {}, 65534, rdma.ErrBadAddress, []string{"uid 65534"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr, path, err := cudaipc.WriteAgentFile(pid, "gen/5", c.edit)
			if err != nil {
				t.Fatal(err)
			}
			if c.edit != nil {
				defer os.Remove(path)
			}
			if c.uid > 0 {
				if os.Getuid() != 0 {
					t.Logf("not root: cannot give the file to uid %d; the check stays unexercised here", c.uid)
					return
				}
				if err := os.Chown(path, c.uid, c.uid); err != nil {
					t.Fatal(err)
				}
			}
			ep, err := w.Connect(addr)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Connect to an agent whose file is true: %v", err)
				}
				defer ep.Close()
				if got := ep.(rdma.IdentifiedEndpoint).PeerIdentity(); got != "gen/5" {
					t.Errorf("the endpoint reports identity %q, its agent file states %q", got, "gen/5")
				}
				return
			}
			if err == nil {
				ep.Close()
				t.Fatalf("Connect to %s with an agent file of %s succeeded", addr, c.name)
			}
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Connect with an agent file of %s: %v, want %v naming %s", c.name, err, c.want, path)
			}
			for _, says := range c.says {
				if !strings.Contains(err.Error(), says) {
					t.Errorf("Connect with an agent file of %s: %v does not say %q", c.name, err, says)
				}
			}
			t.Log(err)
		})
	}

	// A FIFO in the agent file's place: Connect refuses it at once instead
	// of blocking in open until someone writes to it. (Checked to fail:
	// without O_NONBLOCK, Connect is still blocked at the deadline.)
	fifoAddr, fifo, _ := cudaipc.WriteAgentFile(pid, "gen/5", nil)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(fifo)
	connected := make(chan error, 1)
	go func() {
		ep, err := w.Connect(fifoAddr)
		if err == nil {
			ep.Close()
		}
		connected <- err
	}()
	select {
	case err := <-connected:
		if !errors.Is(err, rdma.ErrBadAddress) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Connect with a FIFO for its agent file: %v, want rdma.ErrBadAddress saying it is not a regular file", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Connect with a FIFO for its agent file still blocked after a minute")
	}

	// An address of version 1 is refused by its version.
	v1 := strings.Replace(string(w.Address()), "cudaipc2:", "cudaipc:", 1)
	if _, err := w.Connect([]byte(v1)); !errors.Is(err, rdma.ErrBadAddress) || !strings.Contains(err.Error(), "version 1") {
		t.Errorf("Connect to %s: %v, want rdma.ErrBadAddress naming version 1", v1, err)
	}
}

// TestOpenProcessWithoutPidfd: where pidfd_open is missing or not allowed
// (ENOSYS before Linux 5.3, EPERM under a seccomp profile, EINVAL) a live
// process is watched by its pid instead (no pidfd, no error): before,
// every cross-process Connect failed there, "peer gone". No such process
// is ErrPeerGone; running out of descriptors is not.
func TestOpenProcessWithoutPidfd(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOSYS, syscall.EPERM, syscall.EINVAL} {
		restore := cudaipc.SetPidfdOpen(func(int, int) (int, error) { return -1, errno })
		f, err := cudaipc.OpenProcess(os.Getpid())
		restore()
		if f != nil || err != nil {
			t.Errorf("pidfd_open failing with %v, for a live process: %v, %v; want no pidfd and no error", errno, f, err)
		}
	}
	restore := cudaipc.SetPidfdOpen(func(int, int) (int, error) { return -1, syscall.ESRCH })
	if _, err := cudaipc.OpenProcess(os.Getpid()); !errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("pidfd_open failing with ESRCH: %v, want ErrPeerGone", err)
	}
	restore()
	restore = cudaipc.SetPidfdOpen(func(int, int) (int, error) { return -1, syscall.EMFILE })
	if _, err := cudaipc.OpenProcess(os.Getpid()); err == nil || errors.Is(err, rdma.ErrPeerGone) {
		t.Errorf("pidfd_open failing with EMFILE: %v, want an error that is not ErrPeerGone", err)
	}
	restore()
	f, err := cudaipc.OpenProcess(os.Getpid())
	if err != nil || f == nil {
		t.Fatalf("OpenProcess(self): %v, %v", f, err)
	}
	f.Close()
}
