//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/rdma"
)

// TestRkeyOfLiveContexts: the rkeys this host's UCX packs validate against
// their worker's address, in the transport modes where memory comes from
// a shared-memory segment (default: sysv; posix) and where it does not;
// their segments probe, hold the allocation and nothing beyond it; and the
// checked unpack (rawUCP.unpack) leaves a put working.
func TestRkeyOfLiveContexts(t *testing.T) {
	if os.Getenv("UCX_TLS") != "" {
		t.Skip("sets UCX_TLS itself")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, c := range []struct {
		tls     string
		segment mdKind // what an allocation's rkey names
	}{
		{"", mdSysv}, {"sysv", mdSysv}, {"posix", mdPosix}, {"cma,posix", mdPosix}, {"tcp", 0},
	} {
		for _, alloc := range []bool{true, false} {
			t.Run(fmt.Sprintf("tls=%q/alloc=%v", c.tls, alloc), func(t *testing.T) {
				mods := configMods(defaultOptions(), os.Getenv)
				if c.tls != "" {
					mods += "\nTLS=" + c.tls
				}
				rx, err := openRawUCP(mods)
				if err != nil {
					t.Skipf("UCX_TLS=%q: %v", c.tls, err)
				}
				defer rx.close()
				tx, err := openRawUCP(mods)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.close()
				const n = 1 << 20
				m, dst := rxMemory(t, rx, n, alloc)
				defer rx.memUnmap(m)
				packed, err := rx.rkeyPack(m)
				if err != nil {
					t.Fatal(err)
				}
				peer, err := peerMDsOf(rx.address())
				if err != nil {
					t.Fatal(err)
				}
				base := uint64(addrOf(dst))
				pk, err := checkPackedRkey(peer, packed, base, n)
				if err != nil {
					t.Fatalf("%x: %v", packed, err)
				}
				segs := pk.segments()
				want := 0
				if alloc && c.segment != 0 {
					want = 1
				}
				if len(segs) != want || (want == 1 && segs[0].kind != c.segment) {
					t.Fatalf("%x: segments %v, want %d of %s", packed, segs, want, c.segment)
				}
				bounds, release, err := pk.probeSegments()
				if err != nil {
					t.Fatal(err)
				}
				release()
				if err := within(bounds, base, n); err != nil {
					t.Fatal(err)
				}
				if want == 1 {
					t.Logf("%s: bound %d bytes", segs[0], bounds[0].size)
					// Beyond the segment, by a byte, a page or far.
					for _, r := range [][2]uint64{{base + bounds[0].size, 1}, {base - 4096, n}, {base + 4096, bounds[0].size}, {base + 1<<40, n}} {
						if err := within(bounds, r[0], r[1]); !errors.Is(err, errBadRkey) || !errors.Is(err, rdma.ErrBadKey) {
							t.Errorf("[%#x, +%d): %v", r[0], r[1], err)
						}
					}
				}
				// The checked unpack, and a put with it.
				ep, rk, _ := reach(t, tx, rx, m)
				defer tx.closeEP(ep, rx)
				src := anonMem(t, n)
				src[12345] = 42
				if err := tx.put(ep, rk, addrOf(src), addrOf(dst), n); err != nil {
					t.Fatal(err)
				}
				if err := tx.flush(ep, 10*time.Second, rx); err != nil {
					t.Fatal(err)
				}
				for range 100 {
					rx.progress()
				}
				if !bytes.Equal(src, dst) {
					t.Fatal("the put did not land")
				}
			})
		}
	}
}

// TestProbeSegments: a segment that UCX would fail to attach, or one that
// is not what UCX maps, is refused before ucp_ep_rkey_unpack sees it.
func TestProbeSegments(t *testing.T) {
	def := peerOf(t, defaultAddr) // md 2 sysv, md 3 posix
	const addr = 0x7f0000000000
	probe := func(b []byte) ([]segBound, error) {
		t.Helper()
		pk, err := validateRkey(b, def)
		if err != nil {
			t.Fatalf("%x: %v", b, err)
		}
		bounds, release, err := pk.probeSegments()
		release()
		return bounds, err
	}
	refused := func(what string, b []byte, want string) {
		t.Helper()
		_, err := probe(b)
		if !errors.Is(err, errBadRkey) || !errors.Is(err, rdma.ErrBadKey) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want errBadRkey saying %q", what, err, want)
		}
	}

	// sysv: a live segment, then the same once removed.
	id, err := unix.SysvShmGet(unix.IPC_PRIVATE, 3*4096, unix.IPC_CREAT|0o600)
	if err != nil {
		t.Skipf("no sysv shared memory here: %v", err)
	}
	bounds, err := probe(rkey(0, 2, sysvPart(uint32(id), addr)))
	if err != nil || len(bounds) != 1 || bounds[0].size != 3*4096 {
		t.Errorf("live sysv segment: %v, %v", bounds, err)
	}
	// Held by the probe, a segment its owner removes can still be attached,
	// as UCX attaches it after the probe.
	pk, err := validateRkey(rkey(0, 2, sysvPart(uint32(id), addr)), def)
	if err != nil {
		t.Fatal(err)
	}
	_, release, err := pk.probeSegments()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := unix.SysvShmAttach(id, 0, 0); err != nil {
		t.Errorf("attach of a removed segment the probe holds: %v", err)
	} else {
		unix.SysvShmDetach(b)
	}
	release()
	refused("removed sysv segment", rkey(0, 2, sysvPart(uint32(id), addr)), "shmat")
	refused("sysv shmid never made", rkey(0, 2, sysvPart(0x7fffffff, addr)), "shmat")

	// posix, through this process's own fds (procfs mode, as UCX packs).
	pid := uint64(os.Getpid())
	procfs := func(fd int, n uint64) []byte {
		return rkey(0, 3, posixPart(posixProcfs|posixShmOpen|pid|uint64(fd)<<posixPidBits, addr, n))
	}
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "segment"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(5000); err != nil {
		t.Fatal(err)
	}
	bounds, err = probe(procfs(int(f.Fd()), 8192))
	if err != nil || len(bounds) != 1 || bounds[0].size != 5000 {
		t.Errorf("posix file of 5000 bytes mapped for 8192: %v, %v (want its size as the bound)", bounds, err)
	}
	bounds, err = probe(procfs(int(f.Fd()), 4096))
	if err != nil || len(bounds) != 1 || bounds[0].size != 4096 {
		t.Errorf("posix file of 5000 bytes mapped for 4096: %v, %v", bounds, err)
	}
	refused("posix fd not open", procfs(1<<20, 4096), "stat")
	empty, err := os.Create(filepath.Join(dir, "empty"))
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	refused("empty posix file", procfs(int(empty.Fd()), 4096), "with data")
	null, err := os.OpenFile("/dev/null", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	refused("device", procfs(int(null.Fd()), 4096), "not a regular file")
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	refused("directory", procfs(int(d.Fd()), 4096), "not a regular file")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ff, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ff.Close()
	refused("fifo", procfs(int(ff.Fd()), 4096), "not a regular file")
	refused("mapping of 2^60 bytes", procfs(int(f.Fd()), 1<<60), "mapping of")

	// posix outside procfs mode: the directory the part carries.
	if err := os.WriteFile(filepath.Join(dir, "ucx_shm_posix_1234"), make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	bounds, err = probe(rkey(0, 3, posixPart(0x1234, addr, 8192, append([]byte(dir), 0)...)))
	if err != nil || bounds[0].size != 8192 {
		t.Errorf("posix file in a directory: %v, %v", bounds, err)
	}
	refused("posix file not in the directory", rkey(0, 3, posixPart(0x1235, addr, 8192, append([]byte(dir), 0)...)), "stat")
	refused("posix shm_open name not there", rkey(0, 3, posixPart(posixShmOpen|0x7ffffffe, addr, 8192)), "ucx_shm_posix_7ffffffe")
}
