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

// TestEngineStatsHasEveryStat: kvxfer_engine_stats_get hands C every
// field of kvxfer.Stats, each in the kvxfer_engine_stats field of its name
// (WriteProofs as write_proofs_KIND and write_proof_requests_KIND), with
// the struct's layout fixed: 30 fields of 8 bytes (test/c pins their
// offsets).
// Every Stats field gets a distinct value here, so a field copied into
// another's place, or not at all, is named. A Stats field added later
// fails this test: kvxfer_engine_stats keeps its size (kvxfer.h), so such
// a field comes with a new function.
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
			t.Fatalf("Stats.%s is a %s: give kvxfer_engine_stats a field for it", name, f.Kind())
		}
		want[snake(name)] = next
	}
	c := engineStats(st)
	cv := reflect.ValueOf(c)
	if n, size := cv.NumField(), unsafe.Sizeof(c); n != 30 || size != 240 {
		t.Fatalf("kvxfer_engine_stats has %d fields, %d bytes: its layout is fixed at 30 fields, 240 bytes", n, size)
	}
	got := map[string]int64{}
	for i := range cv.NumField() {
		name := cv.Type().Field(i).Name
		f := cv.Field(i)
		if f.Type().Size() != 8 || cv.Type().Field(i).Offset != uintptr(8*i) {
			t.Errorf("kvxfer_engine_stats.%s: %d bytes at offset %d, want 8 at %d", name, f.Type().Size(), cv.Type().Field(i).Offset, 8*i)
		}
		switch f.Kind() {
		case reflect.Int64:
			got[name] = f.Int()
		case reflect.Uint64:
			got[name] = int64(f.Uint())
		default:
			t.Fatalf("kvxfer_engine_stats.%s is a %s", name, f.Kind())
		}
	}
	for name, v := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("kvxfer.Stats has %s (%d here), kvxfer_engine_stats has no field of that name", name, v)
		} else if g != v {
			t.Errorf("kvxfer_engine_stats.%s = %d, want %d (Stats' value)", name, g, v)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("kvxfer_engine_stats.%s is no field of kvxfer.Stats", name)
		}
	}
}
