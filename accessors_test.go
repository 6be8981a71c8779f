package kvxfer_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
)

// scribble changes, in place, every exported number, string and bool that
// v reaches through pointers, structs, slices and arrays: what a caller
// that mutates a value an accessor returned would reach. It reports how
// many it changed.
func scribble(v reflect.Value) int {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return 0
		}
		return scribble(v.Elem())
	case reflect.Struct:
		n := 0
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				n += scribble(v.Field(i))
			}
		}
		return n
	case reflect.Slice, reflect.Array:
		n := 0
		for i := range v.Len() {
			n += scribble(v.Index(i))
		}
		return n
	}
	if !v.CanSet() {
		return 0
	}
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.String:
		v.SetString(v.String() + "!")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	default:
		return 0
	}
	return 1
}

// TestAccessorsReturnCopies: Layout, Shape, Hello and Memory return copies
// of the engine's state, deep: a caller that changes every field it can
// reach in what one call returned (a group's layers, the Hello's pools
// and descriptors) finds the next call unchanged, and the engine still
// moves every byte. (Checked to fail: returning the engine's own values,
// the next call of each sees the caller's changes.)
func TestAccessorsReturnCopies(t *testing.T) {
	l := smallLayout()
	p := kvcache.Parallel{TP: 1, PP: 1}
	// The generation rank lays its KV out itself (Config.Memory): its
	// Hello carries the descriptors, and Memory is Start's copy of them.
	c := &cluster{link: control.NewMemLink(), ctxPar: p, genPar: p}
	ctxE, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "ctx", Layout: &l, PoolBytes: 4 << 20,
		Link: c.link, TransferTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Shape(p, p.RankAt(0))
	if err != nil {
		t.Fatal(err)
	}
	region, mem := frameworkMemory(t, l, s, memNHD, 24)
	genE, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "gen", Layout: &l, Region: region, Memory: mem,
		Link: c.link, TransferTimeout: 20 * time.Second})
	if err != nil {
		_ = ctxE.Close(context.Background())
		t.Fatal(err)
	}
	c.ctx, c.gen = []*kvxfer.Engine{ctxE}, []*kvxfer.Engine{genE}
	t.Cleanup(func() {
		for _, e := range []*kvxfer.Engine{ctxE, genE} {
			if err := e.Close(context.Background()); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})

	for _, e := range []*kvxfer.Engine{ctxE, genE} {
		for _, a := range []struct {
			name string
			get  func() any // a pointer to what the accessor returned
		}{
			{"Layout", func() any { l := e.Layout(); return &l }},
			{"Shape", func() any { s := e.Shape(); return &s }},
			{"Hello", func() any { return e.Hello() }},
			{"Memory(0)", func() any { return e.Memory(0) }},
			{"Memory(1)", func() any { return e.Memory(1) }},
		} {
			got := a.get()
			before := fmt.Sprintf("%#v", reflect.ValueOf(got).Elem().Interface())
			if n := scribble(reflect.ValueOf(got)); n == 0 {
				t.Fatalf("%s: nothing to change in %s", e.Hello().From, before)
			}
			if after := fmt.Sprintf("%#v", reflect.ValueOf(a.get()).Elem().Interface()); after != before {
				t.Errorf("%s: %s changed by the caller's changes to what it returned:\nbefore %s\nafter  %s",
					e.Hello().From, a.name, before, after)
			}
		}
	}
	if n := transferMemory(t, c, memCase{"NHD to NHD", l, p, p, memNHD, memNHD}, "after-scribble", 1, 64, 32); n == 0 {
		t.Fatal("no byte verified")
	}
	checkNoLeaks(t, c)
}
