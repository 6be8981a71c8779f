package ucx

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvxfer/kvxfer/rdma"
)

// realWorkerAddresses are worker addresses that UCX 1.13.1 (Debian's
// libucx0) packed for ucp_worker_get_address on a host with self, tcp (an
// Ethernet interface and the loopback), sysv, posix and cma: by default,
// in the v2 format, with debug information, and with UCX_TLS=tcp. The
// cgo tests check the addresses of live workers too
// (TestWorkerAddressOfLiveWorkers).
var realWorkerAddresses = map[string]string{
	"default":    "20eae14ab18858d2ca2000637577cc2b3200f8d74f00000000004f0300882149f4079a151b5c21060002c0000202cf1917b751389763344bd7e037370013230082b6e5211201021dfb9bf30a0f9eb3f9ffffef00000000cf1917b75138539e3e4bd7e037370113230082daa342081dfb9bf30a0f9e338d5377cc2b32004c3e5077ccab33004f230088370004000000000043081dfb9bf30a0f9e33a7d377cc2b32004c3e5077ccab33004f230088be2f0000050000c024881dfb9bf30a0f9e33478bbd37063600242e5077ccab330092210084be2f0000",
	"default v2": "01025a37117b5efd58a10000637544a4000080001b0088b259564c6f9ead7b01060002c0000202cf190c015a0080008b0082d71f011201021dfb9bf30a0f9eb3f9ffffef00000000cf190c015a0180008b0082ce4f02081dfb9bf30a0f9e338d534475430081009b00882a0004000000000003081dfb9bf30a0f9e33a7d34475430081009b0088212f0000050000c004881dfb9bf30a0f9e33478bfb5543000000990084212f0000",
	"debug info": "30a1138ec406d749fa08766d3a31323133342000637577cc2b3200f8d74f00000000004f0300887f909b0993d80bf021060002c0000202cf1917b751389763344bd7e03737001323008295f3211201021dfb9bf30a0f9eb3f9ffffef00000000cf1917b75138539e3e4bd7e037370113230082a38342081dfb9bf30a0f9e338d5377cc2b32004c3e5077ccab33004f2300882f0004000000000043081dfb9bf30a0f9e33a7d377cc2b32004c3e5077ccab33004f230088662f0000050000c024881dfb9bf30a0f9e33478bbd37063600242e5077ccab330092210084662f0000",
	"tcp":        "202c828b6dbe921a1b20060002c0000202cf1917b751389763344bd7e0373700132300829bff209201021dfb9bf30a0f9eb3f9ffffef00000000cf1917b75138539e3e4bd7e037370113230082ce53",
	"tcp v2":     "0102d8a6e93817f24e1700060002c0000202cf190c015a0080008b0082c717009201021dfb9bf30a0f9eb3f9ffffef00000000cf190c015a0180008b00829ff7",
}

func realAddresses(t testing.TB) map[string][]byte {
	m := map[string][]byte{}
	for name, h := range realWorkerAddresses {
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		m[name] = b
	}
	return m
}

// validAddress is a real worker address, for tests of the agent address
// around it.
func validAddress(t testing.TB) []byte { return realAddresses(t)["tcp"] }

func refused(t *testing.T, what string, b []byte) {
	t.Helper()
	if _, err := validateWorkerAddress(b); !errors.Is(err, ErrBadWorkerAddress) {
		t.Fatalf("%s (%x): err = %v, want ErrBadWorkerAddress", what, b, err)
	}
}

func TestTransportChecksums(t *testing.T) {
	// As in the addresses above (little-endian on the wire): tcp cf19,
	// self 6375, sysv 8d53, posix a7d3, cma 478b.
	for name, want := range map[string]uint16{"tcp": 0x19cf, "self": 0x7563, "sysv": 0x538d, "posix": 0xd3a7, "cma": 0x8b47} {
		if got := crc16(name); got != want {
			t.Errorf("crc16(%q) = %#04x, want %#04x", name, got, want)
		}
	}
}

func TestWorkerAddressReal(t *testing.T) {
	for name, b := range realAddresses(t) {
		wa, err := validateWorkerAddress(b)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		known := 0
		for _, d := range wa.devices {
			for _, f := range d.ifaces {
				if _, ok := wellKnownTransports[f.tl]; ok {
					known++
				}
			}
		}
		if known == 0 {
			t.Errorf("%s: no transport recognized in %+v", name, wa)
		}
	}
}

func TestWorkerAddressTruncated(t *testing.T) {
	for name, b := range realAddresses(t) {
		for n := range len(b) {
			refused(t, name+" truncated", b[:n])
		}
		refused(t, name+" extended", append(bytes.Clone(b), 0))
	}
}

func TestWorkerAddressVersion(t *testing.T) {
	for name, b := range realAddresses(t) {
		for v := range 16 {
			c := bytes.Clone(b)
			c[0] = c[0]&0xf0 | byte(v)
			if v == int(b[0]&0x0f) {
				continue
			}
			refused(t, name+" with another version", c)
		}
	}
	// The attack: a version UCX asserts on.
	_, err := validateWorkerAddress([]byte{0x0f, 0, 0, 0})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("version 16")) {
		t.Errorf("version 16: %v", err)
	}
}

func TestWorkerAddressRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, 1+rng.IntN(300))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		refused(t, "random bytes", b)
	}
}

// v2 builds worker addresses in the v2 format (lengths escape to a second
// byte at 0x1f and 0x3f) with one tcp interface per device.
type v2 struct{ b []byte }

func newV2() *v2 { return &v2{b: []byte{0x01, hdrWorkerUUID, 1, 2, 3, 4, 5, 6, 7, 8}} }

func (a *v2) device(md int, dev []byte, last bool, iface []byte, ifaceLen int) *v2 {
	a.b = append(a.b, byte(md))
	f := byte(0)
	if last {
		f = flagLast
	}
	if len(dev) >= devLenMask {
		a.b = append(a.b, f|devLenMask, byte(len(dev)))
	} else {
		a.b = append(a.b, f|byte(len(dev)))
	}
	a.b = append(a.b, dev...)
	a.b = binary.LittleEndian.AppendUint16(a.b, crc16("tcp"))
	a.b = append(a.b, 0x0c, 0x01, 0x5a, 0x00, 0x80, 0x00, 0x8b, 0x00) // attributes
	if ifaceLen >= ifaceLenMask {
		a.b = append(a.b, flagLast|ifaceLenMask, byte(ifaceLen))
	} else {
		a.b = append(a.b, flagLast|byte(ifaceLen))
	}
	a.b = append(a.b, iface...)
	return a
}

var tcpDev = []byte{0, 2, 192, 0, 2, 2}

func TestWorkerAddressLengths(t *testing.T) {
	ok := newV2().device(0, tcpDev, true, []byte{1, 2}, 2).b
	if _, err := validateWorkerAddress(ok); err != nil {
		t.Fatalf("built address: %v", err)
	}
	// Interface address lengths that run past the end, in one byte and
	// escaped to a second.
	for _, n := range []int{3, 0x3e, 0x3f, 0xff} {
		refused(t, "overlong interface address", newV2().device(0, tcpDev, true, []byte{1, 2}, n).b)
	}
	// A device address length past the end.
	b := bytes.Clone(ok)
	b[11] = flagLast | devLenMask
	b = append(b[:12], 0xff)
	refused(t, "overlong device address", b)
	// Lengths that fit but are not what tcp reads: UCX's tcp dereferences
	// its device address even when its length is 0.
	refused(t, "tcp device address of 0 bytes", newV2().device(0, nil, true, []byte{1, 2}, 2).b)
	refused(t, "tcp interface address of 1 byte", newV2().device(0, tcpDev, true, []byte{1}, 1).b)
	refused(t, "tcp IPv6 address in 6 bytes", newV2().device(0, []byte{0, 10, 1, 2, 3, 4}, true, []byte{1, 2}, 2).b)
	// A device that never says it is the last one.
	refused(t, "no last device", newV2().device(0, tcpDev, false, []byte{1, 2}, 2).b)
	// More devices than allowed.
	many := newV2()
	for range maxDevices {
		many.device(0, tcpDev, false, []byte{1, 2}, 2)
	}
	refused(t, "too many devices", many.device(0, tcpDev, true, []byte{1, 2}, 2).b)
	// md indexes: 63 is the largest.
	esc := newV2()
	esc.b = append(esc.b, 0x7f, 64)
	esc.b = append(esc.b, newV2().device(0, tcpDev, true, []byte{1, 2}, 2).b[11:]...)
	refused(t, "md index 64", esc.b)
	// The empty address.
	if _, err := validateWorkerAddress([]byte{0x01, 0, nullResource}); err != nil {
		t.Errorf("empty address: %v", err)
	}
	refused(t, "bytes after the empty address", []byte{0x01, 0, nullResource, 0})
}

func TestWorkerAddressThroughParseAddress(t *testing.T) {
	a := newAddress([pubLen]byte{7}, [pubLen]byte{6}, []byte{0x0f, 1, 2, 3})
	_, err := parseAddress(a.encode())
	if !errors.Is(err, rdma.ErrBadAddress) || !errors.Is(err, ErrBadWorkerAddress) {
		t.Fatalf("parseAddress = %v, want rdma.ErrBadAddress and ErrBadWorkerAddress", err)
	}
	if !bytes.Contains([]byte(err.Error()), []byte(a.id.String())) {
		t.Errorf("error %q does not name the agent", err)
	}
}

// FuzzWorkerAddress: the validator never panics, and what it accepts is
// exactly the bytes it read: no shorter or longer input is accepted, and
// every address it reports lies within the input.
func FuzzWorkerAddress(f *testing.F) {
	for _, b := range realAddresses(f) {
		f.Add(b)
	}
	f.Add(newV2().device(0, tcpDev, true, []byte{1, 2}, 2).b)
	f.Add([]byte{0x01, 0, nullResource})
	f.Fuzz(func(t *testing.T, b []byte) {
		wa, err := validateWorkerAddress(b)
		if err != nil {
			if !errors.Is(err, ErrBadWorkerAddress) {
				t.Fatalf("error %v does not wrap ErrBadWorkerAddress", err)
			}
			return
		}
		if len(b) > 0 {
			if _, err := validateWorkerAddress(b[:len(b)-1]); err == nil {
				t.Fatalf("accepted both %x and its prefix", b)
			}
		}
		if _, err := validateWorkerAddress(append(bytes.Clone(b), 0)); err == nil {
			t.Fatalf("accepted both %x and it extended", b)
		}
		within := func(p []byte) {
			if len(p) == 0 {
				return
			}
			if &p[0] != &b[0] && (cap(p) > len(b) || !inside(b, p)) {
				t.Fatalf("address %x outside the input", p)
			}
		}
		for _, d := range wa.devices {
			within(d.addr)
			for _, f := range d.ifaces {
				within(f.addr)
			}
		}
	})
}

// inside says whether p is a subslice of b.
func inside(b, p []byte) bool {
	for i := range b {
		if &b[i] == &p[0] {
			return i+len(p) <= len(b)
		}
	}
	return false
}
