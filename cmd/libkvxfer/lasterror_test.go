package main

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvxfer/kvxfer/capi"
)

// TestLastErrorCut: kvxfer_last_error holds at most 1023 bytes of a
// message, cut before a character, never inside one (kvxfer.h), whatever
// the character's length and where the cut falls in it. test/c reaches
// the cut with a real message (a node's wait for ten silent peers); this
// places it on every byte of 2-, 3- and 4-byte characters.
func TestLastErrorCut(t *testing.T) {
	runtime.LockOSThread() // the message is the thread's
	defer runtime.UnlockOSThread()
	cases := []struct {
		name, msg string
		want      int
	}{
		{"empty", "", 0},
		{"1023 bytes", strings.Repeat("a", 1023), 1023},
		{"1024 bytes", strings.Repeat("a", 1024), 1023},
		{"2000 bytes", strings.Repeat("b", 2000), 1023},
	}
	for _, c := range []string{"é", "€", "😀"} { // 2, 3 and 4 bytes
		for pad := 0; pad < len(c); pad++ {
			msg := strings.Repeat("a", pad) + strings.Repeat(c, 2000/len(c))
			want := 1023
			for want > 0 && !utf8.RuneStart(msg[want]) {
				want--
			}
			cases = append(cases, struct {
				name, msg string
				want      int
			}{c + " after " + strings.Repeat("a", pad), msg, want})
		}
	}
	cut := 0
	for _, c := range cases {
		if st := fail(&capi.Error{Code: capi.ErrConfig, Err: errors.New(c.msg)}); int32(st) != int32(capi.ErrConfig) {
			t.Fatalf("%s: status %d", c.name, st)
		}
		got := lastError()
		if len(got) != c.want || got != c.msg[:c.want] || !utf8.ValidString(got) {
			t.Errorf("%s: kvxfer_last_error is %d bytes (valid UTF-8 %v), want the message's first %d", c.name, len(got),
				utf8.ValidString(got), c.want)
		}
		if c.want < 1023 && len(c.msg) > 1023 {
			cut++
		}
	}
	if cut == 0 {
		t.Fatal("no case cut before a character")
	}
}
