package cuda

import (
	"fmt"
	"math/bits"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/kvcache"
)

// Memory is one device allocation (cuMemAlloc).
type Memory struct {
	dev   *Device
	ptr   DevicePtr
	len   uint64
	freed atomic.Bool
}

// Alloc allocates n bytes of device memory (n ≥ 1). The memory is not
// zeroed.
func (d *Device) Alloc(n uint64) (*Memory, error) {
	if n == 0 {
		return nil, fmt.Errorf("%s: alloc: %w: length 0", d, kvcache.ErrBadRegion)
	}
	ctx, err := d.context()
	if err != nil {
		return nil, err
	}
	p, err := libMemAlloc(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("%s: alloc %d bytes: %w", d, n, err)
	}
	return &Memory{dev: d, ptr: p, len: n}, nil
}

// Ptr is the allocation's device address.
func (m *Memory) Ptr() DevicePtr { return m.ptr }

// Len is the allocation's size in bytes.
func (m *Memory) Len() uint64 { return m.len }

// Device is the device the memory lives on.
func (m *Memory) Device() *Device { return m.dev }

// Region wraps the allocation as a kvcache.Region of kind DeviceMem, for a
// pool and for registration with a data-plane agent. The region does not
// own the memory: free it (Close) only after the region is no longer used.
func (m *Memory) Region() (*kvcache.Region, error) {
	return kvcache.ExternalDeviceRegion(uintptr(m.ptr), m.len, m.dev.ordinal)
}

// Free releases the allocation. Nothing may still read or write it (every
// stream that used it synchronised). Idempotent: once it is freed, later
// calls return nil. On a device closed first (Device.Close says to free
// its memory before) nothing is freed and every call says ErrClosed.
func (m *Memory) Free() error {
	if m.freed.Load() {
		return nil
	}
	ctx, err := m.dev.context()
	if err != nil {
		return err // not freed: a later call says so again
	}
	if m.freed.Swap(true) {
		return nil
	}
	return libMemFree(ctx, m.ptr)
}

// Close is Free, so that Memory is an io.Closer.
func (m *Memory) Close() error { return m.Free() }

// NewRegion allocates n bytes of device memory and returns it as a
// DeviceMem kvcache.Region, with the Memory that owns it: close that after
// the region's last user (an engine, a pool) is done with it.
func (d *Device) NewRegion(n uint64) (*kvcache.Region, *Memory, error) {
	m, err := d.Alloc(n)
	if err != nil {
		return nil, nil, err
	}
	r, err := m.Region()
	if err != nil {
		m.Free()
		return nil, nil, err
	}
	return r, m, nil
}

// NewPool allocates blocks × blockBytes bytes of device memory and carves
// a kvcache.Pool from it (block i at offset i×blockBytes). The Memory owns
// the blocks: close it after the pool's last user is done.
func (d *Device) NewPool(blockBytes uint64, blocks int) (*kvcache.Pool, *Memory, error) {
	if blockBytes == 0 || blocks < 1 {
		return nil, nil, fmt.Errorf("%s: new pool: %w: %d blocks of %d bytes", d, kvcache.ErrBadRegion, blocks, blockBytes)
	}
	hi, size := bits.Mul64(blockBytes, uint64(blocks))
	if hi != 0 {
		return nil, nil, fmt.Errorf("%s: new pool: %w: %d blocks of %d bytes overflow", d, kvcache.ErrBadRegion, blocks, blockBytes)
	}
	r, m, err := d.NewRegion(size)
	if err != nil {
		return nil, nil, err
	}
	p, err := kvcache.NewPool(r, 0, blockBytes, blocks)
	if err != nil {
		m.Free()
		return nil, nil, err
	}
	return p, m, nil
}
