package config

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"1", 1},
		{"4096", 4096},
		{"4096B", 4096},
		{"64KiB", 64 << 10},
		{"64kib", 64 << 10},
		{"1MiB", 1 << 20},
		{" 16MiB ", 16 << 20},
		{"2GiB", 2 << 30},
		{"16777216GiB", 16777216 << 30},
	} {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
}

func TestParseSizeErrorsNameTheValue(t *testing.T) {
	for _, c := range []struct{ in, why string }{
		{"", "byte count"},
		{"KiB", "byte count"},
		{"64KB", `unknown unit "KB"`},
		{"64 KiB", `unknown unit " KiB"`},
		{"1.5MiB", `unknown unit ".5MiB"`},
		{"-1", "byte count"},
		{"0", "at least 1 byte"},
		{"99999999999999999999", "not a number"},
		{"17179869184GiB", "too large"},
	} {
		_, err := ParseSize(c.in)
		if err == nil {
			t.Errorf("ParseSize(%q): accepted", c.in)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, `"`+c.in+`"`) || !strings.Contains(msg, c.why) {
			t.Errorf("ParseSize(%q): %q, want it to quote the input and say %q", c.in, msg, c.why)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[uint64]string{1: "1B", 1000: "1000B", 4096: "4KiB", 65536: "64KiB", 3 << 20: "3MiB", 1 << 30: "1GiB", 1<<20 + 1: "1048577B"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", n, back, err)
		}
	}
}
