package messages_test

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/messages/pb"
)

// TestHelloMemoryRejects: a Hello whose memory descriptor breaks a bound is
// refused by Decode (written bypassing Encode's validation) and by Encode,
// with an error that names the sender and the bad value.
func TestHelloMemoryRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(h *messages.Hello)
		want string
	}{
		{"group beyond pools", func(h *messages.Hello) { h.Memory[0].Group = 2 }, "group 2"},
		{"negative group", func(h *messages.Hello) { h.Memory[0].Group = -1 }, "group -1"},
		{"groups not ascending", func(h *messages.Hello) { h.Memory = append(h.Memory, h.Memory[0]) }, "memory[1] names group 0"},
		{"more descriptors than pools", func(h *messages.Hello) {
			h.Memory = append(h.Memory, h.Memory[0], h.Memory[0])
			h.Memory[1].Group, h.Memory[2].Group = 1, 1
		}, "3 memory descriptors for 2 layer groups"},
		{"three parts", func(h *messages.Hello) { h.Memory[0].Parts = 3 }, "parts = 3"},
		{"zero heads", func(h *messages.Hello) { h.Memory[0].Heads = 0 }, "heads = 0"},
		{"negative head lo", func(h *messages.Hello) { h.Memory[0].HeadLo = -4 }, "head_lo = -4"},
		{"huge head dim", func(h *messages.Hello) { h.Memory[0].HeadDim = math.MaxInt32 }, "head_dim = 2147483647"},
		{"elem bytes 0", func(h *messages.Hello) { h.Memory[0].ElemBytes = 0 }, "elem_bytes = 0"},
		{"tokens per block 0", func(h *messages.Hello) { h.Memory[0].TokensPerBlock = 0 }, "tokens_per_block = 0"},
		{"negative blocks", func(h *messages.Hello) { h.Memory[0].Blocks = -1 }, "blocks = -1"},
		{"too many blocks", func(h *messages.Hello) { h.Memory[0].Blocks = messages.MaxBlocks + 1 }, "blocks = 1048577"},
		{"kind 256", func(h *messages.Hello) { h.Memory[0].Kind = 256 }, "kind 256"},
		{"layers descending", func(h *messages.Hello) { h.Memory[0].Layers = []int32{5, 4} }, "layers[1] = 4"},
		{"negative layer", func(h *messages.Hello) { h.Memory[0].Layers = []int32{-1, 4} }, "layers[0] = -1"},
		{"base short", func(h *messages.Hello) { h.Memory[0].Base = h.Memory[0].Base[:3] }, "3 base offsets for 2 layers × 2 parts"},
		{"too many layers", func(h *messages.Hello) {
			m := &h.Memory[0]
			m.Layers = make([]int32, messages.MaxMemoryLayers+1)
			for i := range m.Layers {
				m.Layers[i] = int32(i)
			}
			m.Base = make([]uint64, 2*len(m.Layers))
		}, "4097 layers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := sampleHelloMemory()
			tc.edit(h)
			err := h.Validate()
			if !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), h.From.String()) {
				t.Fatalf("Validate = %v, want ErrInvalid naming %s and %q", err, h.From, tc.want)
			}
			if _, err := messages.Encode(h); !errors.Is(err, messages.ErrInvalid) {
				t.Fatalf("Encode accepted it: %v", err)
			}
			b := marshalPB(t, &pb.Envelope{Version: messages.Version, Body: &pb.Envelope_Hello{Hello: helloToPB(h)}})
			f, err := messages.Decode(b)
			if f != nil || !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode = %v, %v; want refused naming %q", f, err, tc.want)
			}
		})
	}
}

// TestHelloMemoryRoundTrip: descriptors survive the wire unchanged, and a
// Hello without them (an older peer) decodes with none.
func TestHelloMemoryRoundTrip(t *testing.T) {
	h := sampleHelloMemory()
	got, err := messages.Decode(mustEncode(t, h))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, canonical(h)) {
		t.Fatalf("round trip:\n got %#v\nwant %#v", got, h)
	}
	old, err := messages.Decode(mustEncode(t, sampleHello()))
	if err != nil {
		t.Fatal(err)
	}
	if m := old.(*messages.Hello).Memory; m != nil {
		t.Fatalf("a Hello without descriptors decoded with %v", m)
	}
}

// TestMaxHelloFits: a Hello with a descriptor of MaxMemoryLayers layers of
// two parts for each of MaxGroups groups, every integer at its longest,
// fits MaxFrameBytes.
func TestMaxHelloFits(t *testing.T) {
	h := sampleHello()
	h.Pools = make([]messages.PoolGeometry, messages.MaxGroups)
	h.Region.Len = math.MaxUint64
	for g := range h.Pools {
		h.Pools[g] = messages.PoolGeometry{Offset: 1 << 40, BlockBytes: 1 << 20, Blocks: messages.MaxBlocks}
		layers := make([]int32, messages.MaxMemoryLayers)
		base := make([]uint64, 2*len(layers))
		for i := range layers {
			layers[i] = math.MaxInt32 - int32(len(layers)) + int32(i)
		}
		for i := range base {
			base[i] = math.MaxUint64
		}
		h.Memory = append(h.Memory, messages.KVMemory{Group: int32(g), Kind: 255, Layers: layers,
			HeadLo: messages.MaxMemoryHeads - 1, Heads: messages.MaxMemoryHeads, Parts: 2,
			HeadDim: messages.MaxMemoryHeadDim, ElemBytes: messages.MaxMemoryElemBytes,
			TokensPerBlock: messages.MaxMemoryTPB, Blocks: messages.MaxBlocks, Base: base,
			BlockStride: math.MaxUint64, TokenStride: math.MaxUint64, HeadStride: math.MaxUint64, ElemStride: math.MaxUint64})
	}
	b := mustEncode(t, h)
	t.Logf("largest Hello: %d bytes, MaxFrameBytes %d", len(b), messages.MaxFrameBytes)
	if len(b) > messages.MaxFrameBytes {
		t.Fatalf("largest Hello is %d bytes > MaxFrameBytes %d", len(b), messages.MaxFrameBytes)
	}
	if _, err := messages.Decode(b); err != nil {
		t.Fatal(err)
	}
}

// helloToPB builds the wire form of h without validating it.
func helloToPB(h *messages.Hello) *pb.Hello {
	out := &pb.Hello{From: &pb.PeerID{Instance: h.From.Instance, Rank: h.From.Rank}, Backend: h.Backend,
		AgentAddr: h.AgentAddr, Region: &pb.RemoteRegion{Key: h.Region.Key, Len: h.Region.Len},
		LayoutHash: h.LayoutHash, Parallel: &pb.Parallel{Tp: h.Parallel.TP, Pp: h.Parallel.PP}, Tp: h.TP, Pp: h.PP}
	for _, p := range h.Pools {
		out.Pools = append(out.Pools, &pb.PoolGeometry{Offset: p.Offset, BlockBytes: p.BlockBytes, Blocks: p.Blocks})
	}
	for _, m := range h.Memory {
		out.Memory = append(out.Memory, &pb.KVMemory{Group: m.Group, Kind: m.Kind, Layers: m.Layers, HeadLo: m.HeadLo,
			Heads: m.Heads, Parts: m.Parts, HeadDim: m.HeadDim, ElemBytes: m.ElemBytes, TokensPerBlock: m.TokensPerBlock,
			Blocks: m.Blocks, Base: m.Base, BlockStride: m.BlockStride, TokenStride: m.TokenStride,
			HeadStride: m.HeadStride, ElemStride: m.ElemStride})
	}
	return out
}
