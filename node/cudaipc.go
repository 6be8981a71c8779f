package node

import (
	"errors"
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
)

// ErrOtherHost: a request's peer runs on another host (or pid namespace)
// than this node, and the node's backend (cudaipc) reaches processes of
// one host only.
var ErrOtherHost = errors.New("node: peer on another host")

// thisHost names this host and pid namespace (a variable for tests).
var thisHost = pidwatch.Host

// cudaHint is what a node on backend cudaipc says to use where it cannot
// run.
const cudaHint = `backend "cudaipc" needs an NVIDIA GPU and its CUDA driver (libcuda.so.1, or $` + cuda.LibraryEnv +
	`) on this host: use backend "shm" (host memory, one host) or "ucx" (host memory; device memory with a UCX built with CUDA)`

// cudaDevice checks that the driver is there and that c.Device is one of
// its devices: an error wrapping cuda.ErrNoDevice that names the backend
// when there is no driver or no device, ErrConfig naming device when the
// ordinal is past the devices present.
func cudaDevice(c Config) error {
	n, err := cuda.DeviceCount()
	if err == nil && n == 0 {
		err = fmt.Errorf("%w: the driver reports no device", cuda.ErrNoDevice)
	}
	if err != nil {
		return fmt.Errorf("node: backend = %q: %w (%s)", cudaipc.Backend, err, cudaHint)
	}
	if c.Device >= n {
		return bad("device", c.Device, "this host has %d CUDA devices (ordinals 0..%d): give one of them", n, n-1)
	}
	return nil
}

// openCUDA opens the data plane of a node on backend cudaipc with a pool
// of its own: size bytes of device memory on GPU c.Device, registered by
// the engine with a cudaipc agent on that GPU. The returned closer frees
// the memory and releases the device; closeData calls it after the agent
// closed.
func openCUDA(c Config, size uint64) (rdma.Agent, *kvcache.Region, *devicePool, error) {
	if err := cudaDevice(c); err != nil {
		return nil, nil, nil, err
	}
	dev, err := cuda.OpenDevice(c.Device)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("node: backend = %q, device = %d: %w", cudaipc.Backend, c.Device, err)
	}
	region, mem, err := dev.NewRegion(size)
	if err != nil {
		_ = dev.Close()
		return nil, nil, nil, fmt.Errorf("node: pool_bytes = %d on %s: %w", size, dev, err)
	}
	pool := &devicePool{mem: mem, dev: dev}
	a, err := newCUDAAgent(c)
	if err != nil {
		_ = pool.Close()
		return nil, nil, nil, err
	}
	return a, region, pool, nil
}

// newCUDAAgent starts the cudaipc agent on GPU c.Device, wrapped so that
// a peer of another host is refused by name.
func newCUDAAgent(c Config) (*oneHostAgent, error) {
	if err := cudaDevice(c); err != nil {
		return nil, err
	}
	a, err := cudaipc.New(cudaipc.WithDevice(c.Device))
	if err != nil {
		return nil, fmt.Errorf("node: backend = %q, device = %d: %w (%s)", cudaipc.Backend, c.Device, err, cudaHint)
	}
	o := &oneHostAgent{Agent: a, procs: map[string]hostPeer{}}
	o.host, o.hostErr = thisHost()
	return o, nil
}

// devicePool is a node's own pool on cudaipc: one device allocation, and
// the device handle it was made from (the agent's own is closed with the
// agent, which closes first).
type devicePool struct {
	mem *cuda.Memory
	dev *cuda.Device
}

// Close frees the memory, then releases the device.
func (p *devicePool) Close() error {
	return errors.Join(p.mem.Free(), p.dev.Close())
}

// oneHostAgent is the cudaipc agent of a node. CUDA IPC handles open only
// in processes of the host that made them, and cudaipc's agent addresses
// name a pid, which on another host is some other process or none: the
// node therefore remembers each peer's Hello (the process it names, with
// its host and pid namespace) and refuses, by name, to connect to the
// agent of a peer on another host, instead of letting the request fail on
// a missing control file. A Hello that names no process leaves the check
// to cudaipc: a pid with no process here is rdma.ErrPeerGone (which the
// error then explains), one that is another process's fails the first
// write (rdma.ErrBadKey: the key's control file is not on this host).
type oneHostAgent struct {
	*cudaipc.Agent
	host    string // pidwatch.Host of this process
	hostErr error

	mu    sync.Mutex
	procs map[string]hostPeer // by agent address

	// caller is the framework's memory (CallerMemory.Region), registered
	// by callerSpans, the bytes its tensors use, in callerAllocs
	// allocations; nil for a node's own pool.
	caller       *kvcache.Region
	callerSpans  []cudaipc.Span
	callerAllocs int
}

// hostPeer is the peer whose Hello carried an agent address, and the
// process it named.
type hostPeer struct {
	peer messages.PeerID
	proc messages.ProcessID
}

// noteHello records the process a cudaipc peer's Hello names.
func (a *oneHostAgent) noteHello(h *messages.Hello) {
	if h.Backend != cudaipc.Backend || len(h.AgentAddr) == 0 {
		return
	}
	a.mu.Lock()
	a.procs[string(h.AgentAddr)] = hostPeer{peer: h.From, proc: h.Process}
	a.mu.Unlock()
}

// Connect refuses the agent of a peer whose Hello names a process of
// another host or pid namespace (ErrOtherHost), and otherwise connects
// through cudaipc, saying on rdma.ErrPeerGone that the backend reaches
// processes of this host only.
func (a *oneHostAgent) Connect(peer []byte) (rdma.Endpoint, error) {
	a.mu.Lock()
	p, ok := a.procs[string(peer)]
	a.mu.Unlock()
	if ok && !p.proc.IsZero() && a.hostErr == nil && p.proc.Host != a.host {
		return nil, fmt.Errorf("%w: peer %s runs on host %s (process %d), this node on %s: backend %q reaches GPU memory of processes of one host only: run both ranks on one host, or use backend \"ucx\" (with a UCX built with CUDA) across hosts",
			ErrOtherHost, p.peer, p.proc.Host, p.proc.Pid, a.host, cudaipc.Backend)
	}
	ep, err := a.Agent.Connect(peer)
	if errors.Is(err, rdma.ErrPeerGone) {
		return nil, fmt.Errorf("%w (backend %q reaches processes of this host only: a peer on another host needs backend \"ucx\")", err, cudaipc.Backend)
	}
	return ep, err
}

// validateDevice checks device, and what a node on backend cudaipc cannot
// do: its pool is GPU memory, which the CPU cannot address (memory lays
// tensors out for the CPU's view of the pool) and whose CUDA IPC mappings
// cannot be withdrawn (revocation). The device count is checked at Open
// (cudaDevice): Validate touches no driver.
func (c Config) validateDevice() error {
	if c.Backend != cudaipc.Backend {
		if c.Device != 0 {
			return bad("device", c.Device, "set with backend = %s: only backend %q runs on a GPU of its choice: drop device, or give backend %q",
				show(c.Backend), cudaipc.Backend, cudaipc.Backend)
		}
		return nil
	}
	if c.Device < 0 {
		return bad("device", c.Device, "not a CUDA ordinal: give 0 (the default) or the ordinal of this node's GPU")
	}
	if c.Memory != nil {
		return bad("memory", *c.Memory, "backend %q: memory lays the framework's tensors out in the node's pool, but a cudaipc pool is GPU memory the CPU cannot address: give the framework's own device tensors as CallerMemory (capi: \"memory\" with tensor addresses), or use backend \"shm\" or \"ucx\" for a host pool",
			cudaipc.Backend)
	}
	if c.RevokeSpareBytes > 0 {
		return bad("revoke_spare_bytes", c.RevokeSpareBytes, "backend %q does not revoke: a writer's CUDA IPC mapping of the pool cannot be withdrawn: give 0 or < 0 (failed requests' blocks are then quarantined until their writer's proof)",
			cudaipc.Backend)
	}
	return nil
}

// useCallerMemory makes the agent register the framework's memory m
// (CallerMemory on backend cudaipc) by the CUDA allocations its described
// tensors lie in: a framework's per-layer tensors are as many
// allocations, with unmapped gaps between them, and cudaipc shares memory
// by each allocation's IPC handle (cudaipc.Agent.RegisterSpans). It checks
// them now, so that a tensor no allocation holds, or one that runs out of
// the allocation holding its first byte, fails Open with ErrConfig naming
// the tensor and its addresses; Register then registers m.Region with
// those spans.
func (a *oneHostAgent) useCallerMemory(m *CallerMemory) error {
	r := m.Region
	spans, names, err := callerSpans(m)
	if err != nil {
		return err
	}
	allocs, err := a.Agent.Allocations(r, spans)
	var se *cudaipc.SpanError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("%w: CallerMemory.Region (device %d at %#x, %d bytes): %s, region bytes [%d, +%d): %v: backend %q registers the framework's memory by the CUDA allocations its tensors lie in (one IPC handle each), so each tensor must lie in one allocation on device %d: give tensors the framework allocated on that GPU, each whole (not a view across allocations), or use backend \"ucx\" with a UCX built with CUDA",
			ErrConfig, r.Device, r.Base, r.Len, names[se.Index], se.Span.Off, se.Span.Len, se.Err, cudaipc.Backend, r.Device)
	case err != nil:
		return fmt.Errorf("%w: CallerMemory.Region (device %d at %#x, %d bytes): %v", ErrConfig, r.Device, r.Base, r.Len, err)
	}
	a.caller, a.callerSpans, a.callerAllocs = r, spans, len(allocs)
	return nil
}

// callerSpans lists the bytes of m.Region that m's tensors use, one span
// per (group, layer, part) from its block 0's first byte to its last
// block's last byte, named for errors; the whole region when m has no
// descriptors (the region is then a pool laid out as the node's own).
func callerSpans(m *CallerMemory) ([]cudaipc.Span, []string, error) {
	if len(m.Memory) == 0 {
		return []cudaipc.Span{{Off: 0, Len: m.Region.Len}}, []string{"the region (no Memory descriptors: all of it is the pool)"}, nil
	}
	var spans []cudaipc.Span
	var names []string
	for g, km := range m.Memory {
		if km == nil {
			return nil, nil, fmt.Errorf("%w: CallerMemory.Memory[%d] is nil: give one descriptor per layer group", ErrConfig, g)
		}
		if km.Blocks == 0 {
			continue
		}
		for _, layer := range km.Layers {
			for part := range km.Parts {
				lo, _, ok1 := km.TensorBlock(layer, part, 0)
				hi, n, ok2 := km.TensorBlock(layer, part, kvcache.BlockID(km.Blocks-1))
				name := fmt.Sprintf("CallerMemory.Memory[%d] (%s) layer %d part %d", g, km.Kind, layer, part)
				if !ok1 || !ok2 || hi+n < lo {
					return nil, nil, fmt.Errorf("%w: %s: no tensor span (its Base, strides and Blocks do not give one): check the descriptor (kvcache.KVMemory.Validate)", ErrConfig, name)
				}
				spans = append(spans, cudaipc.Span{Off: lo, Len: hi + n - lo})
				names = append(names, name)
			}
		}
	}
	if len(spans) == 0 {
		return []cudaipc.Span{{Off: 0, Len: m.Region.Len}}, []string{"the region (its descriptors hold no block)"}, nil
	}
	return spans, names, nil
}

// Register registers the framework's memory (useCallerMemory) by the
// allocations its tensors lie in, and any other region as cudaipc does.
func (a *oneHostAgent) Register(r *kvcache.Region) (rdma.Registration, error) {
	if a.caller != nil && r == a.caller {
		return a.Agent.RegisterSpans(r, a.callerSpans)
	}
	return a.Agent.Register(r)
}
