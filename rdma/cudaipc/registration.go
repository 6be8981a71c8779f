package cudaipc

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// registration is a device region registered with one agent: the
// allocations its bytes in use lie in (their IPC handles in the control
// file's table) and a control file that peers map to check the key and
// count their batches in flight.
type registration struct {
	agent  *Agent
	id     uint64
	region *kvcache.Region
	ptr    cuda.DevicePtr // the region's base (device address)
	// allocs are the region's bytes that may be read or written, by
	// allocation: ascending and disjoint, addresses of this process.
	allocs []mapped
	key    regionKey
	ctl    *controlMap
	remote rdma.RemoteRegion
	// dead is set once the registration is revoked, before its control
	// file is unmapped, under use's write lock; a Post reads it, and uses
	// the lease, under use's read lock: a stale registration never touches
	// its lease, and a Deregister cannot unmap it under a Post.
	dead atomic.Bool
	use  sync.RWMutex
}

var _ rdma.Registration = (*registration)(nil)

func (r *registration) Region() *kvcache.Region { return r.region }

func (r *registration) Remote() rdma.RemoteRegion {
	return rdma.RemoteRegion{Key: append([]byte(nil), r.remote.Key...), Len: r.remote.Len}
}

// exports maps the control-file ids of this process's live registrations
// to them: a process cannot open its own IPC handles, so an endpoint whose
// peer lives in the same process finds the allocation here instead.
var exports = struct {
	mu sync.Mutex
	m  map[[16]byte]*registration
}{m: make(map[[16]byte]*registration)}

func exportLocal(r *registration) {
	exports.mu.Lock()
	exports.m[r.key.fileID] = r
	exports.mu.Unlock()
}

func unexportLocal(r *registration) {
	exports.mu.Lock()
	delete(exports.m, r.key.fileID)
	exports.mu.Unlock()
}

func lookupLocal(fileID [16]byte) *registration {
	exports.mu.Lock()
	defer exports.mu.Unlock()
	return exports.m[fileID]
}

// imports counts this process's mappings of other processes' allocations,
// per (handle, device): the driver maps a handle once per device and
// process, and the mapping is closed when its last endpoint closes.
var imports = struct {
	mu sync.Mutex
	m  map[importKey]*imported
}{m: make(map[importKey]*imported)}

type importKey struct {
	handle cuda.IPCHandle
	device int
}

type imported struct {
	key  importKey
	dev  *cuda.Device
	base cuda.DevicePtr
	size uint64 // of the allocation, as the driver reports it
	refs int
}

// openImport maps h on dev's GPU (or takes another reference to its
// mapping). The mapping holds a Device of its own on that GPU (a reference
// to its primary context), closed with the mapping: the agent whose
// endpoint opened it may close before the last endpoint that shares it.
func openImport(dev *cuda.Device, h cuda.IPCHandle) (*imported, error) {
	k := importKey{h, dev.Ordinal()}
	imports.mu.Lock()
	defer imports.mu.Unlock()
	if im := imports.m[k]; im != nil {
		im.refs++
		return im, nil
	}
	dev, err := cuda.OpenDevice(k.device)
	if err != nil {
		return nil, err
	}
	base, err := dev.OpenIPC(h)
	if err != nil {
		_ = dev.Close()
		return nil, err
	}
	// The size comes from the driver, not from the peer: a key's offset
	// and length are checked against it before any copy (endpoint.open).
	start, size, err := dev.AddressRange(base)
	if err != nil || start != base {
		_ = dev.CloseIPC(base)
		_ = dev.Close()
		if err == nil {
			err = fmt.Errorf("the driver puts the imported allocation at %#x, not %#x", start, base)
		}
		return nil, fmt.Errorf("imported allocation: %w", err)
	}
	im := &imported{key: k, dev: dev, base: base, size: size, refs: 1}
	imports.m[k] = im
	return im, nil
}

// release drops one reference; the last closes the mapping. Nothing may
// still copy into it (the caller synchronised its stream).
func (im *imported) release() error {
	imports.mu.Lock()
	defer imports.mu.Unlock()
	if im.refs--; im.refs > 0 {
		return nil
	}
	delete(imports.m, im.key)
	return errors.Join(im.dev.CloseIPC(im.base), im.dev.Close())
}
