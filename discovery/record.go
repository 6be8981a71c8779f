package discovery

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/kvxfer/kvxfer/messages"
)

// RecordVersion is the version of the record format this package writes
// and the only one it reads. A record of another version is refused (and
// named), never guessed at.
//
// Within a version a later build may add fields: a reader ignores the
// fields it does not know (so that ranks upgraded one at a time keep
// reading each other), and requires and checks every field it knows. A
// change an older reader must not read past (a field removed or renamed,
// a value's meaning changed) is a new version, which older readers refuse.
const RecordVersion = 1

// Bounds on a record. A value beyond them is broken or hostile.
const (
	MaxRecordBytes    = 16 << 10
	MaxEndpointLen    = 1024
	MaxAgentAddrLen   = 4096
	MaxBackendLen     = 32
	curvePublicKeyLen = 40
)

// Record is what a rank publishes about itself: how to reach its control
// plane, who it is (instance, rank, incarnation) and what its Hello will
// say (backend, agent address, layout, parallelism). CurvePublicKey is the
// rank's CURVE public key only (Z85, 40 characters; empty when its control
// plane runs without CURVE): a registry is readable by every peer, and a
// secret key never leaves the process that owns it.
type Record struct {
	Instance string
	Rank     int32
	// Incarnation is new at each start of the rank and grows across its
	// restarts (NewIncarnation). 0 means unknown: only a static peer entry
	// may leave it so (the peer's Hello carries it).
	Incarnation     uint64
	ControlEndpoint string
	CurvePublicKey  string
	Backend         string
	AgentAddr       []byte
	LayoutHash      uint64
	Parallel        messages.Parallel
	// TP and PP are the rank's coordinates in its instance.
	TP, PP int32
}

// Peer is the record's (instance, rank).
func (r Record) Peer() messages.PeerID {
	return messages.PeerID{Instance: r.Instance, Rank: r.Rank}
}

func (r Record) String() string {
	return fmt.Sprintf("%s/%d#%d", r.Instance, r.Rank, r.Incarnation)
}

// Validate checks a record a rank registers in etcd or reads from it:
// every field is required and range-checked. Errors wrap ErrInvalidRecord.
func (r Record) Validate() error { return r.validate(true) }

// validateStatic checks a static peer entry: instance, rank and control
// endpoint are required; what the peer's Hello carries may be left out,
// but what is given must be valid.
func (r Record) validateStatic() error { return r.validate(false) }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidRecord}, args...)...)
}

func (r Record) validate(full bool) error {
	if err := checkInstance(r.Instance); err != nil {
		return err
	}
	if r.Rank < 0 || r.Rank >= messages.MaxRank {
		return invalid("%s: rank %d, want 0..%d", r.Instance, r.Rank, messages.MaxRank-1)
	}
	if full && r.Incarnation == 0 {
		return invalid("%s/%d: incarnation 0, want >= 1", r.Instance, r.Rank)
	}
	if err := checkEndpoint(r.ControlEndpoint); err != nil {
		return fmt.Errorf("%s/%d: %w", r.Instance, r.Rank, err)
	}
	if r.CurvePublicKey != "" {
		if err := checkZ85Key(r.CurvePublicKey); err != nil {
			return fmt.Errorf("%s/%d: %w", r.Instance, r.Rank, err)
		}
	}
	if full || r.Backend != "" {
		if r.Backend == "" || len(r.Backend) > MaxBackendLen || !printable(r.Backend) {
			return invalid("%s/%d: backend %q, want 1..%d printable bytes", r.Instance, r.Rank, r.Backend, MaxBackendLen)
		}
	}
	if full || len(r.AgentAddr) > 0 {
		if len(r.AgentAddr) == 0 || len(r.AgentAddr) > MaxAgentAddrLen {
			return invalid("%s/%d: agent address of %d bytes, want 1..%d", r.Instance, r.Rank, len(r.AgentAddr), MaxAgentAddrLen)
		}
	}
	if full || r.Parallel != (messages.Parallel{}) {
		p := r.Parallel
		if p.TP < 1 || p.TP > 1024 || p.PP < 1 || p.PP > 1024 {
			return invalid("%s/%d: parallel TP=%d PP=%d, want 1..1024 each", r.Instance, r.Rank, p.TP, p.PP)
		}
		if r.TP < 0 || r.TP >= p.TP || r.PP < 0 || r.PP >= p.PP {
			return invalid("%s/%d: coordinates tp=%d pp=%d outside TP=%d PP=%d", r.Instance, r.Rank, r.TP, r.PP, p.TP, p.PP)
		}
		if err := messages.CheckStages(p.Stages, p.PP); err != nil {
			return invalid("%s/%d: pp_stages: %v", r.Instance, r.Rank, err)
		}
	} else if r.TP != 0 || r.PP != 0 {
		return invalid("%s/%d: coordinates tp=%d pp=%d without parallel sizes", r.Instance, r.Rank, r.TP, r.PP)
	}
	return nil
}

// checkInstance: an instance name is one etcd key segment, so it holds no
// '/' and nothing unprintable.
func checkInstance(s string) error {
	if s == "" || len(s) > messages.MaxInstanceLen {
		return invalid("instance name of %d bytes, want 1..%d", len(s), messages.MaxInstanceLen)
	}
	if strings.Contains(s, "/") || !printable(s) || strings.Contains(s, " ") {
		return invalid("instance name %q holds '/', a space or an unprintable byte", s)
	}
	return nil
}

// checkEndpoint accepts the control endpoints peers in other processes can
// connect to: tcp://HOST:PORT and ipc://PATH. control/zmq checks the rest
// when it connects; this keeps a broken value out of the membership table.
func checkEndpoint(s string) error {
	if s == "" || len(s) > MaxEndpointLen {
		return invalid("control endpoint of %d bytes, want 1..%d", len(s), MaxEndpointLen)
	}
	if !printable(s) || strings.Contains(s, " ") {
		return invalid("control endpoint %q holds a space or an unprintable byte", s)
	}
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		rest, ok = strings.CutPrefix(s, "ipc://")
	}
	if !ok || rest == "" {
		return invalid("control endpoint %q, want tcp://HOST:PORT or ipc://PATH", s)
	}
	return nil
}

const z85Alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

func checkZ85Key(k string) error {
	if len(k) != curvePublicKeyLen {
		return invalid("CURVE public key of %d characters, want %d (Z85)", len(k), curvePublicKeyLen)
	}
	for i := 0; i < len(k); i++ {
		if strings.IndexByte(z85Alphabet, k[i]) < 0 {
			return invalid("CURVE public key holds %q at %d, not a Z85 character", k[i], i)
		}
	}
	return nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// recordState is a record's lifecycle mark in the registry: "up" while the
// rank serves, "leaving" written once by a rank that leaves on purpose
// (Close) just before it revokes its lease, so that peers can tell a
// departure from an expiry.
const (
	stateUp      = "up"
	stateLeaving = "leaving"
)

// wireRecord is the JSON form, version 1. uint64 fields travel as strings
// so that readers whose numbers are doubles (jq, JavaScript) keep them exact.
// Every field without omitempty is required (wireRecordIn).
type wireRecord struct {
	V               int    `json:"v"`
	State           string `json:"state"`
	Instance        string `json:"instance"`
	Rank            int32  `json:"rank"`
	Incarnation     uint64 `json:"incarnation,string"`
	ControlEndpoint string `json:"control_endpoint"`
	CurvePublicKey  string `json:"curve_public_key,omitempty"`
	Backend         string `json:"backend"`
	AgentAddr       []byte `json:"agent_addr"`
	LayoutHash      uint64 `json:"layout_hash,string"`
	TPSize          int32  `json:"tp_size"`
	PPSize          int32  `json:"pp_size"`
	PPStages        string `json:"pp_stages,omitempty"`
	TP              int32  `json:"tp"`
	PP              int32  `json:"pp"`
}

// wireRecordIn is wireRecord as read: a required field is a pointer, so
// that a field left out (or null) is told apart from one at its zero value
// (rank 0, tp 0, a layout hash of 0). The version is kept raw, to be read
// (and a record of another version refused as such) before anything else;
// the fields JSON carries as strings (64-bit numbers, base64) are parsed
// here, so that an error names the field.
type wireRecordIn struct {
	V               json.RawMessage `json:"v"`
	State           *string         `json:"state"`
	Instance        *string         `json:"instance"`
	Rank            *int32          `json:"rank"`
	Incarnation     *string         `json:"incarnation"`
	ControlEndpoint *string         `json:"control_endpoint"`
	CurvePublicKey  string          `json:"curve_public_key"`
	Backend         *string         `json:"backend"`
	AgentAddr       *string         `json:"agent_addr"`
	LayoutHash      *string         `json:"layout_hash"`
	TPSize          *int32          `json:"tp_size"`
	PPSize          *int32          `json:"pp_size"`
	PPStages        string          `json:"pp_stages"`
	TP              *int32          `json:"tp"`
	PP              *int32          `json:"pp"`
}

// Encode returns the record's value as stored in etcd (JSON, version
// RecordVersion). It validates first.
func (r Record) Encode() ([]byte, error) { return r.encode(stateUp) }

func (r Record) encode(state string) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // Z85 keys hold '<', '>' and '&'; keep them legible
	err := enc.Encode(wireRecord{V: RecordVersion, State: state, Instance: r.Instance, Rank: r.Rank,
		Incarnation: r.Incarnation, ControlEndpoint: r.ControlEndpoint, CurvePublicKey: r.CurvePublicKey,
		Backend: r.Backend, AgentAddr: r.AgentAddr, LayoutHash: r.LayoutHash,
		TPSize: r.Parallel.TP, PPSize: r.Parallel.PP, PPStages: r.Parallel.Stages, TP: r.TP, PP: r.PP})
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), err
}

// DecodeRecord parses and validates a stored value. It never panics; any
// value it does not accept whole (oversized, not JSON, another version,
// a field missing, of the wrong type or out of range, trailing bytes, a
// key given twice or differing from a field's name only in case) is an
// error wrapping ErrInvalidRecord that names the version, the field or
// the key. Fields it does not know (a later build's, RecordVersion) are
// ignored.
func DecodeRecord(b []byte) (Record, error) {
	r, _, err := decodeRecord(b)
	return r, err
}

func decodeRecord(b []byte) (Record, bool, error) {
	if len(b) == 0 || len(b) > MaxRecordBytes {
		return Record{}, false, invalid("value of %d bytes, want 1..%d", len(b), MaxRecordBytes)
	}
	// Decode reads the whole value (a syntax error leaves w untouched),
	// then fills what it can: a field of the wrong type is an error, but
	// the version is still read, and is checked first, so that a record of
	// another version is refused as such, whatever its fields became.
	// Fields this build does not know are skipped, never kept.
	dec := json.NewDecoder(bytes.NewReader(b))
	var w wireRecordIn
	derr := dec.Decode(&w)
	if derr != nil && w.V == nil {
		return Record{}, false, invalid("value is not a version %d record: %v", RecordVersion, derr)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Record{}, false, invalid("value has bytes after the record")
	}
	if w.V == nil || string(w.V) == "null" {
		return Record{}, false, invalid(`record has no version ("v"), want %d`, RecordVersion)
	}
	if v, err := strconv.Atoi(string(w.V)); err != nil || v != RecordVersion {
		return Record{}, false, invalid("record version %.20s, want %d: this build reads version %d records only", w.V, RecordVersion, RecordVersion)
	}
	if err := checkKeys(b, "record", recordKeys); err != nil {
		return Record{}, false, err
	}
	if derr != nil {
		return Record{}, false, invalid("version %d record: %v", RecordVersion, derr)
	}
	for _, f := range [...]struct {
		name    string
		present bool
	}{
		{"state", w.State != nil}, {"instance", w.Instance != nil}, {"rank", w.Rank != nil},
		{"incarnation", w.Incarnation != nil}, {"control_endpoint", w.ControlEndpoint != nil},
		{"backend", w.Backend != nil}, {"agent_addr", w.AgentAddr != nil}, {"layout_hash", w.LayoutHash != nil},
		{"tp_size", w.TPSize != nil}, {"pp_size", w.PPSize != nil}, {"tp", w.TP != nil}, {"pp", w.PP != nil},
	} {
		if !f.present {
			return Record{}, false, invalid("version %d record without %q (or null): every version %d record has it", RecordVersion, f.name, RecordVersion)
		}
	}
	inc, err := strconv.ParseUint(*w.Incarnation, 10, 64)
	if err != nil {
		return Record{}, false, invalid(`"incarnation" %.30q, want a decimal uint64 in a string`, *w.Incarnation)
	}
	layout, err := strconv.ParseUint(*w.LayoutHash, 10, 64)
	if err != nil {
		return Record{}, false, invalid(`"layout_hash" %.30q, want a decimal uint64 in a string`, *w.LayoutHash)
	}
	agent, err := base64.StdEncoding.DecodeString(*w.AgentAddr)
	if err != nil {
		return Record{}, false, invalid(`"agent_addr" of %d characters is not base64: %v`, len(*w.AgentAddr), err)
	}
	var leaving bool
	switch *w.State {
	case stateUp:
	case stateLeaving:
		leaving = true
	default:
		return Record{}, false, invalid("record state %q, want %q or %q", *w.State, stateUp, stateLeaving)
	}
	r := Record{Instance: *w.Instance, Rank: *w.Rank, Incarnation: inc,
		ControlEndpoint: *w.ControlEndpoint, CurvePublicKey: w.CurvePublicKey, Backend: *w.Backend,
		AgentAddr: agent, LayoutHash: layout,
		Parallel: messages.Parallel{TP: *w.TPSize, PP: *w.PPSize, Stages: w.PPStages}, TP: *w.TP, PP: *w.PP}
	if err := r.Validate(); err != nil {
		return Record{}, false, err
	}
	return r, leaving, nil
}

// registration is what a rank's incarnation key holds: the incarnation
// last registered for the rank and the lease it was registered under.
type registration struct {
	Incarnation uint64
	Lease       int64
}

type wireRegistration struct {
	V           int    `json:"v"`
	Incarnation uint64 `json:"incarnation,string"`
	Lease       int64  `json:"lease,string"`
}

func (g registration) encode() []byte {
	b, _ := json.Marshal(wireRegistration{V: RecordVersion, Incarnation: g.Incarnation, Lease: g.Lease})
	return b
}

// decodeRegistration parses an incarnation key's value as a record is
// parsed: every field required and checked, fields a later build added
// (of the same version) ignored.
func decodeRegistration(b []byte) (registration, error) {
	if len(b) == 0 || len(b) > MaxRecordBytes {
		return registration{}, invalid("incarnation value of %d bytes, want 1..%d", len(b), MaxRecordBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var w wireRegistration
	if err := dec.Decode(&w); err != nil {
		return registration{}, invalid("incarnation value is not version %d: %v", RecordVersion, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return registration{}, invalid("incarnation value has bytes after it")
	}
	if err := checkKeys(b, "incarnation value", registrationKeys); err != nil {
		return registration{}, err
	}
	if w.V != RecordVersion || w.Incarnation == 0 || w.Lease == 0 {
		return registration{}, invalid("incarnation value version %d incarnation %d lease %d, want version %d and both set",
			w.V, w.Incarnation, w.Lease, RecordVersion)
	}
	return registration{Incarnation: w.Incarnation, Lease: w.Lease}, nil
}

// The keys of the JSON forms, as every build wrote them (their json tags).
var (
	recordKeys       = jsonKeys(reflect.TypeOf(wireRecordIn{}))
	registrationKeys = jsonKeys(reflect.TypeOf(wireRegistration{}))
)

func jsonKeys(t reflect.Type) []string {
	keys := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		keys = append(keys, name)
	}
	return keys
}

// checkKeys refuses a JSON object (b, a what) whose keys encoding/json
// would read other than as written: a key given twice (the last one wins,
// silently), or a key that is none of keys but matches one of them but
// for case (encoding/json matches names case-insensitively, Unicode
// folding included: "RANK", "ſtate"). Every build writes the exact
// names; keys that match none, a later build's fields, are left to be
// ignored. A value that does not parse as an object is left to the
// decoder, which refuses it.
func checkKeys(b []byte, what string, keys []string) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	seen := make(map[string]bool, len(keys))
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		k, ok := t.(string)
		if !ok {
			return nil
		}
		if seen[k] {
			return invalid("%s holds the key %.40q twice", what, k)
		}
		seen[k] = true
		if !slices.Contains(keys, k) {
			for _, want := range keys {
				if strings.EqualFold(k, want) {
					return invalid("%s key %.40q, want %q: keys are matched exactly", what, k, want)
				}
			}
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil
		}
	}
	return nil
}
