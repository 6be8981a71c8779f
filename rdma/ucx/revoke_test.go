//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// outcomeWait bounds a wait for an outcome that should come at once.
const outcomeWait = 10 * time.Second

// anonMem maps n bytes of anonymous memory, faulted in, unmapped at cleanup.
func anonMem(tb testing.TB, n int) []byte {
	tb.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_POPULATE)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// rxMemory is n bytes of rx's memory, mapped: UCX's own (memAlloc) when
// alloc, else anonymous memory mapped with memMap.
func rxMemory(t *testing.T, rx *rawUCP, n uint64, alloc bool) (rawMemh, []byte) {
	t.Helper()
	var m rawMemh
	var dst []byte
	var err error
	if alloc {
		m, dst, err = rx.memAlloc(n)
	} else {
		dst = anonMem(t, int(n))
		m, err = rx.memMap(addrOf(dst), n)
	}
	if err != nil {
		t.Fatal(err)
	}
	return m, dst
}

// BenchmarkRegistrationWindow measures a registration per request window:
// ucp_mem_map of memory the pool already has, ucp_rkey_pack (the key sent
// with the request) and ucp_mem_unmap (the revocation), per request, for a
// small (2 MiB) and a large (256 MiB) window, against the pool's one-time
// registration (the same three calls on a 1 GiB pool, once per pool).
// Configurations: UCX's default transports with its registration cache
// (UCX_RCACHE_ENABLE=try), without it (what a revocation that is to be
// proof needs), and tcp alone.
//
// This machine has no RDMA device: the memory domains here (tcp, cma,
// posix, sysv, self) pin nothing, so the figures are UCX's bookkeeping
// only. With an InfiniBand or RoCE device ucp_mem_map also registers with
// the NIC (ibv_reg_mr: pins every page) — measure there before deciding.
func BenchmarkRegistrationWindow(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const pool = 1 << 30
	mem := anonMem(b, pool)
	base := addrOf(mem)
	agent := configMods(defaultOptions(), os.Getenv) // as the agent's contexts
	for _, cfg := range []struct{ name, mods string }{
		{"default", ""},
		{"default-norcache", "RCACHE_ENABLE=n"},
		{"tcp", "TLS=tcp"},
	} {
		u, err := openRawUCP(agent + "\n" + cfg.mods)
		if err != nil {
			b.Fatal(err)
		}
		for _, w := range []struct {
			name string
			n    uint64
		}{{"window=2MiB", 2 << 20}, {"window=256MiB", 256 << 20}, {"pool=1GiB", pool}} {
			b.Run(cfg.name+"/"+w.name, func(b *testing.B) {
				// Windows move through the pool, as requests' blocks do.
				slots := uint64(pool) / w.n
				var keyLen int
				for i := 0; i < b.N; i++ {
					off := (uint64(i) % slots) * w.n
					if keyLen, err = u.window(base+uintptr(off), w.n); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "µs/request")
				b.ReportMetric(float64(keyLen), "rkey-bytes")
			})
		}
		u.close()
	}
}

// staleResult is what one stale-rkey probe saw.
type staleResult struct {
	lanes    string // the writer endpoint's lanes (ucp_ep_print_info)
	before   bool   // a put with the live rkey landed (the probe works)
	postErr  string // ucp_put_nbx's error with the stale rkey
	flushErr string // the flush's error after it
	epErr    string // an endpoint error reported meanwhile
	landed   bool   // the stale put's bytes reached the receiver's memory
	// fresh: the same, with the stale packed rkey unpacked only after the
	// unmap (a writer that learns the key late).
	freshErr    string
	freshLanded bool
}

// probeStaleRkey registers receiver memory (existing memory, as the pool's),
// lets a writer unpack its rkey and put once, unmaps the registration
// (ucp_mem_unmap), then has the writer put again with the old rkey, and
// reports whether those bytes reach the receiver's memory. Both workers
// live in this process (two UCP contexts; UCX connects them as it connects
// two processes of one host, with mods' UCX_TLS) and are progressed here.
func probeStaleRkey(t *testing.T, mods string) staleResult {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const n = 1 << 20 // large enough for the zero-copy (cma) lanes
	var res staleResult
	rx, err := openRawUCP(mods)
	if err != nil {
		t.Fatal(err)
	}
	defer rx.close()
	tx, err := openRawUCP(mods)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.close()
	dst := anonMem(t, n)
	src := anonMem(t, n)

	m, err := rx.memMap(addrOf(dst), n)
	if err != nil {
		t.Fatal(err)
	}
	mapped := true
	defer func() { // before the contexts close (deferred earlier)
		if mapped {
			rx.memUnmap(m)
		}
	}()
	ep, rk, packed := reach(t, tx, rx, m)
	defer tx.closeEP(ep, rx)
	const limit = 10 * time.Second
	fill := func(v byte) {
		for i := range src {
			src[i] = v
		}
	}
	fill(0x11)
	if err := tx.put(ep, rk, addrOf(src), addrOf(dst), n); err != nil {
		t.Fatalf("put with the live rkey: %v", err)
	}
	if err := tx.flush(ep, limit, rx); err != nil {
		t.Fatalf("flush of the live put: %v", err)
	}
	res.before = bytes.Equal(dst, src)
	res.lanes = tx.info(ep)

	rx.memUnmap(m) // the revocation under test
	mapped = false

	fill(0x22)
	if err := tx.put(ep, rk, addrOf(src), addrOf(dst), n); err != nil {
		res.postErr = err.Error()
	} else if err := tx.flush(ep, limit, rx); err != nil {
		res.flushErr = err.Error()
	}
	res.epErr = ep.errText()
	res.landed = bytes.Equal(dst, src)

	// A writer that unpacks the stale key only now.
	if ep.err == ucsOK {
		fill(0x33)
		if rk2, err := tx.unpack(ep, packed); err != nil {
			res.freshErr = err.Error()
		} else if err := tx.put(ep, rk2, addrOf(src), addrOf(dst), n); err != nil {
			res.freshErr = err.Error()
		} else if err := tx.flush(ep, limit, rx); err != nil {
			res.freshErr = err.Error()
		}
		res.freshLanded = bytes.Equal(dst, src)
	}
	return res
}

// laneLines keeps the lane lines of ucp_ep_print_info: each lane's
// transport and what it is used for (am, rma, rma_bw, …).
func laneLines(info string) string {
	var out []string
	for _, l := range strings.Split(info, "\n") {
		if strings.Contains(l, "lane[") {
			out = append(out, strings.TrimSpace(strings.TrimLeft(l, "# ")))
		}
	}
	return strings.Join(out, "; ")
}

// TestStaleRkeyPut: does a put with an rkey whose registration the receiver
// unmapped (ucp_mem_unmap) still land, per transport available without an
// RDMA device? docs/membership.md §4 needs the answer: only where it fails
// is unmapping a registration a proof that a late write cannot land. The
// expected outcomes are what UCX 1.13 did here: every one lands, before
// or after the writer unpacks the key, with no error anywhere — every put
// here is software RMA, applied by the receiver's own worker, which checks
// no registration. A UCX that changes that fails the test, and the
// document must change with it.
func TestStaleRkeyPut(t *testing.T) {
	if os.Getenv("UCX_TLS") != "" {
		t.Skip("sets UCX_TLS itself")
	}
	for _, c := range []struct {
		name, tls  string
		wantLanded bool
	}{
		{"tcp", "tcp", true},
		{"posix", "posix", true},
		{"sysv", "sysv", true},
		{"cma+posix", "cma,posix", true},
		{"cma+tcp", "cma,tcp", true},
		{"default", "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The agent's own settings (shared memory with peer
			// error handling, as its endpoints need), then UCX_TLS.
			mods := configMods(defaultOptions(), os.Getenv)
			if c.tls != "" {
				mods += "\nTLS=" + c.tls
			}
			r := probeStaleRkey(t, mods)
			t.Logf("UCX_TLS=%q lanes: %s", c.tls, laneLines(r.lanes))
			t.Logf("stale put: post error %q, flush error %q, endpoint error %q, landed %v; unpacked after the unmap: error %q, landed %v",
				r.postErr, r.flushErr, r.epErr, r.landed, r.freshErr, r.freshLanded)
			if !r.before {
				t.Fatal("the put with the live rkey did not land: the probe proves nothing")
			}
			// None of these has an RMA lane in UCX 1.13: cma has only
			// zero-copy puts, which its RMA lane selection does not take,
			// so ucp_put_nbx goes as software RMA over active messages
			// and the receiver's worker writes the bytes.
			if lanes := laneLines(r.lanes); strings.Contains(lanes, "rma") {
				t.Errorf("UCX_TLS=%q now has an RMA lane (%s): re-check what revoking its registration does", c.tls, lanes)
			}
			if r.landed != c.wantLanded {
				t.Errorf("UCX_TLS=%q: a put with an unmapped registration's rkey landed=%v, want %v (update docs/membership.md §4)", c.tls, r.landed, c.wantLanded)
			}
		})
	}
}

// TestSharedMemoryPutWhoCopies: between two workers of one host whose
// endpoints have no RMA lane (UCX 1.13 with this backend's settings:
// TestStaleRkeyPut), who copies a put's bytes into the receiver's memory?
// The writer posts and progresses only its own worker; the bytes are
// checked before the receiver's worker progresses, then the receiver alone
// progresses (as after the writer stopped or died) until they land.
//
//   - alloc: memory from UCP_MEM_MAP_ALLOCATE (Agent.Alloc, what node
//     uses for ucx pools): the rkey names UCX's shared segment, the writer
//     maps it and copies itself — the bytes are there at once. The writer's
//     exit ends its writes (the pidfd proof holds), and a stale rkey reaches
//     the segment for as long as the writer keeps its mapping.
//   - mapped: existing memory registered with ucp_mem_map (Agent.Register
//     of other host memory, or a per-window registration): software RMA,
//     the receiver's worker copies when it progresses. Bytes a writer
//     queued before it died are applied after its exit, as over tcp.
//
// The expected outcomes are what UCX 1.13 did here; a UCX that does
// otherwise fails the test, and docs/membership.md §4 must change with it.
func TestSharedMemoryPutWhoCopies(t *testing.T) {
	if os.Getenv("UCX_TLS") != "" {
		t.Skip("sets UCX_TLS itself")
	}
	for _, tls := range []string{"", "posix", "sysv"} {
		for _, alloc := range []bool{true, false} {
			name := map[bool]string{true: "alloc", false: "mapped"}[alloc]
			t.Run(fmt.Sprintf("tls=%q/%s", tls, name), func(t *testing.T) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				mods := configMods(defaultOptions(), os.Getenv)
				if tls != "" {
					mods += "\nTLS=" + tls
				}
				const n = 64 << 10
				rx, err := openRawUCP(mods)
				if err != nil {
					t.Fatal(err)
				}
				defer rx.close()
				tx, err := openRawUCP(mods)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.close()
				m, dst := rxMemory(t, rx, n, alloc)
				defer rx.memUnmap(m)
				ep, rk, _ := reach(t, tx, rx, m)
				defer tx.closeEP(ep, rx)
				src := anonMem(t, n)
				put := func(v byte) {
					for i := range src {
						src[i] = v
					}
					if err := tx.put(ep, rk, addrOf(src), addrOf(dst), n); err != nil {
						t.Fatal(err)
					}
				}
				put(0x11) // wires the endpoint up
				if err := tx.flush(ep, 10*time.Second, rx); err != nil || !bytes.Equal(dst, src) {
					t.Fatalf("first put: flush %v, landed %v", err, bytes.Equal(dst, src))
				}
				put(0x22)
				for range 1000 { // the writer's side only
					tx.progress(ep)
				}
				early := bytes.Equal(dst, src)
				// Now the receiver alone progresses, as after the
				// writer stopped (or died): do the bytes land?
				late := early
				for deadline := time.Now().Add(outcomeWait); !late && time.Now().Before(deadline); {
					rx.progress()
					late = bytes.Equal(dst, src)
				}
				if !late {
					t.Errorf("%s memory: the put did not land while only the receiver progressed", name)
				}
				if err := tx.flush(ep, 10*time.Second, rx); err != nil || !bytes.Equal(dst, src) {
					t.Fatalf("second put: flush %v, landed %v", err, bytes.Equal(dst, src))
				}
				t.Logf("lanes: %s; landed before the receiver progressed: %v", laneLines(tx.info(ep)), early)
				if early != alloc {
					t.Errorf("%s memory: landed before the receiver progressed = %v, want %v (update docs/membership.md §4)", name, early, alloc)
				}
			})
		}
	}
}

// reach packs the rkey of rx's memory m, connects tx to rx and unpacks the
// rkey on that endpoint, and returns the endpoint, the rkey and the packed
// rkey; the caller closes the endpoint (tx.closeEP(ep, rx)) before either
// context.
func reach(t *testing.T, tx, rx *rawUCP, m rawMemh) (*rawEP, rawRkey, []byte) {
	t.Helper()
	packed, err := rx.rkeyPack(m)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := tx.connect(rx.address())
	if err != nil {
		t.Fatal(err)
	}
	rk, err := tx.unpack(ep, packed)
	if err != nil {
		tx.closeEP(ep, rx)
		t.Fatal(err)
	}
	return ep, rk, packed
}
