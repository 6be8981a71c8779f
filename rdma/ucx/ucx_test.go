//go:build cgo && linux && !kvxfer_noucx

package ucx_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// modes are the UCX_TLS settings every test runs under: UCX's own choice
// (shared memory and cma between processes of this host, tcp) and tcp
// alone over the loopback interface.
var modes = []struct{ name, tls string }{
	{"default", ""},
	{"tcp", "tcp"},
}

// inMode runs f as a subtest per mode with UCX_TLS set (or unset) for it:
// UCX reads the environment when an agent creates its context.
func inMode(t *testing.T, f func(t *testing.T, tls string)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Setenv("UCX_TLS", m.tls) // restores the old value afterwards
			if m.tls == "" {
				os.Unsetenv("UCX_TLS")
			}
			usable(t, m.tls)
			f(t, m.tls)
		})
	}
}

// usable skips the subtest, saying why, when UCX in this environment cannot
// move a byte between two agents in this mode; tcp must always work.
func usable(t *testing.T, tls string) {
	t.Helper()
	err := probe()
	switch {
	case err == nil:
	case tls == "tcp":
		t.Fatalf("UCX_TLS=tcp over 127.0.0.1 must work: %v", err)
	default:
		t.Skipf("UCX_TLS=%q has no usable transport here (shared-memory transports need a writable /dev/shm, cma needs ptrace permission between the processes): %v", tls, err)
	}
}

func probe() error {
	s, err := ucx.New()
	if err != nil {
		return err
	}
	defer s.Close()
	r, err := ucx.New()
	if err != nil {
		return err
	}
	defer r.Close()
	src, _ := kvcache.NewHostRegion(64)
	dst, _ := kvcache.NewHostRegion(64)
	sreg, err := s.Register(src)
	if err != nil {
		return err
	}
	dreg, err := r.Register(dst)
	if err != nil {
		return err
	}
	ep, err := s.Connect(r.Address())
	if err != nil {
		return err
	}
	defer ep.Close()
	src.Bytes()[7] = 42
	done := make(chan error, 1)
	if err := ep.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(), Segments: []kvcache.Segment{{Src: 0, Dst: 0, Len: 64}},
		Done: func(err error) { done <- err }}); err != nil {
		return err
	}
	select {
	case err := <-done:
		if err == nil && dst.Bytes()[7] != 42 {
			err = errors.New("a put completed but its byte did not land")
		}
		return err
	case <-time.After(20 * time.Second):
		return errors.New("a 64-byte put did not complete within 20s")
	}
}

func newAgent(t *testing.T) *ucx.Agent {
	t.Helper()
	a, err := ucx.New()
	if err != nil {
		t.Fatalf("ucx.New: %v", err)
	}
	return a
}

func pair(t *testing.T) rdmatest.Pair {
	s := newAgent(t)
	r := newAgent(t)
	return rdmatest.Pair{
		Sender:   s,
		Receiver: r,
		NewDst: func(n uint64) (*kvcache.Region, error) {
			reg, err := kvcache.NewHostRegion(n)
			if err == nil {
				t.Cleanup(func() { reg.Close() })
			}
			return reg, err
		},
	}
}

// allocPair is pair with destinations from the receiver's Alloc (memory
// UCX allocated: on this host, shared memory that the sender writes into
// directly).
func allocPair(t *testing.T) rdmatest.Pair {
	p := pair(t)
	r := p.Receiver.(*ucx.Agent)
	p.NewDst = func(n uint64) (*kvcache.Region, error) {
		reg, c, err := r.Alloc(n)
		if err == nil {
			t.Cleanup(func() {
				if err := c.Close(); err != nil {
					t.Errorf("free: %v", err)
				}
			})
		}
		return reg, err
	}
	return p
}

// TestConformance runs the rdma conformance suite with both agents in this
// process, once per UCX_TLS mode, into Go memory and into Alloc'd memory.
func TestConformance(t *testing.T) {
	inMode(t, func(t *testing.T, _ string) {
		t.Run("host", func(t *testing.T) { rdmatest.Run(t, pair) })
		t.Run("alloc", func(t *testing.T) { rdmatest.Run(t, allocPair) })
	})
}

func TestAllocFree(t *testing.T) {
	a := newAgent(t)
	defer a.Close()
	r, c, err := a.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	r.Bytes()[0], r.Bytes()[1<<20-1] = 1, 2 // mapped, writable
	reg, err := a.Register(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register(r); !errors.Is(err, rdma.ErrRegionBusy) {
		t.Errorf("second Register of an allocation: %v, want ErrRegionBusy", err)
	}
	if err := c.Close(); !errors.Is(err, rdma.ErrRegionBusy) {
		t.Errorf("free while registered: %v, want ErrRegionBusy", err)
	}
	if err := a.Deregister(reg); err != nil {
		t.Fatal(err)
	}
	reg2, err := a.Register(r) // registers again once deregistered
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Deregister(reg2); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("free: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second free: %v", err)
	}
	if _, _, err := a.Alloc(0); err == nil {
		t.Errorf("Alloc(0) succeeded")
	}
}

func TestConnectToClosedAgent(t *testing.T) {
	inMode(t, func(t *testing.T, _ string) {
		a := newAgent(t)
		defer a.Close()
		b, err := ucx.New(ucx.WithHandshakeTimeout(3 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		addr := b.Address()
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := a.Connect(addr); !errors.Is(err, rdma.ErrPeerGone) {
			t.Errorf("Connect to a closed agent: %v, want ErrPeerGone", err)
		}
		t.Logf("Connect to a closed agent failed after %v", time.Since(start).Round(time.Millisecond))
	})
}

func TestConnectToSelf(t *testing.T) {
	inMode(t, func(t *testing.T, _ string) {
		a := newAgent(t)
		defer a.Close()
		r, _ := kvcache.NewHostRegion(1 << 20)
		defer r.Close()
		reg, err := a.Register(r)
		if err != nil {
			t.Fatal(err)
		}
		ep, err := a.Connect(a.Address())
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		for i := range 512 {
			r.Bytes()[i] = byte(i)
		}
		done := make(chan error, 1)
		if err := ep.Post(rdma.Batch{Src: reg, Dst: reg.Remote(), Segments: []kvcache.Segment{{Src: 0, Dst: 1 << 19, Len: 512}},
			Done: func(err error) { done <- err }}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		for i := range 512 {
			if r.Bytes()[1<<19+i] != byte(i) {
				t.Fatalf("byte %d did not land", i)
			}
		}
	})
}

// TestIdleCPU: two linked agents with nothing to do sleep on their event
// fds; the process burns (almost) no CPU.
func TestIdleCPU(t *testing.T) {
	inMode(t, func(t *testing.T, _ string) {
		s, r := newAgent(t), newAgent(t)
		defer s.Close()
		defer r.Close()
		ep, err := s.Connect(r.Address())
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		time.Sleep(200 * time.Millisecond) // let wireup settle
		const window = 2 * time.Second
		before := cpuTime(t)
		time.Sleep(window)
		used := cpuTime(t) - before
		pct := 100 * used.Seconds() / window.Seconds()
		t.Logf("idle: %v of CPU in %v (%.2f%% of one core) for the whole process, two linked agents", used, window, pct)
		// Not a speed target: a busy-polling progress loop burns a whole
		// core; event-driven progress burns ~0.1%. The bound is far from
		// both so a loaded machine cannot trip it.
		if pct > 50 {
			t.Errorf("idle agents used %.1f%% of a core: the progress loop is polling, want it asleep on its fds", pct)
		}
	})
}

func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestRegisterDeviceNeedsCUDA(t *testing.T) {
	a := newAgent(t)
	defer a.Close()
	r, _ := kvcache.ExternalDeviceRegion(0x1000, 4096, 0)
	_, err := a.Register(r)
	if err == nil {
		t.Fatalf("Register(device region at 0x1000) succeeded")
	}
	t.Logf("UCX memory types %v; Register(device): %v", a.MemoryTypes(), err)
}

// TestMixedSegments: one batch mixing runs of small segments with segments
// larger than one cgo call copies (posted piece by piece) lands intact.
func TestMixedSegments(t *testing.T) {
	inMode(t, func(t *testing.T, _ string) {
		for _, p := range []rdmatest.Pair{pair(t), allocPair(t)} {
			const n = 12 << 20
			src, _ := kvcache.NewHostRegion(n)
			defer src.Close()
			for i := range src.Bytes() {
				src.Bytes()[i] = byte(i*7 + i>>13)
			}
			dst, err := p.NewDst(n)
			if err != nil {
				t.Fatal(err)
			}
			sreg, err := p.Sender.Register(src)
			if err != nil {
				t.Fatal(err)
			}
			dreg, err := p.Receiver.Register(dst)
			if err != nil {
				t.Fatal(err)
			}
			ep, err := p.Sender.Connect(p.Receiver.Address())
			if err != nil {
				t.Fatal(err)
			}
			segs := []kvcache.Segment{
				{Src: 0, Dst: 5 << 20, Len: 5<<20 + 123}, // pieces
				{Src: 6 << 20, Dst: 0, Len: 100},         // a run of small ones
				{Src: 7 << 20, Dst: 4096, Len: 0},
				{Src: 8 << 20, Dst: 8192, Len: 1 << 20},
				{Src: 10 << 20, Dst: 2 << 20, Len: 2 << 20}, // exactly one run
				{Src: 9 << 20, Dst: 11 << 20, Len: 1},
			}
			done := make(chan error, 1)
			if err := ep.Post(rdma.Batch{Src: sreg, Dst: dreg.Remote(), Segments: segs, Done: func(err error) { done <- err }}); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			for i, s := range segs {
				if got, want := dst.Bytes()[s.Dst:s.Dst+s.Len], src.Bytes()[s.Src:s.Src+s.Len]; string(got) != string(want) {
					t.Errorf("segment %d %+v did not land intact", i, s)
				}
			}
			ep.Close()
			p.Sender.Close()
			p.Receiver.Close()
		}
	})
}

// TestAllocBeyondAvailableMemory: a pool larger than the host's available
// memory is refused at once, naming both sizes — not faulted in until the
// host swaps or the OOM killer comes, leaving UCX's shared-memory file
// behind (kvxfer gen --pool 1000GiB on the default backend did).
func TestAllocBeyondAvailableMemory(t *testing.T) {
	avail, ok := ucx.MemAvailable()
	if !ok {
		t.Skip("no MemAvailable in /proc/meminfo here")
	}
	a := newAgent(t)
	defer a.Close()
	n := avail + 1<<30
	r, c, err := a.Alloc(n)
	if err == nil {
		c.Close()
		t.Fatalf("Alloc(%d) with %d bytes available: got a region of %d bytes", n, avail, r.Len)
	}
	if !errors.Is(err, kvcache.ErrBadRegion) || !strings.Contains(err.Error(), "MemAvailable") || !strings.Contains(err.Error(), strconv.FormatUint(n, 10)) {
		t.Fatalf("Alloc(%d): %v, want ErrBadRegion naming the size and MemAvailable", n, err)
	}
}
