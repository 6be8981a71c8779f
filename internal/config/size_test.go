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
		// Decimals, rounded down to a whole byte count.
		{"1.5GiB", 3 << 29},
		{"1.5gib", 3 << 29},
		{" 0.5MiB ", 1 << 19},
		{".25KiB", 256},
		{"1.0", 1},
		{"2.9", 2},
		{"1.9B", 1},
		{"0.1KiB", 102},
		{"007.50MiB", 15 << 19},
		{"17179869183.999999999GiB", 1<<64 - 2},
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
		{"1.5KB", `unknown unit "KB"`},
		{"-1", "byte count"},
		{"-1.5GiB", "not a negative size"},
		{"NaN", "byte count"},
		{"Inf", "byte count"},
		{".", "byte count"},
		{"1.", `"1." is not a number`},
		{"1.5.5GiB", `"1.5.5" is not a number`},
		{"1..5GiB", `"1..5" is not a number`},
		{"0.1B", "at least 1 byte (0.1B rounds down to 0)"},
		{"0.0GiB", "at least 1 byte"},
		{"17179869184.5GiB", "too large"},
		{"99999999999999999999.5", "too large"},
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
