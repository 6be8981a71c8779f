package messages

import (
	"errors"
	"fmt"
	"github.com/kvxfer/kvxfer/kvcache"
	"math/bits"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Version is the control-plane protocol version carried in every frame.
const Version uint32 = 1

// Bounds on decoded fields. A frame beyond them is hostile or broken.
const (
	MaxRequestIDLen = 256
	MaxInstanceLen  = 128
	MaxGroups       = 16
	MaxBlocks       = 1 << 20
	MaxErrorLen     = 1024
	MaxPayload      = 64 << 10 // a first token, or a framework's per-request metadata (SGLang's aux slot)
	// LegacyMaxPayload is the largest payload a peer without
	// FeatureLargePayload takes: it refuses a Result with a longer one.
	LegacyMaxPayload = 4096
	MaxRank          = 1 << 16
	// MaxRemap bounds RequestData.Remap.
	MaxRemap = 1 << 14
	// MaxGoodbyeReasonLen bounds Heartbeat.Reason, in bytes: room for an
	// error that names two endpoints and what to check (the sender cuts a
	// longer one: GoodbyeReason).
	MaxGoodbyeReasonLen = 512
)

// ErrInvalid is wrapped by every validation failure.
var ErrInvalid = errors.New("messages: invalid frame")

// PeerID names one rank of one engine instance.
type PeerID struct {
	Instance string
	Rank     int32
}

func (p PeerID) String() string { return fmt.Sprintf("%s/%d", p.Instance, p.Rank) }

// Parallel is an instance's tensor- and pipeline-parallel size, and its
// pipeline stages' split of the layers when not the default one
// (kvcache.Parallel.Stages: each stage's layer count, comma-separated).
type Parallel struct {
	TP     int32
	PP     int32
	Stages string
}

// GroupDest is one layer group's destination: global block indices
// First..First+len(Blocks)-1 live in the receiver's physical Blocks.
type GroupDest struct {
	First  int32
	Blocks []int32
}

// Status is a writer's terminal outcome for one request.
type Status uint8

const (
	// StatusUnknown is the zero value; never valid on the wire.
	StatusUnknown Status = iota
	// StatusSuccess: every byte landed (the writer flushed).
	StatusSuccess
	// StatusFailed: the writer failed; it is quiescent.
	StatusFailed
	// StatusInDoubt: the writer retired its writes by closing the
	// endpoint; it is quiescent, the bytes are not trustworthy.
	StatusInDoubt
	// StatusCancelled: the context side cancelled; it is quiescent.
	StatusCancelled
)

var statusNames = [...]string{"UNKNOWN", "SUCCESS", "FAILED", "IN_DOUBT", "CANCELLED"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// ErrorKind says why a FAILED Result failed, where its receiver acts on the
// reason: the receiver reads it here, never from the error text. The
// numbers are the wire's (pb.ErrorKind); a kind this build does not define
// (a newer writer's) is kept as it came and is valid, and names no reason
// this build acts on.
type ErrorKind int32

const (
	// ErrorKindUnspecified: no kind named — any failure without one, and
	// every Result of a writer that predates the field (its text is all
	// there is).
	ErrorKindUnspecified ErrorKind = iota
	// ErrorKindPromptMismatch: the writer's Send describes another prompt
	// length than the receiver's RequestData planned.
	ErrorKindPromptMismatch
)

var errorKindNames = [...]string{"UNSPECIFIED", "PROMPT_MISMATCH"}

// Defined reports whether k is a kind this build names.
func (k ErrorKind) Defined() bool { return k >= 0 && int(k) < len(errorKindNames) }

func (k ErrorKind) String() string {
	if k.Defined() {
		return errorKindNames[k]
	}
	return fmt.Sprintf("ErrorKind(%d)", int32(k))
}

// Frame is any control-plane frame.
type Frame interface {
	// Validate range-checks every field; errors wrap ErrInvalid.
	Validate() error
	// Request is the request the frame names ("" for none).
	Request() string
	// Sender is the peer that sent it.
	Sender() PeerID
}

// Terminal reports whether f ends or answers a request (Result, Cancel,
// CancelAck, Misaddressed): nothing sends such a frame again, so a
// control plane never drops it for queue space, and a sender learns when
// it did not leave.
func Terminal(f Frame) bool {
	switch f.(type) {
	case *Result, *Cancel, *CancelAck, *Misaddressed:
		return true
	}
	return false
}

// RemoteRegion is a registered region a peer may write into.
type RemoteRegion struct {
	Key []byte
	Len uint64
}

// Hello introduces an engine rank to a peer: how to reach its data plane,
// the region a writer targets, and the layout it was built for.
type Hello struct {
	From       PeerID
	Backend    string
	AgentAddr  []byte
	Region     RemoteRegion
	LayoutHash uint64
	Parallel   Parallel
	// Rank is the sender's (tp, pp) coordinate in its instance.
	TP, PP int32
	// Pools places each layer group's block pool inside Region.
	Pools []PoolGeometry
	// Model names the layout the sender serves (informational: a mismatch
	// names both models; LayoutHash decides). At most MaxModelLen bytes.
	Model string
	// Memory describes, in ascending group order, the layer groups whose
	// KV the sender's framework lays out itself: a writer plans into
	// Memory's descriptor instead of Pools[Group]. Groups without one use
	// their pool. Empty for a sender without descriptors (and from a peer
	// that predates them).
	Memory []KVMemory
	// Incarnation is new at each start of the rank (0: not known).
	Incarnation uint64
	// Process names the sender's OS process (zero: not told). A receiver
	// on the same host and pid namespace may watch it and take its exit as
	// proof that the sender's writes are over (docs/membership.md).
	Process ProcessID
	// Features are what the sender's version understands beyond protocol
	// version 1 (FeatureRemap, …); 0 from a peer that predates them.
	Features uint64
	// MaxFrameBytes is the largest frame the sender's listener takes: a
	// peer refuses to send it a larger one. 0: not said (a peer that
	// predates the field), taken as MaxFrameBytes; above MaxFrameBytes (a
	// later build's larger limit) it bounds nothing this build can send,
	// so any such value is valid (PeerFrameLimit); below MinFrameLimit
	// the frames that end a request would not reach the sender, and the
	// Hello is invalid.
	MaxFrameBytes uint64
}

// PeerFrameLimit is the largest frame h's sender takes, for a sender of
// this build: h.MaxFrameBytes, at most MaxFrameBytes (what this build can
// encode), and MaxFrameBytes when h does not say.
func (h *Hello) PeerFrameLimit() int {
	if h.MaxFrameBytes == 0 || h.MaxFrameBytes > MaxFrameBytes {
		return MaxFrameBytes
	}
	return int(h.MaxFrameBytes)
}

// Hello features.
const (
	// FeatureRemap: the sender, as a writer, honours RequestData.Remap.
	// A receiver whose request has moved blocks sends it only to writers
	// that say so (an older writer would write into revoked memory).
	FeatureRemap uint64 = 1 << iota
	// FeatureLargePayload: the sender, as a receiver, takes Result
	// payloads up to MaxPayload; one without it refuses any over
	// LegacyMaxPayload, so a context rank fails such a request itself,
	// naming the peer, instead of reporting DONE for a Result the peer
	// refuses.
	FeatureLargePayload
	// FeatureSendOnly: the sender receives no writes (a send-only rank,
	// whose region is registered as a source only, rdma.RegisterSource):
	// its Region.Key is SendOnlyKey, a placeholder no backend takes (a
	// Hello of a version before this feature needs a key; such a peer,
	// writing only to the ranks that ask it to, never uses it). A writer
	// refuses its RequestData, naming it.
	FeatureSendOnly
	// FeatureMisaddressed: the sender, as a generation rank, takes the
	// Misaddressed frame. A writer answers a RequestData that reached it
	// addressed to an earlier incarnation of itself with one only when the
	// RequestData's sender says so, in the RequestData's Features or in
	// its Hello: a build before it rejects the frame as of an unknown type
	// (counted, with a warning).
	FeatureMisaddressed
)

// SendOnlyKey is the region key a send-only rank's Hello names
// (FeatureSendOnly): a placeholder, so that a peer of an earlier version,
// which refuses a Hello without a key, still takes it.
var SendOnlyKey = []byte("kvxfer: send-only rank, no writable region")

// Has reports whether every feature of want is in h.Features.
func (h *Hello) Has(want uint64) bool { return h.Features&want == want }

// ProcessID names one OS process: Pid, its StartTime (field 22 of
// /proc/<pid>/stat: clock ticks after boot), which tells it from a later
// process that reuses the pid, and Host, the host and pid namespace it
// runs in ("<boot_id>/pid:[<inode>]"); a pid means nothing elsewhere.
type ProcessID struct {
	Pid       uint32
	StartTime uint64
	Host      string
}

// MaxHostLen bounds ProcessID.Host.
const MaxHostLen = 128

// IsZero reports whether p tells nothing.
func (p ProcessID) IsZero() bool { return p == ProcessID{} }

func (p ProcessID) validate() error {
	if p.IsZero() {
		return nil
	}
	if p.Pid == 0 || p.Pid > 1<<22 || p.StartTime == 0 || p.Host == "" || len(p.Host) > MaxHostLen {
		return invalid("hello process: pid %d start time %d host of %d bytes, want pid 1..%d, a start time and a host of 1..%d bytes",
			p.Pid, p.StartTime, len(p.Host), 1<<22, MaxHostLen)
	}
	for i := 0; i < len(p.Host); i++ {
		if c := p.Host[i]; c < 0x21 || c > 0x7e {
			return invalid("hello process host: byte 0x%02x at %d is not printable ASCII", c, i)
		}
	}
	return nil
}

// Incarnations name the incarnation a frame comes from and the one it is
// addressed to (0: not known, as from a peer that predates them). A rank
// never acts on a frame addressed to an earlier incarnation of itself, or
// sent by an earlier incarnation of its peer than the one it knows.
type Incarnations struct {
	FromIncarnation uint64
	ToIncarnation   uint64
}

// Incarnated is a frame that carries Incarnations.
type Incarnated interface {
	Frame
	Incarnation() Incarnations
}

func (m *RequestData) Incarnation() Incarnations  { return m.Incarnations }
func (m *Result) Incarnation() Incarnations       { return m.Incarnations }
func (m *Cancel) Incarnation() Incarnations       { return m.Incarnations }
func (m *CancelAck) Incarnation() Incarnations    { return m.Incarnations }
func (m *Misaddressed) Incarnation() Incarnations { return m.Incarnations }

// MaxModelLen bounds Hello.Model.
const MaxModelLen = 128

// PoolGeometry places one layer group's pool in a region: block i occupies
// [Offset + i*BlockBytes, Offset + (i+1)*BlockBytes).
type PoolGeometry struct {
	Offset     uint64
	BlockBytes uint64
	Blocks     int32
}

// RequestData asks a context rank to write one request's KV into the
// sender's (a generation rank's) blocks.
type RequestData struct {
	RequestID string
	Epoch     uint64
	From      PeerID
	// GenParallel and (GenTP, GenPP) place the receiver in its instance,
	// so the writer can compute the peer map.
	GenParallel Parallel
	GenTP       int32
	GenPP       int32
	PromptLen   int32
	Groups      []GroupDest
	// DeadlineUnixNano is when the receiver gives up (0 = none).
	DeadlineUnixNano int64
	// Remap lists the runs of the receiver's region, sorted and disjoint,
	// that writers must address at another offset than the one the
	// request's blocks and plans give (blocks of a shared-memory region
	// the receiver revoked from an earlier, stale writer); empty while none
	// of the request's blocks was.
	Remap []Extent
	Incarnations
	// Features are what the sender takes in answer beyond protocol
	// version 1, as Hello.Features (FeatureMisaddressed): a writer that
	// drops the frame unread may answer it without the sender's Hello,
	// which it may not have heard yet (a restart). 0 from a peer that
	// predates them.
	Features uint64
}

// Extent says that region bytes [View, View+Len) are written at [File,
// File+Len).
type Extent struct {
	View, File, Len uint64
}

// Result is a writer's terminal outcome for one request; the writer is
// quiescent for that request when it sends one.
type Result struct {
	RequestID string
	Epoch     uint64
	From      PeerID
	Status    Status
	Bytes     uint64
	Error     string
	// ErrorKind says why a FAILED Result failed (Error is its text); a
	// defined kind other than ErrorKindUnspecified is valid only with
	// StatusFailed. An undefined one (a newer writer's) is valid with any
	// status.
	ErrorKind ErrorKind
	// Payload is a small opaque value from the context side (first token).
	Payload []byte
	Incarnations
	// wireStatus is the status a decoded frame carried when it is not a
	// defined one (Status is then StatusUnknown), for Validate to name.
	wireStatus int32
}

// Cancel asks a writer to stop; it answers CancelAck once quiescent.
type Cancel struct {
	RequestID string
	Epoch     uint64
	From      PeerID
	Reason    string
	Incarnations
}

// CancelAck says the writer is quiescent for the request.
type CancelAck struct {
	RequestID string
	Epoch     uint64
	From      PeerID
	Incarnations
}

// Misaddressed answers a RequestData that reached an incarnation of its
// writer other than the one it was addressed to — a later one: the writer
// restarted on the same endpoint and took frames before its new Hello
// reached the generation rank — which dropped it unread. It says: your
// RequestData for RequestID (Epoch) addressed to incarnation Addressed
// reached incarnation FromIncarnation of From, which dropped it.
// ToIncarnation is the dropped frame's FromIncarnation (the generation
// rank that sent it).
//
// It is not a terminal frame and no proof that any incarnation's writes
// are over: the generation rank takes it only for a RequestData it sent
// once addressed to Addressed, that left, and that no answer of Addressed
// has shown received; a RequestData is handed to the transport once per
// incarnation it is addressed to, and the transport delivers a copy at
// most once, to one process, so the frame never reached Addressed, and
// the request may be addressed to FromIncarnation (docs/membership.md).
// It is sent only to a peer that says FeatureMisaddressed, in its Hello
// or in the RequestData answered (RequestData.Features).
type Misaddressed struct {
	RequestID string
	Epoch     uint64
	From      PeerID
	// Addressed is the incarnation the dropped RequestData was addressed
	// to (its ToIncarnation): not 0, and earlier than FromIncarnation.
	Addressed uint64
	Incarnations
}

// Heartbeat proves a peer is alive. With Leaving set it is a goodbye: the
// sender's control link is closing gracefully and this is its last
// heartbeat to the receiver.
type Heartbeat struct {
	From PeerID
	Seq  uint64
	// FromIncarnation is the sender's incarnation, as its Hello named it
	// (0: not told, as from a peer that predates it).
	FromIncarnation uint64
	// Leaving marks a goodbye: the sender's link closes (a graceful stop)
	// and it will say nothing more on this connection. A receiver may take
	// that incarnation of the sender as down at once instead of after its
	// heartbeat timeout. By itself it is liveness, never proof that the
	// sender's writes are over (DESIGN.md §3). A peer that predates it
	// ignores the field and takes the frame for a heartbeat.
	Leaving bool
	// Drained, set only with Leaving, makes the goodbye a proof: the
	// sender's engine stopped taking the frames that start writes and
	// every write it ever started is over (completed or proven over, none
	// in doubt), so incarnation FromIncarnation of the sender writes no
	// more — what a Result says for one request, said for all
	// (docs/membership.md, "A drained goodbye is proof"). A receiver that
	// validated the goodbye as the connection's own may end the quarantine
	// of the requests addressed to that incarnation. Without it (an older
	// sender, or one whose close left a write in doubt) a goodbye proves
	// nothing. A peer that predates it ignores the field.
	Drained bool
	// Reason, set only with Leaving, is why the sender closes when it
	// exits on an error it found (a mistake its peer should name instead
	// of waiting for a restart): at most MaxGoodbyeReasonLen bytes of
	// UTF-8 without control characters (GoodbyeReason makes any text
	// fit). "" (also from a peer that predates it): no reason given, and
	// the sender may come back (a restart).
	Reason string
}

// GoodbyeReason makes s fit Heartbeat.Reason: invalid UTF-8 is replaced
// with U+FFFD, each control character is escaped as in a Go string
// literal (a newline as \n), and the result is cut to at most
// MaxGoodbyeReasonLen bytes on a rune boundary.
func GoodbyeReason(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexFunc(s, unicode.IsControl) >= 0 {
		var b strings.Builder
		for _, r := range s {
			if unicode.IsControl(r) {
				q := strconv.QuoteRune(r)
				b.WriteString(q[1 : len(q)-1])
				continue
			}
			b.WriteRune(r)
		}
		s = b.String()
	}
	return TruncateText(s, MaxGoodbyeReasonLen)
}

func (m *Hello) Request() string        { return "" }
func (m *RequestData) Request() string  { return m.RequestID }
func (m *Result) Request() string       { return m.RequestID }
func (m *Cancel) Request() string       { return m.RequestID }
func (m *CancelAck) Request() string    { return m.RequestID }
func (m *Misaddressed) Request() string { return m.RequestID }
func (m *Heartbeat) Request() string    { return "" }

func (m *Hello) Sender() PeerID        { return m.From }
func (m *RequestData) Sender() PeerID  { return m.From }
func (m *Result) Sender() PeerID       { return m.From }
func (m *Cancel) Sender() PeerID       { return m.From }
func (m *CancelAck) Sender() PeerID    { return m.From }
func (m *Misaddressed) Sender() PeerID { return m.From }
func (m *Heartbeat) Sender() PeerID    { return m.From }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

func (p PeerID) validate() error {
	if p.Instance == "" || len(p.Instance) > MaxInstanceLen {
		return invalid("sender instance length %d, want 1..%d", len(p.Instance), MaxInstanceLen)
	}
	if p.Rank < 0 || p.Rank >= MaxRank {
		return invalid("sender rank %d, want 0..%d", p.Rank, MaxRank-1)
	}
	return nil
}

func validateRequestID(id string) error {
	if id == "" || len(id) > MaxRequestIDLen {
		return invalid("request id length %d, want 1..%d", len(id), MaxRequestIDLen)
	}
	return nil
}

func (p Parallel) validate(what string) error {
	if p.TP < 1 || p.TP > 1024 || p.PP < 1 || p.PP > 1024 {
		return invalid("%s parallel TP=%d PP=%d, want 1..1024 each", what, p.TP, p.PP)
	}
	if err := CheckStages(p.Stages, p.PP); err != nil {
		return invalid("%s parallel %v", what, err)
	}
	return nil
}

// CheckStages checks a Parallel's Stages against its PP, wherever a peer's
// parallelism comes from (a Hello, a RequestData, a discovery record): ""
// (the default split) or PP layer counts as kvcache.ParseStages reads them,
// the value bounded before it is split (counts of at most 4 digits each).
// The error names the value; the caller says where it came from.
func CheckStages(stages string, pp int32) error {
	if stages == "" {
		return nil
	}
	if pp < 1 || len(stages) > 5*int(pp) {
		return fmt.Errorf("stages of %d bytes for PP=%d, want at most %d", len(stages), pp, 5*max(int(pp), 0))
	}
	counts, err := kvcache.ParseStages(stages)
	if err != nil {
		return fmt.Errorf("stages: %w", err)
	}
	if len(counts) != int(pp) {
		return fmt.Errorf("stages %q name %d stages, PP=%d", stages, len(counts), pp)
	}
	return nil
}

// Validate implements Frame.
func (m *Hello) Validate() error {
	if err := m.From.validate(); err != nil {
		return err
	}
	if m.Backend == "" || len(m.Backend) > 32 {
		return invalid("hello backend %q", m.Backend)
	}
	if len(m.Model) > MaxModelLen {
		return invalid("hello model name of %d bytes, want at most %d", len(m.Model), MaxModelLen)
	}
	if m.MaxFrameBytes != 0 && m.MaxFrameBytes < MinFrameLimit {
		return invalid("hello max frame bytes %d, want 0 (not said) or at least MinFrameLimit %d: the frames that end a request would not fit",
			m.MaxFrameBytes, MinFrameLimit)
	}
	if len(m.AgentAddr) == 0 || len(m.AgentAddr) > 4096 {
		return invalid("hello agent address length %d, want 1..4096", len(m.AgentAddr))
	}
	// No key: a rank that receives no writes (FeatureSendOnly's
	// placeholder is the usual form); a writer refuses its RequestData.
	if len(m.Region.Key) > 4096 {
		return invalid("hello region key length %d, want at most 4096", len(m.Region.Key))
	}
	if err := m.Parallel.validate("hello"); err != nil {
		return err
	}
	if m.TP < 0 || m.TP >= m.Parallel.TP || m.PP < 0 || m.PP >= m.Parallel.PP {
		return invalid("hello rank tp=%d pp=%d outside TP=%d PP=%d", m.TP, m.PP, m.Parallel.TP, m.Parallel.PP)
	}
	if len(m.Pools) == 0 || len(m.Pools) > MaxGroups {
		return invalid("hello: %d pools, want 1..%d", len(m.Pools), MaxGroups)
	}
	for g, p := range m.Pools {
		if p.Blocks < 0 || p.Blocks > MaxBlocks || p.BlockBytes == 0 {
			return invalid("hello: pool %d blocks %d block bytes %d", g, p.Blocks, p.BlockBytes)
		}
		// Blocks*BlockBytes and Offset+size may each overflow uint64: a
		// wrapped end would place the pool's blocks outside the region.
		hi, size := bits.Mul64(uint64(p.Blocks), p.BlockBytes)
		end, carry := bits.Add64(p.Offset, size, 0)
		if hi != 0 || carry != 0 {
			return invalid("hello: pool %d (%d blocks of %d bytes at offset %d) ends past 2^64, past region length %d",
				g, p.Blocks, p.BlockBytes, p.Offset, m.Region.Len)
		}
		if end > m.Region.Len {
			return invalid("hello: pool %d ends at %d past region length %d", g, end, m.Region.Len)
		}
	}
	if err := m.Process.validate(); err != nil {
		return err
	}
	return m.validateMemory()
}

// Named checks only the fields that name m — its request id and sender —
// so that a receiver can answer a RequestData that fails Validate.
func (m *RequestData) Named() error { return validateNames(m.RequestID, m.From) }

// Named checks only the fields that name m — its request id and sender —
// so that a receiver can fail the request a Result that fails Validate
// answers (an unknown status from a newer writer, an oversized error).
func (m *Result) Named() error { return validateNames(m.RequestID, m.From) }

func validateNames(request string, from PeerID) error {
	if err := validateRequestID(request); err != nil {
		return err
	}
	return from.validate()
}

// Validate implements Frame. Block ids are checked against the receiver's
// pool by the writer, which knows the pool's size.
func (m *RequestData) Validate() error {
	if err := validateRequestID(m.RequestID); err != nil {
		return err
	}
	if err := m.From.validate(); err != nil {
		return err
	}
	if err := m.GenParallel.validate("generation"); err != nil {
		return err
	}
	if m.GenTP < 0 || m.GenTP >= m.GenParallel.TP || m.GenPP < 0 || m.GenPP >= m.GenParallel.PP {
		return invalid("request %s: generation rank tp=%d pp=%d outside TP=%d PP=%d",
			m.RequestID, m.GenTP, m.GenPP, m.GenParallel.TP, m.GenParallel.PP)
	}
	if m.PromptLen < 0 {
		return invalid("request %s: prompt length %d", m.RequestID, m.PromptLen)
	}
	if len(m.Groups) == 0 || len(m.Groups) > MaxGroups {
		return invalid("request %s: %d layer groups, want 1..%d", m.RequestID, len(m.Groups), MaxGroups)
	}
	total := 0
	for g, d := range m.Groups {
		if d.First < 0 {
			return invalid("request %s: group %d first block %d", m.RequestID, g, d.First)
		}
		total += len(d.Blocks)
		if total > MaxBlocks {
			return invalid("request %s: more than %d destination blocks", m.RequestID, MaxBlocks)
		}
		for i, b := range d.Blocks {
			if b < 0 {
				return invalid("request %s: group %d block[%d] = %d", m.RequestID, g, i, b)
			}
		}
	}
	if len(m.Remap) > MaxRemap {
		return invalid("request %s: %d remapped extents, at most %d", m.RequestID, len(m.Remap), MaxRemap)
	}
	var end uint64
	for i, x := range m.Remap {
		if x.Len == 0 || x.View+x.Len < x.View || x.File+x.Len < x.File {
			return invalid("request %s: remap[%d] = view %d file %d len %d: empty or overflowing", m.RequestID, i, x.View, x.File, x.Len)
		}
		if i > 0 && x.View < end {
			return invalid("request %s: remap[%d] view %d overlaps or precedes the extent before it (ending at %d)", m.RequestID, i, x.View, end)
		}
		end = x.View + x.Len
	}
	return nil
}

// WireStatus is the status a decoded Result carried when it is not a
// defined one (Status is then StatusUnknown), the one Validate names; 0
// otherwise. A trace records it beside the Result (package trace).
func (m *Result) WireStatus() int32 { return m.wireStatus }

// SetWireStatus sets what WireStatus returns: a Result rebuilt from a
// record of a decoded one (a trace's replay) validates as that one did.
func (m *Result) SetWireStatus(s int32) { m.wireStatus = s }

// Validate implements Frame.
func (m *Result) Validate() error {
	if err := validateRequestID(m.RequestID); err != nil {
		return err
	}
	if err := m.From.validate(); err != nil {
		return err
	}
	if m.Status == StatusUnknown || int(m.Status) >= len(statusNames) {
		st := int32(m.Status)
		if m.Status == StatusUnknown {
			st = m.wireStatus
		}
		return invalid("request %s from %s: result status %d, want 1..%d", m.RequestID, m.From, st, len(statusNames)-1)
	}
	if len(m.Error) > MaxErrorLen {
		return invalid("request %s: error text length %d > %d", m.RequestID, len(m.Error), MaxErrorLen)
	}
	if m.ErrorKind != ErrorKindUnspecified && m.ErrorKind.Defined() && m.Status != StatusFailed {
		// A contradiction (a SUCCESS that failed for a reason). A kind
		// this build does not define is a newer writer's, whose rules
		// this build cannot judge: it passes, and means nothing here.
		return invalid("request %s from %s: result status %s with error kind %s (%d): a kind is only for FAILED",
			m.RequestID, m.From, m.Status, m.ErrorKind, int32(m.ErrorKind))
	}
	if len(m.Payload) > MaxPayload {
		return invalid("request %s: payload length %d > %d", m.RequestID, len(m.Payload), MaxPayload)
	}
	return nil
}

// Validate implements Frame.
func (m *Cancel) Validate() error {
	if err := validateRequestID(m.RequestID); err != nil {
		return err
	}
	if len(m.Reason) > MaxErrorLen {
		return invalid("request %s: cancel reason length %d > %d", m.RequestID, len(m.Reason), MaxErrorLen)
	}
	return m.From.validate()
}

// Validate implements Frame.
func (m *CancelAck) Validate() error {
	if err := validateRequestID(m.RequestID); err != nil {
		return err
	}
	return m.From.validate()
}

// Validate implements Frame. Both incarnations it names are known (not 0),
// and the one the dropped frame was addressed to is the earlier.
func (m *Misaddressed) Validate() error {
	if err := validateRequestID(m.RequestID); err != nil {
		return err
	}
	if err := m.From.validate(); err != nil {
		return err
	}
	if m.Addressed == 0 || m.FromIncarnation <= m.Addressed {
		return invalid("request %s from %s: misaddressed to incarnation %d, dropped by incarnation %d: want an earlier incarnation than the dropping one, neither 0",
			m.RequestID, m.From, m.Addressed, m.FromIncarnation)
	}
	if m.ToIncarnation == 0 {
		return invalid("request %s from %s: misaddressed answer names no incarnation of its receiver", m.RequestID, m.From)
	}
	return nil
}

// Validate implements Frame.
func (m *Heartbeat) Validate() error {
	if err := m.From.validate(); err != nil {
		return err
	}
	if m.Drained && !m.Leaving {
		return invalid("heartbeat %d of %s says drained without leaving: only a goodbye may say that its writes are over", m.Seq, m.From)
	}
	if m.Reason != "" {
		if !m.Leaving {
			return invalid("heartbeat %d of %s gives a reason without leaving: only a goodbye may say why its sender closes", m.Seq, m.From)
		}
		if len(m.Reason) > MaxGoodbyeReasonLen {
			return invalid("goodbye %d of %s: reason length %d > %d", m.Seq, m.From, len(m.Reason), MaxGoodbyeReasonLen)
		}
		if !utf8.ValidString(m.Reason) {
			return invalid("goodbye %d of %s: reason is not valid UTF-8", m.Seq, m.From)
		}
		if i := strings.IndexFunc(m.Reason, unicode.IsControl); i >= 0 {
			r, _ := utf8.DecodeRuneInString(m.Reason[i:])
			return invalid("goodbye %d of %s: reason holds control character %U at byte %d (a sender escapes them: GoodbyeReason)", m.Seq, m.From, r, i)
		}
	}
	return nil
}
