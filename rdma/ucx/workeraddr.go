package ucx

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrBadWorkerAddress: a peer's UCP worker address is not one that the UCX
// this package is built against (1.13) unpacks safely. Errors that wrap it
// also wrap rdma.ErrBadAddress.
var ErrBadWorkerAddress = errors.New("ucx: bad UCP worker address")

// This file checks a peer's UCP worker address before ucp_ep_create sees
// it. UCX's ucp_address_unpack (src/ucp/wireup/address.c) trusts its input:
// it takes no length, asserts (aborting the process) on an unknown
// version, and reads every field where the previous one said it is; the
// transports then read their device and interface addresses at the sizes
// they expect (tcp dereferences its device address even when its length is
// 0). validateWorkerAddress walks the same format with a bounds check on
// every read and refuses anything the worker address a UCX 1.13 (or later,
// in the v1 and v2 formats) worker packs for ucp_worker_get_address could
// not be, stricter than UCX where that is simpler.
//
// The format, as ucp_ep_create unpacks it (pack flags WORKER_UUID,
// WORKER_NAME, DEVICE_ADDR, IFACE_ADDR, EP_ADDR, not unified mode):
//
//	header   v1: version(4 bits, 0) | flags(4 bits) << 4
//	         v2: version(4 bits, 1) | release(4 bits) << 4, flags u8
//	uuid     u64, in v1 always, in v2 when flags has WORKER_UUID
//	client   u64 when flags has CLIENT_ID
//	name     len u8, len bytes, when flags has DEBUG_INFO
//	then 0xff (no devices) or, per device:
//	md       EMPTY(0x80) | index (v1: 5 bits; v2: 7 bits, 0x7f: index in the next byte)
//	dev len  LAST(0x80) | NUM_PATHS(0x40) | SYS_DEVICE(0x20) | len (5 bits; v2: 0x1f: len in the next byte)
//	paths u8 if NUM_PATHS, sysdev u8 if SYS_DEVICE, device address[len]
//	then, unless EMPTY (never, for UCX's own addresses), per transport interface:
//	  tl name checksum u16 (CRC-16 of the transport's name)
//	  attributes: v1 16 bytes (3 float32, u32), v2 8 bytes (3 fp8, prio, seg u16, flags u16)
//	  iface len  LAST(0x80) | HAS_EP_ADDR(0x40) | len (6 bits; v2: 0x3f: len in the next byte)
//	  interface address[len]
//
// The address must end exactly where the last interface address ends.
//
// Limits: the checks assume the receiving worker does not run in UCX's
// unified mode (UCX_UNIFIED_MODE=y changes the format); the per-transport
// checks (wellKnownTransports) cover the transports of one host and tcp,
// and only the generic bounds hold for others (InfiniBand, GPU copies).

// UCX 1.13's limits and flags (address.c, ucp_types.h).
const (
	addrV1 = 0 // UCP_OBJECT_VERSION_V1
	addrV2 = 1 // UCP_OBJECT_VERSION_V2

	hdrDebugInfo  = 1 << 0
	hdrWorkerUUID = 1 << 1
	hdrClientID   = 1 << 2
	hdrAMOnly     = 1 << 3
	hdrKnown      = hdrDebugInfo | hdrWorkerUUID | hdrClientID | hdrAMOnly

	nullResource = 0xff // UCP_NULL_RESOURCE: an address without devices

	mdEmptyDev = 0x80
	mdMaskV1   = 0x1f // v1 also carries ALLOC 0x40 and REG 0x20
	mdMaskV2   = 0x7f

	flagLast      = 0x80
	flagNumPaths  = 0x40 // device length byte
	flagSysDevice = 0x20 // device length byte
	flagHasEPAddr = 0x40 // interface length byte
	devLenMask    = 0x1f
	ifaceLenMask  = 0x3f

	sysDeviceUnknown = 0xff

	// Stricter than UCX: it allows 128 interfaces (UCP_MAX_RESOURCES) and
	// indexes md maps of 64 bits (UCP_MAX_MDS).
	maxMDIndex = 63
	maxDevices = 64
	maxIfaces  = 128

	attrSizeV1 = 16 // ucp_address_packed_iface_attr_t
	attrSizeV2 = 8  // ucp_address_v2_packed_iface_attr_t

	// ucp_address_v2_packed_iface_attr_t flags (UCP_ADDR_IFACE_FLAG_*).
	ifaceFlagsKnownV2 = 1<<10 - 1

	fp8ExponentMask = 0x0f
	fp8NaN          = 0x0f
)

// workerAddress is a worker address as validateWorkerAddress read it.
type workerAddress struct {
	version int
	flags   uint8
	uuid    uint64
	devices []workerDevice
}

type workerDevice struct {
	md     int
	paths  int
	sysDev int // sysDeviceUnknown when absent
	addr   []byte
	ifaces []workerIface
}

type workerIface struct {
	tl   uint16 // the transport name's checksum
	addr []byte
}

// byteReader reads a peer's bytes with a bounds check on every read; the
// first failure sticks, wrapping kind.
type byteReader struct {
	b    []byte
	off  int
	err  error
	kind error
}

// addrReader reads a worker address.
type addrReader struct{ byteReader }

func (r *byteReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %d bytes: at byte %d: %s", r.kind, len(r.b), r.off, fmt.Sprintf(format, args...))
	}
}

func (r *byteReader) bytes(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.fail("%s of %d bytes runs past the end", what, n)
		return nil
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p
}

func (r *byteReader) u8(what string) uint8 {
	p := r.bytes(1, what)
	if p == nil {
		return 0
	}
	return p[0]
}

// extended reads a value of mask's bits in b (its first byte), and, in v2,
// when they are all set, the value from the next byte.
func (r *addrReader) extended(b uint8, mask uint8, version int, what string) int {
	v := b & mask
	if version != addrV1 && v == mask {
		return int(r.u8(what))
	}
	return int(v)
}

// validateWorkerAddress checks b, a peer's UCP worker address, and returns
// what it read; errors wrap ErrBadWorkerAddress and say what was wrong
// where.
func validateWorkerAddress(b []byte) (workerAddress, error) {
	r := &addrReader{byteReader{b: b, kind: ErrBadWorkerAddress}}
	var wa workerAddress
	h := r.u8("header")
	if r.err != nil {
		return wa, r.err
	}
	wa.version = int(h & 0x0f)
	switch wa.version {
	case addrV1:
		wa.flags = h >> 4
	case addrV2:
		// The high bits carry the packer's release in newer UCX; 1.13
		// ignores them.
		wa.flags = r.u8("header flags")
		if wa.flags&^hdrKnown != 0 {
			r.fail("unknown header flags %#x", wa.flags)
		}
	default:
		r.fail("version %d: UCX 1.13 unpacks versions 1 and 2 only (it aborts on others)", wa.version+1)
		return wa, r.err
	}
	if wa.version == addrV1 || wa.flags&hdrWorkerUUID != 0 {
		if u := r.bytes(8, "worker uuid"); u != nil {
			wa.uuid = binary.LittleEndian.Uint64(u)
		}
	}
	if wa.flags&hdrClientID != 0 {
		r.bytes(8, "client id")
	}
	if wa.flags&hdrDebugInfo != 0 {
		n := r.u8("worker name length")
		r.bytes(int(n), "worker name")
	}
	if r.err != nil {
		return wa, r.err
	}
	if r.off < len(b) && b[r.off] == nullResource {
		r.off++
		if r.off != len(b) {
			r.fail("%d bytes after an empty device list", len(b)-r.off)
		}
		return wa, r.err
	}
	nifaces := 0
	for last := false; !last && r.err == nil; {
		if len(wa.devices) == maxDevices {
			r.fail("more than %d devices", maxDevices)
			break
		}
		d, l := r.device(wa.version, &nifaces)
		wa.devices = append(wa.devices, d)
		last = l
	}
	if r.err == nil && r.off != len(b) {
		r.fail("%d bytes after the last device", len(b)-r.off)
	}
	return wa, r.err
}

// device reads one device and its interfaces.
func (r *addrReader) device(version int, nifaces *int) (workerDevice, bool) {
	d := workerDevice{paths: 1, sysDev: sysDeviceUnknown}
	at := r.off
	mb := r.u8("device md index")
	mask := uint8(mdMaskV2)
	if version == addrV1 {
		mask = mdMaskV1
	}
	d.md = r.extended(mb, mask, version, "device md index")
	if d.md > maxMDIndex && r.err == nil {
		r.fail("device at byte %d: md index %d above %d", at, d.md, maxMDIndex)
	}
	if mb&mdEmptyDev != 0 && r.err == nil {
		// UCX packs a device only for an interface it packs.
		r.fail("device at byte %d: no interfaces", at)
	}
	lb := r.u8("device address length")
	n := r.extended(lb, devLenMask, version, "device address length")
	last := lb&flagLast != 0
	if lb&flagNumPaths != 0 {
		d.paths = int(r.u8("device path count"))
		if d.paths < 2 && r.err == nil {
			r.fail("device at byte %d: %d paths (packed only when above 1)", at, d.paths)
		}
	}
	if lb&flagSysDevice != 0 {
		d.sysDev = int(r.u8("device system device"))
		if d.sysDev == sysDeviceUnknown && r.err == nil {
			r.fail("device at byte %d: system device flagged but unknown", at)
		}
	}
	d.addr = r.bytes(n, "device address")
	for lastIface := false; !lastIface && r.err == nil; {
		if *nifaces == maxIfaces {
			r.fail("more than %d interfaces", maxIfaces)
			break
		}
		*nifaces++
		var f workerIface
		f, lastIface = r.iface(version, d.addr)
		d.ifaces = append(d.ifaces, f)
	}
	return d, last
}

// iface reads one transport interface of a device whose address is dev.
func (r *addrReader) iface(version int, dev []byte) (workerIface, bool) {
	var f workerIface
	at := r.off
	if c := r.bytes(2, "transport name checksum"); c != nil {
		f.tl = binary.LittleEndian.Uint16(c)
	}
	if version == addrV1 {
		a := r.bytes(attrSizeV1, "interface attributes")
		if a != nil {
			overhead := math.Float32frombits(binary.LittleEndian.Uint32(a[0:]))
			bw := math.Float32frombits(binary.LittleEndian.Uint32(a[4:]))
			lat := math.Float32frombits(binary.LittleEndian.Uint32(a[8:]))
			// UCX asserts that its lane scores, which divide by sums
			// with the overhead, are not negative or NaN.
			if !finite(overhead) || !finite(lat) || !finite(bw) || bw == 0 || overhead < 0 || lat < 0 {
				r.fail("interface at byte %d: attributes overhead %g bandwidth %g latency %g", at, overhead, bw, lat)
			}
		}
	} else {
		a := r.bytes(attrSizeV2, "interface attributes")
		if a != nil {
			bw := a[1] & fp8ExponentMask
			flags := binary.LittleEndian.Uint16(a[6:])
			switch {
			case a[0]&fp8ExponentMask == fp8NaN, a[2]&fp8ExponentMask == fp8NaN:
				r.fail("interface at byte %d: overhead or latency is not a number", at)
			case bw == 0 || bw == fp8NaN:
				r.fail("interface at byte %d: bandwidth %#x is zero or not a number", at, a[1])
			case flags&^ifaceFlagsKnownV2 != 0:
				r.fail("interface at byte %d: unknown flags %#x", at, flags)
			}
		}
	}
	lb := r.u8("interface address length")
	if lb&flagHasEPAddr != 0 && r.err == nil {
		r.fail("interface at byte %d: endpoint addresses in a worker address", at)
	}
	n := r.extended(lb, ifaceLenMask, version, "interface address length")
	f.addr = r.bytes(n, "interface address")
	if r.err == nil {
		if tl, ok := wellKnownTransports[f.tl]; ok {
			if why := tl.check(dev, f.addr); why != "" {
				r.fail("%s interface at byte %d: %s", tl.name, at, why)
			}
		}
	}
	return f, lb&flagLast != 0
}

func finite(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// A transport whose device and interface addresses are checked against the
// layout its UCT component reads (src/uct in UCX 1.13): a transport of the
// local UCX reads them at the sizes it expects, whatever lengths the
// address gave.
type transport struct {
	name  string
	check func(dev, iface []byte) string // why they are wrong, or ""
}

// wellKnownTransports, by the CRC-16 of their names, as the address carries
// them.
var wellKnownTransports = func() map[uint16]transport {
	m := map[uint16]transport{}
	for _, t := range []transport{
		{"self", func(dev, iface []byte) string { return lengths(dev, iface, []int{0}, []int{8}) }},
		{"tcp", checkTCP},
		{"sysv", func(dev, iface []byte) string {
			return first(checkHostDevice(dev), lengths(dev, iface, nil, []int{8}))
		}},
		{"posix", checkPosix},
		{"cma", func(dev, iface []byte) string {
			if why := checkHostDevice(dev); why != "" {
				return why
			}
			// ucs_cma_iface_ext_device_addr_t: pid u32, with bit 31 a pid
			// namespace u64 follows.
			if len(iface) < 4 {
				return lengths(dev, iface, nil, []int{4, 12})
			}
			if binary.LittleEndian.Uint32(iface)&(1<<31) != 0 {
				return lengths(dev, iface, nil, []int{12})
			}
			return lengths(dev, iface, nil, []int{4})
		}},
		{"knem", func(dev, iface []byte) string {
			return first(checkHostDevice(dev), lengths(dev, iface, nil, []int{0}))
		}},
		{"xpmem", func(dev, iface []byte) string {
			return first(checkHostDevice(dev), lengths(dev, iface, nil, []int{16}))
		}},
	} {
		m[crc16(t.name)] = t
	}
	return m
}()

func first(whys ...string) string {
	for _, w := range whys {
		if w != "" {
			return w
		}
	}
	return ""
}

// lengths checks the address lengths against the allowed ones (nil: any).
func lengths(dev, iface []byte, devLens, ifaceLens []int) string {
	in := func(n int, ok []int) bool {
		if ok == nil {
			return true
		}
		for _, v := range ok {
			if n == v {
				return true
			}
		}
		return false
	}
	switch {
	case !in(len(dev), devLens):
		return fmt.Sprintf("device address of %d bytes, want one of %v", len(dev), devLens)
	case !in(len(iface), ifaceLens):
		return fmt.Sprintf("interface address of %d bytes, want one of %v", len(iface), ifaceLens)
	}
	return ""
}

// checkHostDevice checks a shared-memory device address
// (uct_iface_local_addr_ns_t): a host id u64, with bit 63 an IPC namespace
// u64 follows.
func checkHostDevice(dev []byte) string {
	switch {
	case len(dev) != 8 && len(dev) != 16:
		return fmt.Sprintf("device address of %d bytes, want 8 or 16", len(dev))
	case (binary.LittleEndian.Uint64(dev)>>63 == 1) != (len(dev) == 16):
		return fmt.Sprintf("device address of %d bytes disagrees with its namespace flag", len(dev))
	}
	return ""
}

// checkTCP checks uct_tcp_device_addr_t (flags u8, family u8, then the
// IPv4 or IPv6 address, or for loopback a host id and namespace of 16
// bytes) and uct_tcp_iface_addr_t (port u16).
func checkTCP(dev, iface []byte) string {
	const loopback, afInet, afInet6 = 1, 2, 10
	if len(dev) < 2 {
		return fmt.Sprintf("device address of %d bytes, want 6 or 18", len(dev))
	}
	want := 0
	switch {
	case dev[0]&^loopback != 0:
		return fmt.Sprintf("unknown device flags %#x", dev[0])
	case dev[1] != afInet && dev[1] != afInet6:
		return fmt.Sprintf("address family %d", dev[1])
	case dev[0]&loopback != 0, dev[1] == afInet6:
		want = 2 + 16
	default:
		want = 2 + 4
	}
	return lengths(dev, iface, []int{want}, []int{2})
}

// checkPosix checks the posix transport's interface address
// (uct_mm_iface_addr_t: the FIFO's segment id u64, then what the segment
// id's flags say: a pid namespace u64, nothing, or a NUL-terminated
// directory).
func checkPosix(dev, iface []byte) string {
	const procfs, shmOpen, pidNS = 1 << 63, 1 << 62, 1 << 60
	if why := checkHostDevice(dev); why != "" {
		return why
	}
	if len(iface) < 8 {
		return fmt.Sprintf("interface address of %d bytes, want at least 8", len(iface))
	}
	seg, extra := binary.LittleEndian.Uint64(iface), iface[8:]
	switch {
	case seg&pidNS != 0:
		if seg&procfs == 0 || len(extra) != 8 {
			return fmt.Sprintf("segment id %#x with a pid namespace and %d bytes after it", seg, len(extra))
		}
	case seg&(procfs|shmOpen) != 0:
		if len(extra) != 0 {
			return fmt.Sprintf("segment id %#x and %d bytes after it", seg, len(extra))
		}
	default:
		if len(extra) < 2 || extra[len(extra)-1] != 0 {
			return fmt.Sprintf("segment id %#x wants a NUL-terminated directory after it", seg)
		}
	}
	return ""
}

// crc16 is UCX's ucs_crc16_string: CRC-16-CCITT (reflected 0x8408, initial
// 0xffff, complemented).
func crc16(s string) uint16 {
	crc := uint16(0xffff)
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i])
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0x8408
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

// aliasOf says why a peer's worker address would make UCX reach this
// worker, not the peer, on some lane: own is this worker's address. ""
// when it would not. An address a peer hands out may carry this worker's
// uuid or its self transport's interface id (it learns them from this
// agent's address, which every peer of it has): UCX 1.13 takes such a self
// interface as reachable and a put on that lane as a copy within this
// process, to the address a key names — a write into this process's own
// memory wherever a hostile key says. (A cma interface naming this
// process's pid is no such sign: another worker of this process, a peer
// in the same process, carries it too.) Connecting to this agent's own
// address (its id, not only its worker) is legal, and not checked here.
func aliasOf(own, peer workerAddress) string {
	if peer.uuid != 0 && peer.uuid == own.uuid {
		return fmt.Sprintf("it carries this worker's uuid %#x", own.uuid)
	}
	self := crc16("self")
	for _, pd := range peer.devices {
		for _, pf := range pd.ifaces {
			if pf.tl != self {
				continue
			}
			for _, od := range own.devices {
				for _, of := range od.ifaces {
					if of.tl == self && bytes.Equal(pf.addr, of.addr) {
						return fmt.Sprintf("its self transport interface %x is this worker's", pf.addr)
					}
				}
			}
		}
	}
	return ""
}
