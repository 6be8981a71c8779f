package messages_test

import (
	"math"
	"slices"
	"strings"

	"pgregory.net/rapid"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Test fixtures shared by the codec tests, fuzzers and benchmarks.

var testPeer = messages.PeerID{Instance: "ctx-0", Rank: 3}

func sampleHello() *messages.Hello {
	return &messages.Hello{
		From:       testPeer,
		Backend:    "ucx",
		AgentAddr:  []byte("ucx-worker-address\x00\x01\x02"),
		Region:     messages.RemoteRegion{Key: []byte{0xde, 0xad, 0xbe, 0xef}, Len: 1 << 30},
		LayoutHash: 0x9e3779b97f4a7c15,
		Parallel:   messages.Parallel{TP: 4, PP: 2},
		TP:         3,
		PP:         1,
		Pools: []messages.PoolGeometry{
			{Offset: 0, BlockBytes: 1 << 20, Blocks: 512},
			{Offset: 512 << 20, BlockBytes: 1 << 19, Blocks: 256},
		},
	}
}

func sampleRequestData(blocks int) *messages.RequestData {
	b := make([]int32, blocks)
	for i := range b {
		b[i] = int32(i*7 + 1000)
	}
	return &messages.RequestData{
		RequestID:        "req-0001",
		Epoch:            7,
		From:             messages.PeerID{Instance: "gen-1", Rank: 0},
		GenParallel:      messages.Parallel{TP: 2, PP: 1},
		GenTP:            1,
		GenPP:            0,
		PromptLen:        4096,
		Groups:           []messages.GroupDest{{First: 0, Blocks: b}, {First: 16, Blocks: []int32{0, math.MaxInt32}}},
		DeadlineUnixNano: 1_750_000_000_000_000_000,
	}
}

func sampleResult() *messages.Result {
	return &messages.Result{
		RequestID: "req-0001",
		Epoch:     7,
		From:      testPeer,
		Status:    messages.StatusSuccess,
		Bytes:     256 << 20,
		Payload:   []byte{0x01, 0x7f, 0x00, 0x00},
	}
}

// sampleFrames holds one or more valid frames of every type.
func sampleFrames() map[string]messages.Frame {
	failed := sampleResult()
	failed.Status, failed.Payload = messages.StatusFailed, nil
	failed.Error = "rdma: peer gone: ctx-0/3 (écrit 12 Mio)"
	kind := sampleResult()
	kind.Status, kind.Payload = messages.StatusFailed, nil
	kind.Error, kind.ErrorKind = "prompt of 32 tokens, Send has 48", messages.ErrorKindPromptMismatch
	return map[string]messages.Frame{
		"hello":         sampleHello(),
		"hello_memory":  sampleHelloMemory(),
		"request_data":  sampleRequestData(8),
		"result":        sampleResult(),
		"result_failed": failed,
		"result_kind":   kind,
		"cancel":        &messages.Cancel{RequestID: "req-0001", Epoch: 7, From: testPeer, Reason: "client went away"},
		"cancel_ack":    &messages.CancelAck{RequestID: "req-0001", Epoch: 7, From: testPeer},
		"heartbeat":     &messages.Heartbeat{From: testPeer, Seq: math.MaxUint64},
		"goodbye":       &messages.Heartbeat{From: testPeer, Seq: 9, FromIncarnation: math.MaxUint64, Leaving: true},
		"goodbye_drained": &messages.Heartbeat{From: testPeer, Seq: 10, FromIncarnation: math.MaxUint64, Leaving: true,
			Drained: true},
		"goodbye_reason": &messages.Heartbeat{From: testPeer, Seq: 11, FromIncarnation: math.MaxUint64, Leaving: true,
			Reason: messages.GoodbyeReason("gen/0: a Hello came from ctx2/0, which is not a peer of this engine: « é »")},
		"misaddressed": &messages.Misaddressed{RequestID: "req-0001", Epoch: 7, From: testPeer, Addressed: 1<<62 + 3,
			Incarnations: messages.Incarnations{FromIncarnation: math.MaxUint64, ToIncarnation: 1<<63 + 1}},
	}
}

// maxRequestData is the largest valid frame: every bound at its limit and
// every integer at its longest encoding.
func maxRequestData() *messages.RequestData {
	groups := make([]messages.GroupDest, messages.MaxGroups)
	per := messages.MaxBlocks / messages.MaxGroups
	for g := range groups {
		b := make([]int32, per)
		for i := range b {
			b[i] = math.MaxInt32
		}
		groups[g] = messages.GroupDest{First: math.MaxInt32, Blocks: b}
	}
	return &messages.RequestData{
		RequestID:        strings.Repeat("r", messages.MaxRequestIDLen),
		Epoch:            math.MaxUint64,
		From:             messages.PeerID{Instance: strings.Repeat("i", messages.MaxInstanceLen), Rank: messages.MaxRank - 1},
		GenParallel:      messages.Parallel{TP: 1024, PP: 1024, Stages: strings.TrimSuffix(strings.Repeat("4096,", 1024), ",")},
		GenTP:            1023,
		GenPP:            1023,
		PromptLen:        math.MaxInt32,
		Groups:           groups,
		DeadlineUnixNano: math.MinInt64,
		Remap:            maxRemap(),
	}
}

// maxRemap is the longest valid remap, with the widest varints.
func maxRemap() []messages.Extent {
	xs := make([]messages.Extent, messages.MaxRemap)
	for i := range xs {
		v := uint64(1)<<62 + uint64(i)*2
		xs[i] = messages.Extent{View: v, File: uint64(1) << 62, Len: 1}
	}
	return xs
}

// canonical returns f with every empty slice nil: the wire does not tell
// an empty field from an absent one, and Decode returns nil for both.
func canonical(f messages.Frame) messages.Frame {
	switch m := f.(type) {
	case *messages.Hello:
		c := *m
		c.AgentAddr = nilIfEmpty(c.AgentAddr)
		c.Region.Key = nilIfEmpty(c.Region.Key)
		c.Pools = nilIfEmpty(c.Pools)
		c.Memory = nilIfEmpty(c.Memory)
		if c.Memory != nil {
			c.Memory = append([]messages.KVMemory(nil), c.Memory...)
			for i := range c.Memory {
				c.Memory[i].Layers = nilIfEmpty(c.Memory[i].Layers)
				c.Memory[i].Base = nilIfEmpty(c.Memory[i].Base)
			}
		}
		return &c
	case *messages.RequestData:
		c := *m
		c.Groups = nilIfEmpty(c.Groups)
		if c.Groups != nil {
			c.Groups = append([]messages.GroupDest(nil), c.Groups...)
			for i := range c.Groups {
				c.Groups[i].Blocks = nilIfEmpty(c.Groups[i].Blocks)
			}
		}
		return &c
	case *messages.Result:
		c := *m
		c.Payload = nilIfEmpty(c.Payload)
		return &c
	}
	return f
}

func nilIfEmpty[S ~[]E, E any](s S) S {
	if len(s) == 0 {
		return nil
	}
	return s
}

// Rapid generators of valid frames.

func genText(maxLen int) *rapid.Generator[string] {
	return rapid.StringOfN(rapid.Rune(), 0, -1, maxLen)
}

func genNonEmptyText(maxLen int) *rapid.Generator[string] {
	return rapid.StringOfN(rapid.Rune(), 1, -1, maxLen)
}

func drawPeer(t *rapid.T, label string) messages.PeerID {
	return messages.PeerID{
		Instance: genNonEmptyText(messages.MaxInstanceLen).Draw(t, label+".instance"),
		Rank:     rapid.Int32Range(0, messages.MaxRank-1).Draw(t, label+".rank"),
	}
}

func drawParallel(t *rapid.T, label string) messages.Parallel {
	p := messages.Parallel{
		TP: rapid.Int32Range(1, 1024).Draw(t, label+".tp"),
		PP: rapid.Int32Range(1, 1024).Draw(t, label+".pp"),
	}
	if rapid.Bool().Draw(t, label+".split") {
		counts := rapid.SliceOfN(rapid.IntRange(1, kvcache.MaxLayers), int(p.PP), int(p.PP)).Draw(t, label+".stages")
		p.Stages = kvcache.FormatStages(counts)
	}
	return p
}

func drawBytes(t *rapid.T, label string, minLen, maxLen int) []byte {
	return rapid.SliceOfN(rapid.Byte(), minLen, maxLen).Draw(t, label)
}

func drawHello(t *rapid.T) *messages.Hello {
	par := drawParallel(t, "parallel")
	pools := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) messages.PoolGeometry {
		return messages.PoolGeometry{
			Offset:     rapid.Uint64Range(0, 1<<40).Draw(t, "offset"),
			BlockBytes: rapid.Uint64Range(1, 1<<24).Draw(t, "blockBytes"),
			Blocks:     rapid.Int32Range(0, messages.MaxBlocks).Draw(t, "blocks"),
		}
	}), 1, messages.MaxGroups).Draw(t, "pools")
	var end uint64
	for _, p := range pools {
		end = max(end, p.Offset+uint64(p.Blocks)*p.BlockBytes)
	}
	var mem []messages.KVMemory
	for g := range pools {
		if rapid.Bool().Draw(t, "described") {
			mem = append(mem, drawMemory(t, int32(g)))
		}
	}
	return &messages.Hello{
		Memory:    mem,
		From:      drawPeer(t, "from"),
		Backend:   genNonEmptyText(32).Draw(t, "backend"),
		AgentAddr: drawBytes(t, "agentAddr", 1, 4096),
		Region: messages.RemoteRegion{
			Key: drawBytes(t, "key", 1, 4096),
			Len: end + rapid.Uint64Range(0, 1<<20).Draw(t, "slack"),
		},
		LayoutHash: rapid.Uint64().Draw(t, "layoutHash"),
		Parallel:   par,
		TP:         rapid.Int32Range(0, par.TP-1).Draw(t, "tp"),
		PP:         rapid.Int32Range(0, par.PP-1).Draw(t, "pp"),
		Pools:      pools,
	}
}

func drawRequestData(t *rapid.T) *messages.RequestData {
	par := drawParallel(t, "genParallel")
	return &messages.RequestData{
		RequestID:   genNonEmptyText(messages.MaxRequestIDLen).Draw(t, "requestID"),
		Epoch:       rapid.Uint64().Draw(t, "epoch"),
		From:        drawPeer(t, "from"),
		GenParallel: par,
		GenTP:       rapid.Int32Range(0, par.TP-1).Draw(t, "genTP"),
		GenPP:       rapid.Int32Range(0, par.PP-1).Draw(t, "genPP"),
		PromptLen:   rapid.Int32Range(0, math.MaxInt32).Draw(t, "promptLen"),
		Groups: rapid.SliceOfN(rapid.Custom(func(t *rapid.T) messages.GroupDest {
			return messages.GroupDest{
				First:  rapid.Int32Range(0, math.MaxInt32).Draw(t, "first"),
				Blocks: rapid.SliceOfN(rapid.Int32Range(0, math.MaxInt32), 0, 64).Draw(t, "blocks"),
			}
		}), 1, messages.MaxGroups).Draw(t, "groups"),
		DeadlineUnixNano: rapid.Int64().Draw(t, "deadline"),
	}
}

func drawResult(t *rapid.T) *messages.Result {
	r := &messages.Result{
		RequestID: genNonEmptyText(messages.MaxRequestIDLen).Draw(t, "requestID"),
		Epoch:     rapid.Uint64().Draw(t, "epoch"),
		From:      drawPeer(t, "from"),
		Status: rapid.SampledFrom([]messages.Status{
			messages.StatusSuccess, messages.StatusFailed, messages.StatusInDoubt, messages.StatusCancelled,
		}).Draw(t, "status"),
		Bytes:   rapid.Uint64().Draw(t, "bytes"),
		Error:   genText(messages.MaxErrorLen).Draw(t, "error"),
		Payload: drawBytes(t, "payload", 0, messages.MaxPayload),
	}
	// A defined kind only with FAILED; an undefined one (a newer
	// writer's) with any status.
	r.ErrorKind = rapid.SampledFrom([]messages.ErrorKind{
		messages.ErrorKindUnspecified, messages.ErrorKindPromptMismatch, 7, -1,
	}).Draw(t, "errorKind")
	if r.ErrorKind.Defined() && r.Status != messages.StatusFailed {
		r.ErrorKind = messages.ErrorKindUnspecified
	}
	return r
}

func drawFrame(t *rapid.T) messages.Frame {
	switch rapid.IntRange(0, 6).Draw(t, "type") {
	case 0:
		return drawHello(t)
	case 1:
		return drawRequestData(t)
	case 2:
		return drawResult(t)
	case 3:
		return &messages.Cancel{
			RequestID: genNonEmptyText(messages.MaxRequestIDLen).Draw(t, "requestID"),
			Epoch:     rapid.Uint64().Draw(t, "epoch"),
			From:      drawPeer(t, "from"),
			Reason:    genText(messages.MaxErrorLen).Draw(t, "reason"),
		}
	case 4:
		return &messages.CancelAck{
			RequestID: genNonEmptyText(messages.MaxRequestIDLen).Draw(t, "requestID"),
			Epoch:     rapid.Uint64().Draw(t, "epoch"),
			From:      drawPeer(t, "from"),
		}
	case 5:
		addressed := rapid.Uint64Range(1, math.MaxUint64-1).Draw(t, "addressed")
		return &messages.Misaddressed{
			RequestID: genNonEmptyText(messages.MaxRequestIDLen).Draw(t, "requestID"),
			Epoch:     rapid.Uint64().Draw(t, "epoch"),
			From:      drawPeer(t, "from"),
			Addressed: addressed,
			Incarnations: messages.Incarnations{FromIncarnation: rapid.Uint64Range(addressed+1, math.MaxUint64).Draw(t, "fromIncarnation"),
				ToIncarnation: rapid.Uint64Range(1, math.MaxUint64).Draw(t, "toIncarnation")},
		}
	default:
		hb := &messages.Heartbeat{From: drawPeer(t, "from"), Seq: rapid.Uint64().Draw(t, "seq"),
			FromIncarnation: rapid.Uint64().Draw(t, "fromIncarnation"), Leaving: rapid.Bool().Draw(t, "leaving")}
		if hb.Leaving {
			hb.Drained = rapid.Bool().Draw(t, "drained") // only a goodbye may say it
		}
		return hb
	}
}

// drawMemory draws a descriptor within Hello's bounds (not necessarily one
// whose strides a writer would accept).
func drawMemory(t *rapid.T, g int32) messages.KVMemory {
	parts := rapid.Int32Range(1, 2).Draw(t, "parts")
	layers := rapid.SliceOfNDistinct(rapid.Int32Range(0, 200), 0, 16, rapid.ID[int32]).Draw(t, "layers")
	slices.Sort(layers)
	return messages.KVMemory{
		Group: g, Kind: rapid.Uint32Range(0, 255).Draw(t, "kind"), Layers: layers,
		HeadLo: rapid.Int32Range(0, messages.MaxMemoryHeads-1).Draw(t, "headLo"),
		Heads:  rapid.Int32Range(1, messages.MaxMemoryHeads).Draw(t, "heads"), Parts: parts,
		HeadDim:        rapid.Int32Range(1, messages.MaxMemoryHeadDim).Draw(t, "headDim"),
		ElemBytes:      rapid.Int32Range(1, messages.MaxMemoryElemBytes).Draw(t, "elemBytes"),
		TokensPerBlock: rapid.Int32Range(1, messages.MaxMemoryTPB).Draw(t, "tpb"),
		Blocks:         rapid.Int32Range(0, messages.MaxBlocks).Draw(t, "blocks"),
		Base:           rapid.SliceOfN(rapid.Uint64(), len(layers)*int(parts), len(layers)*int(parts)).Draw(t, "base"),
		BlockStride:    rapid.Uint64().Draw(t, "blockStride"), TokenStride: rapid.Uint64().Draw(t, "tokenStride"),
		HeadStride: rapid.Uint64().Draw(t, "headStride"), ElemStride: rapid.Uint64().Draw(t, "elemStride"),
	}
}

// sampleHelloMemory is sampleHello with vLLM NHD memory for group 0: two
// layers, 8 heads of 128 bf16 elements, 16 tokens per block, 512 blocks.
func sampleHelloMemory() *messages.Hello {
	h := sampleHello()
	const block = 16 * 8 * 128 * 2
	const tensor = 2 * 512 * block
	h.Memory = []messages.KVMemory{{Group: 0, Kind: 1, Layers: []int32{4, 5}, HeadLo: 8, Heads: 8, Parts: 2,
		HeadDim: 128, ElemBytes: 2, TokensPerBlock: 16, Blocks: 512,
		Base:        []uint64{0, tensor / 2, tensor, tensor + tensor/2},
		BlockStride: block, TokenStride: 8 * 128 * 2, HeadStride: 128 * 2, ElemStride: 2}}
	return h
}
