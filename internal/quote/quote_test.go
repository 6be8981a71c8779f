package quote

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestStringShortIsQ(t *testing.T) {
	for _, s := range []string{"", "tiny", "a\"b\n", strings.Repeat("x", Max), "é\xff"} {
		if got, want := String(s), fmt.Sprintf("%q", s); got != want {
			t.Errorf("String(%q) = %s, want %s", s, got, want)
		}
		if got := Raw(s); got != s {
			t.Errorf("Raw(%q) = %q, want it unchanged", s, got)
		}
	}
}

func TestStringLongIsClipped(t *testing.T) {
	s := strings.Repeat("a", 2000)
	if got, want := String(s), `"`+s[:Max]+`"… (2000 bytes)`; got != want {
		t.Errorf("String = %s, want %s", got, want)
	}
	if got, want := Raw(s), s[:Max]+"… (2000 bytes)"; got != want {
		t.Errorf("Raw = %s, want %s", got, want)
	}
	// Cut before a character, never inside one.
	u := strings.Repeat("a", Max-1) + "é" + strings.Repeat("b", 10)
	if got, want := String(u), `"`+strings.Repeat("a", Max-1)+`"… (75 bytes)`; got != want {
		t.Errorf("String = %s, want %s", got, want)
	}
}

var errBase = errors.New("base")

func TestIn(t *testing.T) {
	short := "addr"
	e := fmt.Errorf("%w: address %s: missing port", errBase, short)
	if In(e, short) != e {
		t.Errorf("In changed an error naming a short value")
	}
	long := strings.Repeat("h", 3000)
	e = fmt.Errorf("%w: address %s: missing port; preset %q", errBase, long, long)
	got := In(e, long)
	if !errors.Is(got, errBase) {
		t.Errorf("In(%v) does not wrap its cause", got)
	}
	if msg := got.Error(); len(msg) > 300 || !strings.Contains(msg, ": missing port; preset ") ||
		!strings.Contains(msg, long[:Max]+"… (3000 bytes)") || !strings.Contains(msg, `"`+long[:Max]+`"… (3000 bytes)`) {
		t.Errorf("In = %q", msg)
	}
}

func TestJSONUnknownField(t *testing.T) {
	var v struct{ A int }
	decode := func(js string) error {
		d := json.NewDecoder(strings.NewReader(js))
		d.DisallowUnknownFields()
		return d.Decode(&v)
	}
	e := decode(`{"bnid":1}`)
	if got := JSON(e); got != e {
		t.Errorf("JSON changed %v into %v", e, got)
	}
	long := strings.Repeat("k", 2000)
	got := JSON(decode(`{"` + long + `":1}`))
	if msg := got.Error(); len(msg) > 150 || msg != `json: unknown field "`+long[:Max]+`"… (2000 bytes)` {
		t.Errorf("JSON = %q", msg)
	}
	if e := decode(`{"A":"x"}`); JSON(e) != e {
		t.Errorf("JSON changed a type error")
	}
}

func TestJSONValue(t *testing.T) {
	for _, raw := range []string{`"5xs"`, `12`, `{"a":1}`} {
		if got := JSONValue([]byte(raw)); got != raw {
			t.Errorf("JSONValue(%s) = %s, want it unchanged", raw, got)
		}
	}
	long := strings.Repeat("d", 2000)
	if got, want := JSONValue([]byte(`"`+long+`"`)), String(long); got != want {
		t.Errorf("JSONValue(long string) = %s, want %s", got, want)
	}
	num := strings.Repeat("7", 100)
	if got, want := JSONValue([]byte(num)), num[:Max]+"… (100 bytes)"; got != want {
		t.Errorf("JSONValue(long number) = %s, want %s", got, want)
	}
}
