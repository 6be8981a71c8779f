package zmq

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// holdIPCCheck makes Listen's probe of its ipc path wait until the test
// lets it go (release: the test calls it at cleanup too, before the
// link's Close); entered is signalled as a Listen reaches the probe.
func holdIPCCheck(t *testing.T) (entered <-chan struct{}, release func()) {
	t.Helper()
	in, gate := make(chan struct{}, 4), make(chan struct{})
	old := ipcFreeToListen
	ipcFreeToListen = func(endpoint string) error {
		in <- struct{}{}
		<-gate
		return checkIPCFree(endpoint)
	}
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(func() { release(); ipcFreeToListen = old })
	return in, release
}

// within waits (up to patience) for done, failing the test with what.
func within(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(patience):
		t.Fatalf("%s waits for Listen's probe of its ipc path", what)
	}
}

// The link's other calls do not wait while Listen probes its ipc path
// (up to ipcInUseWait, 2 s, for a path in use): Listen held the link's
// lock meanwhile. A second Listen is still refused, and the first binds
// once the probe ends. (Checked to fail: with the probe under the lock
// again, Hello waits for it.)
func TestListenProbesIPCWithoutTheLock(t *testing.T) {
	entered, release := holdIPCCheck(t)
	bind := "ipc://" + filepath.Join(t.TempDir(), "l.sock")
	l, err := New(Config{Insecure: true, Bind: bind, HeartbeatInterval: -1, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	t.Cleanup(release) // first: a Listen still held would hold the Close
	self := pid("ctx", 0)
	listened := make(chan error, 1)
	go func() {
		_, err := l.Listen(helloOf(self, "1"), func(messages.Frame) {})
		listened <- err
	}()
	within(t, entered, "the test")
	done := make(chan struct{})
	var helloErr, peerErr, dupErr error
	go func() {
		defer close(done)
		_, helloErr = l.Hello(pid("gen", 0))
		peerErr = l.AddPeer(pid("gen", 0), "tcp://127.0.0.1:5712")
		_, _ = l.PeerState(pid("gen", 0))
		_ = l.Endpoint()
		_, dupErr = l.Listen(helloOf(pid("other", 0), "1"), func(messages.Frame) {})
	}()
	within(t, done, "Hello, AddPeer, PeerState, Endpoint and a second Listen")
	if !errors.Is(helloErr, control.ErrPeerGone) || peerErr != nil || !errors.Is(dupErr, control.ErrDuplicate) {
		t.Fatalf("Hello: %v (want ErrPeerGone); AddPeer: %v; second Listen: %v (want ErrDuplicate)", helloErr, peerErr, dupErr)
	}
	release()
	if err := <-listened; err != nil {
		t.Fatal(err)
	}
	if got := l.Endpoint(); got != bind {
		t.Fatalf("Endpoint %q, want %q", got, bind)
	}
}

// A Close while Listen probes its ipc path returns without waiting for
// the probe, and the Listen then fails (control.ErrClosed) with nothing
// bound: no socket file, no goroutine. (Checked to fail: with the probe
// under the lock again, Close waits for it.)
func TestCloseWhileListenProbesIPC(t *testing.T) {
	entered, release := holdIPCCheck(t)
	path := filepath.Join(t.TempDir(), "l.sock")
	l, err := New(Config{Insecure: true, Bind: "ipc://" + path, HeartbeatInterval: -1, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	t.Cleanup(release) // first: a Listen still held would hold the Close
	listened := make(chan error, 1)
	go func() {
		_, err := l.Listen(helloOf(pid("ctx", 0), "1"), func(messages.Frame) {})
		listened <- err
	}()
	within(t, entered, "the test")
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		l.Close()
	}()
	within(t, closed, "Close")
	release()
	if err := <-listened; !errors.Is(err, control.ErrClosed) {
		t.Fatalf("Listen after Close: %v, want control.ErrClosed", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the ipc path after Close: %v, want nothing bound there", err)
	}
	if l.Endpoint() != "" {
		t.Fatalf("Endpoint %q after a Listen that failed", l.Endpoint())
	}
}
