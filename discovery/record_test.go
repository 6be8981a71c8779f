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
		"unknown field":    strings.Replace(s, `"v":1`, `"v":1,"secret_key":"x"`, 1),
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
