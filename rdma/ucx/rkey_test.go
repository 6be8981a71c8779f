package ucx

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/rdma"
)

// realRkeys are packed rkeys that UCX 1.13.1 (Debian's libucx0) packed
// with ucp_rkey_pack on a host with self, tcp, sysv, posix and cma, beside
// the address of the worker whose context packed them: of memory from
// UCP_MEM_MAP_ALLOCATE (Agent.Alloc: a sysv segment by default, a posix
// one under UCX_TLS=posix) and of existing memory (ucp_mem_map). The cgo
// tests check live ones too (TestRkeyOfLiveContexts).
var realRkeys = []struct {
	name, addr, rkey string
	segment          mdKind // the kind of segment it names, if any
}{
	{"default alloc", defaultAddr, "17000000000000000000000c3980b70200e0d725e57f000000", mdSysv},
	{"default mapped", defaultAddr, "130000000000000000000000", 0},
	{"posix alloc", posixAddr, "01000000000000000018f2080000050000c000a02526e57f00000000010000000000", mdPosix},
	{"posix mapped", posixAddr, "000000000000000000", 0},
	{"tcp", tcpAddr, "01000000000000000000", 0},
	// The same host's addresses in the v2 format name the same memory
	// domains.
	{"default alloc, v2 address", realWorkerAddresses["default v2"], "17000000000000000000000c3980b70200e0d725e57f000000", mdSysv},
}

const (
	defaultAddr = "205e75db06c9dd3e622000637577cc2b3200f8d74f00000000004f0300881fa1ee691fadbe01211201025d6c2083d44816b8f9ffffef00000000cf1917b75138539e3e4bd7e037370113230082e32f21060002c0000202cf1917b751389763344bd7e037370013230082b28d42085d6c2083d44816388d5377cc2b32004c3e5077ccab33004f2300883780b7020000000043085d6c2083d4481638a7d377cc2b32004c3e5077ccab33004f230088f2080000050000c024885d6c2083d4481638478bbd37063600242e5077ccab330092210084f2080000"
	posixAddr   = "20b10a681ebf881ea240885d6c2083d4481638a7d377cc2b32004c3e5077ccab33004f230088f20800c0030000c0"
	tcpAddr     = "205c991fb824a94ae9201201025d6c2083d44816b8f9ffffef00000000cf1917b75138539e3e4bd7e037370113230082b33320860002c0000202cf1917b751389763344bd7e037370013230082c9d7"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func peerOf(t testing.TB, addr string) *peerMDs {
	t.Helper()
	p, err := peerMDsOf(unhex(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func rkeyRefused(t *testing.T, what string, b []byte, peer *peerMDs) error {
	t.Helper()
	_, err := validateRkey(b, peer)
	if !errors.Is(err, errBadRkey) || !errors.Is(err, rdma.ErrBadKey) {
		t.Fatalf("%s (%x): err = %v, want errBadRkey and rdma.ErrBadKey", what, b, err)
	}
	return err
}

func TestRkeyReal(t *testing.T) {
	for _, c := range realRkeys {
		pk, err := validateRkey(unhex(t, c.rkey), peerOf(t, c.addr))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		segs := pk.segments()
		switch {
		case c.segment == 0 && len(segs) != 0:
			t.Errorf("%s: segments %v", c.name, segs)
		case c.segment != 0 && (len(segs) != 1 || segs[0].kind != c.segment):
			t.Errorf("%s: segments %v, want one %s segment", c.name, segs, c.segment)
		}
	}
	// What the default one says.
	pk, _ := validateRkey(unhex(t, realRkeys[0].rkey), peerOf(t, defaultAddr))
	s := pk.segments()[0]
	if s.md != 2 || s.shmid != 0x02b78039 || s.addr != 0x7fe525d7e000 {
		t.Errorf("sysv segment %+v", s)
	}
	pk, _ = validateRkey(unhex(t, realRkeys[2].rkey), peerOf(t, posixAddr))
	s = pk.segments()[0]
	if s.path != "/proc/2290/fd/20" || s.addr != 0x7fe52625a000 || s.len != 1<<16 {
		t.Errorf("posix segment %+v", s)
	}
}

func TestRkeyTransports(t *testing.T) {
	if len(rkeyTransports) != 10 {
		t.Fatalf("%d transports: two names share a checksum", len(rkeyTransports))
	}
}

func TestRkeyTruncated(t *testing.T) {
	for _, c := range realRkeys {
		b, peer := unhex(t, c.rkey), peerOf(t, c.addr)
		for n := range len(b) {
			rkeyRefused(t, c.name+" truncated", b[:n], peer)
		}
		rkeyRefused(t, c.name+" extended", append(bytes.Clone(b), 0), peer)
	}
}

// rkey builds a packed rkey: md_map from the parts' md indexes.
func rkey(memType byte, parts ...any) []byte {
	var mdMap uint64
	var body []byte
	for i := 0; i < len(parts); i += 2 {
		mdMap |= 1 << parts[i].(int)
		p := parts[i+1].([]byte)
		body = append(body, byte(len(p)))
		body = append(body, p...)
	}
	b := binary.LittleEndian.AppendUint64(nil, mdMap)
	return append(append(b, memType), body...)
}

func sysvPart(shmid uint32, addr uint64) []byte {
	return binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(nil, shmid), addr)
}

func posixPart(seg, addr, n uint64, extra ...byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, seg)
	b = binary.LittleEndian.AppendUint64(b, addr)
	b = binary.LittleEndian.AppendUint64(b, n)
	return append(b, extra...)
}

// procfsSeg is a procfs-mode segment id (pid 1234, fd 7).
const procfsSeg = posixProcfs | posixShmOpen | 1234 | 7<<posixPidBits

func TestRkeyMalformed(t *testing.T) {
	def := peerOf(t, defaultAddr) // md 0 self, 1 tcp, 2 sysv, 3 posix, 4 cma
	const addr = 0x7f0000000000
	// What ucp_rkey_pack packs on that host: accepted.
	for _, ok := range [][]byte{
		rkey(0, 0, []byte{}, 1, []byte{}, 2, sysvPart(5, addr), 4, []byte{}),
		rkey(0, 3, posixPart(procfsSeg, addr, 4096)),
		rkey(0, 3, posixPart(procfsSeg|posixPidNS, addr, 4096, 1, 2, 3, 4, 5, 6, 7, 8)),
		rkey(0, 3, posixPart(posixShmOpen|0x1234, addr, 4096)),
		rkey(0, 3, posixPart(0x1234, addr, 4096, []byte("/shm/x\x00")...)),
		rkey(1, 1, []byte{}),        // cuda memory
		rkey(0),                     // no md registered it
		rkey(0, 9, []byte{1, 2, 3}), // an md the address does not name: framing only
	} {
		if _, err := validateRkey(ok, def); err != nil {
			t.Errorf("%x: %v", ok, err)
		}
	}
	for _, c := range []struct {
		what string
		b    []byte
		want string // in the error
	}{
		{"memory type 5", rkey(5, 1, []byte{}), "memory type 5"},
		{"memory type 255", rkey(255, 1, []byte{}), "memory type"},
		// Bad md maps: parts the map promises and the bytes lack, or the
		// other way round.
		{"md map beyond the parts", append(rkey(0, 1, []byte{}), 0), "bytes after"},
		{"md map with a missing part", func() []byte {
			b := rkey(0, 1, []byte{})
			b[0] |= 1 << 4
			return b
		}(), "runs past the end"},
		{"every md", func() []byte {
			b := rkey(0, 1, []byte{})
			binary.LittleEndian.PutUint64(b, ^uint64(0))
			return b
		}(), "runs past the end"},
		// Bad lengths: a known part at another size than its
		// component's reads.
		{"sysv part of 0 bytes", rkey(0, 2, []byte{}, 4, []byte{}), "md 2 (sysv) part of 0 bytes"},
		{"sysv part of 11 bytes", rkey(0, 2, sysvPart(5, addr)[:11]), "want 12"},
		{"sysv part of 13 bytes", rkey(0, 2, append(sysvPart(5, addr), 0)), "want 12"},
		{"rkey-less part of 1 byte", rkey(0, 4, []byte{0}), "md 4 (rkey-less)"},
		{"posix part of 23 bytes", rkey(0, 3, posixPart(procfsSeg, addr, 4096)[:23]), "want at least 24"},
		{"posix procfs with extra bytes", rkey(0, 3, posixPart(procfsSeg, addr, 4096, 0)), "wants 0 bytes"},
		{"posix pid namespace without its bytes", rkey(0, 3, posixPart(procfsSeg|posixPidNS, addr, 4096)), "wants 8 bytes"},
		{"posix shm_open with extra bytes", rkey(0, 3, posixPart(posixShmOpen|1, addr, 4096, 0)), "wants nothing"},
		{"posix directory without its NUL", rkey(0, 3, posixPart(1, addr, 4096, []byte("/shm")...)), "NUL-terminated"},
		{"posix directory with an early NUL", rkey(0, 3, posixPart(1, addr, 4096, []byte("/shm\x00x\x00")...)), "NUL-terminated"},
		{"posix directory empty", rkey(0, 3, posixPart(1, addr, 4096, 0)), "NUL-terminated"},
		{"posix directory, no bytes", rkey(0, 3, posixPart(1, addr, 4096)), "NUL-terminated"},
		{"posix pid namespace outside procfs", rkey(0, 3, posixPart(posixPidNS|posixShmOpen|1, addr, 4096)), "outside procfs"},
		{"posix huge pages", rkey(0, 3, posixPart(procfsSeg|posixHugetlb, addr, 4096)), "huge pages"},
		{"posix pid 0", rkey(0, 3, posixPart(posixProcfs|7<<posixPidBits, addr, 4096)), "pid 0"},
		{"posix mmid beyond rand_r", rkey(0, 3, posixPart(posixShmOpen|1<<40, addr, 4096)), "mmid above"},
		{"posix length 0", rkey(0, 3, posixPart(procfsSeg, addr, 0)), "segment ["},
		{"posix segment wraps", rkey(0, 3, posixPart(procfsSeg, ^uint64(0)-10, 4096)), "segment ["},
		{"posix address 0", rkey(0, 3, posixPart(procfsSeg, 0, 4096)), "segment ["},
		{"sysv shmid negative", rkey(0, 2, sysvPart(1<<31, addr)), "not an int"},
		{"sysv address 0", rkey(0, 2, sysvPart(5, 0)), "address 0"},
		// A part of the other kind than the address says.
		{"posix part where the address says sysv", rkey(0, 2, posixPart(procfsSeg, addr, 4096)), "want 12"},
		{"sysv part where the address says posix", rkey(0, 3, sysvPart(5, addr)), "want at least 24"},
		{"a size byte past the end", []byte{4, 0, 0, 0, 0, 0, 0, 0, 0, 12, 1, 2}, "runs past the end"},
		{"empty", nil, "header"},
	} {
		err := rkeyRefused(t, c.what, c.b, def)
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want it to say %q", c.what, err, c.want)
		}
	}
}

// TestRkeyMixedMemoryDomain: an address that names one md with transports
// of two components (UCX packs none: one md, one component) makes the
// rkey's part for that md unusable.
func TestRkeyMixedMemoryDomain(t *testing.T) {
	// v2, one device on md 0 with a posix and a sysv interface.
	a := []byte{0x01, hdrWorkerUUID, 1, 2, 3, 4, 5, 6, 7, 8, 0, flagLast | 8}
	a = binary.LittleEndian.AppendUint64(a, 0x1234) // host id
	for i, tl := range []string{"posix", "sysv"} {
		a = binary.LittleEndian.AppendUint16(a, crc16(tl))
		a = append(a, 0x0c, 0x01, 0x5a, 0x00, 0x80, 0x00, 0x8b, 0x00)
		f := byte(0)
		if i == 1 {
			f = flagLast
		}
		if tl == "posix" {
			a = append(a, f|8)
			a = binary.LittleEndian.AppendUint64(a, posixProcfs|posixShmOpen|1)
		} else {
			a = append(a, f|8)
			a = append(a, 0, 0, 0, 0, 0, 0, 0, 0)
		}
	}
	peer, err := peerMDsOf(a)
	if err != nil {
		t.Fatal(err)
	}
	err = rkeyRefused(t, "sysv part of a mixed md", rkey(0, 0, sysvPart(5, 0x7f0000000000)), peer)
	if !strings.Contains(err.Error(), "different memory domains") {
		t.Errorf("%v", err)
	}
}

func TestRkeyRandom(t *testing.T) {
	def := peerOf(t, defaultAddr)
	rng := rand.New(rand.NewPCG(16, 1))
	for range 20000 {
		b := make([]byte, 1+rng.IntN(64))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		rkeyRefused(t, "random bytes", b, def)
	}
	// Random parts behind a well-formed header naming the host's memory
	// domains.
	for range 20000 {
		b := rkey(0, 0, []byte{}, 1, []byte{}, 2, sysvPart(5, 0x7f0000000000), 4, []byte{})
		for range 1 + rng.IntN(3) {
			b[9+rng.IntN(len(b)-9)] = byte(rng.Uint32())
		}
		if _, err := validateRkey(b, def); err == nil {
			// Only the sysv part's contents may change and stay valid.
			if b[9] != 0 || b[10] != 0 || b[11] != 12 || b[24] != 0 {
				t.Fatalf("accepted %x", b)
			}
		}
	}
}

func TestRkeyBounds(t *testing.T) {
	def := peerOf(t, defaultAddr)
	const addr, n = 0x7f0000000000, 1 << 20
	pk, err := validateRkey(rkey(0, 3, posixPart(procfsSeg, addr, n)), def)
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range [][2]uint64{{addr, n}, {addr + 4096, n - 4096}, {addr, 1}, {addr + n - 1, 1}, {addr + n, 0}} {
		if err := pk.checkBounds(ok[0], ok[1]); err != nil {
			t.Errorf("[%#x, +%d): %v", ok[0], ok[1], err)
		}
	}
	for _, bad := range [][2]uint64{
		{addr - 1, n}, {addr, n + 1}, {addr + n, 1}, {addr + 4096, n}, {addr + 1<<40, n},
		{0, n}, {addr, ^uint64(0)}, {^uint64(0) - 10, 100},
	} {
		err := pk.checkBounds(bad[0], bad[1])
		if !errors.Is(err, errBadRkey) || !errors.Is(err, rdma.ErrBadKey) {
			t.Errorf("[%#x, +%d): %v, want errBadRkey", bad[0], bad[1], err)
			continue
		}
		if bad[0]+bad[1] >= bad[0] && (!strings.Contains(err.Error(), "posix segment /proc/1234/fd/7") ||
			!strings.Contains(err.Error(), fmt.Sprintf("[%#x, +%d)", bad[0], bad[1]))) {
			t.Errorf("[%#x, +%d): %v does not name the region and the segment", bad[0], bad[1], err)
		}
	}
	// A sysv part carries no length: its bound is the kernel's (probeSegments).
	sysv := &shmSegment{kind: mdSysv, md: 2, shmid: 5, addr: addr}
	bounds := []segBound{{sysv, n}}
	if err := within(bounds, addr, n); err != nil {
		t.Error(err)
	}
	if err := within(bounds, addr+1, n); !errors.Is(err, errBadRkey) || !strings.Contains(err.Error(), "sysv segment shmid 5") {
		t.Errorf("beyond a sysv segment: %v", err)
	}
}

// FuzzRkey: the validator never panics, and what it accepts is exactly the
// bytes it read: no shorter or longer input is accepted, every part lies
// within the input, and the parts follow the md map.
func FuzzRkey(f *testing.F) {
	for _, c := range realRkeys {
		f.Add(unhex(f, c.rkey), c.addr == posixAddr)
	}
	f.Add(rkey(0, 3, posixPart(0x1234, 0x7f0000000000, 4096, []byte("/shm/x\x00")...)), false)
	f.Add(rkey(0, 3, posixPart(procfsSeg|posixPidNS, 0x7f0000000000, 4096, 1, 2, 3, 4, 5, 6, 7, 8)), false)
	peers := map[bool]*peerMDs{false: peerOf(f, defaultAddr), true: peerOf(f, posixAddr)}
	f.Fuzz(func(t *testing.T, b []byte, posix bool) {
		peer := peers[posix]
		pk, err := validateRkey(b, peer)
		if err != nil {
			if !errors.Is(err, errBadRkey) || !errors.Is(err, rdma.ErrBadKey) {
				t.Fatalf("error %v does not wrap errBadRkey and rdma.ErrBadKey", err)
			}
			return
		}
		if _, err := validateRkey(b[:len(b)-1], peer); err == nil {
			t.Fatalf("accepted both %x and its prefix", b)
		}
		if _, err := validateRkey(append(bytes.Clone(b), 0), peer); err == nil {
			t.Fatalf("accepted both %x and it extended", b)
		}
		var mdMap uint64
		for _, p := range pk.parts {
			mdMap |= 1 << p.md
			if len(p.b) > 0 && (cap(p.b) > len(b) || !inside(b, p.b)) {
				t.Fatalf("md %d part %x outside the input", p.md, p.b)
			}
			if s := p.seg; s != nil && (s.kind != p.kind || (s.kind == mdPosix && s.path == "")) {
				t.Fatalf("md %d: segment %+v", p.md, s)
			}
		}
		if mdMap != pk.mdMap {
			t.Fatalf("parts for md map %#x, want %#x", mdMap, pk.mdMap)
		}
		_ = pk.checkBounds(0x7f0000000000, 4096)
	})
}
