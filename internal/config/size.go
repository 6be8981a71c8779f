package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes ParseSize accepts, largest first.
var sizeUnits = []struct {
	suffix string
	shift  uint
}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

// ParseSize parses a positive byte count: digits, optionally followed by B,
// KiB, MiB or GiB (case-insensitive), as in "4096", "64KiB", "16MiB". The
// error quotes the input.
func ParseSize(s string) (uint64, error) {
	n, why := parseSize(s)
	if why != "" {
		return 0, fmt.Errorf("bad size %q: %s", s, why)
	}
	return n, nil
}

// parseSize is ParseSize with the reason alone (no input quoted), for
// messages that quote the value themselves.
func parseSize(s string) (uint64, string) {
	in := strings.TrimSpace(s)
	i := strings.IndexFunc(in, func(r rune) bool { return r < '0' || r > '9' })
	if i < 0 {
		i = len(in)
	}
	digits, unit := in[:i], in[i:]
	if digits == "" {
		return 0, "want a byte count such as 4096, 64KiB or 16MiB"
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, fmt.Sprintf("%q is not a number", digits)
	}
	shift, ok := uint(0), unit == ""
	for _, u := range sizeUnits {
		if strings.EqualFold(unit, u.suffix) {
			shift, ok = u.shift, true
		}
	}
	switch {
	case !ok:
		return 0, fmt.Sprintf("unknown unit %q (want B, KiB, MiB or GiB)", unit)
	case n == 0:
		return 0, "must be at least 1 byte"
	case n > math.MaxUint64>>shift:
		return 0, "too large"
	}
	return n << shift, ""
}

// FormatSize writes n with the largest unit that divides it: 65536 is
// "64KiB", 1000 is "1000B".
func FormatSize(n uint64) string {
	for _, u := range sizeUnits {
		if u.shift > 0 && n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatUint(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}
