package node

import (
	"fmt"
	"slices"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// CallerMemory is KV memory the serving framework allocated itself (vLLM's
// KV cache tensors), which a node opened with Config.CallerMemory uses as
// its memory instead of a pool of its own: peers write into the
// framework's tensors, and block ids are the framework's.
//
// Region spans the tensors (kvcache.ExternalHostRegion over the lowest
// tensor byte, of the length to the end of the highest; or
// kvcache.ExternalDeviceRegion); Memory has one descriptor per layer group
// (kvcache.FrameworkMemory, or any strided kvcache.KVMemory), offsets
// relative to Region, RegionLen equal to Region.Len, as the root package's
// Config.Region and Config.Memory take them. Capi's kvxfer_node_open builds
// both from the tensors' addresses ("memory" with "layers"). With Memory
// nil, Region is the pool itself, laid out as the node's own would be
// (block b of group g at the group's offset + b × its block bytes: one
// cross-layer block, as vLLM's cross-layer KV cache tensor;
// kvxfer_node_open's "pool_address").
//
// Backends, checked at Validate (each refusal names the backend):
//
//   - A receiving rank (not SendOnly) needs its peers to write into this
//     memory, so its backend must register memory it did not allocate:
//     ucx does (host memory; device memory only where UCX reports CUDA
//     support, ucx.Agent.MemoryTypes, else Open fails naming the types it
//     has). shm does not (its pool must live in its /dev/shm file): a
//     receiving node over caller memory on shm, or on "auto" where this
//     binary has no UCX, is refused. loopback works, for peers in this
//     same process only.
//   - cudaipc (GPU to GPU on one host): device memory of GPU
//     Config.Device only. Its bytes may lie in several CUDA allocations
//     (vLLM's per-layer tensors, each its own, with gaps between them):
//     the node registers the region by the allocations that hold the
//     described tensors (each (layer, part) tensor from its block 0 to its
//     last block; the whole region when Memory is nil), one IPC handle
//     each (cudaipc.Agent.RegisterSpans). Each tensor must lie in one
//     allocation: host memory, another GPU's memory, a tensor in no
//     allocation or one that runs out of its allocation (a view across
//     two) are refused at Open by name, as are more than
//     cudaipc.MaxAllocations allocations.
//   - A SendOnly rank's memory is only read by its own agent, so any
//     backend works for host memory (shm and loopback read host memory
//     only; device memory needs ucx with CUDA).
//
// What does not apply, by design: revocation (revoke_spare_bytes > 0 is
// refused: a framework block is no one range of a pool to move onto spare
// memory; failed requests' blocks are quarantined until their writer's
// proof) and proofs of death through a writer's exit (no peer process maps
// the framework's memory, so none can be tied to it: its pages wait for a
// Result or CancelAck).
//
// The memory must outlive the node: the node never frees it, and the
// framework must not free or reuse it before Close returned nil. When
// Close returns an error (a session could not drain within its ctx, as
// kvxfer_engine_close's KVXFER_ERR_TIMEOUT), a peer's write may still
// land: the memory must then never be freed (keep it for the life of the
// process).
type CallerMemory struct {
	Region *kvcache.Region
	Memory []*kvcache.KVMemory
}

// validateCallerMemory checks CallerMemory against the rest of c.
func (c Config) validateCallerMemory() error {
	m := c.CallerMemory
	if m == nil {
		return nil
	}
	if m.Region == nil || m.Region.Len == 0 || m.Region.Base == 0 {
		return fmt.Errorf("%w: CallerMemory.Region is nil or empty: want the region spanning the framework's tensors", ErrConfig)
	}
	if c.Memory != nil {
		return bad("memory", *c.Memory, "set with CallerMemory: memory lays the framework's tensors out inside the node's own pool, CallerMemory is the framework's own memory; give one")
	}
	if c.PoolBytes != 0 && c.PoolBytes != m.Region.Len {
		return bad("pool_bytes", c.PoolBytes, "the node has no pool over the framework's memory (CallerMemory, %d bytes): leave pool_bytes 0", m.Region.Len)
	}
	if c.RevokeSpareBytes > 0 {
		return bad("revoke_spare_bytes", c.RevokeSpareBytes, "a node over the framework's memory does not revoke (a framework block is no one range of a pool to move onto spare memory): give 0 or < 0; failed requests' blocks are quarantined until their writer's proof")
	}
	backend, shown := c.backend(), show(c.Backend)
	if backend != c.Backend {
		shown += " (" + backend + ")"
	}
	if backend == cudaipc.Backend {
		switch {
		case m.Region.Kind != kvcache.DeviceMem:
			return fmt.Errorf("%w: CallerMemory.Region (%s memory at %#x, %d bytes): backend %q moves GPU memory only: give device tensors, or use backend \"shm\" (send_only) or \"ucx\" for host memory",
				ErrConfig, m.Region.Kind, m.Region.Base, m.Region.Len, backend)
		case m.Region.Device != c.Device:
			return fmt.Errorf("%w: CallerMemory.Region is memory of device %d, but device = %d: the node's cudaipc agent copies on device %d: give device = %d (or tensors of device %d)",
				ErrConfig, m.Region.Device, c.Device, c.Device, m.Region.Device, c.Device)
		}
		return nil
	}
	if m.Region.Kind == kvcache.DeviceMem && backend != ucx.Backend {
		return fmt.Errorf("%w: backend = %s: the framework's memory is GPU memory (device %d), which backend %s cannot read or write (host memory only): use backend \"ucx\" with a UCX built with CUDA, or \"cudaipc\" between processes of one host",
			ErrConfig, shown, m.Region.Device, backend)
	}
	if !c.SendOnly && backend == shm.Backend {
		return fmt.Errorf("%w: backend = %s: a receiving node over the framework's memory needs a backend that registers memory it did not allocate, and shm's pool must live in its /dev/shm file: use backend \"ucx\" (or send_only for a rank that only sends)",
			ErrConfig, shown)
	}
	return nil
}

// callerAgent opens backend's agent for a node over the framework's
// memory, refusing device memory this UCX cannot register.
func callerAgent(c Config, backend string, self messages.PeerID, uopts []ucx.Option) (rdma.Agent, error) {
	switch backend {
	case cudaipc.Backend:
		a, err := newCUDAAgent(c, self.String())
		if err != nil {
			return nil, err
		}
		if err := a.useCallerMemory(c.CallerMemory); err != nil {
			_ = a.Close()
			return nil, err
		}
		return a, nil
	case loopback.Backend:
		return loopback.New(), nil
	case shm.Backend: // a send-only node: its memory is only a source
		return shm.New(), nil
	}
	a, err := ucx.New(uopts...)
	if err != nil {
		return nil, fmt.Errorf("node: backend ucx: %w (backend \"shm\" runs without UCX, for a send-only rank)", err)
	}
	if r := c.CallerMemory.Region; r.Kind == kvcache.DeviceMem && !slices.Contains(a.MemoryTypes(), "cuda") {
		_ = a.Close()
		return nil, fmt.Errorf("%w: backend = %q: the framework's memory is GPU memory (device %d at %#x, %d bytes), but this UCX has no CUDA support (it registers: %v): use a UCX built with CUDA, or host tensors",
			ErrConfig, backend, r.Device, r.Base, r.Len, a.MemoryTypes())
	}
	return a, nil
}
