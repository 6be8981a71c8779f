package pidwatch_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/internal/pidwatch/pidwatchtest"
)

func TestMain(m *testing.M) {
	pidwatchtest.MaybeChild()
	os.Exit(m.Run())
}

// sharedFile creates a file of 64 KiB on tmpfs where there is one (a
// file system without overlay, so that stat and /proc/<pid>/maps name it
// by the same device and inode) and returns its path.
func sharedFile(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "pidwatch-test-")
		if err == nil {
			dir = d
			t.Cleanup(func() { _ = os.RemoveAll(d) })
		}
	}
	path := filepath.Join(dir, "pool")
	if err := os.WriteFile(path, make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// mapFile maps path into this process (shared or private) and returns
// the mapping.
func mapFile(t *testing.T, path string, flags int) []byte {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// BackingFile names the file of a shared mapping by the device and inode
// stat gives; private and anonymous memory have none.
func TestBackingFile(t *testing.T) {
	path := sharedFile(t)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	want := pidwatch.File{Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev), Ino: st.Ino}
	shared := mapFile(t, path, unix.MAP_SHARED)
	got, err := pidwatch.BackingFile(uintptr(unsafe.Pointer(&shared[100])))
	if err != nil || got != want {
		t.Fatalf("BackingFile of a shared mapping of %s: %v, %v; want %v", path, got, err, want)
	}
	private := mapFile(t, path, unix.MAP_PRIVATE)
	heap := make([]byte, 1<<20)
	for name, b := range map[string][]byte{"private mapping": private, "heap": heap} {
		if f, err := pidwatch.BackingFile(uintptr(unsafe.Pointer(&b[0]))); !errors.Is(err, pidwatch.ErrAnonymous) {
			t.Errorf("BackingFile of %s: %v, %v; want ErrAnonymous", name, f, err)
		}
	}
}

// MapsShared tells a process that maps the file from one that does not,
// and refuses to conclude anything about a process that has exited.
func TestMapsShared(t *testing.T) {
	path := sharedFile(t)
	mine := mapFile(t, path, unix.MAP_SHARED)
	file, err := pidwatch.BackingFile(uintptr(unsafe.Pointer(&mine[0])))
	if err != nil {
		t.Fatal(err)
	}
	w := pidwatch.New()
	defer w.Close()
	mapper, mp := pidwatchtest.Mapper(t, path)
	_, ip := pidwatchtest.Idle(t)
	gone := make(chan struct{})
	mproc, err := w.Watch(mp, func() { close(gone) })
	if err != nil {
		t.Fatal(err)
	}
	iproc, err := w.Watch(ip, func() {})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := mproc.MapsShared(file); !ok || err != nil {
		t.Fatalf("a process that maps the file: %v, %v", ok, err)
	}
	if ok, err := iproc.MapsShared(file); ok || err != nil {
		t.Fatalf("a process that does not map the file: %v, %v", ok, err)
	}
	other := file
	other.Ino++
	if ok, err := mproc.MapsShared(other); ok || err != nil {
		t.Fatalf("another inode: %v, %v", ok, err)
	}
	if err := mapper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(time.Minute):
		t.Fatal("the mapper's exit was not reported within a minute")
	}
	if ok, err := mproc.MapsShared(file); ok || !errors.Is(err, pidwatch.ErrExited) {
		t.Fatalf("after the mapper exited: %v, %v; want ErrExited", ok, err)
	}
}
