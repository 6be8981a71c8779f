package discovery

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

func TestRecordRoundTrip(t *testing.T) {
	r := testRecord("ctx", 1, 1<<62+3)
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	// uint64 fields travel as strings, exact for every JSON reader.
	if !bytes.Contains(b, []byte(`"incarnation":"4611686018427387907"`)) || !bytes.Contains(b, []byte(`"layout_hash":"18369614218089748088"`)) {
		t.Errorf("encoded %s: want uint64 fields as strings", b)
	}
	got, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if !recordsEqual(got, r) {
		t.Errorf("round trip %+v, want %+v", got, r)
	}
	// A pipeline split otherwise than by default travels with the record.
	staged := r
	staged.Parallel, staged.PP = messages.Parallel{TP: 2, PP: 4, Stages: "7,8,8,7"}, 3
	b2, err := staged.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeRecord(b2); err != nil || got.Parallel != staged.Parallel || !bytes.Contains(b2, []byte(`"pp_stages":"7,8,8,7"`)) {
		t.Errorf("round trip of %s: %+v, %v; want its pp_stages", b2, got.Parallel, err)
	}
	if bytes.Contains(b, []byte("pp_stages")) {
		t.Errorf("a record of the default split names pp_stages: %s", b)
	}
	if !bytes.Contains(b, []byte(`"curve_public_key":"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"`)) {
		t.Errorf("encoded %s: want the Z85 key as is", b)
	}
	// No secret key field exists in the format.
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for k := range m {
		if strings.Contains(k, "secret") {
			t.Errorf("field %q in a record", k)
		}
	}
}

func TestRecordValidate(t *testing.T) {
	mod := func(f func(*Record)) Record { r := testRecord("gen", 1, 9); f(&r); return r }
	cases := []struct {
		name string
		r    Record
		want string
	}{
		{"empty instance", mod(func(r *Record) { r.Instance = "" }), "instance name of 0 bytes"},
		{"slash in instance", mod(func(r *Record) { r.Instance = "a/b" }), `instance name "a/b"`},
		{"long instance", mod(func(r *Record) { r.Instance = strings.Repeat("x", messages.MaxInstanceLen+1) }), "instance name of 129 bytes"},
		{"negative rank", mod(func(r *Record) { r.Rank = -1 }), "rank -1"},
		{"rank too large", mod(func(r *Record) { r.Rank = messages.MaxRank }), "rank 65536"},
		{"no incarnation", mod(func(r *Record) { r.Incarnation = 0 }), "incarnation 0"},
		{"endpoint without scheme", mod(func(r *Record) { r.ControlEndpoint = "127.0.0.1:5" }), `control endpoint "127.0.0.1:5"`},
		{"endpoint empty host", mod(func(r *Record) { r.ControlEndpoint = "tcp://" }), `control endpoint "tcp://"`},
		{"endpoint with newline", mod(func(r *Record) { r.ControlEndpoint = "tcp://a:1\n" }), "unprintable"},
		{"short key", mod(func(r *Record) { r.CurvePublicKey = "abc" }), "CURVE public key of 3 characters"},
		{"non-Z85 key", mod(func(r *Record) { r.CurvePublicKey = strings.Repeat("~", 40) }), "not a Z85 character"},
		{"no backend", mod(func(r *Record) { r.Backend = "" }), "backend"},
		{"no agent address", mod(func(r *Record) { r.AgentAddr = nil }), "agent address of 0 bytes"},
		{"no parallel", mod(func(r *Record) { r.Parallel = messages.Parallel{} }), "parallel TP=0"},
		{"tp outside", mod(func(r *Record) { r.TP = 2 }), "coordinates tp=2"},
		{"stages of another PP", mod(func(r *Record) { r.Parallel.Stages = "3,4" }), `gen/1: pp_stages: stages "3,4" name 2 stages, PP=1`},
		{"stages malformed", mod(func(r *Record) { r.Parallel.Stages = "x" }), `gen/1: pp_stages: stages: kvcache: bad parallelism: Stages "x"`},
		{"stages too long", mod(func(r *Record) { r.Parallel.Stages = "1,1,1,1,1,1" }), `gen/1: pp_stages: stages of 11 bytes for PP=1, want at most 5`},
	}
	for _, c := range cases {
		err := c.r.Validate()
		if !errors.Is(err, ErrInvalidRecord) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %v naming %q", c.name, err, ErrInvalidRecord, c.want)
		}
		if _, err := c.r.Encode(); err == nil {
			t.Errorf("%s: encoded an invalid record", c.name)
		}
	}
	if err := testRecord("gen", 1, 9).Validate(); err != nil {
		t.Errorf("valid record: %v", err)
	}
	noKey := mod(func(r *Record) { r.CurvePublicKey = "" })
	if err := noKey.Validate(); err != nil {
		t.Errorf("record without CURVE (insecure control plane): %v", err)
	}
}

func TestDecodeRecordRefuses(t *testing.T) {
	good, _ := testRecord("gen", 0, 1).Encode()
	s := string(good)
	cases := map[string]string{
		"empty":            "",
		"not JSON":         "{",
		"array":            "[]",
		"other version":    strings.Replace(s, `"v":1`, `"v":2`, 1),
		"no version":       strings.Replace(s, `"v":1,`, ``, 1),
		"trailing bytes":   s + "{}",
		"bad state":        strings.Replace(s, `"state":"up"`, `"state":"zombie"`, 1),
		"number as string": strings.Replace(s, `"incarnation":"1"`, `"incarnation":1`, 1),
		"negative tp size": strings.Replace(s, `"tp_size":2`, `"tp_size":-2`, 1),
		"oversized":        s + strings.Repeat(" ", MaxRecordBytes),
		"bad base64":       strings.Replace(s, `"agent_addr":"`, `"agent_addr":"!`, 1),
		"bad pp_stages":    strings.Replace(s, `"tp":`, `"pp_stages":"3,4","tp":`, 1),
	}
	for name, v := range cases {
		if v == s {
			t.Fatalf("%s: the case changed nothing", name)
		}
		if _, err := DecodeRecord([]byte(v)); !errors.Is(err, ErrInvalidRecord) {
			t.Errorf("%s: %v, want %v", name, err, ErrInvalidRecord)
		}
	}
}

// recordFields is a valid record's value as a map of its fields, to edit.
func recordFields(t *testing.T, r Record, state string) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(enc(t, r, state), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func marshalFields(t *testing.T, m map[string]json.RawMessage) []byte {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeRecordIgnoresUnknownFields: a version 1 record with fields this
// build does not know (as a later build that adds a field writes it) is
// accepted with the fields it knows, so that a rank upgraded while its
// peers are not is seen by them. It was refused ("unknown field"): during
// a rolling upgrade, every rank upgraded first was Rejected by the others
// and never came Up.
func TestDecodeRecordIgnoresUnknownFields(t *testing.T) {
	r := testRecord("gen", 0, 1<<40)
	r.Parallel, r.PP = messages.Parallel{TP: 2, PP: 2, Stages: "3,5"}, 1
	for _, state := range []string{stateUp, stateLeaving} {
		m := recordFields(t, r, state)
		m["zone"] = json.RawMessage(`"us-east-1b"`)
		m["numa"] = json.RawMessage(`{"node":1,"cpus":[0,1,2],"nested":{"deep":[null,true,1.5e3]}}`)
		m["tp_groups"] = json.RawMessage(`[[0,1],[2,3]]`)
		m["weight"] = json.RawMessage(`-0.25`)
		b := marshalFields(t, m)
		got, leaving, err := decodeRecord(b)
		if err != nil {
			t.Fatalf("%s record with fields this build does not know: %v\n%s", state, err, b)
		}
		if !recordsEqual(got, r) || leaving != (state == stateLeaving) {
			t.Errorf("decoded %+v (leaving %v), want %+v (state %s)", got, leaving, r, state)
		}
	}
	// As the newer build's Encode writes it: the extra field after the
	// known ones.
	v, _ := r.Encode()
	newer := append(bytes.TrimSuffix(v, []byte("}")), []byte(`,"zone":"b"}`)...)
	if got, err := DecodeRecord(newer); err != nil || !recordsEqual(got, r) {
		t.Errorf("DecodeRecord(%s): %+v, %v; want %+v", newer, got, err, r)
	}
	// The incarnation key too.
	g, err := decodeRegistration([]byte(`{"v":1,"incarnation":"7","lease":"9","zone":"b"}`))
	if err != nil || g != (registration{Incarnation: 7, Lease: 9}) {
		t.Errorf("incarnation value with an unknown field: %+v, %v; want incarnation 7 lease 9", g, err)
	}
}

// TestDecodeRecordRequiresKnownFields: every field a version 1 record
// carries is required and checked, unknown fields notwithstanding: one left
// out, null, of the wrong type or out of range is refused, naming the
// field; a record of another version is refused naming its version, before
// its fields are looked at. A field left out whose zero value is valid
// (rank 0, tp 0, a layout hash of 0) was taken as that zero.
func TestDecodeRecordRequiresKnownFields(t *testing.T) {
	r := testRecord("gen", 0, 5)
	for _, f := range []string{"v", "state", "instance", "rank", "incarnation", "control_endpoint",
		"backend", "agent_addr", "layout_hash", "tp_size", "pp_size", "tp", "pp"} {
		for _, how := range []string{"left out", "null"} {
			m := recordFields(t, r, stateUp)
			if _, ok := m[f]; !ok {
				t.Fatalf("the record has no %q to take out", f)
			}
			if how == "null" {
				m[f] = json.RawMessage(`null`)
			} else {
				delete(m, f)
			}
			m["zone"] = json.RawMessage(`"b"`) // a newer build's, besides
			b := marshalFields(t, m)
			_, err := DecodeRecord(b)
			if !errors.Is(err, ErrInvalidRecord) || !strings.Contains(err.Error(), `"`+f+`"`) {
				t.Errorf("%s %s: %v, want %v naming %q\n%s", f, how, err, ErrInvalidRecord, f, b)
			}
		}
	}
	good, _ := r.Encode()
	s := strings.Replace(string(good), `"v":1,`, `"v":1,"zone":"b",`, 1)
	bad := map[string]struct{ value, want string }{
		"rank of the wrong type":        {strings.Replace(s, `"rank":0`, `"rank":"0"`, 1), "rank"},
		"rank out of range":             {strings.Replace(s, `"rank":0`, `"rank":70000`, 1), "rank 70000"},
		"incarnation not a string":      {strings.Replace(s, `"incarnation":"5"`, `"incarnation":5`, 1), "incarnation"},
		"incarnation 0":                 {strings.Replace(s, `"incarnation":"5"`, `"incarnation":"0"`, 1), "incarnation 0"},
		"layout_hash not a number":      {strings.Replace(s, `"layout_hash":"`, `"layout_hash":"x`, 1), "layout_hash"},
		"tp_size negative":              {strings.Replace(s, `"tp_size":2`, `"tp_size":-2`, 1), "TP=-2"},
		"tp outside":                    {strings.Replace(s, `"tp":0`, `"tp":5`, 1), "tp=5"},
		"state unknown":                 {strings.Replace(s, `"state":"up"`, `"state":"draining"`, 1), `state "draining"`},
		"endpoint":                      {strings.Replace(s, `"control_endpoint":"tcp://`, `"control_endpoint":"udp://`, 1), "control endpoint"},
		"curve key":                     {strings.Replace(s, `"curve_public_key":"rq`, `"curve_public_key":"~~`, 1), "CURVE public key"},
		"version of the wrong type":     {strings.Replace(s, `"v":1`, `"v":"1"`, 1), `record version "1", want 1`},
		"agent_addr not base64":         {strings.Replace(s, `"agent_addr":"`, `"agent_addr":"!`, 1), `"agent_addr" of`},
		"version 2":                     {strings.Replace(s, `"v":1`, `"v":2`, 1), "record version 2, want 1"},
		"version 2, a field left out":   {strings.Replace(strings.Replace(s, `"v":1`, `"v":2`, 1), `"rank":0,`, ``, 1), "record version 2, want 1"},
		"version 2, a field's type new": {strings.Replace(strings.Replace(s, `"v":1`, `"v":2`, 1), `"rank":0`, `"rank":{"tp":0}`, 1), "record version 2, want 1"},
		"trailing bytes":                {s + "{}", "bytes after the record"},
		"oversized, unknown field":      {strings.Replace(s, `"zone":"b"`, `"zone":"`+strings.Repeat("b", MaxRecordBytes)+`"`, 1), "want 1..16384"},
	}
	for name, c := range bad {
		if c.value == s {
			t.Fatalf("%s: the case changed nothing", name)
		}
		_, err := DecodeRecord([]byte(c.value))
		if !errors.Is(err, ErrInvalidRecord) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %v naming %q", name, err, ErrInvalidRecord, c.want)
		}
	}
	// The incarnation key: each field required, the version checked.
	for _, v := range []string{`{"lease":"9","incarnation":"7","x":1}`, `{"v":1,"lease":"9","x":1}`,
		`{"v":1,"incarnation":"7","x":1}`, `{"v":2,"incarnation":"7","lease":"9"}`} {
		if _, err := decodeRegistration([]byte(v)); !errors.Is(err, ErrInvalidRecord) {
			t.Errorf("incarnation value %s: %v, want %v", v, err, ErrInvalidRecord)
		}
	}
}

// TestDecodeRecordNamesBadStages: a stored record whose pp_stages does not
// fit its pp_size is refused with an error naming the record, the field
// and the value.
func TestDecodeRecordNamesBadStages(t *testing.T) {
	good, _ := testRecord("gen", 0, 1).Encode()
	bad := strings.Replace(string(good), `"tp":`, `"pp_stages":"3,4","tp":`, 1)
	_, err := DecodeRecord([]byte(bad))
	if want := `gen/0: pp_stages: stages "3,4" name 2 stages, PP=1`; !errors.Is(err, ErrInvalidRecord) || !strings.Contains(err.Error(), want) {
		t.Errorf("DecodeRecord(%s): %v, want %v naming %q", bad, err, ErrInvalidRecord, want)
	}
}

// FuzzDecodeRecord: no input panics; what decodes is valid and encodes
// back to a value that decodes to the same record.
func FuzzDecodeRecord(f *testing.F) {
	good, _ := testRecord("gen", 0, 1).Encode()
	leaving, _ := testRecord("ctx", 3, 1<<40).encode(stateLeaving)
	f.Add(good)
	f.Add(leaving)
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for i := 0; i <= len(b); i++ { // every prefix too
			r, err := DecodeRecord(b[:i])
			if err != nil {
				if !errors.Is(err, ErrInvalidRecord) {
					t.Fatalf("error %v does not wrap ErrInvalidRecord", err)
				}
				continue
			}
			if err := r.Validate(); err != nil {
				t.Fatalf("decoded an invalid record: %v", err)
			}
			again, err := r.Encode()
			if err != nil {
				t.Fatal(err)
			}
			r2, err := DecodeRecord(again)
			if err != nil || !recordsEqual(r, r2) {
				t.Fatalf("re-encoding %q: %+v, %v", again, r2, err)
			}
		}
	})
}

func TestNewIncarnationGrows(t *testing.T) {
	prev := NewIncarnation()
	for range 1000 {
		n := NewIncarnation()
		if n <= prev {
			t.Fatalf("incarnation %d after %d", n, prev)
		}
		prev = n
	}
}

// TestDecodeRecordKeysAreExact: encoding/json matches a key to a field
// case-insensitively (also through Unicode folding: 'ſ' for 's', the
// Kelvin sign for 'k') and lets the last of two equal keys win, so a
// record with "RANK", or with "rank" and "Rank" both, was accepted, one
// of them silently read. Every build writes the exact names (the json
// tags), so a key that differs from one only in case, and a key given
// twice, is refused naming it; keys that match no field still are
// ignored. The incarnation key's value is read the same way.
func TestDecodeRecordKeysAreExact(t *testing.T) {
	good, _ := testRecord("gen", 3, 1).Encode()
	s := string(good)
	for name, v := range map[string]string{
		"RANK":            strings.Replace(s, `"rank":3`, `"RANK":3`, 1),
		"Rank too":        strings.Replace(s, `"rank":3`, `"rank":3,"Rank":5`, 1),
		"Rank first":      strings.Replace(s, `"rank":3`, `"Rank":5,"rank":3`, 1),
		"rank twice":      strings.Replace(s, `"rank":3`, `"rank":5,"rank":3`, 1),
		"V":               strings.Replace(s, `"v":1`, `"V":1`, 1),
		"long s":          strings.Replace(s, `"state":"up"`, `"ſtate":"up"`, 1),
		"kelvin":          strings.Replace(s, `"backend":"shm"`, `"bac\u212Aend":"shm"`, 1),
		"unknown twice":   strings.Replace(s, `"v":1`, `"v":1,"zone":"a","zone":"b"`, 1),
		"escaped variant": strings.Replace(s, `"tp":1`, `"tp":1,"T\u0050":0`, 1),
	} {
		if v == s {
			t.Fatalf("%s: the case changed nothing", name)
		}
		_, err := DecodeRecord([]byte(v))
		if !errors.Is(err, ErrInvalidRecord) || !strings.Contains(err.Error(), "key") {
			t.Errorf("%s: %v, want %v naming the key\n%s", name, err, ErrInvalidRecord, v)
		}
	}
	for name, v := range map[string]string{
		"LEASE":       `{"v":1,"incarnation":"7","lease":"9","LEASE":"10"}`,
		"Incarnation": `{"v":1,"Incarnation":"7","lease":"9"}`,
		"v twice":     `{"v":1,"incarnation":"7","lease":"9","v":1}`,
	} {
		if g, err := decodeRegistration([]byte(v)); !errors.Is(err, ErrInvalidRecord) || !strings.Contains(err.Error(), "key") {
			t.Errorf("incarnation value %s: %+v, %v, want %v naming the key", name, g, err, ErrInvalidRecord)
		}
	}
	// Keys that match no field, whatever their case, are a later build's.
	v := strings.Replace(s, `"v":1`, `"v":1,"Zone":"a","ZONE":"b"`, 1)
	if r, err := DecodeRecord([]byte(v)); err != nil || !recordsEqual(r, testRecord("gen", 3, 1)) {
		t.Errorf("record with unknown keys: %+v, %v", r, err)
	}
}
