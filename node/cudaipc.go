package node

import (
	"errors"
	"fmt"
	"slices"
	"strings"
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
func openCUDA(c Config, size uint64, identity string) (rdma.Agent, *kvcache.Region, *devicePool, error) {
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
	a, err := newCUDAAgent(c, identity)
	if err != nil {
		_ = pool.Close()
		return nil, nil, nil, err
	}
	return a, region, pool, nil
}

// newCUDAAgent starts the cudaipc agent on GPU c.Device, stating
// identity (the node's rank) in its agent file, wrapped so that a peer of
// another host is refused by name.
func newCUDAAgent(c Config, identity string) (*oneHostAgent, error) {
	if err := cudaDevice(c); err != nil {
		return nil, err
	}
	a, err := cudaipc.New(cudaipc.WithDevice(c.Device), cudaipc.WithIdentity(identity))
	if err != nil {
		return nil, fmt.Errorf("node: backend = %q, device = %d: %w (%s)", cudaipc.Backend, c.Device, err, cudaHint)
	}
	o := &oneHostAgent{Agent: a, procs: map[messages.PeerID]hostPeer{}}
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
// name a pid, which on another host is some other process or none.
// Whether an agent is on this host is cudaipc's to answer, from what is
// local: its agent file, which names the agent's process, host and pid
// namespace (cudaipc.Agent.Connect). The node only words the refusal:
// it remembers each peer's last Hello (the agent address and the process
// it names), and when cudaipc cannot find an agent here that a peer of
// another host named, it refuses with ErrOtherHost naming that peer and
// host. A Hello decides nothing about an agent that is found: a peer's
// Hello naming another's address cannot fail requests to it. Which peer
// an agent found serves is the writer's check (cudaipc's endpoints are
// rdma.IdentifiedEndpoint).
type oneHostAgent struct {
	*cudaipc.Agent
	host    string // pidwatch.Host of this process
	hostErr error

	mu sync.Mutex
	// procs holds each peer's last cudaipc Hello: one entry per peer (a
	// restarted peer replaces its own), at most maxHelloPeers.
	procs map[messages.PeerID]hostPeer

	// caller is the framework's memory (CallerMemory.Region), registered
	// by callerSpans, the bytes its tensors use, in callerAllocs
	// allocations; nil for a node's own pool.
	caller       *kvcache.Region
	callerSpans  []cudaipc.Span
	callerAllocs int
}

// maxHelloPeers bounds the peers whose Hello oneHostAgent remembers; past
// it one entry is dropped for each new peer (the records only word an
// error).
const maxHelloPeers = 4096

// hostPeer is the agent address of a peer's Hello, and the process it
// named.
type hostPeer struct {
	addr string
	proc messages.ProcessID
}

// noteHello records the agent address and process a cudaipc peer's Hello
// names, replacing that peer's earlier one.
func (a *oneHostAgent) noteHello(h *messages.Hello) {
	if h.Backend != cudaipc.Backend || len(h.AgentAddr) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.procs[h.From]; !ok && len(a.procs) >= maxHelloPeers {
		for p := range a.procs {
			delete(a.procs, p)
			break
		}
	}
	a.procs[h.From] = hostPeer{addr: string(h.AgentAddr), proc: h.Process}
}

// Connect connects through cudaipc, which finds the agent on this host or
// refuses. When it cannot find it (rdma.ErrPeerGone), the error says that
// the backend reaches processes of this host only, and is ErrOtherHost,
// naming the peer and its host, if a peer whose last Hello named this
// address runs on another host or pid namespace.
func (a *oneHostAgent) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := a.Agent.Connect(peer)
	if !errors.Is(err, rdma.ErrPeerGone) {
		return ep, err
	}
	if a.hostErr == nil {
		a.mu.Lock()
		var far []string
		for id, p := range a.procs {
			if p.addr == string(peer) && !p.proc.IsZero() && p.proc.Host != a.host {
				far = append(far, fmt.Sprintf("peer %s runs on host %s (process %d)", id, p.proc.Host, p.proc.Pid))
			}
		}
		a.mu.Unlock()
		if len(far) > 0 {
			slices.Sort(far)
			return nil, fmt.Errorf("%w: %s, this node on %s: backend %q reaches GPU memory of processes of one host only: run both ranks on one host, or use backend \"ucx\" (with a UCX built with CUDA) across hosts (%v)",
				ErrOtherHost, strings.Join(far, "; "), a.host, cudaipc.Backend, err)
		}
	}
	return nil, fmt.Errorf("%w (backend %q reaches processes of this host only: a peer on another host needs backend \"ucx\")", err, cudaipc.Backend)
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
// the tensor and its addresses, and so does memory of another GPU than
// the region's Device (the driver's word: cuPointerGetAttribute), naming
// both; Register then registers m.Region with those spans.
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
	// Under unified addressing the driver sizes another GPU's allocation
	// as well: ask whose memory each allocation is.
	for i, al := range allocs {
		o, err := a.Agent.Device().PointerDevice(al.Base)
		if err != nil {
			return fmt.Errorf("%w: CallerMemory.Region (device %d at %#x, %d bytes): allocation %d of %d at %#x: which device's memory: %v",
				ErrConfig, r.Device, r.Base, r.Len, i, len(allocs), uintptr(al.Base), err)
		}
		if o != r.Device {
			return fmt.Errorf("%w: CallerMemory.Region (at %#x, %d bytes) says device %d, but the driver puts its allocation %d of %d at %#x on device %d: give the device the framework's tensors are on (Region.Device and device = %d), or tensors of device %d",
				ErrConfig, r.Base, r.Len, r.Device, i, len(allocs), uintptr(al.Base), o, o, r.Device)
		}
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
