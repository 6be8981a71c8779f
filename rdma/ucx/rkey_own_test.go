//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
)

// ownSegChildEnv makes the test binary, re-executed, the peer of
// TestKeyNamingTheWritersOwnSegmentIsRefused.
const ownSegChildEnv = "KVXFER_UCX_OWNSEG_CHILD"

// TestOwnSegmentChild is the peer agent, in a process of its own, that
// hands the writer a key whose packed rkey names one of the writer's own
// shared-memory segments. Its protocol, one line each way:
//
//	child:  OWNSEG READY <address hex>
//	parent: FORGE <md> <part hex> <base> <len> <via>
//	child:  OWNSEG KEY <key hex>
//
// then it closes its agent when its stdin closes. With via 1 the part is
// a posix part in procfs mode (/proc/PID/fd/FD of the writer): the child
// opens that file itself and names it by its own /proc/PID/fd/FD.
func TestOwnSegmentChild(t *testing.T) {
	if os.Getenv(ownSegChildEnv) == "" {
		t.Skip("runs only as the own-segment test's child")
	}
	r, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	dst, _, err := r.Alloc(1 << 20) // freed by Close
	if err != nil {
		t.Fatal(err)
	}
	reg, err := r.Register(dst)
	if err != nil {
		t.Fatal(err)
	}
	real, err := parseKey(reg.Remote().Key)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("OWNSEG READY %x\n", r.Address())
	in := bufio.NewScanner(os.Stdin)
	var forged uint64
	for in.Scan() {
		var md, via int
		var part string
		var base, n uint64
		if _, err := fmt.Sscanf(in.Text(), "FORGE %d %s %d %d %d", &md, &part, &base, &n, &via); err != nil {
			t.Fatalf("%q: %v", in.Text(), err)
		}
		p, err := hex.DecodeString(part)
		if err != nil {
			t.Fatal(err)
		}
		if via == 1 {
			seg := binary.LittleEndian.Uint64(p)
			mmid := seg & posixMMIDMask
			f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", mmid&(1<<posixPidBits-1), mmid>>posixPidBits), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			binary.LittleEndian.PutUint64(p, seg&^posixMMIDMask|uint64(os.Getpid())|uint64(f.Fd())<<posixPidBits)
		}
		// The segment's part of this agent's own key replaced by the
		// writer's: a key this agent signs, as any owner can.
		k := real
		// A registration id of its own per key (one this agent will
		// make, for the writer), so that each key's rkey is unpacked.
		forged++
		k.reg = 1<<32 + forged
		partOf(real.rkey, md) // panics when this agent's key has no md part there
		k.rkey = withPart(real.rkey, md, p)
		k.base, k.len = base, n
		fmt.Printf("OWNSEG KEY %x\n", k.encode(r.sign))
	}
}

// TestKeyNamingTheWritersOwnSegmentIsRefused: a peer in another process
// can name in the packed rkey of a key it hands out any shared-memory
// segment of this host, the writer's own among them: its sysv shmid, or
// /proc/PID/fd/FD of the writer's posix file (both visible to every
// process of the user). The checks found the key well formed and inside
// the segment, and UCX attached the writer's own segment and copied the
// write into it: into the writer's pool (another request's pages), or
// into UCX's own FIFO segments of its worker, which crashed the writer
// (SIGSEGV, or "free(): invalid pointer" when its agent closed: found by
// writing through keys with one byte of the real one changed). The write
// must fail with rdma.ErrBadKey and leave the writer's memory as it was.
// Before the fix it completed and overwrote the writer's Alloc'd memory.
func TestKeyNamingTheWritersOwnSegmentIsRefused(t *testing.T) {
	if os.Getenv(ownSegChildEnv) != "" || os.Getenv(rkeyChildEnv) != "" || os.Getenv("UCX_TLS") != "" {
		t.Skip("parent only; sets UCX_TLS itself")
	}
	for _, tls := range rkeyModes {
		t.Run(fmt.Sprintf("tls=%q", tls), func(t *testing.T) {
			var env []string
			if tls != "" {
				t.Setenv("UCX_TLS", tls)
				env = append(env, "UCX_TLS="+tls)
			}
			s, err := New()
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := s.Close(); err != nil {
					t.Error(err)
				}
			}()
			// The writer's own memory, as a node's pool is: Alloc'd.
			own, free, err := s.Alloc(1 << 20)
			if err != nil {
				t.Fatal(err)
			}
			defer free.Close()
			oreg, err := s.Register(own)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Deregister(oreg)
			ok, err := parseKey(oreg.Remote().Key)
			if err != nil {
				t.Fatal(err)
			}
			mds, err := peerMDsOf(workerAddrOf(t, s.Address()))
			if err != nil {
				t.Fatal(err)
			}
			pk, err := validateRkey(ok.rkey, mds)
			if err != nil {
				t.Fatal(err)
			}
			segs := pk.segments()
			if len(segs) != 1 {
				t.Skipf("Alloc's memory here is no shared-memory segment: %x", ok.rkey)
			}
			rdmatest.Pattern(own.Bytes(), 1)
			want := bytes.Clone(own.Bytes())
			srcRegion, err := kvcache.NewHostRegion(4096)
			if err != nil {
				t.Fatal(err)
			}
			defer srcRegion.Close()
			rdmatest.Pattern(srcRegion.Bytes(), 2)
			src, err := s.RegisterSource(srcRegion)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Deregister(src)

			c := rdmatest.StartChild(t, "TestOwnSegmentChild", append(env, ownSegChildEnv+"=1")...)
			addr, err := hex.DecodeString(strings.TrimPrefix(c.Expect(t, "OWNSEG READY "), "OWNSEG READY "))
			if err != nil {
				t.Fatal(err)
			}
			ep, err := s.Connect(addr)
			if err != nil {
				t.Fatal(err)
			}
			// A posix segment is named by the writer's own /proc/PID/fd/FD,
			// then by the peer's, on the file it opened through the
			// writer's.
			vias := []int{0}
			if segs[0].kind == mdPosix && segs[0].seg&posixProcfs != 0 {
				vias = append(vias, 1)
			}
			how := []string{"named directly", "named by the peer's /proc/PID/fd/FD on the file it opened through the writer's"}
			for _, via := range vias {
				c.Send(t, fmt.Sprintf("FORGE %d %x %d %d %d", segs[0].md, partOf(ok.rkey, segs[0].md), own.Base, own.Len, via))
				key, err := hex.DecodeString(strings.TrimPrefix(c.Expect(t, "OWNSEG KEY "), "OWNSEG KEY "))
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				err = ep.Post(rdma.Batch{Src: src, Dst: rdma.RemoteRegion{Key: key, Len: own.Len},
					Segments: []kvcache.Segment{{Src: 0, Dst: 0, Len: 4096}}, Done: func(err error) { done <- err }})
				if err == nil {
					err = rdmatest.Recv(t, done, "the write's Done")
				}
				if i := rdmatest.FirstDiff(own.Bytes(), want); i >= 0 {
					t.Errorf("a peer's key naming the writer's own %s (%s) sent the write there: byte %d of the writer's memory changed", segs[0], how[via], i)
					copy(own.Bytes(), want)
				}
				if !errors.Is(err, rdma.ErrBadKey) || !errors.Is(err, errBadRkey) {
					t.Errorf("write through a peer's key naming the writer's own %s (%s): %v, want rdma.ErrBadKey from the rkey checks", segs[0], how[via], err)
				} else {
					t.Log(err)
				}
			}
			if err := ep.Close(); err != nil {
				t.Error(err)
			}
			c.Wait(t)
		})
	}
}

// workerAddrOf is the UCP worker address in an agent address.
func workerAddrOf(t *testing.T, addr []byte) []byte {
	t.Helper()
	pa, err := parseAddress(addr)
	if err != nil {
		t.Fatal(err)
	}
	return pa.worker
}
