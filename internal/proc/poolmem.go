package proc

import (
	"fmt"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/kvcache"
)

// poolMem reads and writes blocks of a role's pool: the CPU's own view of
// a host pool, or, for a device pool (backend cudaipc), copies between
// host buffers and the GPU through package cuda — as a framework's
// kernels would write its KV cache and read it back.
type poolMem struct {
	host []byte       // a host pool's memory
	dev  *cuda.Device // a device pool's GPU (nil for a host pool)
	base cuda.DevicePtr
}

// openPoolMem opens access to e's pool; close it after the node closed.
func openPoolMem(e *kvxfer.Engine) (*poolMem, error) {
	r := e.Region()
	if r.Kind != kvcache.DeviceMem {
		return &poolMem{host: r.Bytes()}, nil
	}
	d, err := cuda.OpenDevice(r.Device)
	if err != nil {
		return nil, fmt.Errorf("--device %d: the pool's GPU: %w", r.Device, err)
	}
	return &poolMem{dev: d, base: cuda.DevicePtr(r.Base)}, nil
}

// scratch is a buffer get needs for n bytes: none for a host pool (the
// timed paths allocate nothing for it), n bytes for a device pool.
func (m *poolMem) scratch(n uint64) []byte {
	if m.dev == nil {
		return nil
	}
	return make([]byte, n)
}

// get returns the n bytes at pool offset off: the pool's own memory for a
// host pool (buf unused; writes into it land in the pool), buf (scratch's,
// of n bytes) filled from the GPU for a device pool (write it back with
// put).
func (m *poolMem) get(off, n uint64, buf []byte) ([]byte, error) {
	if m.dev == nil {
		return m.host[off : off+n : off+n], nil
	}
	if uint64(len(buf)) != n {
		return nil, fmt.Errorf("a %d-byte buffer for %d bytes of the device pool", len(buf), n)
	}
	if err := m.dev.CopyDtoH(buf, m.base+cuda.DevicePtr(off)); err != nil {
		return nil, err
	}
	return buf, nil
}

// put writes b, which get returned for off, back into the pool (nothing
// to do for a host pool).
func (m *poolMem) put(off uint64, b []byte) error {
	if m.dev == nil {
		return nil
	}
	return m.dev.CopyHtoD(m.base+cuda.DevicePtr(off), b)
}

// close releases the GPU (a host pool holds nothing).
func (m *poolMem) close() error {
	if m == nil || m.dev == nil {
		return nil
	}
	return m.dev.Close()
}
