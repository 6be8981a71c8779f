package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// flagLine is the help line of flag --name in a command's help.
func flagLine(help, name string) string {
	re := regexp.MustCompile(`(?m)^\s+--` + regexp.QuoteMeta(name) + ` .*$`)
	return re.FindString(help)
}

// TestHelpShowsOwnDefaults: a flag several commands share shows, in each
// command's help, that command's default, never another's. (Checked to
// fail without addSettingFlags: kvxfer bench's --pool said "default:
// demo: 2GiB; ctx, gen: 1GiB; bench: sized to the scenario", and demo's,
// ctx's and gen's --tokens-per-block "bench small, fragmented: 16"; and
// without the role's own usage, gen's --chunk-tokens showed ctx's 512 as
// its own.)
func TestHelpShowsOwnDefaults(t *testing.T) {
	for _, c := range []struct {
		cmd  []string
		flag string
		want string
	}{
		{[]string{"demo"}, "pool", "(default 2GiB)"},
		{[]string{"ctx"}, "pool", "(default 1GiB)"},
		{[]string{"gen"}, "pool", "(default 1GiB)"},
		{[]string{"bench"}, "pool", "(default: e2e sizes its pools to hold its requests)"},
		{[]string{"bench", "e2e"}, "pool", "(default: sized to hold the scenario's requests)"},
		{[]string{"demo"}, "tokens-per-block", "(default: the model preset's, 32)"},
		{[]string{"ctx"}, "tokens-per-block", "(default: the model preset's, 32)"},
		{[]string{"gen"}, "tokens-per-block", "(default: the model preset's, 32)"},
		{[]string{"bench"}, "tokens-per-block", "(default: the model preset's, 32; small and fragmented: 16)"},
		{[]string{"bench", "e2e"}, "tokens-per-block", "(default: the model preset's, 32)"},
		{[]string{"bench", "small"}, "tokens-per-block", "(default 16)"},
		{[]string{"bench", "fragmented"}, "tokens-per-block", "(default 16)"},
		{[]string{"demo"}, "timeout", "(default 5m)"},
		{[]string{"ctx"}, "timeout", "(default 1m)"},
		{[]string{"bench"}, "backend", "(default loopback)"},
		{[]string{"bench", "raw"}, "backend", "(default shm)"},
		{[]string{"ctx"}, "chunk-tokens", "prefill chunk size in tokens (default 512)"},
		{[]string{"gen"}, "chunk-tokens", "unused here: kvxfer ctx's"},
		{[]string{"gen"}, "compute", "unused here: kvxfer ctx's"},
		// gen takes neither --layer-parts nor --writer-lease: its help
		// says so. (Checked to fail before: "taken so that both roles
		// accept one command line", which kvxfer ctx --layer-parts 2 is
		// not.)
		{[]string{"gen"}, "chunk-tokens", "(not kvxfer ctx's own --layer-parts and --writer-lease: give those to ctx alone)"},
		{[]string{"gen"}, "compute", "(not kvxfer ctx's own --layer-parts and --writer-lease: give those to ctx alone)"},
	} {
		out, err := run(append(c.cmd, "--help")...)
		if err != nil {
			t.Fatalf("%s --help: %v", strings.Join(c.cmd, " "), err)
		}
		line := flagLine(out, c.flag)
		if !strings.Contains(line, c.want) {
			t.Errorf("kvxfer %s --help, --%s:\n%s\nwant it to say %q", strings.Join(c.cmd, " "), c.flag, line, c.want)
		}
	}

	// No command's help names another command's default: a "(default:
	// …)" naming a command other than its own (or, for kvxfer bench, its
	// scenarios) is someone else's.
	others := []string{"demo", "ctx", "gen", "bench", "e2e", "small", "fragmented", "raw"}
	root := newRootCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		path := strings.Fields(c.CommandPath())[1:]
		out, err := run(append(path, "--help")...)
		if err != nil {
			t.Fatalf("%s --help: %v", c.CommandPath(), err)
		}
		mine := map[string]bool{c.Name(): true}
		for _, s := range c.Commands() {
			mine[s.Name()] = true
		}
		for _, m := range regexp.MustCompile(`\(default: [^\n]*`).FindAllString(out, -1) {
			for _, o := range others {
				if !mine[o] && regexp.MustCompile(`\b`+o+`\b`).MatchString(m) {
					t.Errorf("%s --help shows another command's (%s) default: %s", c.CommandPath(), o, m)
				}
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	for _, c := range root.Commands() {
		walk(c)
	}
}
