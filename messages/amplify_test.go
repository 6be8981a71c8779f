package messages_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/messages/pb"
)

// decodeAlloc decodes b and returns the bytes Decode allocated and its
// error.
func decodeAlloc(b []byte) (uint64, error) {
	var a, z runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	_, err := messages.Decode(b)
	runtime.ReadMemStats(&z)
	return z.TotalAlloc - a.TotalAlloc, err
}

// fillFrame repeats unit until the message is nearly MaxFrameBytes long
// and returns it with the number of units.
func fillFrame(unit func([]byte) []byte) ([]byte, int) {
	var msg []byte
	n := 0
	for len(msg) < messages.MaxFrameBytes-64 {
		msg = unit(msg)
		n++
	}
	return msg, n
}

// TestRevDecodeAmplification: a frame of repeated empty elements of a
// bounded repeated field (two bytes each) is refused before it is
// unmarshalled, allocating little, with an error naming the field, its
// count and its bound. Without Decode's first pass the four frames made
// it allocate 395 to 971 MiB.
func TestRevDecodeAmplification(t *testing.T) {
	for _, c := range []struct {
		name        string
		body, field int
		path, what  string
		limit       int
	}{
		{"hello memory", fieldHello, 11, "hello.memory", "memory descriptors", messages.MaxGroups},
		{"hello pools", fieldHello, 9, "hello.pools", "pools", messages.MaxGroups},
		{"request_data groups", fieldRequestData, 8, "request_data.groups", "layer groups", messages.MaxGroups},
		{"request_data remap", fieldRequestData, 10, "request_data.remap", "remapped extents", messages.MaxRemap},
	} {
		msg, n := fillFrame(func(msg []byte) []byte { return bytesField(msg, protowire.Number(c.field), nil) })
		b := rawEnvelope(1, protowire.Number(c.body), msg)
		alloc, err := decodeAlloc(b)
		if alloc > 16*uint64(len(b)) {
			t.Errorf("%s: a %d-byte frame made Decode allocate %d MiB", c.name, len(b), alloc>>20)
		}
		want := fmt.Sprintf("%s holds %d %s, want at most %d", c.path, n, c.what, c.limit)
		if !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Decode error %v, want ErrInvalid naming %q", c.name, err, want)
		}
	}
}

// TestDecodeAmplificationShapes: other shapes of frame that made
// Unmarshal allocate many times their size — bodies of two frame types in
// turn (each change allocates a new body), descriptors and destination
// groups stuffed with elements — are refused as cheaply, by name.
func TestDecodeAmplificationShapes(t *testing.T) {
	version := varintField(nil, 1, 1)
	alternating, _ := fillFrame(func(m []byte) []byte {
		return bytesField(bytesField(m, fieldHello, nil), fieldRequestData, nil)
	})
	layers, nLayers := fillFrame(func(m []byte) []byte { return varintField(m, 3, 0) })
	base, nBase := fillFrame(func(m []byte) []byte { return varintField(m, 11, 0) })
	packed := make([]byte, messages.MaxFrameBytes-64)
	blocks, nBlocks := fillFrame(func(m []byte) []byte { return varintField(m, 2, 0) })
	groups, nGroups := fillFrame(func(m []byte) []byte { return bytesField(m, 8, bytesField(nil, 2, nil)) })
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"alternating bodies", append(version, alternating...),
			"carries two bodies, hello (envelope field 2) and request_data (envelope field 3)"},
		{"memory layers unpacked", rawEnvelope(1, fieldHello, bytesField(nil, 11, layers)),
			fmt.Sprintf("hello.memory[0].layers holds %d layers, want at most %d", nLayers, messages.MaxMemoryLayers)},
		{"memory base unpacked", rawEnvelope(1, fieldHello, bytesField(nil, 11, base)),
			fmt.Sprintf("hello.memory[0].base holds %d base offsets, want at most %d", nBase, 2*messages.MaxMemoryLayers)},
		{"memory base packed", rawEnvelope(1, fieldHello, bytesField(nil, 11, bytesField(nil, 11, packed))),
			fmt.Sprintf("hello.memory[0].base holds %d base offsets", len(packed))},
		{"blocks unpacked", rawEnvelope(1, fieldRequestData, bytesField(nil, 8, blocks)),
			fmt.Sprintf("request_data.groups.blocks holds %d destination blocks, want at most %d", nBlocks, messages.MaxBlocks)},
		{"groups of empty blocks", rawEnvelope(1, fieldRequestData, groups),
			fmt.Sprintf("request_data.groups holds %d layer groups", nGroups)},
	} {
		alloc, err := decodeAlloc(c.b)
		if alloc > 4*uint64(len(c.b)) {
			t.Errorf("%s: a %d-byte frame made Decode allocate %d MiB", c.name, len(c.b), alloc>>20)
		}
		if !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Decode error %v, want ErrInvalid naming %q", c.name, err, c.want)
		}
	}
}

// TestDecodeRefusesOverBound: each bounded repeated field, written by the
// generated code one element past its bound, is refused by Decode's first
// pass with an error naming the sender, the field, the count and the
// bound; at its bound it passes that pass. A RequestData whose naming
// fields are valid comes back as an InvalidFrame, as one that fails
// Validate does.
func TestDecodeRefusesOverBound(t *testing.T) {
	// The field numbers the hand-built frames above use.
	fields := pb.File_messages_proto_kvxfer_proto.Messages()
	for _, f := range []struct {
		msg, field protoreflect.Name
		num        protowire.Number
	}{
		{"Envelope", "hello", fieldHello}, {"Envelope", "request_data", fieldRequestData},
		{"Hello", "pools", 9}, {"Hello", "memory", 11}, {"KVMemory", "layers", 3}, {"KVMemory", "base", 11},
		{"RequestData", "groups", 8}, {"RequestData", "remap", 10}, {"GroupDest", "blocks", 2},
	} {
		if got := fields.ByName(f.msg).Fields().ByName(f.field).Number(); got != f.num {
			t.Fatalf("%s.%s is field %d in kvxfer.proto, the test uses %d", f.msg, f.field, got, f.num)
		}
	}

	hello := func(pools, memory, layers, base int) *pb.Envelope {
		h := helloToPB(sampleHello())
		h.Pools = make([]*pb.PoolGeometry, pools)
		for i := range h.Pools {
			h.Pools[i] = &pb.PoolGeometry{BlockBytes: 1, Blocks: 1}
		}
		h.Memory = make([]*pb.KVMemory, memory)
		for i := range h.Memory {
			h.Memory[i] = &pb.KVMemory{Group: int32(i)}
		}
		if memory > 0 {
			h.Memory[memory-1].Layers = make([]int32, layers)
			h.Memory[memory-1].Base = make([]uint64, base)
		}
		return &pb.Envelope{Version: messages.Version, Body: &pb.Envelope_Hello{Hello: h}}
	}
	request := func(groups, blocks, remap int) *pb.Envelope {
		gs := make([]*pb.GroupDest, groups)
		for i := range gs {
			gs[i] = &pb.GroupDest{}
		}
		gs[groups-1].Blocks = make([]int32, blocks)
		env := pbRequestData(gs...)
		env.GetRequestData().Remap = make([]*pb.Extent, remap)
		for i := range remap {
			env.GetRequestData().Remap[i] = &pb.Extent{View: uint64(i) * 2, File: 1, Len: 1}
		}
		env.GetRequestData().ToIncarnation = 9
		return env
	}
	const G, L = messages.MaxGroups, messages.MaxMemoryLayers
	from := "hello from " + testPeer.String() + ": "
	for _, c := range []struct {
		name       string
		over, at   *pb.Envelope
		want       string
		namesFrame bool
	}{
		{"hello pools", hello(G+1, 0, 0, 0), hello(G, 0, 0, 0),
			from + fmt.Sprintf("hello.pools holds %d pools, want at most %d", G+1, G), false},
		{"hello memory", hello(G, G+1, 0, 0), hello(G, G, 0, 0),
			from + fmt.Sprintf("hello.memory holds %d memory descriptors, want at most %d", G+1, G), false},
		{"hello memory layers", hello(G, 3, L+1, 0), hello(G, 3, L, 0),
			from + fmt.Sprintf("hello.memory[2].layers holds %d layers, want at most %d", L+1, L), false},
		{"hello memory base", hello(G, 3, 0, 2*L+1), hello(G, 3, 0, 2*L),
			from + fmt.Sprintf("hello.memory[2].base holds %d base offsets, want at most %d", 2*L+1, 2*L), false},
		{"request_data groups", request(G+1, 1, 0), request(G, 1, 0),
			fmt.Sprintf("request req-1 from gen-0/0: request_data.groups holds %d layer groups, want at most %d", G+1, G), true},
		{"request_data blocks", request(G, messages.MaxBlocks+1, 0), request(G, messages.MaxBlocks, 0),
			fmt.Sprintf("request_data.groups.blocks holds %d destination blocks, want at most %d", messages.MaxBlocks+1, messages.MaxBlocks), true},
		{"request_data remap", request(1, 1, messages.MaxRemap+1), request(1, 1, messages.MaxRemap),
			fmt.Sprintf("request_data.remap holds %d remapped extents, want at most %d", messages.MaxRemap+1, messages.MaxRemap), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := messages.Decode(marshalPB(t, c.over))
			if f != nil || !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Decode = %v, %v; want ErrInvalid naming %q", f, err, c.want)
			}
			var inv *messages.InvalidFrame
			if got := errors.As(err, &inv); got != c.namesFrame {
				t.Fatalf("errors.As(%v, *InvalidFrame) = %v, want %v", err, got, c.namesFrame)
			}
			if inv != nil {
				rd, ok := inv.Frame.(*messages.RequestData)
				if !ok || rd.RequestID != "req-1" || rd.Epoch != 1 || rd.From != (messages.PeerID{Instance: "gen-0"}) ||
					rd.ToIncarnation != 9 {
					t.Fatalf("InvalidFrame names %+v", inv.Frame)
				}
			}
			// At the bound the frame passes the first pass: whatever
			// Validate then says, it does not say "holds".
			if _, err := messages.Decode(marshalPB(t, c.at)); err != nil && strings.Contains(err.Error(), " holds ") {
				t.Fatalf("at its bound: %v", err)
			}
		})
	}
}

// TestDecodeOverBoundThenMalformedNeverPanics: a Hello whose memory
// descriptor holds more layers than MaxMemoryLayers is refused by the
// first pass as soon as that descriptor is counted, before the rest of
// the Hello's body is read; refuse then decoded the frame without its
// bounded fields, to name its sender, and walked the whole body with
// protowire.ConsumeField, slicing with its length unchecked: a malformed
// field after the descriptor (or in a second Hello body) made Decode panic
// (slice bounds out of range [:-1]), on the listener goroutine, from any
// peer whose frames reach it. Decode refuses the frame instead.
func TestDecodeOverBoundThenMalformedNeverPanics(t *testing.T) {
	const L = messages.MaxMemoryLayers
	memory := func(layers int) []byte {
		var packed []byte
		for range layers {
			packed = protowire.AppendVarint(packed, 1)
		}
		var m []byte
		m = protowire.AppendTag(m, 3, protowire.BytesType) // KVMemory.layers
		return protowire.AppendBytes(m, packed)
	}
	body := func(fields ...[]byte) []byte {
		var b []byte
		for _, f := range fields {
			b = append(b, f...)
		}
		return b
	}
	field := func(num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	envelope := func(bodies ...[]byte) []byte {
		b := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), uint64(messages.Version))
		for _, h := range bodies {
			b = append(b, field(fieldHello, h)...)
		}
		return b
	}
	truncated := []byte{0x0a, 0x7f} // field 1, 127 bytes that are not there
	badTag := []byte{0x80}          // a tag cut short
	over := field(11, memory(L+1))  // Hello.memory, one layer too many
	for _, c := range []struct {
		name  string
		frame []byte
	}{
		{"malformed field after the descriptor", envelope(body(over, truncated))},
		{"cut tag after the descriptor", envelope(body(over, badTag))},
		{"malformed second body", envelope(body(over), body(truncated))},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := messages.Decode(c.frame)
			if f != nil || !errors.Is(err, messages.ErrInvalid) {
				t.Fatalf("Decode = %v, %v; want ErrInvalid", f, err)
			}
		})
	}
}
