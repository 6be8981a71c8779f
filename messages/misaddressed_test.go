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

const fieldMisaddressed = 8

func sampleMisaddressed() *messages.Misaddressed {
	return &messages.Misaddressed{RequestID: "req-0001", Epoch: 7, From: testPeer, Addressed: 3,
		Incarnations: messages.Incarnations{FromIncarnation: 9, ToIncarnation: 5}}
}

// TestMisaddressedRoundTrip: the Misaddressed frame is Envelope body field
// 8 (additive: a build before it rejects it as of an unknown frame type,
// so it is sent only to a peer whose Hello says FeatureMisaddressed, bit
// 3), and every field survives the wire.
func TestMisaddressedRoundTrip(t *testing.T) {
	fields := pb.File_messages_proto_kvxfer_proto.Messages()
	if got := fields.ByName("Envelope").Fields().ByName("misaddressed").Number(); got != fieldMisaddressed {
		t.Fatalf("Envelope.misaddressed is field %d, want %d", got, fieldMisaddressed)
	}
	if messages.FeatureMisaddressed != 1<<3 {
		t.Fatalf("FeatureMisaddressed = %#x, want bit 3 (the wire says so)", messages.FeatureMisaddressed)
	}
	for _, m := range []*messages.Misaddressed{sampleMisaddressed(),
		{RequestID: strings.Repeat("r", messages.MaxRequestIDLen), Epoch: math.MaxUint64, From: messages.PeerID{Instance: "c", Rank: messages.MaxRank - 1},
			Addressed: math.MaxUint64 - 1, Incarnations: messages.Incarnations{FromIncarnation: math.MaxUint64, ToIncarnation: math.MaxUint64}}} {
		b := mustEncode(t, m)
		got, err := messages.Decode(b)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if !reflect.DeepEqual(got, messages.Frame(m)) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
		}
		if in := got.(messages.Incarnated).Incarnation(); in != m.Incarnations {
			t.Fatalf("Incarnation() = %+v, want %+v", in, m.Incarnations)
		}
	}
}

// TestMisaddressedRejects: a Misaddressed that names no incarnation it was
// addressed to, one not earlier than the incarnation that dropped it, no
// receiver's incarnation, or a bad request id or sender is refused by
// Encode and by Decode (a plain ErrInvalid: it names no request a
// receiver may act on), and so is one written beside another frame's body.
func TestMisaddressedRejects(t *testing.T) {
	for name, mod := range map[string]func(m *messages.Misaddressed){
		"addressed 0":          func(m *messages.Misaddressed) { m.Addressed = 0 },
		"dropped by 0":         func(m *messages.Misaddressed) { m.FromIncarnation = 0 },
		"dropped by the same":  func(m *messages.Misaddressed) { m.FromIncarnation = m.Addressed },
		"dropped by earlier":   func(m *messages.Misaddressed) { m.FromIncarnation = m.Addressed - 1 },
		"to no incarnation":    func(m *messages.Misaddressed) { m.ToIncarnation = 0 },
		"empty request":        func(m *messages.Misaddressed) { m.RequestID = "" },
		"long request":         func(m *messages.Misaddressed) { m.RequestID = strings.Repeat("r", messages.MaxRequestIDLen+1) },
		"no sender":            func(m *messages.Misaddressed) { m.From = messages.PeerID{} },
		"sender rank too high": func(m *messages.Misaddressed) { m.From.Rank = messages.MaxRank },
	} {
		m := sampleMisaddressed()
		mod(m)
		if _, err := messages.Encode(m); !errors.Is(err, messages.ErrInvalid) {
			t.Errorf("%s: Encode: %v, want ErrInvalid", name, err)
		}
		b := marshalPB(t, &pb.Envelope{Version: messages.Version, Body: &pb.Envelope_Misaddressed{Misaddressed: &pb.Misaddressed{
			RequestId: m.RequestID, Epoch: m.Epoch, From: &pb.PeerID{Instance: m.From.Instance, Rank: m.From.Rank},
			Addressed: m.Addressed, FromIncarnation: m.FromIncarnation, ToIncarnation: m.ToIncarnation}}})
		f, err := messages.Decode(b)
		var inv *messages.InvalidFrame
		if !errors.Is(err, messages.ErrInvalid) || errors.As(err, &inv) || f != nil {
			t.Errorf("%s: Decode: %v, %v; want a plain ErrInvalid", name, f, err)
		}
	}
	// Two bodies: the walk before Unmarshal counts field 8 as a body.
	b := append(mustEncode(t, sampleMisaddressed()), bytesField(nil, fieldHeartbeat, rawHeartbeat())...)
	if f, err := messages.Decode(b); err == nil || !strings.Contains(err.Error(), "two bodies") {
		t.Fatalf("a Misaddressed and a Heartbeat body in one frame: %v, %v; want refused as two bodies", f, err)
	}
}

// TestRequestDataFeatures: RequestData.Features (field 22) survives the
// wire, and a RequestData without features encodes as a build before the
// field writes it (an older writer skips the field: unknown fields are
// ignored).
func TestRequestDataFeatures(t *testing.T) {
	rd := sampleRequestData(2)
	plain := mustEncode(t, rd)
	rd.Features = messages.FeatureMisaddressed
	b := mustEncode(t, rd)
	got, err := messages.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if f := got.(*messages.RequestData).Features; f != messages.FeatureMisaddressed {
		t.Fatalf("features %#x after the wire, want %#x", f, messages.FeatureMisaddressed)
	}
	if want := varintField(plain, 22, messages.FeatureMisaddressed); len(b) != len(want) {
		t.Fatalf("with features: %d bytes, want the plain encoding (%d) plus field 22 (%d)", len(b), len(plain), len(want))
	}
	fields := pb.File_messages_proto_kvxfer_proto.Messages()
	if got := fields.ByName("RequestData").Fields().ByName("features").Number(); got != 22 {
		t.Fatalf("RequestData.features is field %d, want 22", got)
	}
}
