package ucx

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"

	"github.com/kvxfer/kvxfer/rdma"
)

// errBadRkey: a peer's packed rkey (the rkey in its region key) is not one
// that the UCX this package is built against (1.13) unpacks safely, or it
// names a shared-memory segment that does not hold the key's region.
// Errors that wrap it also wrap rdma.ErrBadKey.
var errBadRkey = errors.New("ucx: bad packed rkey")

// This file checks a peer's packed rkey before ucp_ep_rkey_unpack sees it.
// The peer that hands out a region key is its author, so the packed rkey
// in it is the peer's word, as are the key's base and length (the mac only
// says that the owner wrote them). UCX 1.13 trusts all of it:
//
//   - ucp_ep_rkey_unpack takes no length (src/ucp/core/ucp_rkey.c:
//     ucp_ep_rkey_unpack passes 0 to ucp_ep_rkey_unpack_internal) and
//     reads each memory domain's part where the previous one said it
//     ends; each transport then reads its part at the size it expects,
//     whatever size the buffer gave (posix also reads a NUL-terminated
//     directory from it).
//   - When a transport fails to unpack its part (a shared-memory segment
//     that cannot be attached: a wrong shmid, a file that is not there),
//     the error path, ucp_rkey_destroy, releases every memory domain of
//     the rkey's map, including the ones never unpacked, with whatever the
//     rkey's pool object held before: a NULL component (SIGSEGV at 0x38)
//     or a stale handle (an unmap or a shmdt of someone else's mapping).
//   - The shared-memory transports (sysv, posix) write a put by copying to
//     the remote address plus (their mapping of the segment - the
//     segment's address in the owner), without bounds: a key whose base
//     and length lie outside the segment makes the writer copy outside its
//     mapping (SIGSEGV, or bytes in another mapping of its own).
//
// validateRkey walks the format with a bounds check on every read and
// refuses anything UCX 1.13's ucp_rkey_pack could not produce, stricter
// than UCX where that is simpler; it learns which memory domain of the
// peer is which transport from the peer's worker address, as UCX does
// (ucp_wireup_get_reachable_mds: a remote md index is unpacked by the
// component of the local transport that reaches the address's interfaces
// of that md). The segments a sysv or posix part names are then checked
// against the kernel's objects (rkeyseg.go) before UCX attaches
// them.
//
// The format, as ucp_rkey_pack writes it (ucp_rkey_pack_common, with no
// system device, which ucp_rkey_pack never packs):
//
//	md_map u64 (little-endian: the peer's memory domains with a part)
//	mem_type u8 (ucs_memory_type_t)
//	per md in md_map, lowest index first: size u8, part[size]
//
// and it ends there. The parts (rkey_packed_size and mkey_pack of each
// component in src/uct):
//
//	self, tcp, cma     nothing
//	ib (rc, ud, dc)    rkey u64 (ib_md.c: UCT_IB_MD_PACKED_RKEY_SIZE)
//	sysv               shmid u32, owner_ptr u64 (mm_sysv.c: uct_sysv_packed_rkey_t)
//	posix              seg_id u64, address u64, length u64 (mm_posix.c:
//	                   uct_posix_packed_rkey_t), then: in procfs mode
//	                   (seg_id bit 63) nothing, or 8 bytes (not written by
//	                   UCX) when the owner is in another pid namespace
//	                   (bit 60); with shm_open (bit 62) nothing; else the
//	                   owner's directory, NUL-terminated
//
// Limits: a memory domain that the peer's address names with transports
// this file does not list (knem, xpmem, GPU copies, ...) is checked for
// its framing only; its component reads what it reads. A sysv part
// carries no length: the segment's size is the kernel's (shmctl), read
// just before UCX attaches the segment.

// Packed rkey limits and flags (UCX 1.13).
const (
	rkeyHeader = 8 + 1 // md_map, mem_type

	memTypeLast = 5 // UCS_MEMORY_TYPE_LAST: host, cuda, cuda-managed, rocm, rocm-managed

	sysvRkeySize  = 4 + 8
	posixRkeySize = 8 + 8 + 8
	ibRkeySize    = 8

	posixProcfs   = 1 << 63 // UCT_POSIX_SEG_FLAG_PROCFS
	posixShmOpen  = 1 << 62 // UCT_POSIX_SEG_FLAG_SHM_OPEN
	posixHugetlb  = 1 << 61 // UCT_POSIX_SEG_FLAG_HUGETLB
	posixPidNS    = 1 << 60 // UCT_POSIX_SEG_FLAG_PID_NS
	posixMMIDMask = 1<<60 - 1
	posixPidBits  = 30 // UCT_POSIX_PROCFS_MMID_PID_BITS; the fd is the next 30 bits
	posixNSSize   = 8  // ucs_sys_ns_t
	// Stricter than UCX: outside procfs mode the mmid is rand_r's.
	posixMaxMMID = 1<<31 - 1
	pathMax      = 4096 // PATH_MAX: UCX truncates the path there
)

// mdKind is a memory domain's component, as far as its rkey goes.
type mdKind uint8

const (
	mdFramed mdKind = iota // unknown: framing checked only
	mdNoRkey               // self, tcp, cma: a part of 0 bytes
	mdIB
	mdSysv
	mdPosix
)

func (k mdKind) String() string {
	return [...]string{"unknown", "rkey-less", "ib", "sysv", "posix"}[k]
}

// rkeyTransports are the transports whose memory domains' rkeys this file
// knows, by the CRC-16 of their names (as worker addresses carry them).
var rkeyTransports = func() map[uint16]mdKind {
	m := map[uint16]mdKind{}
	for name, k := range map[string]mdKind{
		"self": mdNoRkey, "tcp": mdNoRkey, "cma": mdNoRkey,
		"sysv": mdSysv, "posix": mdPosix,
		"rc_verbs": mdIB, "rc_mlx5": mdIB, "ud_verbs": mdIB, "ud_mlx5": mdIB, "dc_mlx5": mdIB,
	} {
		m[crc16(name)] = k
	}
	return m
}()

// peerMDs is what a peer's worker address says of its memory domains:
// which are named there (only those can be unpacked) and, where known,
// their component.
type peerMDs struct {
	named uint64       // md indexes with interfaces in the address
	kind  [64]mdKind   // per md index
	why   [64]string   // an md whose transports disagree: why it is refused
	tls   [64][]uint16 // its transports' checksums (for errors)
}

// peerMemoryDomains reads a validated worker address's memory domains. An
// md whose interfaces name transports of different components (never so
// in an address UCX packs: one md, one component) is marked refused.
func peerMemoryDomains(wa workerAddress) *peerMDs {
	p := &peerMDs{}
	for _, d := range wa.devices {
		if d.md < 0 || d.md > maxMDIndex {
			continue // validateWorkerAddress refuses these
		}
		for _, f := range d.ifaces {
			k := rkeyTransports[f.tl] // mdFramed when unknown
			p.tls[d.md] = append(p.tls[d.md], f.tl)
			if p.named&(1<<d.md) == 0 {
				p.named |= 1 << d.md
				p.kind[d.md] = k
			} else if k != p.kind[d.md] && p.why[d.md] == "" {
				p.why[d.md] = fmt.Sprintf("the peer's address names md %d with transports of different memory domains (checksums %04x)", d.md, p.tls[d.md])
			}
		}
	}
	return p
}

// peerMDsOf validates a peer's worker address and reads its memory domains.
func peerMDsOf(worker []byte) (*peerMDs, error) {
	wa, err := validateWorkerAddress(worker)
	if err != nil {
		return nil, err
	}
	return peerMemoryDomains(wa), nil
}

// packedRkey is a packed rkey as validateRkey read it.
type packedRkey struct {
	mdMap   uint64
	memType uint8
	parts   []rkeyPart // in md index order
}

// rkeyPart is one memory domain's part of a packed rkey.
type rkeyPart struct {
	md   int
	kind mdKind // mdFramed also for an md the peer's address does not name
	b    []byte // aliases the input
	seg  *shmSegment
}

// shmSegment is the shared-memory segment a sysv or posix part names: UCX
// attaches it when it unpacks the rkey, and its puts copy into that
// mapping at (remote address - addr).
type shmSegment struct {
	kind mdKind // mdSysv or mdPosix
	md   int
	addr uint64 // the segment's address in the owner
	// posix: the segment's length (the mapping UCX makes; the file may be
	// shorter). sysv: 0, the part carries none.
	len   uint64
	shmid uint32 // sysv
	seg   uint64 // posix seg_id
	path  string // posix: the file UCX opens
}

func (s *shmSegment) String() string {
	if s.kind == mdSysv {
		return fmt.Sprintf("sysv segment shmid %d at %#x (md %d)", s.shmid, s.addr, s.md)
	}
	return fmt.Sprintf("posix segment %s [%#x, +%d) (md %d)", s.path, s.addr, s.len, s.md)
}

// rkeyReader reads a packed rkey (byteReader, its failures wrapping
// rdma.ErrBadKey and errBadRkey).
type rkeyReader struct{ byteReader }

// errBadPackedRkey is what an rkeyReader's failures wrap.
var errBadPackedRkey = fmt.Errorf("%w: %w", rdma.ErrBadKey, errBadRkey)

// validateRkey checks b, a peer's packed rkey, against what the peer's
// worker address says of its memory domains, and returns what it read;
// errors wrap rdma.ErrBadKey and errBadRkey and say what was wrong where.
func validateRkey(b []byte, peer *peerMDs) (packedRkey, error) {
	r := &rkeyReader{byteReader{b: b, kind: errBadPackedRkey}}
	var pk packedRkey
	h := r.bytes(rkeyHeader, "header")
	if r.err != nil {
		return pk, r.err
	}
	pk.mdMap, pk.memType = binary.LittleEndian.Uint64(h), h[8]
	// An empty md_map is legal: memory that no memory domain registered
	// (host memory under UCX_TLS=sysv or posix, whose domains only
	// allocate), or the dummy key of a zero-length registration. Puts with
	// it go as software RMA: the owner's worker writes them.
	if pk.memType >= memTypeLast {
		r.fail("memory type %d (UCX 1.13 knows %d)", pk.memType, memTypeLast)
	}
	for m := pk.mdMap; m != 0 && r.err == nil; m &= m - 1 {
		md := bits.TrailingZeros64(m)
		at := r.off
		n := r.bytes(1, fmt.Sprintf("md %d part size", md))
		if n == nil {
			break
		}
		part := rkeyPart{md: md, b: r.bytes(int(n[0]), fmt.Sprintf("md %d part", md))}
		if r.err != nil {
			break
		}
		if peer.named&(1<<md) != 0 {
			if why := peer.why[md]; why != "" {
				r.off = at
				r.fail("%s", why)
				break
			}
			part.kind = peer.kind[md]
		}
		if why := part.check(); why != "" {
			r.off = at
			r.fail("md %d (%s) part of %d bytes: %s", md, part.kind, len(part.b), why)
			break
		}
		pk.parts = append(pk.parts, part)
	}
	if r.err == nil && r.off != len(b) {
		r.fail("%d bytes after the last md part", len(b)-r.off)
	}
	if r.err != nil {
		return packedRkey{}, r.err
	}
	return pk, nil
}

// check checks a part against its component's layout and fills in its
// segment; it says why the part is wrong, or "".
func (p *rkeyPart) check() string {
	b := p.b
	switch p.kind {
	case mdNoRkey:
		if len(b) != 0 {
			return "want 0"
		}
	case mdIB:
		if len(b) != ibRkeySize {
			return fmt.Sprintf("want %d", ibRkeySize)
		}
	case mdSysv:
		if len(b) != sysvRkeySize {
			return fmt.Sprintf("want %d", sysvRkeySize)
		}
		s := &shmSegment{kind: mdSysv, md: p.md, shmid: binary.LittleEndian.Uint32(b), addr: binary.LittleEndian.Uint64(b[4:])}
		switch {
		case s.shmid > 1<<31-1:
			return fmt.Sprintf("shmid %d is not an int's", s.shmid)
		case s.addr == 0:
			return "segment address 0"
		}
		p.seg = s
	case mdPosix:
		return p.checkPosix()
	}
	return ""
}

// checkPosix checks a posix part (uct_posix_md_mkey_pack) and names the
// file its segment is in, as uct_posix_mem_attach_common opens it.
func (p *rkeyPart) checkPosix() string {
	b := p.b
	if len(b) < posixRkeySize {
		return fmt.Sprintf("want at least %d", posixRkeySize)
	}
	s := &shmSegment{kind: mdPosix, md: p.md, seg: binary.LittleEndian.Uint64(b),
		addr: binary.LittleEndian.Uint64(b[8:]), len: binary.LittleEndian.Uint64(b[16:])}
	extra := b[posixRkeySize:]
	mmid := s.seg & posixMMIDMask
	switch {
	case s.seg&posixHugetlb != 0:
		// Stricter than UCX: huge-page segments (a posix directory on
		// hugetlbfs) are mapped with MAP_HUGETLB and aligned to the huge
		// page size, which this check does not mirror.
		return fmt.Sprintf("segment id %#x: huge pages (refused)", s.seg)
	case s.addr == 0 || s.len == 0 || s.addr+s.len < s.addr:
		return fmt.Sprintf("segment [%#x, +%d)", s.addr, s.len)
	case s.seg&posixProcfs != 0:
		pid, fd := mmid&(1<<posixPidBits-1), mmid>>posixPidBits
		if pid == 0 {
			return fmt.Sprintf("segment id %#x: pid 0", s.seg)
		}
		want := 0
		if s.seg&posixPidNS != 0 {
			want = posixNSSize
		}
		if len(extra) != want {
			return fmt.Sprintf("segment id %#x wants %d bytes after the segment, not %d", s.seg, want, len(extra))
		}
		s.path = fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	case s.seg&posixPidNS != 0:
		return fmt.Sprintf("segment id %#x: a pid namespace outside procfs mode", s.seg)
	case mmid > posixMaxMMID:
		return fmt.Sprintf("segment id %#x: mmid above %#x", s.seg, posixMaxMMID)
	case s.seg&posixShmOpen != 0:
		if len(extra) != 0 {
			return fmt.Sprintf("segment id %#x wants nothing after the segment, not %d bytes", s.seg, len(extra))
		}
		s.path = fmt.Sprintf("/dev/shm/ucx_shm_posix_%x", mmid) // glibc's shm_open
	default:
		// The owner's directory, NUL-terminated (uct_posix_copy_dir).
		nul := bytes.IndexByte(extra, 0)
		if nul < 1 || nul != len(extra)-1 {
			return fmt.Sprintf("segment id %#x wants a NUL-terminated directory after the segment", s.seg)
		}
		s.path = fmt.Sprintf("%s/ucx_shm_posix_%x", extra[:nul], mmid)
		if len(s.path) >= pathMax {
			return fmt.Sprintf("path of %d bytes", len(s.path))
		}
	}
	p.seg = s
	return ""
}

// segments are the shared-memory segments the rkey names.
func (pk packedRkey) segments() []*shmSegment {
	var out []*shmSegment
	for _, p := range pk.parts {
		if p.seg != nil {
			out = append(out, p.seg)
		}
	}
	return out
}

// within checks that [base, base+n), a key's region, lies in a segment at
// addr of size bytes; size is the bound as far as it is known (for posix:
// the part's length, then the file's size).
func (s *shmSegment) within(base, n, size uint64) error {
	if base < s.addr || base-s.addr > size || n > size-(base-s.addr) {
		return fmt.Errorf("%w: %w: the key's region [%#x, +%d) is not inside %s, of %d bytes", rdma.ErrBadKey, errBadRkey, base, n, s, size)
	}
	return nil
}

// segBound is a segment and its size as the kernel has it (probeSegments).
type segBound struct {
	s    *shmSegment
	size uint64
}

// within checks that [base, base+n) lies in every segment of bounds: UCX
// writes through whichever one its lane selection takes.
func within(bounds []segBound, base, n uint64) error {
	for _, b := range bounds {
		if err := b.s.within(base, n, b.size); err != nil {
			return err
		}
	}
	return nil
}

// checkBounds checks [base, base+n) against the bounds the packed bytes
// themselves carry: a posix segment's address and length. (A sysv
// segment's size is the kernel's: probeSegments.)
func (pk packedRkey) checkBounds(base, n uint64) error {
	if base+n < base {
		return fmt.Errorf("%w: %w: the key's region [%#x, +%d) wraps around", rdma.ErrBadKey, errBadRkey, base, n)
	}
	for _, s := range pk.segments() {
		if s.kind == mdPosix {
			if err := s.within(base, n, s.len); err != nil {
				return err
			}
		}
	}
	return nil
}
