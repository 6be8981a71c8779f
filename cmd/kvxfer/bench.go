package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/internal/bench"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/cpustat"
	"github.com/kvxfer/kvxfer/internal/gcfloor"
	"github.com/kvxfer/kvxfer/internal/report"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/rdmabench"
)

// scenario is one `kvxfer bench` scenario. Its logic lives in
// internal/bench (or rdma/rdmabench); here are its flags, how the common
// settings apply to it, and how its results print.
type scenario interface {
	// name is the subcommand; short and long its help; example its
	// examples.
	name() string
	short() string
	long() string
	example() string
	// keys are the common settings it takes, with its own defaults.
	keys() ([]string, map[string]string)
	// flags registers its own flags, defaulting to its current values.
	flags(fs *pflag.FlagSet)
	// steps is how many progress steps run reports.
	steps() int
	// run measures into r, reporting progress.
	run(ctx context.Context, s config.Settings, p bench.ProgressFunc, r *report.Results) error
	// print writes its part of r: a table, or JSON lines.
	print(w io.Writer, r *report.Results, asJSON bool) error
}

// checker is a scenario that checks the common settings before any
// scenario of the run starts (a backend it cannot run), so that `kvxfer
// bench --backend ucx` is refused at once, not after the scenarios before
// it ran.
type checker interface {
	check(s config.Settings) error
}

// scenarios are every scenario, fresh (with their defaults), in the order
// `kvxfer bench` runs them.
func scenarios() []scenario {
	return []scenario{newRawScenario(), newOverheadScenario(), newWorkersScenario(), newPipeliningScenario(),
		newSmallScenario(), newFragmentedScenario(), newE2EScenario()}
}

func scenarioNames() []string {
	var names []string
	for _, s := range scenarios() {
		names = append(names, s.name())
	}
	return names
}

// benchKeys are the common settings `kvxfer bench` (all scenarios) takes.
var (
	benchKeys     = []string{config.Model, config.Pool, config.TokensPerBlock, config.Workers, config.Backend, config.Timeout}
	benchDefaults = map[string]string{config.Backend: "loopback", config.Timeout: "1m"}
	benchDocs     = map[string]string{config.Pool: "e2e sizes its pools to hold its requests",
		config.TokensPerBlock: presetBlockDoc + "; small and fragmented: 16"}
)

// benchOutput are the flags of every bench command.
type benchOutput struct {
	json   bool
	report string
}

// newBenchCmd is `kvxfer bench`: with --report or --scenarios it runs
// scenarios; each is also a subcommand.
func newBenchCmd(a *app) *cobra.Command {
	var out benchOutput
	var chosen []string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure kvxfer: raw backends, per-chunk overhead, workers, pipelining, small and fragmented requests, end to end",
		Long: `bench measures kvxfer on this machine. Each scenario is a subcommand; with
--scenarios or --report, bench runs the scenarios --scenarios names (all of
them by default, in the order below) with their defaults (with neither, it
prints this help), prints each one's table (or JSON,
one object per scenario, with --json) and, with --report DIR, writes
DIR/README.md, DIR/results.json and PNG plots:

  raw         a backend's raw Post bandwidth beside Go's copy, by size
  overhead    the engine's per-chunk path with ~0-byte writes
  workers     1 sender worker against 4 (4 peers and 1 peer)
  pipelining  exposed latency against chunk size; one request's chunk timeline
  small       128- and 512-token requests against the raw peak of the same backend
  fragmented  shuffled block ids on both sides against fresh pools
  e2e         whole requests of a preset, pipelined and after prefill

Run this way, raw also measures 4 and 64 MiB and small also 16- and 32-token
requests, for the report's bandwidth plot.

Figures on a shared machine are noisy: each scenario alternates what it
compares within one run and reports medians.`,
		Example: examples(
			"every scenario, a Markdown report with plots in bench-report/", "kvxfer bench --report bench-report",
			"two scenarios, JSON", "kvxfer bench --scenarios small,e2e --json",
			"one scenario with its own flags", "kvxfer bench small --tokens 128,512 --concurrency 8",
		),
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out.report == "" && !cmd.Flags().Changed("scenarios") {
				// Bare, bench prints its help; given flags but no
				// scenario, it would ignore them and still exit 0.
				if given := givenFlags(cmd); len(given) > 0 {
					return fmt.Errorf("%s: no scenario chosen, so nothing would run: add --scenarios NAMES (of %s) or --report DIR (every scenario, with a report), or run one scenario: kvxfer bench SCENARIO %s",
						strings.Join(given, " "), strings.Join(scenarioNames(), ", "), strings.Join(given, " "))
				}
				return cmd.Help()
			}
			if len(chosen) == 0 {
				return fmt.Errorf("--scenarios: no scenario given (known: %s)", strings.Join(scenarioNames(), ", "))
			}
			var run []scenario
			for j, name := range chosen {
				i := slices.Index(scenarioNames(), name)
				if i < 0 {
					return fmt.Errorf("--scenarios: unknown scenario %q (known: %s)", name, strings.Join(scenarioNames(), ", "))
				}
				// Given twice, a scenario ran twice (twice its time),
				// both runs into the one set of results.
				if slices.Contains(chosen[:j], name) {
					return fmt.Errorf("--scenarios %s: %q is given twice: name each scenario once", strings.Join(chosen, ","), name)
				}
				sc := scenarios()[i]
				// More sizes than each subcommand's defaults, so that the
				// report's bandwidth plot has a curve.
				switch sc := sc.(type) {
				case *rawScenario:
					sc.sizes = []string{"64KiB", "1MiB", "4MiB", "16MiB", "64MiB"}
				case *smallScenario:
					sc.tokens = []int{16, 32, 128, 512}
				}
				run = append(run, sc)
			}
			s, err := a.settings(cmd, benchDefaults, benchKeys...)
			if err != nil {
				return err
			}
			for _, w := range unusedSettings(s, run) {
				a.log.Warn().Msg(w)
			}
			return runScenarios(cmd, a, out, s, run, true)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&chosen, "scenarios", scenarioNames(), "scenarios to run, comma-separated")
	addSettingFlags(f, benchDefaults, benchDocs, benchKeys...)
	cmd.PersistentFlags().BoolVar(&out.json, "json", false, "print JSON lines instead of tables")
	cmd.PersistentFlags().StringVar(&out.report, "report", "", "also write DIR/README.md, DIR/results.json and PNG plots; DIR is created if missing and must be empty or hold a previous report, whose files are replaced (its plots this run does not draw are removed); checked before the first scenario runs")
	for _, sc := range scenarios() {
		cmd.AddCommand(newScenarioCmd(a, &out, sc))
	}
	cmd.AddCommand(newRawPeerCmd())
	return cmd
}

// givenFlags are the flags given to cmd on its command line (as --name or
// --name=value), --config and --log-level aside: they apply to whatever
// runs.
func givenFlags(cmd *cobra.Command) []string {
	var given []string
	cmd.Flags().Visit(func(f *pflag.Flag) {
		switch f.Name {
		case "config", "log-level", "help":
			return
		}
		if f.Value.Type() == "bool" {
			given = append(given, "--"+f.Name)
			return
		}
		given = append(given, "--"+f.Name+"="+f.Value.String())
	})
	return given
}

// unusedSettings warns, for `kvxfer bench`, of each value given (not a
// default) for a key that a chosen scenario does not take: each scenario
// takes only its own keys (scenario.keys) and runs the others at its own
// values, which a value given to bench does not change.
func unusedSettings(s config.Settings, run []scenario) []string {
	var out []string
	for _, k := range benchKeys {
		if !s.Set(k) || s.Origin(k).Source == config.SourceDefault {
			continue
		}
		var takes, ignores []string
		for _, sc := range run {
			if keys, _ := sc.keys(); slices.Contains(keys, k) {
				takes = append(takes, sc.name())
			} else {
				ignores = append(ignores, sc.name())
			}
		}
		if len(ignores) == 0 {
			continue
		}
		why := "not used by bench " + strings.Join(ignores, ", ")
		if len(takes) > 0 {
			why += " (only " + strings.Join(takes, ", ") + " of the scenarios chosen take it)"
		} else {
			why += " (no scenario chosen takes it)"
		}
		out = append(out, s.Invalid(k, why).Error())
	}
	return out
}

// newRawPeerCmd is `kvxfer bench raw-peer`, the receiver process of `bench
// raw --peer-process` (hidden: the sender starts it).
func newRawPeerCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "raw-peer",
		Short:  "The receiver process of bench raw --peer-process",
		Hidden: true,
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec := os.Getenv(rdmabench.PeerEnv)
			if spec == "" {
				return fmt.Errorf("raw-peer is started by bench raw --peer-process ($%s is not set)", rdmabench.PeerEnv)
			}
			return rdmabench.ServePeer(spec, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
}

// newScenarioCmd is `kvxfer bench NAME`.
func newScenarioCmd(a *app, out *benchOutput, sc scenario) *cobra.Command {
	keys, defaults := sc.keys()
	cmd := &cobra.Command{
		Use:     sc.name(),
		Short:   sc.short(),
		Long:    sc.long(),
		Example: sc.example(),
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.settings(cmd, defaults, keys...)
			if err != nil {
				return err
			}
			return runScenarios(cmd, a, *out, s, []scenario{sc}, false)
		},
	}
	var docs map[string]string
	if d, ok := sc.(interface{ defaultDocs() map[string]string }); ok {
		docs = d.defaultDocs()
	}
	addSettingFlags(cmd.Flags(), defaults, docs, keys...)
	sc.flags(cmd.Flags())
	return cmd
}

// pooled is a scenario that sizes its engines' pools itself, to hold its
// requests (e2e: unless --pool is set).
type pooled interface {
	// sizedBy names the flags that size the pools with their values
	// ("--tokens 128,512 and --concurrency 8"), and those to make smaller
	// for smaller pools ("--tokens or --concurrency").
	sizedBy() (given, smaller string)
}

// poolHint adds to a scenario's error what to change when the error is its
// pools': a pool the machine would not map (kvcache.ErrBadRegion: past
// the largest host region, or refused by mmap), which the scenario sized
// to its requests unless --pool was set, a pool so sized of more blocks
// than a pool may hold (kvxfer.TooManyBlocksError), and a --pool too
// small for a request.
// Without it the error named only a byte count ("kvxfer: bad config:
// kvcache: bad region: region length 65558020096: mmap: cannot allocate
// memory"), the engine's own field ("PoolBytes = 6920741060608 holds
// 3300066 blocks per layer group …: use a smaller pool or more
// TokensPerBlock", of bench small --concurrency 100000), or the pool's
// blocks, and no flag. A pool set is named as the user set it: --pool,
// KVXFER_POOL or the file's key.
func poolHint(sc scenario, s config.Settings, err error) error {
	set := s.Set(config.Pool) && s.Pool > 0
	given, smaller := "", ""
	if p, ok := sc.(pooled); ok {
		given, smaller = p.sizedBy()
	}
	var tooMany *kvxfer.TooManyBlocksError
	switch {
	case errors.Is(err, kvcache.ErrBadRegion) && set:
		name := settingName(s, config.Pool)
		return fmt.Errorf("%w: this machine maps no pool of %s %s: use a smaller %s", err, name, s.Origin(config.Pool).Raw, name)
	case errors.Is(err, kvcache.ErrBadRegion) && smaller != "":
		return fmt.Errorf("%w: bench %s sizes its pools to hold its requests, and this machine maps no pool that large: use a smaller %s",
			err, sc.name(), smaller)
	case errors.As(err, &tooMany) && !set && smaller != "": // a set pool is refused before (poolHoldsABlock)
		return &renamed{msg: fmt.Sprintf("%s: the pools sized to hold these requests would hold %d blocks per layer group, more than the %d blocks a pool may hold: use a smaller %s%s",
			given, tooMany.Blocks, messages.MaxBlocks, smaller, largerBlocks(sc)), err: err}
	case errors.Is(err, kvcache.ErrPoolTooSmall) && set:
		return fmt.Errorf("%w: use a larger %s (unset, bench sizes the pools to the scenario)", err, settingName(s, config.Pool))
	}
	return err
}

// largerBlocks is the other way to fewer blocks, where sc takes
// --tokens-per-block.
func largerBlocks(sc scenario) string {
	if keys, _ := sc.keys(); slices.Contains(keys, config.TokensPerBlock) {
		return ", or a larger --tokens-per-block"
	}
	return ""
}

// settingName is how the user gave key: its flag, its variable, or the
// file's key with where it is ("pool (kvxfer.yaml:3)").
func settingName(s config.Settings, key string) string {
	switch o := s.Origin(key); o.Source {
	case config.SourceEnv:
		return o.Where
	case config.SourceFile:
		return key + " (" + o.Where + ")"
	}
	return "--" + key
}

// runScenarios runs each scenario with progress, prints it, and writes the
// report. JSON from several scenarios is one object per scenario.
//
// SIGINT, SIGTERM and SIGHUP stop it as they stop ctx, gen and demo
// (interruptible): the first cancels the scenario under way, a second
// exits at once, and the error says a signal stopped the run (exit
// status 128 + its number). With signal.NotifyContext every later signal
// was swallowed: a scenario that does not watch its context (raw) ran to
// its end through any number of Ctrl-Cs, and the run ended with status 1.
func runScenarios(cmd *cobra.Command, a *app, out benchOutput, s config.Settings, run []scenario, several bool) (err error) {
	ctx, got, stop := interruptible(cmd.Context())
	defer stop()
	defer func() { err = interrupted(got, err) }()
	gcfloor.Warm() // the engines' first requests, not only the later ones, as a server's run long
	w := cmd.OutOrStdout()
	if out.report != "" {
		// Before the first scenario: a directory the report cannot go to
		// fails now, not after every scenario ran.
		if err := prepareReportDir(out.report); err != nil {
			return err
		}
	}
	for _, sc := range run {
		if c, ok := sc.(checker); ok {
			if err := c.check(s); err != nil {
				return fmt.Errorf("bench %s: %w", sc.name(), err)
			}
		}
	}
	res := report.Results{Command: commandLine(cmd), Started: time.Now()}
	for i, sc := range run {
		if ctx.Err() != nil {
			return fmt.Errorf("bench %s: not started", sc.name())
		}
		a.log.Info().Str("scenario", sc.name()).Msg("bench starting")
		p := a.newProgress(cmd, sc.steps(), sc.name(), out.json)
		meter := cpustat.Start()
		err := sc.run(ctx, s, p.Step, &res)
		p.Done()
		if err != nil {
			return fmt.Errorf("bench %s: %w", sc.name(), poolHint(sc, s, err))
		}
		steal, stealKnown := meter.Stop()
		if stealKnown {
			if res.Steal == nil {
				res.Steal = map[string]float64{}
			}
			res.Steal[sc.name()] = steal.Steal
		}
		switch {
		case out.json && several:
			var buf strings.Builder
			if err := sc.print(&buf, &res, true); err != nil {
				return err
			}
			if err := printScenarioJSON(w, sc.name(), buf.String()); err != nil {
				return err
			}
		default:
			if several && i > 0 {
				fmt.Fprintln(w)
			}
			if several && !out.json {
				fmt.Fprintf(w, "== %s ==\n", sc.name())
			}
			if err := sc.print(w, &res, out.json); err != nil {
				return err
			}
			if stealKnown && !out.json {
				// On a virtual machine the host's other guests take CPU
				// time; every figure above moves with it.
				fmt.Fprintf(w, "CPU time the host took (steal) during %s: %.0f%%\n", sc.name(), 100*steal.Steal)
			}
		}
	}
	res.Elapsed = time.Since(res.Started).Round(time.Millisecond)
	if out.report == "" {
		return nil
	}
	if err := removeStalePlots(out.report); err != nil {
		return err
	}
	files, err := report.Write(out.report, res)
	if err != nil {
		return fmt.Errorf("--report %s: %w", out.report, err)
	}
	a.log.Info().Strs("files", files).Msg("report written")
	if !out.json {
		fmt.Fprintf(w, "\nreport: %s (%d files)\n", files[len(files)-1], len(files))
	}
	return nil
}

// reportFiles are the names report.Write writes: what a previous report
// holds.
var (
	reportPlots = []string{report.BandwidthPNG, report.TimelinePNG, report.LatencyCDFPNG, report.PipeliningPNG}
	reportFiles = append([]string{"README.md", "results.json"}, reportPlots...)
)

// prepareReportDir makes --report's directory and checks, before anything
// runs, that the report can be written there: it is a directory, this
// process can create files in it, and it is empty or holds nothing but a
// previous report's files (which the new report replaces).
func prepareReportDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--report %s: %w", dir, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("--report %s: %w", dir, err)
	}
	for _, e := range ents {
		if !slices.Contains(reportFiles, e.Name()) || !e.Type().IsRegular() {
			return fmt.Errorf("--report %s: the directory holds %s, which is no part of a previous report: give a new or empty directory, or a previous report's (its %s are replaced)",
				dir, e.Name(), strings.Join(reportFiles, ", "))
		}
	}
	probe, err := os.CreateTemp(dir, ".kvxfer-report-probe-*")
	if err != nil {
		return fmt.Errorf("--report %s: cannot write the report there: %w", dir, err)
	}
	_ = probe.Close()
	return os.Remove(probe.Name())
}

// removeStalePlots removes a previous report's plots from dir before a new
// report is written there: the new one draws only those its results allow,
// and one left from an earlier run would sit beside it as if it were new.
func removeStalePlots(dir string) error {
	for _, name := range reportPlots {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("--report %s: removing the previous report's %s: %w", dir, name, err)
		}
	}
	return nil
}

// printScenarioJSON wraps a scenario's JSON lines into one object:
// {"scenario": NAME, "results": [ … ]}.
func printScenarioJSON(w io.Writer, name, lines string) error {
	var results []json.RawMessage
	for _, l := range strings.Split(strings.TrimSpace(lines), "\n") {
		if l != "" {
			results = append(results, json.RawMessage(l))
		}
	}
	return json.NewEncoder(w).Encode(struct {
		Scenario string            `json:"scenario"`
		Results  []json.RawMessage `json:"results"`
	}{name, results})
}

// commandLine is the command as typed, for the report.
func commandLine(cmd *cobra.Command) string {
	parts := []string{cmd.CommandPath()}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		parts = append(parts, "--"+f.Name+"="+f.Value.String())
	})
	return strings.Join(parts, " ")
}

// jsonLines writes each value as one JSON line.
func jsonLines[T any](w io.Writer, vs ...T) error {
	enc := json.NewEncoder(w)
	for _, v := range vs {
		if err := enc.Encode(v); err != nil {
			return err
		}
	}
	return nil
}

func gb(bps float64) string { return fmt.Sprintf("%.2f", bps/1e9) }

func micros(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }

func millis(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }
