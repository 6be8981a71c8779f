package cudaipc_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/cuda/cudatest"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// requireGPU skips t unless the driver under test (the real one, or
// $KVXFER_LIBCUDA's) has a device.
func requireGPU(t *testing.T) {
	t.Helper()
	d, err := cuda.OpenDevice(0)
	if errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("needs a GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}

// agent starts an agent closed at cleanup.
func agent(t *testing.T, opts ...cudaipc.Option) *cudaipc.Agent {
	t.Helper()
	a, err := cudaipc.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("agent Close: %v", err)
		}
	})
	return a
}

// unprovenAgent starts an agent that the test leaves with a batch whose
// end no stream synchronisation proved (the fake driver's fails): a copy
// may still read or write its region, which stays busy for good, so its
// Close at cleanup must say rdma.ErrCloseUnproven (the memory must stay
// allocated), not nil.
func unprovenAgent(t *testing.T) *cudaipc.Agent {
	t.Helper()
	a, err := cudaipc.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); !errors.Is(err, rdma.ErrCloseUnproven) {
			t.Errorf("agent Close with a batch of unproven end counted in its region: %v, want rdma.ErrCloseUnproven", err)
		}
	})
	return a
}

// TestNewWithoutDevice: without a GPU, New fails cleanly with
// cuda.ErrNoDevice.
func TestNewWithoutDevice(t *testing.T) {
	a, err := cudaipc.New()
	if err == nil {
		a.Close()
		t.Skip("a GPU is present")
	}
	if !errors.Is(err, cuda.ErrNoDevice) {
		t.Fatalf("New without a GPU: %v, want cuda.ErrNoDevice", err)
	}
	t.Logf("New: %v", err)
}

func pair(t *testing.T) rdmatest.Pair {
	s, err := newMirror()
	if err != nil {
		t.Fatal(err)
	}
	r, err := newMirror()
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { // runs after the suite closed both agents
		for _, m := range []*mirror{s, r} {
			if err := m.failures(); err != nil {
				t.Errorf("mirror: %v", err)
			}
		}
	})
	return rdmatest.Pair{Sender: s, Receiver: r, NewDst: kvcache.NewHostRegion}
}

// TestConformance runs the rdma conformance suite on the GPU, through the
// mirror (see mirror_test.go). Both agents live in this process, so
// destinations are reached by address; TestCrossProcess covers IPC
// handles.
func TestConformance(t *testing.T) {
	requireGPU(t)
	rdmatest.Run(t, pair)
}

// childTests are the tests TestFakeDriver runs against the fake driver.
const childTests = "^(TestConformance|TestCrossProcess|TestRefusedKeyMapsNothing|TestIdentity|TestRegister|TestCloseNoLateWrite|TestCloseWithAPeerBatchInFlightIsUnproven|TestSubRegion|TestSpansCrossProcess|TestRegisterSpans)$"

// TestFakeDriver runs the GPU tests of this package in a child process
// against the fake driver (cuda/cudatest), so that the backend's logic is
// exercised on machines without a GPU too.
func TestFakeDriver(t *testing.T) {
	if p := os.Getenv(cuda.LibraryEnv); p != "" {
		t.Skipf("the driver under test is chosen already ($%s=%s)", cuda.LibraryEnv, p)
	}
	if testing.Short() {
		t.Skip("-short")
	}
	out, err := cudatest.RunOnFake(t, cuda.LibraryEnv, childTests, "FAKECUDA_COPY_DELAY_US=20")
	if err != nil {
		t.Fatalf("GPU tests on the fake driver: %v\n%s", err, out)
	}
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, "--- ") {
			t.Log(strings.TrimSpace(l))
		}
		if strings.HasPrefix(l, "--- SKIP") {
			t.Errorf("a GPU test skipped on the fake driver: %s", l)
		}
	}
	for _, name := range []string{"TestConformance", "TestCrossProcess", "TestIdentity"} {
		if !strings.Contains(out, "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass on the fake driver:\n%s", name, out)
		}
	}
}

// TestFakeDriverFailingSync runs TestCloseUnprovenWhenSyncFails on the
// fake driver with its stream synchronisation failing and a copy slow
// enough to be running at Close.
func TestFakeDriverFailingSync(t *testing.T) {
	if p := os.Getenv(cuda.LibraryEnv); p != "" {
		t.Skipf("the driver under test is chosen already ($%s=%s)", cuda.LibraryEnv, p)
	}
	if testing.Short() {
		t.Skip("-short")
	}
	out, err := cudatest.RunOnFake(t, cuda.LibraryEnv, "^TestCloseUnprovenWhenSyncFails$", "FAKECUDA_FAIL_SYNC=1", "FAKECUDA_COPY_DELAY_US=200000")
	if err != nil || !strings.Contains(out, "--- PASS: TestCloseUnprovenWhenSyncFails") {
		t.Fatalf("TestCloseUnprovenWhenSyncFails on the fake driver: %v\n%s", err, out)
	}
}
