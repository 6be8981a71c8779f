package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagError is every command's flag error: an unknown flag close to one
// the command takes (a typo: --tokens-per-blok, --peer_key) is named
// with that flag, and a long flag written with one dash (-pool, which
// pflag reads as the shorthands p, o, o, l) with its two-dash form.
// Other errors pass as they are.
func flagError(cmd *cobra.Command, err error) error {
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
