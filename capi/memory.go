package capi

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"unsafe"

	"github.com/kvxfer/kvxfer"
	quotepkg "github.com/kvxfer/kvxfer/internal/quote"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Memory is the framework's KV memory in an engine's JSON config
// ("memory"): the address of each layer's tensor as the framework holds it,
// for every layer this rank holds, in ascending global layer order.
//
//   - "nhd": vLLM's [2, num_blocks, block_size, kv_heads, head_dim] per
//     layer (layers: the tensors' addresses);
//   - "hnd": [2, num_blocks, kv_heads, block_size, head_dim];
//   - "split_kv": [num_blocks, block_size, kv_heads, head_dim], K tensors in
//     layers and V tensors in v_layers;
//   - "mla": [num_blocks, block_size, latent] per layer.
//
// strides, when given, replace the kind's contiguous byte strides (PyTorch
// strides × element size): block, token, head, elem, and kv, the distance
// from a joint tensor's K to its V (nhd, hnd). The registered region spans
// the lowest tensor address to the end of the highest tensor; kvxfer writes
// only the described elements of it. dtype_bytes, when given, is the
// tensors' element size, refused unless it is the layout's dtype_bytes
// (float32 tensors under a bf16 layout would get half of each element).
// device, when given, is the CUDA ordinal of the tensors: the region is
// then GPU memory (kvcache.ExternalDeviceRegion over the same span), which
// only a node over a data plane that reaches GPU memory can use (Open
// refuses it: its loopback data plane copies with the CPU).
type Memory struct {
	Kind       string   `json:"kind"`
	NumBlocks  int      `json:"num_blocks"`
	Layers     []uint64 `json:"layers"`
	VLayers    []uint64 `json:"v_layers"`
	Strides    *Strides `json:"strides"`
	DTypeBytes int      `json:"dtype_bytes"`
	// Device is the raw "device" value (cudaOrdinal reads it): absent or
	// null for host memory.
	Device json.RawMessage `json:"device"`
}

// Strides are a Memory's byte strides.
type Strides struct {
	Block uint64 `json:"block"`
	Token uint64 `json:"token"`
	Head  uint64 `json:"head"`
	Elem  uint64 `json:"elem"`
	KV    uint64 `json:"kv"`
}

// maxMemorySpan bounds the region from the lowest to the highest tensor
// byte: a user address space (2^47 bytes on x86-64 and arm64). Separately
// allocated tensors (a framework's per-layer caches) lie far apart, and the
// in-process engine's region is only address arithmetic over them: the
// loopback data plane copies the described elements and touches nothing
// between.
const maxMemorySpan = 1 << 47

// minHostAddress is the lowest address host memory can have: the first
// page is never mapped, and the Go runtime aborts the process when it
// finds a "pointer" below it on a stack it moves ("invalid pointer found
// on stack"), so such an address must be refused before it becomes an
// unsafe.Pointer.
const minHostAddress = 4096

// HostAddress refuses a caller's host address (what names it) that no
// memory can have: 0 < a < minHostAddress (ErrInvalidArgument naming
// it). 0 is left to the callers, which take it for "none" or refuse it.
func HostAddress(what string, a uint64) error {
	if a != 0 && a < minHostAddress {
		return errorf(ErrInvalidArgument, "%s = %#x: not an address of host memory (below %d, never mapped)", what, a, minHostAddress)
	}
	return nil
}

// cudaOrdinal reads key's raw value, the CUDA device ordinal of memory
// given by address: (ordinal, true) for an integer in [0, 2^31), (0,
// false) when absent or null (host memory). Anything else (negative, a
// fraction, a string) is ErrConfig naming key and value.
func cudaOrdinal(key string, raw json.RawMessage) (int, bool, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false, nil
	}
	var d int64
	if err := json.Unmarshal(raw, &d); err != nil || d < 0 || d > math.MaxInt32 {
		return 0, false, errorf(ErrConfig, "%s = %s: want the CUDA device ordinal of the memory (torch's tensor.device.index), an integer ≥ 0; leave %s out for host memory",
			key, quotepkg.JSONValue(raw), key)
	}
	return int(d), true, nil
}

// stageNote says, for a rank of a pipeline-parallel instance, which layers
// its stage holds and how the config splits the model's layers over the
// stages: a framework that splits them otherwise gives a stage another
// number of layers, and says its split in pp_stages (vLLM puts the extra
// layers of an uneven split on the stages before the last, and
// VLLM_PP_LAYER_PARTITION splits any way).
func stageNote(kc *kvxfer.Config, l kvcache.Layout, s kvcache.Shape) string {
	if kc.Parallel.PP <= 1 {
		return ""
	}
	note := fmt.Sprintf(" (layers %d to %d of the model's %d: the stages split them as %v",
		s.LayerLo, s.LayerHi-1, l.Layers, kc.Parallel.Split(l.Layers))
	if kc.Parallel.Stages == "" && l.Layers%kc.Parallel.PP != 0 {
		note += ", kvxfer's default for an uneven count, the first stages one layer longer (TensorRT-LLM's); " +
			"a framework that splits otherwise says its split in pp_stages (vLLM's default here: \"" +
			kvcache.VLLMStages(l.Layers, kc.Parallel.PP) + "\")"
	}
	return note + ")"
}

// describe sets kc.Region and kc.Memory from m: a host region, or a
// device region (kvcache.DeviceMem) when m.Device is given.
func (m *Memory) describe(kc *kvxfer.Config) error {
	dev, onDevice, err := cudaOrdinal("memory.device", m.Device)
	if err != nil {
		return err
	}
	l, s, err := kc.LayoutShape()
	if err != nil {
		return errorf(ErrConfig, "memory: %v", err)
	}
	var held int
	for g := range l.Groups {
		held += len(s.Layers[g])
	}
	split := m.Kind == "split_kv"
	if !slices.Contains(kvcache.FrameworkKinds, m.Kind) {
		return errorf(ErrConfig, "memory.kind = %s, want %s", quote(m.Kind), strings.Join(kvcache.FrameworkKinds, ", "))
	}
	if m.DTypeBytes != 0 && m.DTypeBytes != l.DTypeBytes {
		return errorf(ErrConfig, "memory.dtype_bytes = %d (the tensors' element size), but the layout's dtype_bytes is %d: tensors of another dtype than the model's",
			m.DTypeBytes, l.DTypeBytes)
	}
	if m.NumBlocks < 1 || m.NumBlocks > math.MaxInt32 {
		return errorf(ErrConfig, "memory.num_blocks = %d, must be ≥ 1", m.NumBlocks)
	}
	if len(m.Layers) != held {
		return errorf(ErrConfig, "memory.layers has %d addresses, rank %v holds %d layers%s", len(m.Layers), kc.Rank, held, stageNote(kc, l, s))
	}
	if split != (len(m.VLayers) > 0) || (split && len(m.VLayers) != held) {
		return errorf(ErrConfig, "memory.v_layers has %d addresses for kind %s (split_kv needs one per layer, %d; other kinds none)",
			len(m.VLayers), quote(m.Kind), held)
	}
	lo := uint64(math.MaxUint64)
	for i, a := range append(append([]uint64(nil), m.Layers...), m.VLayers...) {
		if a == 0 {
			return errorf(ErrConfig, "memory: tensor address %d is NULL", i)
		}
		lo = min(lo, a)
	}
	const provisional = math.MaxUint64 >> 2 // before the span is known
	kc.Memory = make([]*kvcache.KVMemory, len(l.Groups))
	for g := range l.Groups {
		n := len(s.Layers[g])
		if n == 0 {
			continue
		}
		offs := make([]uint64, n)
		var voffs []uint64
		for i, L := range s.Layers[g] {
			// m.Layers is in ascending layer order, every layer of the
			// stage [LayerLo, LayerHi) in one group or another: layer L's
			// address is at L-LayerLo, wherever its group's layers interleave
			// with another group's.
			offs[i] = m.Layers[L-s.LayerLo] - lo
			if split {
				voffs = append(voffs, m.VLayers[L-s.LayerLo]-lo)
			}
		}
		var d *kvcache.KVMemory
		if st := m.Strides; st != nil {
			// Validated with these strides: layers interleaved within a
			// block (vLLM's cross-layer caches) overlap as contiguous ones.
			d, err = kvcache.FrameworkMemoryStrided(m.Kind, l, s, g, m.NumBlocks, offs, voffs,
				kvcache.TensorStrides{Block: st.Block, Token: st.Token, Head: st.Head, Elem: st.Elem, KV: st.KV}, provisional)
		} else {
			d, err = kvcache.FrameworkMemory(m.Kind, l, s, g, m.NumBlocks, offs, voffs, provisional)
		}
		if err != nil {
			return errorf(ErrConfig, "memory of group %d: %v", g, err)
		}
		kc.Memory[g] = d
	}
	var end uint64
	for _, d := range kc.Memory {
		if d == nil {
			continue
		}
		for _, L := range d.Layers {
			for p := range d.Parts {
				off, n, ok := d.TensorBlock(L, p, kvcache.BlockID(d.Blocks-1))
				if !ok || off+n > maxMemorySpan {
					return errorf(ErrConfig, "memory: layer %d's tensors span more than %d bytes from the lowest address %#x (strides %+v)",
						L, uint64(maxMemorySpan), lo, m.Strides)
				}
				end = max(end, off+n)
			}
		}
	}
	for _, d := range kc.Memory {
		if d != nil {
			d.RegionLen = end
		}
	}
	var r *kvcache.Region
	if onDevice {
		// A device address: never dereferenced here (the region has no
		// bytes); the data plane that registers it reaches GPU memory.
		r, err = kvcache.ExternalDeviceRegion(uintptr(lo), end, dev)
	} else {
		// lo is the caller's (C) address, never a Go pointer: reinterpret
		// its bits rather than convert a uintptr (which vet rightly flags
		// for Go memory).
		if err := HostAddress("memory's lowest tensor address", lo); err != nil {
			return err
		}
		r, err = kvcache.ExternalHostRegion(*(*unsafe.Pointer)(unsafe.Pointer(&lo)), end)
	}
	if err != nil {
		return errorf(ErrInvalidArgument, "memory at %#x of %d bytes: %v", lo, end, err)
	}
	kc.Region, kc.PoolBytes = r, 0
	return nil
}
