package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagError is every command's flag error: an unknown flag close to one
// the command takes (a typo: --tokens-per-blok, --peer_key) is named
// with that flag, a long flag written with one dash (-pool, which
// pflag reads as the shorthands p, o, o, l) with its two-dash form, and
// a flag of kvxfer ctx alone given to kvxfer gen (ctxOnlyFlags) as ctx's;
// a value a flag cannot parse is named with what it takes (invalidValue).
// Other errors pass as they are.
func flagError(cmd *cobra.Command, err error) error {
	var iv *pflag.InvalidValueError
	if errors.As(err, &iv) {
		return invalidValue(iv)
	}
	var ne *pflag.NotExistError
	if !errors.As(err, &ne) {
		return err
	}
	names := map[string]bool{}
	cmd.Flags().VisitAll(func(f *pflag.Flag) { names[f.Name] = true })
	cmd.InheritedFlags().VisitAll(func(f *pflag.Flag) { names[f.Name] = true })
	if short := ne.GetSpecifiedShortnames(); short != "" {
		if names[short] {
			return fmt.Errorf("%w: did you mean --%s? (a long flag takes two dashes)", err, short)
		}
		return err
	}
	typed := ne.GetSpecifiedName()
	if why, ok := ctxOnlyFlags[typed]; ok && cmd.CommandPath() == "kvxfer gen" {
		return fmt.Errorf("%w: --%s is kvxfer ctx's alone (%s): give it to kvxfer ctx, not to gen", err, typed, why)
	}
	best, bestD := "", 0
	for name := range names {
		d := editDistance(typed, name)
		if best == "" || d < bestD || d == bestD && name < best {
			best, bestD = name, d
		}
	}
	if best != "" && bestD <= 2 && bestD < len(typed)/2+1 {
		return fmt.Errorf("%w: did you mean --%s? (%s --help lists its flags)", err, best, cmd.CommandPath())
	}
	return fmt.Errorf("%w (%s --help lists its flags)", err, cmd.CommandPath())
}

// wantValue is what a flag of each plain type takes, as an invalid value's
// error says it.
var wantValue = map[string]string{
	"int":      "want a whole number",
	"int32":    "want a whole number",
	"int64":    "want a whole number",
	"uint":     "want a whole number ≥ 0",
	"uint32":   "want a whole number ≥ 0",
	"uint64":   "want a whole number ≥ 0",
	"float64":  "want a number",
	"duration": "want a duration with its unit, such as 500ms, 2s or 1m",
}

// invalidValue is pflag's error for a value a flag of a plain type cannot
// parse, naming the flag, the value and what the flag takes, with its
// default: pflag's said `invalid argument "abc" for "--requests" flag:
// strconv.ParseInt: parsing "abc": invalid syntax`, the parser's words.
// A list of whole numbers is named by intSliceValue; other types (the
// settings' own values) keep their error, which says what they take.
func invalidValue(iv *pflag.InvalidValueError) error {
	f := iv.GetFlag()
	if f.Value.Type() == "bool" {
		return fmt.Errorf("--%s = %q: want true or false (--%s alone is true)", f.Name, iv.GetValue(), f.Name)
	}
	if f.Value.Type() == "intSlice" {
		return intSliceValue(iv)
	}
	want, ok := wantValue[f.Value.Type()]
	if !ok {
		return iv
	}
	if errors.Is(iv, strconv.ErrRange) {
		return fmt.Errorf("--%s = %q: out of range (default %s)", f.Name, iv.GetValue(), f.DefValue)
	}
	return fmt.Errorf("--%s = %q: %s (default %s)", f.Name, iv.GetValue(), want, f.DefValue)
}

// intSliceValue is invalidValue for a list of whole numbers (bench small
// --tokens, bench pipelining --chunk-sizes), naming the entry that is not
// one: pflag's error was its parser's, `invalid argument "128,abc" for
// "--tokens" flag: strconv.Atoi: parsing "abc": invalid syntax`.
func intSliceValue(iv *pflag.InvalidValueError) error {
	f := iv.GetFlag()
	want := fmt.Sprintf("want whole numbers, comma-separated (default %s)", strings.Trim(f.DefValue, "[]"))
	var ne *strconv.NumError
	switch {
	case !errors.As(iv, &ne):
	case ne.Num == "":
		want = "an empty entry: " + want
	case errors.Is(ne, strconv.ErrRange):
		want = ne.Num + " is out of range: " + want
	case ne.Num != iv.GetValue():
		want = fmt.Sprintf("%q is not a whole number: %s", ne.Num, want)
	}
	return fmt.Errorf("--%s = %q: %s", f.Name, iv.GetValue(), want)
}

// editDistance is the Levenshtein distance of a and b, with '_' and '-'
// the same letter (--peer_key is --peer-key).
func editDistance(a, b string) int {
	a, b = strings.ReplaceAll(a, "_", "-"), strings.ReplaceAll(b, "_", "-")
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// noArgs is cobra.NoArgs for every command, naming what was meant: for a
// command with subcommands (bench, trace), an unknown one with the
// subcommands close to it (`kvxfer bench smal`: did you mean small?), as
// cobra does for kvxfer itself; for the others, which take only flags,
// the argument as unexpected, with the flag it may have been meant as
// (`kvxfer gen insecure`: --insecure). cobra.NoArgs said `unknown command
// "smal" for "kvxfer bench"` with no suggestion, and `unknown command
// "insecure" for "kvxfer gen"` of a command that has none.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	arg := args[0]
	if cmd.HasAvailableSubCommands() {
		msg := fmt.Sprintf("unknown command %q for %q", arg, cmd.CommandPath())
		if cmd.SuggestionsMinimumDistance <= 0 {
			cmd.SuggestionsMinimumDistance = 2 // as cobra's own suggestions
		}
		if s := cmd.SuggestionsFor(arg); len(s) > 0 {
			msg += ": did you mean " + strings.Join(s, " or ") + "?"
		}
		return fmt.Errorf("%s (%s --help lists its commands)", msg, cmd.CommandPath())
	}
	msg := fmt.Sprintf("unexpected argument %q: %s takes flags only", arg, cmd.CommandPath())
	typed := strings.TrimLeft(arg, "-")
	best, bestD := "", 0
	visit := func(f *pflag.Flag) {
		if d := editDistance(typed, f.Name); best == "" || d < bestD || d == bestD && f.Name < best {
			best, bestD = f.Name, d
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	if best != "" && bestD <= 2 && bestD < len(typed)/2+1 {
		msg += fmt.Sprintf(": did you mean --%s?", best)
	}
	return fmt.Errorf("%s (%s --help lists its flags)", msg, cmd.CommandPath())
}
