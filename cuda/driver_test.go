package cuda

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestMissingLibrary: a driver library that is not there is ErrNoDevice
// with the loader's reason, not a crash.
func TestMissingLibrary(t *testing.T) {
	err := initDriver("/nonexistent/libcuda.so.1")
	if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("initDriver(missing) = %v, want ErrNoDevice", err)
	}
	if !strings.Contains(err.Error(), "no CUDA driver") || !strings.Contains(err.Error(), "/nonexistent/libcuda.so.1") {
		t.Errorf("error %q does not say which library is missing", err)
	}
	if cgoAvailable && !strings.Contains(err.Error(), LibraryEnv) {
		t.Errorf("error %q does not say what to do (install the driver, or name its library in $%s)", err, LibraryEnv)
	}
	t.Logf("missing library: %v", err)
}

func TestErrorIsNoDevice(t *testing.T) {
	for code, want := range map[int]bool{codeNoDevice: true, codeInsufficientDriver: true, codeInvalidDevice: true, 2: false, 600: false} {
		e := &Error{Op: "cuX", Code: code}
		if got := errors.Is(e, ErrNoDevice); got != want {
			t.Errorf("code %d: Is(ErrNoDevice) = %v, want %v", code, got, want)
		}
	}
	if s := (&Error{Op: "cuMemAlloc", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Desc: "out of memory"}).Error(); s != "cuda: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory" {
		t.Errorf("Error() = %q", s)
	}
}

func TestDevice(t *testing.T) {
	d := device(t)
	if d.Name() == "" || d.PCIBusID() == "" || d.TotalMem() == 0 || d.Ordinal() != 0 {
		t.Errorf("device 0: name %q, bus %q, memory %d, ordinal %d", d.Name(), d.PCIBusID(), d.TotalMem(), d.Ordinal())
	}
	v, err := DriverVersion()
	if err != nil || v < 1000 {
		t.Errorf("DriverVersion = %d, %v", v, err)
	}
	n, _ := DeviceCount()
	// A wrong ordinal is ErrNoDevice naming it and the ordinals to use.
	for _, o := range []int{n, n + 7, -1, -1 << 31} {
		_, err := OpenDevice(o)
		if !errors.Is(err, ErrNoDevice) {
			t.Errorf("OpenDevice(%d) of %d devices: %v, want ErrNoDevice", o, n, err)
			continue
		}
		if s := err.Error(); !strings.Contains(s, fmt.Sprintf("device %d ", o)) || !strings.Contains(s, fmt.Sprintf("0..%d", n-1)) {
			t.Errorf("OpenDevice(%d) of %d devices: %q does not name the ordinal and say to use one in 0..%d", o, n, s, n-1)
		}
	}
	t.Logf("%s, %d bytes, driver %s, %d devices", d, d.TotalMem(), FormatCUDAVersion(v), n)
}

func TestClosedDevice(t *testing.T) {
	device(t) // skips without a driver
	d, err := OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := d.Alloc(16); !errors.Is(err, ErrClosed) {
		t.Errorf("Alloc on a closed device: %v, want ErrClosed", err)
	}
}

// TestFreeOnClosedDevice: memory, a stream and an event whose device was
// closed first were not freed, so every Free or Close of them says
// ErrClosed, not only the first: before the fix the first call marked the
// object freed before it found the device closed, and a second call
// returned nil, hiding the leak. Memory, streams and events freed before
// the device closed stay freed: a later call returns nil.
func TestFreeOnClosedDevice(t *testing.T) {
	device(t) // skips without a driver; keeps the primary context retained
	d, err := OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	ev, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	freed, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	closedS, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	closedEv, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []func() error{freed.Free, closedS.Close, closedEv.Close} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// m, s and ev leak in the driver: the caller broke the rule (close
	// them before the device); what is checked is that they say so.
	for i := range 3 {
		for _, c := range []struct {
			name string
			f    func() error
		}{{"Memory.Free", m.Free}, {"Memory.Close", m.Close}, {"Stream.Close", s.Close}, {"Event.Close", ev.Close}} {
			if err := c.f(); !errors.Is(err, ErrClosed) {
				t.Errorf("call %d of %s after the device closed, nothing freed: %v, want ErrClosed", i+1, c.name, err)
			}
		}
		for _, c := range []struct {
			name string
			f    func() error
		}{{"Memory.Free", freed.Free}, {"Stream.Close", closedS.Close}, {"Event.Close", closedEv.Close}} {
			if err := c.f(); err != nil {
				t.Errorf("call %d of %s after the device closed, freed before: %v, want nil", i+1, c.name, err)
			}
		}
	}
}

// TestCopies: host → device → device → host round trips, synchronous and
// on a stream, land byte for byte.
func TestCopies(t *testing.T) {
	d := device(t)
	const n = 1 << 20
	a, b := alloc(t, d, n), alloc(t, d, n)
	want := pattern(n, 1)
	if err := d.CopyHtoD(a.Ptr(), want); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyDtoD(b.Ptr(), a.Ptr(), n); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := d.CopyDtoH(got, b.Ptr()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("synchronous round trip changed the bytes")
	}

	s := stream(t, d)
	want2 := pattern(n, 2)
	if err := s.CopyHtoD(a.Ptr(), want2); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyDtoD(b.Ptr()+100, a.Ptr(), n-200); err != nil {
		t.Fatal(err)
	}
	got2 := make([]byte, n)
	if err := s.CopyDtoH(got2, b.Ptr()); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if done, err := s.Query(); !done || err != nil {
		t.Errorf("Query after Synchronize = %v, %v", done, err)
	}
	model := bytes.Clone(want)
	copy(model[100:n-100], want2[:n-200])
	if !bytes.Equal(got2, model) {
		t.Fatal("stream round trip: bytes differ")
	}
}

// TestCopyBatch: one call enqueues every copy in order (later copies see
// earlier ones), skipping empty ones.
func TestCopyBatch(t *testing.T) {
	d := device(t)
	const n = 64 << 10
	a, b := alloc(t, d, n), alloc(t, d, n)
	src := pattern(n, 3)
	if err := d.CopyHtoD(a.Ptr(), src); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyHtoD(b.Ptr(), make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	s := stream(t, d)
	copies := []Copy{
		{Dst: b.Ptr(), Src: a.Ptr() + 10, Len: 1000},
		{Dst: b.Ptr() + 5000, Src: a.Ptr(), Len: 0},
		{Dst: b.Ptr() + 2000, Src: b.Ptr(), Len: 500}, // reads the first copy's bytes
	}
	if k, err := s.CopyDtoDBatch(copies); k != len(copies) || err != nil {
		t.Fatalf("CopyDtoDBatch = %d, %v", k, err)
	}
	if k, err := s.CopyDtoDBatch(nil); k != 0 || err != nil {
		t.Errorf("CopyDtoDBatch(nil) = %d, %v", k, err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := d.CopyDtoH(got, b.Ptr()); err != nil {
		t.Fatal(err)
	}
	model := make([]byte, n)
	copy(model[0:1000], src[10:1010])
	copy(model[2000:2500], model[0:500])
	if !bytes.Equal(got, model) {
		t.Error("batch copies: bytes differ")
	}
}

func TestAddressRangeAndIPC(t *testing.T) {
	d := device(t)
	m := alloc(t, d, 1<<16)
	base, size, err := d.AddressRange(m.Ptr() + 100)
	if err != nil || base != m.Ptr() || size < m.Len() {
		t.Errorf("AddressRange(base+100) = %#x, %d, %v; want %#x, ≥%d", base, size, err, m.Ptr(), m.Len())
	}
	if _, _, err := d.AddressRange(0x1000); err == nil {
		t.Error("AddressRange(0x1000): no error for an address outside every allocation")
	}
	h, err := d.IPCHandle(m.Ptr())
	if err != nil || h == (IPCHandle{}) {
		t.Errorf("IPCHandle = %v, %v", h, err)
	}
	if _, err := d.IPCHandle(0x1000); err == nil {
		t.Error("IPCHandle(0x1000): no error")
	}
}

// TestPointerDevice: the driver names the device whose memory an address
// is, also asked through another device (with two devices or more).
func TestPointerDevice(t *testing.T) {
	d := device(t)
	m := alloc(t, d, 1<<16)
	if o, err := d.PointerDevice(m.Ptr() + 100); err != nil || o != 0 {
		t.Errorf("PointerDevice(memory of device 0) = %d, %v; want 0", o, err)
	}
	if _, err := d.PointerDevice(0x1000); err == nil {
		t.Error("PointerDevice(0x1000): no error for an address outside every allocation")
	}
	if n, err := DeviceCount(); err != nil || n < 2 {
		t.Logf("one device (%v): not asking through another", err)
		return
	}
	d1, err := OpenDevice(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d1.Close() }) // after m1 is freed
	m1 := alloc(t, d1, 1<<16)
	if o, err := d.PointerDevice(m1.Ptr()); err != nil || o != 1 {
		t.Errorf("PointerDevice(memory of device 1), asked through device 0 = %d, %v; want 1", o, err)
	}
}

func TestRegionAndPool(t *testing.T) {
	d := device(t)
	r, m, err := d.NewRegion(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if r.Kind.String() != "device" || r.Bytes() != nil || r.Len != 1<<20 || r.Base != uintptr(m.Ptr()) || r.Device != 0 {
		t.Errorf("region %+v", r)
	}
	p, pm, err := d.NewPool(4096, 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pm.Close() })
	if p.Len() != 16 || p.Offset(3) != 3*4096 || p.Block(0) != nil || p.Region().Len != 16*4096 {
		t.Errorf("pool: %d blocks, offset(3) %d", p.Len(), p.Offset(3))
	}
	if _, _, err := d.NewPool(0, 4); err == nil {
		t.Error("NewPool(0 bytes): no error")
	}
	if _, _, err := d.NewPool(1<<40, 1<<30); err == nil {
		t.Error("NewPool(overflowing): no error")
	}
	if _, err := d.Alloc(0); err == nil {
		t.Error("Alloc(0): no error")
	}
}

// TestEventFence: a fence recorded after copies fires, on the poller,
// once they landed; OnReady after firing runs at once; many fences from
// many goroutines each fire exactly once.
func TestEventFence(t *testing.T) {
	d := device(t)
	const n = 4 << 20
	a, b := alloc(t, d, n), alloc(t, d, n)
	want := pattern(n, 4)
	if err := d.CopyHtoD(a.Ptr(), want); err != nil {
		t.Fatal(err)
	}
	s := stream(t, d)
	for range 4 {
		if err := s.CopyDtoD(b.Ptr(), a.Ptr(), n); err != nil {
			t.Fatal(err)
		}
	}
	f, err := s.Fence(nil)
	if err != nil {
		t.Fatal(err)
	}
	fired := make(chan error, 2)
	f.OnReady(func(err error) { fired <- err })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if err := <-fired; err != nil {
		t.Fatalf("OnReady(%v)", err)
	}
	got := make([]byte, n)
	if err := d.CopyDtoH(got, b.Ptr()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("fence fired before the copies landed")
	}
	f.OnReady(func(err error) { fired <- err }) // after firing: at once
	select {
	case err := <-fired:
		if err != nil {
			t.Error(err)
		}
	default:
		t.Error("OnReady on a fired fence did not call back at once")
	}
	if ok, err := f.Fired(); !ok || err != nil {
		t.Errorf("Fired() = %v, %v", ok, err)
	}

	// Many fences on many streams, registered from many goroutines.
	const streams, per = 4, 25
	calls := make(chan int, streams*per*2)
	errs := make(chan error, streams)
	for i := range streams {
		go func() {
			s, err := d.NewStream()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			for k := range per {
				if err := s.CopyDtoD(b.Ptr()+DevicePtr(i*4096), a.Ptr(), 4096); err != nil {
					errs <- err
					return
				}
				f, err := s.Fence(nil)
				if err != nil {
					errs <- err
					return
				}
				id := i*per + k
				f.OnReady(func(err error) {
					if err == nil {
						calls <- id
					}
				})
			}
			errs <- s.Synchronize()
		}()
	}
	for range streams {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	seen := make(map[int]int)
	deadline := time.After(30 * time.Second)
	for len(seen) < streams*per {
		select {
		case id := <-calls:
			seen[id]++
		case <-deadline:
			t.Fatalf("%d of %d fences fired", len(seen), streams*per)
		}
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("fence %d fired %d times", id, c)
		}
	}
}
