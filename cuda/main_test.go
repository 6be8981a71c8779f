package cuda

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer/cuda/cudatest"
)

// fakeErr is why no fake driver could be built (nil when it was, or when
// $KVXFER_LIBCUDA names a library to test instead).
var fakeErr error

// TestMain points the package at a fake driver built for the run, unless
// $KVXFER_LIBCUDA names a library (the real driver on a GPU machine).
func TestMain(m *testing.M) {
	dir := ""
	if os.Getenv(LibraryEnv) == "" {
		var err error
		if dir, err = os.MkdirTemp("", "fakecuda"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		lib, err := cudatest.BuildFake(dir)
		if err != nil {
			fakeErr = err
		} else {
			os.Setenv(LibraryEnv, lib)
			os.Setenv("FAKECUDA_COPY_DELAY_US", "100") // keep events pending a while
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	if dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// device opens device 0 of the driver under test, closed at cleanup, or
// skips saying why there is none.
func device(t *testing.T) *Device {
	t.Helper()
	if fakeErr != nil {
		t.Skipf("no driver to test: the fake driver did not build: %v", fakeErr)
	}
	d, err := OpenDevice(0)
	if errors.Is(err, ErrNoDevice) {
		t.Skipf("no CUDA device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("device Close: %v", err)
		}
	})
	return d
}

// alloc allocates n bytes on d, freed at cleanup.
func alloc(t *testing.T, d *Device, n uint64) *Memory {
	t.Helper()
	m, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Free(); err != nil {
			t.Errorf("Free: %v", err)
		}
	})
	return m
}

// stream makes a stream on d, closed at cleanup.
func stream(t *testing.T, d *Device) *Stream {
	t.Helper()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("stream Close: %v", err)
		}
	})
	return s
}

// pattern returns n reproducible bytes for seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed ^ byte(i>>9)
	}
	return b
}
