package proc

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode"

	"github.com/kvxfer/kvxfer"
)

// snake is a Go field name as the report (and kvxfer.h) spells it:
// OpsPosted is ops_posted.
func snake(name string) string {
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// TestReportHasEveryEngineStat: a role's JSON report carries every field
// of its engine's kvxfer.Stats under engine_stats, named as the C ABI's
// kvxfer_engine_stats (WriteProofs as write_proofs_KIND and
// write_proof_requests_KIND), zero or not. Every Stats field gets a
// distinct value here, so one reported in another's place, or not at
// all, is named.
func TestReportHasEveryEngineStat(t *testing.T) {
	var st kvxfer.Stats
	want := map[string]float64{}
	sv := reflect.ValueOf(&st).Elem()
	next := int64(100)
	for i := range sv.NumField() {
		f, name := sv.Field(i), sv.Type().Field(i).Name
		next++
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(next)
		case reflect.Uint64:
			f.SetUint(uint64(next))
		case reflect.Array: // WriteProofs
			for k := range f.Len() {
				kind := kvxfer.ProofKind(k).String()
				f.Index(k).Set(reflect.ValueOf(kvxfer.ProofCount{Proofs: next, Requests: next + 1000}))
				want["write_proofs_"+kind], want["write_proof_requests_"+kind] = float64(next), float64(next+1000)
				next++
			}
			continue
		default:
			t.Fatalf("Stats.%s is a %s: give the report a field for it", name, f.Kind())
		}
		want[snake(name)] = float64(next)
	}
	b, err := json.Marshal(Report{Role: "ctx", EngineStats: engineStats(st)})
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		EngineStats map[string]float64 `json:"engine_stats"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	for name, v := range want {
		if got, ok := rep.EngineStats[name]; !ok {
			t.Errorf("kvxfer.Stats has %s (%v here), the report's engine_stats has no such key: %s", name, v, b)
		} else if got != v {
			t.Errorf("engine_stats.%s = %v, want %v (Stats' value)", name, got, v)
		}
	}
	for name := range rep.EngineStats {
		if _, ok := want[name]; !ok {
			t.Errorf("engine_stats.%s is no field of kvxfer.Stats", name)
		}
	}
	// Zero counts are written too: a reader sees that nothing was refused.
	b, _ = json.Marshal(Report{Role: "gen"})
	if !strings.Contains(string(b), `"engine_stats":{"ops_posted":0,`) || !strings.Contains(string(b), `"parent_panics":0`) {
		t.Errorf("a report of an engine that counted nothing: %s, want every engine_stats key with 0", b)
	}
}
