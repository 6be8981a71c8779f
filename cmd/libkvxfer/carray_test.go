package main

import (
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/capi"
)

// An empty array may come with any pointer (Rust's empty slice: 0x4):
// cArray gives nil for it and never makes the address a Go pointer; a
// non-zero count at NULL or below the first page is refused naming the
// argument and the address. test/c (make ctest) calls every export that
// takes an array with such a pointer, over a library that moves the stack
// at every call.
func TestCArrayEmptyWithAnyPointer(t *testing.T) {
	for _, addr := range []uint64{0, 4, 8, 1 << 40} {
		got, err := cArray[int32]("kvxfer_x", argName{arg: "ids"}, uintptr(addr), 0)
		if got != nil || err != nil {
			t.Errorf("%#x with count 0: %v, %v; want nil, nil", addr, got, err)
		}
	}
	for _, c := range []struct {
		addr uint64
		arg  argName
		want string
	}{
		{0, argName{arg: "ids"}, "kvxfer_x: ids is NULL"},
		{4, argName{arg: "ids"}, "kvxfer_x: ids (3 elements) = 0x4"},
		{0, argName{"runs", 2, "ids"}, "kvxfer_x: runs[2].ids is NULL"},
		{4095, argName{"runs", 0, "ids"}, "kvxfer_x: runs[0].ids (3 elements) = 0xfff"},
	} {
		got, err := cArray[int32]("kvxfer_x", c.arg, uintptr(c.addr), 3)
		if got != nil || err == nil || capi.Code(err) != capi.ErrInvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%#x with count 3: %v, %v; want ErrInvalidArgument naming %q", c.addr, got, err, c.want)
		}
	}
}
