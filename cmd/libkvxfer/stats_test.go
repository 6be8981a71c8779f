package main

import (
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unsafe"

	"github.com/kvxfer/kvxfer"
)

// snake is a Go field name in kvxfer.h's spelling: OpsPosted is
// ops_posted.
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

// TestEngineStatsHasEveryStat: kvxfer_engine_stats_get and
// kvxfer_engine_stats_ext_get hand C every field of kvxfer.Stats, each in
// the kvxfer_engine_stats or kvxfer_engine_stats_ext field of its name
// (WriteProofs as write_proofs_KIND and write_proof_requests_KIND), with
// kvxfer_engine_stats' layout fixed (30 fields of 8 bytes; test/c pins
// their offsets) and kvxfer_engine_stats_ext's fields of 8 bytes, one
// after the other (test/c pins them too).
// Every Stats field gets a distinct value here, so a field copied into
// another's place, or not at all, is named. A Stats field added later
// fails this test until it goes at the end of kvxfer_engine_stats_ext
// (kvxfer_engine_stats keeps its size: kvxfer.h).
func TestEngineStatsHasEveryStat(t *testing.T) {
	var st kvxfer.Stats
	want := map[string]int64{} // the C field's name: its value
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
				want["write_proofs_"+kind], want["write_proof_requests_"+kind] = next, next+1000
				next++
			}
			continue
		default:
			t.Fatalf("Stats.%s is a %s: give kvxfer_engine_stats_ext a field for it", name, f.Kind())
		}
		want[snake(name)] = next
	}
	c, ext := engineStats(st), engineStatsExt(st)
	cv, ev := reflect.ValueOf(c), reflect.ValueOf(ext)
	if n, size := cv.NumField(), unsafe.Sizeof(c); n != 30 || size != 240 {
		t.Fatalf("kvxfer_engine_stats has %d fields, %d bytes: its layout is fixed at 30 fields, 240 bytes", n, size)
	}
	if n, size := ev.NumField(), unsafe.Sizeof(ext); size != uintptr(8*n) {
		t.Fatalf("kvxfer_engine_stats_ext has %d fields, %d bytes: want 8 bytes a field", n, size)
	}
	got := map[string]int64{}
	for _, s := range []struct {
		c string
		v reflect.Value
	}{{"kvxfer_engine_stats", cv}, {"kvxfer_engine_stats_ext", ev}} {
		for i := range s.v.NumField() {
			name, off := s.v.Type().Field(i).Name, s.v.Type().Field(i).Offset
			f := s.v.Field(i)
			if f.Type().Size() != 8 || off != uintptr(8*i) {
				t.Errorf("%s.%s: %d bytes at offset %d, want 8 at %d", s.c, name, f.Type().Size(), off, 8*i)
			}
			if _, dup := got[name]; dup {
				t.Errorf("kvxfer_engine_stats and kvxfer_engine_stats_ext both have %s", name)
			}
			switch f.Kind() {
			case reflect.Int64:
				got[name] = f.Int()
			case reflect.Uint64:
				got[name] = int64(f.Uint())
			default:
				t.Fatalf("%s.%s is a %s", s.c, name, f.Kind())
			}
		}
	}
	for name, v := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("kvxfer.Stats has %s (%d here), neither kvxfer_engine_stats nor kvxfer_engine_stats_ext has a field of that name: add it at the end of kvxfer_engine_stats_ext", name, v)
		} else if g != v {
			t.Errorf("kvxfer_engine_stats(_ext).%s = %d, want %d (Stats' value)", name, g, v)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("kvxfer_engine_stats(_ext).%s is no field of kvxfer.Stats", name)
		}
	}
}
