package messages

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvxfer/kvxfer/messages/pb"
)

// MaxFrameBytes bounds one encoded frame; Decode rejects a longer input
// before parsing it, and a transport should set its own message-size limit
// (ZMQ_MAXMSGSIZE) to it.
//
// The largest valid frame is a RequestData naming MaxBlocks destination
// blocks: each block is one packed varint of at most 5 bytes (a
// non-negative int32), 5 MiB in all, plus well under 8 KiB of headers
// (request id, sender, MaxGroups group headers). TestMaxFrameFits encodes
// that worst case and checks it fits.
const MaxFrameBytes = 6 << 20

// MinFrameLimit is the smallest frame limit a listener may have
// (zmq.Config.MaxFrameBytes, and the Hello's MaxFrameBytes that says it):
// every frame that ends a request fits in it at its fields' bounds — a
// FAILED Result without payload, with the longest error text; a Cancel
// with the longest reason; a CancelAck; a Misaddressed — so that a
// request's end always reaches its peer. A smaller limit would drop them
// there, and the peer would wait for its deadline with its pages held.
// (TestMinFrameLimitFitsEveryEnd encodes those worst cases.) A SUCCESS
// Result whose payload makes it larger than the peer's limit is refused
// at send, and its request ends with a FAILED Result, which fits.
const MinFrameLimit = 4096

// ErrVersion is wrapped, beside ErrInvalid, when a frame carries a protocol
// version other than Version; the error is a *VersionError, which says the
// version the frame carried.
var ErrVersion = errors.New("messages: unsupported protocol version")

// VersionError is Decode's error for a frame written in another protocol
// version: its sender speaks Got, this build speaks Version. It wraps
// ErrInvalid and ErrVersion.
type VersionError struct{ Got uint32 }

func (e *VersionError) Error() string {
	return fmt.Sprintf("%v: %v %d, want %d", ErrInvalid, ErrVersion, e.Got, Version)
}
func (e *VersionError) Unwrap() []error { return []error{ErrInvalid, ErrVersion} }

// Encode returns the wire encoding of f: an Envelope carrying Version and
// the frame. It validates f first and never encodes an invalid frame; every
// error wraps ErrInvalid. Text fields must also be valid UTF-8 (proto3
// strings); pass free-form text through TruncateText first.
func Encode(f Frame) ([]byte, error) { return AppendEncode(nil, f) }

// AppendEncode appends the wire encoding of f to dst, as Encode does. On
// error it returns dst unchanged in length.
func AppendEncode(dst []byte, f Frame) ([]byte, error) {
	env, err := toWire(f)
	if err != nil {
		return dst, err
	}
	out, err := proto.MarshalOptions{}.MarshalAppend(dst, env)
	if err != nil {
		return dst, invalid("encode %T: %v", f, err)
	}
	if n := len(out) - len(dst); n > MaxFrameBytes {
		return dst, invalid("encode %T: %d bytes exceeds MaxFrameBytes %d", f, n, MaxFrameBytes)
	}
	return out, nil
}

// Decode parses one wire frame and returns it only if every field is in
// range: the input is at most MaxFrameBytes, the version is Version, the
// body is a known frame type, every integer converts without truncation and
// the frame passes Validate. Before it unmarshals anything it walks b and
// refuses a frame that carries bodies of two frame types or holds more
// elements in a repeated field than its bound (MaxGroups, MaxBlocks,
// MaxRemap, MaxMemoryLayers) lets a valid frame hold, so that no input
// makes it allocate more than a small multiple of len(b). Every error
// wraps ErrInvalid and names the field and value. Decode never panics,
// whatever b holds, and does not retain b. Unknown fields inside a known
// frame are ignored.
func Decode(b []byte) (Frame, error) {
	if len(b) > MaxFrameBytes {
		return nil, invalid("frame of %d bytes exceeds MaxFrameBytes %d", len(b), MaxFrameBytes)
	}
	// Refuse what would make Unmarshal allocate far more than len(b),
	// before it runs (decode_bounds.go).
	if err := checkWire(b); err != nil {
		return nil, err
	}
	var env pb.Envelope
	if err := proto.Unmarshal(b, &env); err != nil {
		return nil, malformed(b, err)
	}
	if v := env.GetVersion(); v != Version {
		return nil, &VersionError{Got: v}
	}
	f, err := fromWire(&env)
	if err != nil {
		return nil, err
	}
	incarnationsFromWire(&env, f)
	if err := f.Validate(); err != nil {
		if n, ok := f.(named); ok && n.Named() == nil {
			return nil, &InvalidFrame{Frame: f, Err: err}
		}
		return nil, err
	}
	return f, nil
}

// InvalidFrame is the error Decode returns for a RequestData or a Result
// that parsed but failed Validate while the fields that name it — request
// id, epoch, sender, incarnations — are valid on their own (Named): its
// receiver may fail the request at once with Err instead of leaving it to
// its deadline (DESIGN.md §6). A RequestData is answered FAILED; a Result
// fails the generation session it names, as no proof that its writer is
// done. Only the naming fields of Frame may be read; it wraps Err, so
// errors.Is(err, ErrInvalid) holds.
type InvalidFrame struct {
	Frame Frame
	Err   error
}

func (e *InvalidFrame) Error() string { return e.Err.Error() }
func (e *InvalidFrame) Unwrap() error { return e.Err }

// named is a frame whose naming fields can be checked alone.
type named interface{ Named() error }

// TruncateText makes s fit a frame's text field (Result.Error,
// Cancel.Reason): invalid UTF-8 is replaced with U+FFFD and the result is
// cut to at most limit bytes on a rune boundary.
func TruncateText(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if limit < 0 {
		limit = 0
	}
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// toWire validates f and builds its Envelope. The Envelope aliases f's
// slices; it is only read, by Marshal.
func toWire(f Frame) (*pb.Envelope, error) {
	env := &pb.Envelope{Version: Version}
	switch m := f.(type) {
	case nil:
		return nil, invalid("encode: nil frame")
	case *Hello:
		if m == nil {
			return nil, invalid("encode: nil %T", m)
		}
		if err := checkText(m, "sender instance", m.From.Instance, "backend", m.Backend); err != nil {
			return nil, err
		}
		pools := make([]*pb.PoolGeometry, len(m.Pools))
		for i, p := range m.Pools {
			pools[i] = &pb.PoolGeometry{Offset: p.Offset, BlockBytes: p.BlockBytes, Blocks: p.Blocks}
		}
		env.Body = &pb.Envelope_Hello{Hello: &pb.Hello{
			From:       peerToWire(m.From),
			Backend:    m.Backend,
			AgentAddr:  m.AgentAddr,
			Region:     &pb.RemoteRegion{Key: m.Region.Key, Len: m.Region.Len},
			LayoutHash: m.LayoutHash,
			Parallel:   &pb.Parallel{Tp: m.Parallel.TP, Pp: m.Parallel.PP, Stages: m.Parallel.Stages},
			Tp:         m.TP,
			Pp:         m.PP,
			Pools:      pools,
			Model:      m.Model,
			Memory:     memoryToWire(m.Memory),
		}}
	case *RequestData:
		if m == nil {
			return nil, invalid("encode: nil %T", m)
		}
		if err := checkText(m, "request id", m.RequestID, "sender instance", m.From.Instance); err != nil {
			return nil, err
		}
		groups := make([]*pb.GroupDest, len(m.Groups))
		for i, g := range m.Groups {
			groups[i] = &pb.GroupDest{First: g.First, Blocks: g.Blocks}
		}
		env.Body = &pb.Envelope_RequestData{RequestData: &pb.RequestData{
			RequestId:        m.RequestID,
			Epoch:            m.Epoch,
			From:             peerToWire(m.From),
			GenParallel:      &pb.Parallel{Tp: m.GenParallel.TP, Pp: m.GenParallel.PP, Stages: m.GenParallel.Stages},
			GenTp:            m.GenTP,
			GenPp:            m.GenPP,
			PromptLen:        m.PromptLen,
			Groups:           groups,
			DeadlineUnixNano: m.DeadlineUnixNano,
			Remap:            remapToWire(m.Remap),
		}}
	case *Result:
		if m == nil {
			return nil, invalid("encode: nil %T", m)
		}
		if err := checkText(m, "request id", m.RequestID, "sender instance", m.From.Instance, "error text", m.Error); err != nil {
			return nil, err
		}
		env.Body = &pb.Envelope_Result{Result: &pb.Result{
			RequestId: m.RequestID,
			Epoch:     m.Epoch,
			From:      peerToWire(m.From),
			Status:    pb.Status(m.Status),
			Bytes:     m.Bytes,
			Error:     m.Error,
			ErrorKind: pb.ErrorKind(m.ErrorKind),
			Payload:   m.Payload,
		}}
	case *Cancel:
		if m == nil {
			return nil, invalid("encode: nil %T", m)
		}
		if err := checkText(m, "request id", m.RequestID, "sender instance", m.From.Instance, "cancel reason", m.Reason); err != nil {
			return nil, err
		}
		env.Body = &pb.Envelope_Cancel{Cancel: &pb.Cancel{
			RequestId: m.RequestID,
			Epoch:     m.Epoch,
			From:      peerToWire(m.From),
			Reason:    m.Reason,
		}}
	case *CancelAck:
		if m == nil {
			return nil, invalid("encode: nil %T", m)
		}
		if err := checkText(m, "request id", m.RequestID, "sender instance", m.From.Instance); err != nil {
			return nil, err
		}
		env.Body = &pb.Envelope_CancelAck{CancelAck: &pb.CancelAck{
			RequestId: m.RequestID,
			Epoch:     m.Epoch,
			From:      peerToWire(m.From),
		}}
	case *Misaddressed:
		if m == nil {
			return nil, invalid("encode: nil %T", m)
		}
		if err := checkText(m, "request id", m.RequestID, "sender instance", m.From.Instance); err != nil {
			return nil, err
		}
		env.Body = &pb.Envelope_Misaddressed{Misaddressed: &pb.Misaddressed{
			RequestId: m.RequestID,
			Epoch:     m.Epoch,
			From:      peerToWire(m.From),
			Addressed: m.Addressed,
		}}
	case *Heartbeat:
		if m == nil {
			return nil, invalid("encode: nil %T", m)
		}
		if err := checkText(m, "sender instance", m.From.Instance); err != nil {
			return nil, err
		}
		env.Body = &pb.Envelope_Heartbeat{Heartbeat: &pb.Heartbeat{
			From:            peerToWire(m.From),
			Seq:             m.Seq,
			Leaving:         m.Leaving,
			Drained:         m.Drained,
			Reason:          m.Reason,
			FromIncarnation: m.FromIncarnation,
		}}
	default:
		return nil, invalid("encode: frame type %T has no wire encoding", f)
	}
	incarnationsToWire(env, f)
	return env, nil
}

// checkText validates f, then checks that each named text field (pairs of
// name, value) is valid UTF-8, as proto3 requires of strings.
func checkText(f Frame, fields ...string) error {
	if err := f.Validate(); err != nil {
		return err
	}
	for i := 0; i+1 < len(fields); i += 2 {
		if !utf8.ValidString(fields[i+1]) {
			return invalid("encode %T (request %q, sender %s): %s is not valid UTF-8",
				f, f.Request(), f.Sender(), fields[i])
		}
	}
	return nil
}

// fromWire converts a decoded Envelope's body to its frame. Only narrowing
// conversions are checked here; Validate checks the rest.
func fromWire(env *pb.Envelope) (Frame, error) {
	switch body := env.GetBody().(type) {
	case *pb.Envelope_Hello:
		m := body.Hello
		pools := make([]PoolGeometry, len(m.GetPools()))
		for i, p := range m.GetPools() {
			pools[i] = PoolGeometry{Offset: p.GetOffset(), BlockBytes: p.GetBlockBytes(), Blocks: p.GetBlocks()}
		}
		return &Hello{
			From:       peerFromWire(m.GetFrom()),
			Backend:    m.GetBackend(),
			AgentAddr:  nonEmpty(m.GetAgentAddr()),
			Region:     RemoteRegion{Key: nonEmpty(m.GetRegion().GetKey()), Len: m.GetRegion().GetLen()},
			LayoutHash: m.GetLayoutHash(),
			Parallel:   Parallel{TP: m.GetParallel().GetTp(), PP: m.GetParallel().GetPp(), Stages: m.GetParallel().GetStages()},
			TP:         m.GetTp(),
			PP:         m.GetPp(),
			Pools:      nonEmpty(pools),
			Model:      m.GetModel(),
			Memory:     memoryFromWire(m.GetMemory()),
		}, nil
	case *pb.Envelope_RequestData:
		m := body.RequestData
		groups := make([]GroupDest, len(m.GetGroups()))
		for i, g := range m.GetGroups() {
			// The decoded message is ours alone: alias its blocks.
			groups[i] = GroupDest{First: g.GetFirst(), Blocks: nonEmpty(g.GetBlocks())}
		}
		return &RequestData{
			RequestID:        m.GetRequestId(),
			Epoch:            m.GetEpoch(),
			From:             peerFromWire(m.GetFrom()),
			GenParallel:      Parallel{TP: m.GetGenParallel().GetTp(), PP: m.GetGenParallel().GetPp(), Stages: m.GetGenParallel().GetStages()},
			GenTP:            m.GetGenTp(),
			GenPP:            m.GetGenPp(),
			PromptLen:        m.GetPromptLen(),
			Groups:           nonEmpty(groups),
			DeadlineUnixNano: m.GetDeadlineUnixNano(),
			Remap:            remapFromWire(m.GetRemap()),
		}, nil
	case *pb.Envelope_Result:
		m := body.Result
		r := &Result{
			RequestID: m.GetRequestId(),
			Epoch:     m.GetEpoch(),
			From:      peerFromWire(m.GetFrom()),
			Bytes:     m.GetBytes(),
			Error:     m.GetError(),
			// An open enum too, kept as it came: an undefined kind (a
			// newer writer's) is valid and names no reason this build
			// acts on; absent (an older writer) it is unspecified.
			ErrorKind: ErrorKind(m.GetErrorKind()),
			Payload:   nonEmpty(m.GetPayload()),
		}
		// Status is an open enum (any int32) on the wire; it becomes the
		// uint8 Status only once it is known to be a defined value. An
		// unknown one (a newer writer's) stays StatusUnknown, and
		// Validate names the value that came.
		if s := m.GetStatus(); s > pb.Status_STATUS_UNKNOWN && int64(s) < int64(len(statusNames)) {
			r.Status = Status(s)
		} else {
			r.wireStatus = int32(s)
		}
		return r, nil
	case *pb.Envelope_Cancel:
		m := body.Cancel
		return &Cancel{
			RequestID: m.GetRequestId(),
			Epoch:     m.GetEpoch(),
			From:      peerFromWire(m.GetFrom()),
			Reason:    m.GetReason(),
		}, nil
	case *pb.Envelope_CancelAck:
		m := body.CancelAck
		return &CancelAck{
			RequestID: m.GetRequestId(),
			Epoch:     m.GetEpoch(),
			From:      peerFromWire(m.GetFrom()),
		}, nil
	case *pb.Envelope_Misaddressed:
		m := body.Misaddressed
		return &Misaddressed{
			RequestID: m.GetRequestId(),
			Epoch:     m.GetEpoch(),
			From:      peerFromWire(m.GetFrom()),
			Addressed: m.GetAddressed(),
		}, nil
	case *pb.Envelope_Heartbeat:
		m := body.Heartbeat
		return &Heartbeat{From: peerFromWire(m.GetFrom()), Seq: m.GetSeq(),
			FromIncarnation: m.GetFromIncarnation(), Leaving: m.GetLeaving(), Drained: m.GetDrained(), Reason: m.GetReason()}, nil
	case nil:
		if num, ok := firstUnknownField(env); ok {
			return nil, invalid("unknown frame type (envelope field %d)", num)
		}
		return nil, invalid("frame has no body")
	default:
		return nil, invalid("frame body %T has no conversion", body)
	}
}

// firstUnknownField names the first field of env that this version does not
// know, for the rejection message (a peer speaking a newer dialect).
func firstUnknownField(env *pb.Envelope) (protowire.Number, bool) {
	num, _, n := protowire.ConsumeTag(env.ProtoReflect().GetUnknown())
	return num, n > 0
}

func peerToWire(p PeerID) *pb.PeerID { return &pb.PeerID{Instance: p.Instance, Rank: p.Rank} }

func peerFromWire(p *pb.PeerID) PeerID {
	return PeerID{Instance: p.GetInstance(), Rank: p.GetRank()}
}

// nonEmpty maps an empty slice to nil, so that a decoded frame is canonical
// whether or not the sender wrote an empty field.
func nonEmpty[S ~[]E, E any](s S) S {
	if len(s) == 0 {
		return nil
	}
	return s
}

func remapToWire(xs []Extent) []*pb.Extent {
	if len(xs) == 0 {
		return nil
	}
	out := make([]*pb.Extent, len(xs))
	for i, x := range xs {
		out[i] = &pb.Extent{View: x.View, File: x.File, Len: x.Len}
	}
	return out
}

func remapFromWire(xs []*pb.Extent) []Extent {
	if len(xs) == 0 {
		return nil
	}
	out := make([]Extent, len(xs))
	for i, x := range xs {
		out[i] = Extent{View: x.GetView(), File: x.GetFile(), Len: x.GetLen()}
	}
	return out
}
