package config

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes ParseSize accepts, largest first.
var sizeUnits = []struct {
	suffix string
	shift  uint
}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

// ParseSize parses a positive byte count: a number, optionally followed by
// B, KiB, MiB or GiB (case-insensitive), as in "4096", "64KiB", "16MiB".
// The number may have a decimal fraction ("1.5GiB", "0.5MiB"): the size
// is rounded down to a whole number of bytes. The error quotes the input.
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
	const want = "want a byte count such as 4096, 64KiB, 16MiB or 1.5GiB"
	in := strings.TrimSpace(s)
	if strings.HasPrefix(in, "-") {
		return 0, want + ", not a negative size"
	}
	i := strings.IndexFunc(in, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(in)
	}
	digits, unit := in[:i], in[i:]
	if digits == "" || digits == "." {
		return 0, want
	}
	shift, ok := uint(0), unit == ""
	for _, u := range sizeUnits {
		if strings.EqualFold(unit, u.suffix) {
			shift, ok = u.shift, true
		}
	}
	if whole, frac, dot := strings.Cut(digits, "."); dot {
		return parseDecimalSize(digits, whole, frac, unit, shift, ok)
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, fmt.Sprintf("%q is not a number", digits)
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

// parseDecimalSize is parseSize of a number with a decimal point (digits,
// whole "." frac) times 2^shift of its unit (known says the unit is one),
// rounded down to a whole byte count.
func parseDecimalSize(digits, whole, frac, unit string, shift uint, known bool) (uint64, string) {
	isDigits := func(s string) bool {
		return strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }) < 0
	}
	if frac == "" || !isDigits(frac) {
		return 0, fmt.Sprintf("%q is not a number", digits)
	}
	if !known {
		return 0, fmt.Sprintf("unknown unit %q (want B, KiB, MiB or GiB)", unit)
	}
	r, ok := new(big.Rat).SetString("0" + whole + "." + frac)
	if !ok {
		return 0, fmt.Sprintf("%q is not a number", digits)
	}
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), shift)))
	n := new(big.Int).Quo(r.Num(), r.Denom()) // both positive: rounds down
	switch {
	case n.Sign() == 0:
		return 0, "must be at least 1 byte (" + digits + unit + " rounds down to 0)"
	case !n.IsUint64():
		return 0, "too large"
	}
	return n.Uint64(), ""
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
