package messages_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/messages/pb"
)

func mustEncode(t testing.TB, f messages.Frame) []byte {
	t.Helper()
	b, err := messages.Encode(f)
	if err != nil {
		t.Fatalf("Encode(%T): %v", f, err)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	for name, f := range sampleFrames() {
		t.Run(name, func(t *testing.T) {
			b := mustEncode(t, f)
			got, err := messages.Decode(b)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if want := canonical(f); !reflect.DeepEqual(got, want) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, want)
			}
			// AppendEncode appends the same bytes after a prefix.
			prefix := []byte("zmq-identity")
			out, err := messages.AppendEncode(prefix, f)
			if err != nil {
				t.Fatalf("AppendEncode: %v", err)
			}
			if !bytes.Equal(out[:len(prefix)], []byte("zmq-identity")) || !bytes.Equal(out[len(prefix):], b) {
				t.Fatalf("AppendEncode = %x, want prefix then %x", out, b)
			}
		})
	}
}

func TestRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := drawFrame(t)
		if err := f.Validate(); err != nil {
			t.Fatalf("generator drew an invalid frame: %v", err)
		}
		b, err := messages.Encode(f)
		if err != nil {
			t.Fatalf("Encode(%T): %v", f, err)
		}
		if len(b) > messages.MaxFrameBytes {
			t.Fatalf("encoded %d bytes > MaxFrameBytes", len(b))
		}
		got, err := messages.Decode(b)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if want := canonical(f); !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, want)
		}
	})
}

// TestMaxFrameFits pins MaxFrameBytes to MaxBlocks: the largest valid
// frame encodes, fits, and decodes.
func TestMaxFrameFits(t *testing.T) {
	f := maxRequestData()
	b := mustEncode(t, f)
	t.Logf("largest RequestData: %d bytes, MaxFrameBytes %d", len(b), messages.MaxFrameBytes)
	if len(b) > messages.MaxFrameBytes {
		t.Fatalf("largest valid frame is %d bytes > MaxFrameBytes %d", len(b), messages.MaxFrameBytes)
	}
	got, err := messages.Decode(b)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !reflect.DeepEqual(got, canonical(f)) {
		t.Fatal("largest frame did not round-trip")
	}
}

// Hand-built wire bytes, bypassing Encode's validation.

func varintField(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func bytesField(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func rawEnvelope(version uint64, body protowire.Number, msg []byte) []byte {
	return bytesField(varintField(nil, 1, version), body, msg)
}

func rawPeer(instance string, rank uint64) []byte {
	return varintField(bytesField(nil, 1, []byte(instance)), 2, rank)
}

func rawHeartbeat() []byte { return bytesField(nil, 1, rawPeer("p", 0)) }

func rawResult(requestID string, status uint64) []byte {
	b := bytesField(nil, 1, []byte(requestID))
	b = varintField(b, 2, 1)
	b = bytesField(b, 3, rawPeer("ctx-0", 1))
	return varintField(b, 4, status)
}

const (
	fieldHello       = 2
	fieldRequestData = 3
	fieldResult      = 4
	fieldHeartbeat   = 7
)

// marshalPB encodes a generated message as it is, with no validation.
func marshalPB(t *testing.T, env *pb.Envelope) []byte {
	t.Helper()
	b, err := proto.Marshal(env)
	if err != nil {
		t.Fatalf("proto.Marshal: %v", err)
	}
	return b
}

func pbPeer() *pb.PeerID { return &pb.PeerID{Instance: "gen-0", Rank: 0} }

func pbRequestData(groups ...*pb.GroupDest) *pb.Envelope {
	return &pb.Envelope{Version: messages.Version, Body: &pb.Envelope_RequestData{RequestData: &pb.RequestData{
		RequestId: "req-1", Epoch: 1, From: pbPeer(),
		GenParallel: &pb.Parallel{Tp: 1, Pp: 1}, Groups: groups,
	}}}
}

// withRemap is a valid one-group RequestData carrying xs as its remap.
func withRemap(xs ...*pb.Extent) *pb.Envelope {
	env := pbRequestData(&pb.GroupDest{Blocks: []int32{1}})
	for i, x := range xs {
		if x == nil {
			xs[i] = &pb.Extent{View: uint64(i) * 2, File: 1, Len: 1}
		}
	}
	env.GetRequestData().Remap = xs
	return env
}

func pbResult(r *pb.Result) *pb.Envelope {
	if r.RequestId == "" {
		r.RequestId = "req-1"
	}
	if r.From == nil {
		r.From = pbPeer()
	}
	if r.Status == 0 {
		r.Status = pb.Status_STATUS_SUCCESS
	}
	return &pb.Envelope{Version: messages.Version, Body: &pb.Envelope_Result{Result: r}}
}

func TestDecodeRejects(t *testing.T) {
	valid := mustEncode(t, sampleResult())
	hello := func(mod func(h *pb.Hello)) *pb.Envelope {
		h := &pb.Hello{
			From: pbPeer(), Backend: "ucx", AgentAddr: []byte{1},
			Region:   &pb.RemoteRegion{Key: []byte{1}, Len: 1 << 20},
			Parallel: &pb.Parallel{Tp: 1, Pp: 1},
			Pools:    []*pb.PoolGeometry{{Offset: 0, BlockBytes: 1 << 10, Blocks: 1024}},
		}
		mod(h)
		return &pb.Envelope{Version: messages.Version, Body: &pb.Envelope_Hello{Hello: h}}
	}
	// nest is a version and then depth unknown groups, one in another.
	nest := func(depth int) []byte {
		b := varintField(nil, 1, 1)
		for range depth {
			b = protowire.AppendTag(b, 50, protowire.StartGroupType)
		}
		for range depth {
			b = protowire.AppendTag(b, 50, protowire.EndGroupType)
		}
		return b
	}
	deep := nest(100)
	manyGroups := make([]*pb.GroupDest, messages.MaxGroups+1)
	for i := range manyGroups {
		manyGroups[i] = &pb.GroupDest{Blocks: []int32{1}}
	}

	tests := []struct {
		name    string
		in      []byte
		want    string // in the error text
		version bool   // the error also wraps ErrVersion
	}{
		{"empty input", nil, "version 0, want 1", true},
		{"version 0", rawEnvelope(0, fieldHeartbeat, rawHeartbeat()), "version 0, want 1", true},
		{"version 2", rawEnvelope(2, fieldHeartbeat, rawHeartbeat()), "version 2, want 1", true},
		{"version as bytes", bytesField(nil, 1, []byte{1}), "version 0, want 1", true},
		{"no body", varintField(nil, 1, 1), "frame has no body", false},
		{"unknown frame type", rawEnvelope(1, 99, rawHeartbeat()), "unknown frame type (envelope field 99)", false},
		{"status unknown", rawEnvelope(1, fieldResult, rawResult("req-1", 0)), "result status 0", false},
		{"status past last", rawEnvelope(1, fieldResult, rawResult("req-1", 5)), "result status 5, want 1..4", false},
		{"status 257 not truncated to SUCCESS", rawEnvelope(1, fieldResult, rawResult("req-1", 257)), "result status 257", false},
		{"status negative", rawEnvelope(1, fieldResult, rawResult("req-1", math.MaxUint64)), "result status -1", false},
		{"status bad with long request id", rawEnvelope(1, fieldResult, rawResult(strings.Repeat("x", 300), 9)), "request id length 300", false},
		{"oversize", make([]byte, messages.MaxFrameBytes+1), "exceeds MaxFrameBytes", false},
		{"truncated", valid[:len(valid)-1], "malformed frame", false},
		{"garbage", []byte{0xff, 0xff, 0xff, 0xff}, "malformed frame", false},
		{"invalid utf-8 request id", rawEnvelope(1, fieldResult, rawResult("req-\xff", 1)), "malformed frame", false},
		{"unknown groups nested", deep, "unknown frame type (envelope field 50)", false},
		{"unknown groups nested too deep", nest(20000), "malformed frame", false},
		{"missing sender", rawEnvelope(1, fieldHeartbeat, nil), "sender instance length 0", false},
		{"rank as 32-bit -1", rawEnvelope(1, fieldHeartbeat, bytesField(nil, 1, rawPeer("p", 0xffffffff))), "sender rank -1", false},
		{"rank too large", rawEnvelope(1, fieldHeartbeat, bytesField(nil, 1, rawPeer("p", messages.MaxRank))), "sender rank 65536", false},
		{"request id absent", rawEnvelope(1, fieldResult, varintField(bytesField(nil, 3, rawPeer("p", 0)), 4, 1)), "request id length 0", false},
		{"request id too long", marshalPB(t, pbResult(&pb.Result{RequestId: strings.Repeat("r", messages.MaxRequestIDLen+1)})), "request id length 257", false},
		{"error text too long", marshalPB(t, pbResult(&pb.Result{Error: strings.Repeat("e", messages.MaxErrorLen+1)})), "error text length 1025", false},
		{"payload too long", marshalPB(t, pbResult(&pb.Result{Payload: make([]byte, messages.MaxPayload+1)})), "payload length 65537", false},
		{"negative block", marshalPB(t, pbRequestData(&pb.GroupDest{Blocks: []int32{3, -1}})), "group 0 block[1] = -1", false},
		{"negative first", marshalPB(t, pbRequestData(&pb.GroupDest{First: -5, Blocks: []int32{3}})), "group 0 first block -5", false},
		{"no groups", marshalPB(t, pbRequestData()), "0 layer groups", false},
		{"remap empty extent", marshalPB(t, withRemap(&pb.Extent{View: 4096, File: 8192})), "remap[0] = view 4096 file 8192 len 0", false},
		{"remap overflows", marshalPB(t, withRemap(&pb.Extent{View: math.MaxUint64 - 10, File: 0, Len: 11})), "remap[0] = view 18446744073709551605", false},
		{"remap out of order", marshalPB(t, withRemap(&pb.Extent{View: 8192, File: 0, Len: 4096}, &pb.Extent{View: 4096, File: 4096, Len: 4096})), "remap[1] view 4096 overlaps or precedes", false},
		{"remap overlapping", marshalPB(t, withRemap(&pb.Extent{View: 0, File: 0, Len: 4097}, &pb.Extent{View: 4096, File: 4096, Len: 4096})), "remap[1] view 4096 overlaps", false},
		{"remap too long", marshalPB(t, withRemap(make([]*pb.Extent, messages.MaxRemap+1)...)), "16385 remapped extents", false},
		{"too many groups", marshalPB(t, pbRequestData(manyGroups...)), "17 layer groups", false},
		{"too many blocks", marshalPB(t, pbRequestData(&pb.GroupDest{Blocks: make([]int32, messages.MaxBlocks+1)})), "request_data.groups.blocks holds 1048577 destination blocks, want at most 1048576", false},
		{"hello without pools", marshalPB(t, hello(func(h *pb.Hello) { h.Pools = nil })), "0 pools", false},
		{"hello pool past region", marshalPB(t, hello(func(h *pb.Hello) { h.Region.Len = 1<<20 - 1 })), "past region length", false},
		{"hello pool overflows", marshalPB(t, hello(func(h *pb.Hello) {
			h.Pools[0] = &pb.PoolGeometry{Offset: math.MaxUint64 - 10, BlockBytes: 1 << 10, Blocks: 1}
		})), "past region length", false},
		{"hello pool size overflows", marshalPB(t, hello(func(h *pb.Hello) {
			h.Region.Len = math.MaxUint64
			h.Pools[0] = &pb.PoolGeometry{Offset: 0, BlockBytes: 1 << 63, Blocks: 2} // 2 * 2^63 wraps to 0
		})), "ends past 2^64", false},
		{"hello rank outside parallel", marshalPB(t, hello(func(h *pb.Hello) { h.Tp = 1 })), "hello rank tp=1", false},
		// A Hello without a key is a send-only rank's; without a region
		// at all, its pools lie past a region of length 0.
		{"hello missing region", marshalPB(t, hello(func(h *pb.Hello) { h.Region = nil })), "pool 0 ends at 1048576 past region length 0", false},
		{"hello region key too long", marshalPB(t, hello(func(h *pb.Hello) { h.Region.Key = make([]byte, 4097) })), "hello region key length 4097, want at most 4096", false},
		{"hello stages of another PP", marshalPB(t, hello(func(h *pb.Hello) { h.Parallel.Stages = "3,4" })), `hello parallel stages "3,4" name 2 stages, PP=1`, false},
		{"hello stages malformed", marshalPB(t, hello(func(h *pb.Hello) { h.Parallel.Stages = "x" })), `stage 0's layer count "x"`, false},
		{"hello stages too long", marshalPB(t, hello(func(h *pb.Hello) { h.Parallel.Stages = strings.Repeat("1,", 3000) })), "hello parallel stages of 6000 bytes for PP=1", false},
		{"request stages of another PP", marshalPB(t, func() *pb.Envelope {
			e := pbRequestData(&pb.GroupDest{Blocks: []int32{1}})
			e.GetRequestData().GenParallel.Stages = "1,1"
			return e
		}()), `generation parallel stages "1,1" name 2 stages, PP=1`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := messages.Decode(tc.in)
			if err == nil {
				t.Fatalf("Decode accepted %#v", f)
			}
			if f != nil {
				t.Errorf("Decode returned frame %#v with error", f)
			}
			if !errors.Is(err, messages.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if got := errors.Is(err, messages.ErrVersion); got != tc.version {
				t.Errorf("errors.Is(err, ErrVersion) = %v, want %v (err %v)", got, tc.version, err)
			}
			var ve *messages.VersionError
			if got := errors.As(err, &ve); got != tc.version {
				t.Errorf("errors.As(err, *VersionError) = %v, want %v (err %v)", got, tc.version, err)
			} else if got && !strings.Contains(tc.want, fmt.Sprintf("version %d,", ve.Got)) {
				t.Errorf("VersionError.Got = %d, want the version in %q", ve.Got, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestDecodeIgnoresUnknownFields: a field this version does not know,
// inside a known frame, is skipped (and not kept).
func TestDecodeIgnoresUnknownFields(t *testing.T) {
	body := varintField(rawHeartbeat(), 2, 42)
	body = bytesField(body, 15, []byte("from the future"))
	b := varintField(rawEnvelope(1, fieldHeartbeat, body), 20, 1)
	f, err := messages.Decode(b)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	want := &messages.Heartbeat{From: messages.PeerID{Instance: "p"}, Seq: 42}
	if !reflect.DeepEqual(f, want) {
		t.Fatalf("got %#v, want %#v", f, want)
	}
}

// TestGoodbyeIsAHeartbeatToAnOlderPeer: a goodbye (Heartbeat.Leaving) and
// the sender's incarnation are two optional fields of the Heartbeat body,
// numbers 3 and 20, and nothing else changes: a heartbeat that sets
// neither encodes as an older build writes it (from, seq), and one that
// sets both is that encoding plus those two fields, which a decoder that
// does not know them skips (TestDecodeIgnoresUnknownFields): an older
// peer takes a goodbye for a plain heartbeat, and a newer one takes an
// older peer's heartbeat for one that is no goodbye and names no
// incarnation.
func TestGoodbyeIsAHeartbeatToAnOlderPeer(t *testing.T) {
	peer := messages.PeerID{Instance: "p", Rank: 3}
	old := rawEnvelope(1, fieldHeartbeat, varintField(bytesField(nil, 1, rawPeer("p", 3)), 2, 42))
	if b := mustEncode(t, &messages.Heartbeat{From: peer, Seq: 42}); !bytes.Equal(b, old) {
		t.Fatalf("a plain heartbeat encodes as %x, want the older encoding %x", b, old)
	}
	f, err := messages.Decode(old)
	if err != nil || !reflect.DeepEqual(f, &messages.Heartbeat{From: peer, Seq: 42}) {
		t.Fatalf("an older peer's heartbeat decodes as %#v, %v", f, err)
	}
	bye := mustEncode(t, &messages.Heartbeat{From: peer, Seq: 42, FromIncarnation: 7, Leaving: true})
	var env pb.Envelope
	if err := proto.Unmarshal(bye, &env); err != nil {
		t.Fatal(err)
	}
	// The body as an older build reads it: its known fields, in order,
	// and the two it does not know.
	body := env.GetHeartbeat()
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	var known []byte
	unknown := map[protowire.Number]uint64{}
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			t.Fatalf("goodbye body %x does not parse", raw)
		}
		m := protowire.ConsumeFieldValue(num, typ, raw[n:])
		if m < 0 {
			t.Fatalf("goodbye body %x does not parse", raw)
		}
		switch num {
		case 1, 2:
			known = append(known, raw[:n+m]...)
		default:
			v, k := protowire.ConsumeVarint(raw[n:])
			if typ != protowire.VarintType || k < 0 {
				t.Fatalf("goodbye body field %d of wire type %d, want varints only", num, typ)
			}
			unknown[num] = v
		}
		raw = raw[n+m:]
	}
	if want := map[protowire.Number]uint64{3: 1, 20: 7}; !reflect.DeepEqual(unknown, want) {
		t.Fatalf("goodbye adds fields %v to the heartbeat body, want %v (leaving, from_incarnation)", unknown, want)
	}
	if b := rawEnvelope(1, fieldHeartbeat, known); !bytes.Equal(b, old) {
		t.Fatalf("goodbye without its new fields is %x, want the older heartbeat %x", b, old)
	}
}

// TestDrainedGoodbyeIsAGoodbyeToAnOlderPeer: a drained goodbye
// (Heartbeat.Drained, the goodbye that proves the sender's writes over)
// is the goodbye's encoding plus one optional varint field, number 4,
// and round-trips. An older peer skips the field it does not know
// (TestDecodeIgnoresUnknownFields) and reads the goodbye it knows, which
// proves nothing to it; a newer peer reads an older peer's goodbye (no
// field 4) as not drained. Drained without Leaving is refused both ways,
// naming it: only a goodbye may say that the sender's writes are over.
// (Checked to fail without the field: the round trip loses Drained.)
func TestDrainedGoodbyeIsAGoodbyeToAnOlderPeer(t *testing.T) {
	peer := messages.PeerID{Instance: "p", Rank: 3}
	bye := &messages.Heartbeat{From: peer, Seq: 42, FromIncarnation: 7, Leaving: true}
	drained := &messages.Heartbeat{From: peer, Seq: 42, FromIncarnation: 7, Leaving: true, Drained: true}
	b := mustEncode(t, drained)
	f, err := messages.Decode(b)
	if err != nil || !reflect.DeepEqual(f, drained) {
		t.Fatalf("a drained goodbye decodes as %#v, %v; want %#v", f, err, drained)
	}
	head := varintField(varintField(bytesField(nil, 1, rawPeer("p", 3)), 2, 42), 3, 1)
	want := rawEnvelope(1, fieldHeartbeat, varintField(varintField(slices.Clone(head), 4, 1), 20, 7))
	if !bytes.Equal(b, want) {
		t.Fatalf("a drained goodbye encodes as %x, want the goodbye with field 4 = 1: %x", b, want)
	}
	// As an older build reads it: without field 4, the plain goodbye.
	older := rawEnvelope(1, fieldHeartbeat, varintField(slices.Clone(head), 20, 7))
	if plain := mustEncode(t, bye); !bytes.Equal(older, plain) {
		t.Fatalf("a drained goodbye without field 4 is %x, want the plain goodbye %x", older, plain)
	}
	if f, err := messages.Decode(older); err != nil || !reflect.DeepEqual(f, bye) {
		t.Fatalf("an older peer's goodbye decodes as %#v, %v; want %#v (not drained)", f, err, bye)
	}
	beat := &messages.Heartbeat{From: peer, Seq: 42, FromIncarnation: 7, Drained: true}
	if _, err := messages.Encode(beat); !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), "drained without leaving") {
		t.Fatalf("Encode of a heartbeat drained without leaving: %v; want ErrInvalid naming it", err)
	}
	raw := rawEnvelope(1, fieldHeartbeat, varintField(varintField(bytesField(nil, 1, rawPeer("p", 3)), 2, 42), 4, 1))
	if f, err := messages.Decode(raw); !errors.Is(err, messages.ErrInvalid) || f != nil || !strings.Contains(err.Error(), "drained without leaving") {
		t.Fatalf("Decode of a heartbeat drained without leaving: %#v, %v; want ErrInvalid naming it", f, err)
	}
}

// TestGoodbyeReasonIsAGoodbyeToAnOlderPeer: a goodbye's reason
// (Heartbeat.Reason, why its sender exits) is the goodbye's encoding plus
// one optional string field, number 5, and round-trips; an older peer
// skips it and reads the goodbye it knows, and a newer one reads an older
// peer's goodbye as one without reason (a possible restart). A reason
// longer than MaxGoodbyeReasonLen, holding a control character, or on a
// heartbeat that is no goodbye is refused both ways, naming it;
// GoodbyeReason makes any text one that is taken. (Checked to fail
// without the field: the round trip loses Reason.)
func TestGoodbyeReasonIsAGoodbyeToAnOlderPeer(t *testing.T) {
	peer := messages.PeerID{Instance: "p", Rank: 3}
	bye := &messages.Heartbeat{From: peer, Seq: 42, FromIncarnation: 7, Leaving: true}
	why := &messages.Heartbeat{From: peer, Seq: 42, FromIncarnation: 7, Leaving: true, Reason: "no Hello from ctx/0"}
	b := mustEncode(t, why)
	if f, err := messages.Decode(b); err != nil || !reflect.DeepEqual(f, why) {
		t.Fatalf("a goodbye with a reason decodes as %#v, %v; want %#v", f, err, why)
	}
	head := varintField(varintField(bytesField(nil, 1, rawPeer("p", 3)), 2, 42), 3, 1)
	want := rawEnvelope(1, fieldHeartbeat, varintField(bytesField(slices.Clone(head), 5, []byte(why.Reason)), 20, 7))
	if !bytes.Equal(b, want) {
		t.Fatalf("a goodbye with a reason encodes as %x, want the goodbye with field 5: %x", b, want)
	}
	older := rawEnvelope(1, fieldHeartbeat, varintField(slices.Clone(head), 20, 7))
	if plain := mustEncode(t, bye); !bytes.Equal(older, plain) {
		t.Fatalf("a goodbye without field 5 is %x, want the plain goodbye %x", older, plain)
	}
	if f, err := messages.Decode(older); err != nil || !reflect.DeepEqual(f, bye) {
		t.Fatalf("an older peer's goodbye decodes as %#v, %v; want %#v (no reason)", f, err, bye)
	}
	for _, c := range []struct {
		hb   *messages.Heartbeat
		says string
	}{
		{&messages.Heartbeat{From: peer, Seq: 1, Leaving: true, Reason: strings.Repeat("x", messages.MaxGoodbyeReasonLen+1)}, fmt.Sprintf("reason length %d > %d", messages.MaxGoodbyeReasonLen+1, messages.MaxGoodbyeReasonLen)},
		{&messages.Heartbeat{From: peer, Seq: 1, Leaving: true, Reason: "two\nlines"}, "control character U+000A"},
		{&messages.Heartbeat{From: peer, Seq: 1, Leaving: true, Reason: "c1\u0085"}, "control character U+0085"},
		{&messages.Heartbeat{From: peer, Seq: 1, Reason: "not leaving"}, "reason without leaving"},
	} {
		if _, err := messages.Encode(c.hb); !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Encode of reason %.20q: %v; want ErrInvalid saying %q", c.hb.Reason, err, c.says)
		}
		var leaving uint64
		if c.hb.Leaving {
			leaving = 1
		}
		raw := rawEnvelope(1, fieldHeartbeat, bytesField(varintField(bytesField(nil, 1, rawPeer("p", 3)), 3, leaving), 5, []byte(c.hb.Reason)))
		if f, err := messages.Decode(raw); !errors.Is(err, messages.ErrInvalid) || f != nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Decode of reason %.20q: %#v, %v; want ErrInvalid saying %q", c.hb.Reason, f, err, c.says)
		}
	}
	for in, out := range map[string]string{
		"":                         "",
		"plain é":                  "plain é",
		"a\nb\tc\x00\x1b[2J\u0085": `a\nb\tc\x00\x1b[2J\u0085`,
		"bad \xff utf-8":           "bad \uFFFD utf-8",
	} {
		if got := messages.GoodbyeReason(in); got != out {
			t.Errorf("GoodbyeReason(%q) = %q, want %q", in, got, out)
		}
	}
	long := messages.GoodbyeReason(strings.Repeat("é", messages.MaxGoodbyeReasonLen) + "\n")
	if len(long) > messages.MaxGoodbyeReasonLen || !utf8.ValidString(long) {
		t.Fatalf("GoodbyeReason of a long text: %d bytes, valid UTF-8 %v", len(long), utf8.ValidString(long))
	}
	if _, err := messages.Encode(&messages.Heartbeat{From: peer, Seq: 1, Leaving: true, Reason: long}); err != nil {
		t.Fatalf("Encode of a goodbye with GoodbyeReason's text: %v", err)
	}
}

// TestDecodeEveryPrefixAndSuffix splits every sample at every byte: each
// part decodes to a valid frame or is rejected with ErrInvalid.
func TestDecodeEveryPrefixAndSuffix(t *testing.T) {
	for name, f := range sampleFrames() {
		t.Run(name, func(t *testing.T) {
			b := mustEncode(t, f)
			for i := 0; i <= len(b); i++ {
				checkDecodes(t, b[:i])
				checkDecodes(t, b[i:])
			}
		})
	}
}

// checkDecodes asserts Decode's contract on arbitrary input: an error
// wrapping ErrInvalid, or a valid frame that survives a re-encode.
func checkDecodes(t testing.TB, b []byte) {
	t.Helper()
	f, err := messages.Decode(b)
	if err != nil {
		if !errors.Is(err, messages.ErrInvalid) {
			t.Fatalf("Decode(%x): error %v does not wrap ErrInvalid", b, err)
		}
		if f != nil {
			t.Fatalf("Decode(%x): frame %#v with error %v", b, f, err)
		}
		return
	}
	if err := f.Validate(); err != nil {
		t.Fatalf("Decode(%x) returned an invalid frame: %v", b, err)
	}
	b2, err := messages.Encode(f)
	if err != nil {
		t.Fatalf("Decode(%x) = %#v, which does not encode: %v", b, f, err)
	}
	f2, err := messages.Decode(b2)
	if err != nil {
		t.Fatalf("re-encoded %#v does not decode: %v", f, err)
	}
	if !reflect.DeepEqual(f, f2) {
		t.Fatalf("re-encode changed the frame:\n got %#v\nwant %#v", f2, f)
	}
}

type foreignFrame struct{ messages.Heartbeat }

func TestEncodeRejects(t *testing.T) {
	badUTF8 := sampleResult()
	badUTF8.Status, badUTF8.Payload, badUTF8.Error = messages.StatusFailed, nil, "cut \xe2\x82"
	tests := []struct {
		name string
		f    messages.Frame
		want string
	}{
		{"nil", nil, "nil frame"},
		{"typed nil", (*messages.Result)(nil), "nil *messages.Result"},
		{"foreign type", &foreignFrame{}, "has no wire encoding"},
		{"invalid", &messages.Heartbeat{}, "sender instance length 0"},
		{"unknown status", &messages.Result{RequestID: "r", From: testPeer}, "result status 0"},
		{"status out of range", &messages.Result{RequestID: "r", From: testPeer, Status: 9}, "result status 9"},
		{"invalid utf-8 error text", badUTF8, "error text is not valid UTF-8"},
		{"invalid utf-8 instance", &messages.Heartbeat{From: messages.PeerID{Instance: "\xff"}}, "sender instance is not valid UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("prefix")
			out, err := messages.AppendEncode(dst, tc.f)
			if err == nil {
				t.Fatalf("AppendEncode accepted %#v", tc.f)
			}
			if !errors.Is(err, messages.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
			if string(out) != "prefix" {
				t.Errorf("AppendEncode returned %q on error, want dst unchanged", out)
			}
		})
	}
}

func TestTruncateText(t *testing.T) {
	tests := []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"abcdef", 3, "abc"},
		{"a€b", 2, "a"}, // € is 3 bytes: never cut inside it
		{"a€b", 4, "a€"},
		{"bad\xffbyte", 100, "bad\uFFFDbyte"},
		{"anything", 0, ""},
		{"anything", -1, ""},
	}
	for _, tc := range tests {
		got := messages.TruncateText(tc.in, tc.max)
		if got != tc.want {
			t.Errorf("TruncateText(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.String().Draw(t, "s")
		n := rapid.IntRange(0, 64).Draw(t, "max")
		got := messages.TruncateText(s, n)
		if len(got) > n || !utf8.ValidString(got) {
			t.Fatalf("TruncateText(%q, %d) = %q: %d bytes, valid %v", s, n, got, len(got), utf8.ValidString(got))
		}
	})
}

// TestDecodeDoesNotRetainInput: the caller may reuse its buffer (a ZeroMQ
// message) as soon as Decode returns.
func TestDecodeDoesNotRetainInput(t *testing.T) {
	for name, f := range sampleFrames() {
		t.Run(name, func(t *testing.T) {
			b := mustEncode(t, f)
			got, err := messages.Decode(b)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			clear(b)
			if want := canonical(f); !reflect.DeepEqual(got, want) {
				t.Fatalf("frame changed with its input buffer:\n got %#v\nwant %#v", got, want)
			}
		})
	}
}

// TestDecodeNamesAnInvalidFrame: a RequestData or a Result that fails
// Validate but names its request and sender validly comes back as an
// InvalidFrame error carrying those fields (and still wrapping
// ErrInvalid); one whose naming fields are bad, or another frame type,
// does not.
func TestDecodeNamesAnInvalidFrame(t *testing.T) {
	env := pbRequestData(&pb.GroupDest{Blocks: []int32{1, -5}})
	env.GetRequestData().FromIncarnation = 7
	_, err := messages.Decode(marshalPB(t, env))
	var inv *messages.InvalidFrame
	if !errors.As(err, &inv) || !errors.Is(err, messages.ErrInvalid) {
		t.Fatalf("negative block: %v, want an InvalidFrame wrapping ErrInvalid", err)
	}
	rd, ok := inv.Frame.(*messages.RequestData)
	if !ok || rd.RequestID != "req-1" || rd.Epoch != 1 || rd.From != (messages.PeerID{Instance: "gen-0"}) ||
		rd.FromIncarnation != 7 || !strings.Contains(err.Error(), "block[1] = -5") {
		t.Fatalf("named %+v, error %v", inv.Frame, err)
	}
	noID := pbRequestData(&pb.GroupDest{Blocks: []int32{-5}})
	noID.GetRequestData().RequestId = ""
	if _, err := messages.Decode(marshalPB(t, noID)); err == nil || errors.As(err, &inv) {
		t.Fatalf("no request id: %v, want a plain rejection", err)
	}
	noFrom := pbRequestData(&pb.GroupDest{Blocks: []int32{-5}})
	noFrom.GetRequestData().From = &pb.PeerID{}
	if _, err := messages.Decode(marshalPB(t, noFrom)); err == nil || errors.As(err, &inv) {
		t.Fatalf("no sender: %v, want a plain rejection", err)
	}
	// A Result of a status this version does not know (a newer writer's).
	_, err = messages.Decode(marshalPB(t, pbResult(&pb.Result{Status: 99, Epoch: 4, ToIncarnation: 3})))
	if !errors.As(err, &inv) || !errors.Is(err, messages.ErrInvalid) || !strings.Contains(err.Error(), "status 99") {
		t.Fatalf("unknown status: %v, want an InvalidFrame naming status 99", err)
	}
	if r, ok := inv.Frame.(*messages.Result); !ok || r.RequestID != "req-1" || r.Epoch != 4 || r.ToIncarnation != 3 {
		t.Fatalf("named %+v", inv.Frame)
	}
	noID = pbResult(&pb.Result{Status: 99, RequestId: strings.Repeat("x", messages.MaxRequestIDLen+1)})
	if _, err := messages.Decode(marshalPB(t, noID)); err == nil || errors.As(err, &inv) {
		t.Fatalf("invalid Result with a bad request id: %v, want a plain rejection", err)
	}
	bad := &pb.Envelope{Version: messages.Version, Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{
		RequestId: "req-1", From: pbPeer(), Reason: strings.Repeat("x", messages.MaxErrorLen+1)}}}
	if _, err := messages.Decode(marshalPB(t, bad)); err == nil || errors.As(err, &inv) {
		t.Fatalf("invalid Cancel: %v, want a plain rejection", err)
	}
}
