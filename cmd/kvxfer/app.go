package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/kvcache"
)

// app is what every command shares: the --config file, the logger the
// root sets up before any command runs, and how to tell a terminal.
type app struct {
	configFile string
	log        zerolog.Logger
	// terminal reports whether w is a terminal (a variable so that tests
	// can pretend).
	terminal func(w io.Writer) bool
}

func newApp() *app {
	return &app{log: zerolog.Nop(), terminal: isTerminal}
}

// isTerminal reports whether w is a file open on a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// setupLog is the root's PersistentPreRunE: it resolves --log-level (flag,
// KVXFER_LOG_LEVEL, the file, the default) and builds the logger on the
// command's standard error: human-readable on a terminal, JSON otherwise.
func (a *app) setupLog(cmd *cobra.Command) error {
	l := config.FromOS(a.configFile, cmd.Flags())
	l.Environ = nil // unknown variables are reported once, by the command that loads its keys
	s, err := l.LoadOnly(config.LogLevel)
	if err != nil {
		return err
	}
	w := cmd.ErrOrStderr()
	if a.terminal(w) {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	a.log = zerolog.New(w).Level(s.LogLevel).With().Timestamp().Logger()
	return nil
}

// addSettingFlags is config.AddFlags, the command's own defaults
// (defaults) shown in the help, and for a key the command leaves unset
// its own account of what that means (docs, by key name) instead of the
// key's DefaultDoc, which states every command's default at once: one
// command's help then showed the defaults of others ("demo: 2GiB; ctx,
// gen: 1GiB; …" under kvxfer bench, "bench small, fragmented: 16" under
// kvxfer ctx).
func addSettingFlags(fl *pflag.FlagSet, defaults, docs map[string]string, keys ...string) {
	config.AddFlags(fl, defaults, keys...)
	for _, name := range keys {
		doc, ok := docs[name]
		if !ok || defaults[name] != "" {
			continue
		}
		k, _ := config.KeyNamed(name)
		f := fl.Lookup(k.Name)
		f.Usage = strings.TrimSuffix(f.Usage, " (default: "+k.DefaultDoc+")") + " (default: " + doc + ")"
	}
}

// presetBlockDoc is what --tokens-per-block unset means where the model's
// preset sets the block size.
var presetBlockDoc = fmt.Sprintf("the model preset's, %d", kvcache.DefaultTokensPerBlock)

// settings loads keys for cmd from the file, the environment and its
// flags, checking every value any source gives; defaults are the
// command's own. It logs where each value came from at debug level and
// warns of unknown KVXFER_ variables.
func (a *app) settings(cmd *cobra.Command, defaults map[string]string, keys ...string) (config.Settings, error) {
	l := config.FromOS(a.configFile, cmd.Flags())
	l.Defaults = defaults
	s, err := l.Load(keys...)
	if err != nil {
		return s, err
	}
	for _, w := range s.Warnings {
		a.log.Warn().Msg(w)
	}
	ev := a.log.Debug().Str("command", cmd.CommandPath())
	if s.File != "" {
		ev = ev.Str("config", s.File)
	}
	for k, v := range s.Describe() {
		ev = ev.Str(k, v)
	}
	ev.Msg("settings")
	return s, nil
}

// progress reports a long command's steps: a bar on standard error when
// standard output and standard error are terminals (and the output is not
// JSON), plain log lines otherwise.
type progress struct {
	bar *progressbar.ProgressBar
	log zerolog.Logger
}

// newProgress starts a progress report of total steps named what.
func (a *app) newProgress(cmd *cobra.Command, total int, what string, asJSON bool) *progress {
	p := &progress{log: a.log.With().Str("task", what).Logger()}
	if !asJSON && a.terminal(cmd.OutOrStdout()) && a.terminal(cmd.ErrOrStderr()) {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(cmd.ErrOrStderr()),
			progressbar.OptionSetDescription(what),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionShowDescriptionAtLineEnd())
	}
	return p
}

// Step reports step done of total.
func (p *progress) Step(done, total int, what string) {
	if p.bar != nil {
		p.bar.ChangeMax(total)
		p.bar.Describe(what)
		_ = p.bar.Set(done)
		return
	}
	p.log.Info().Int("step", done).Int("of", total).Msg(what)
}

// Done clears the bar.
func (p *progress) Done() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

// lineWriter turns each line written to it into one progress step (the
// demo writes a line per finished request).
type lineWriter struct {
	p     *progress
	total int
	done  int
	buf   []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(b), nil
		}
		line := strings.Join(strings.Fields(string(w.buf[:i])), " ")
		w.buf = w.buf[i+1:]
		w.done++
		w.p.Step(w.done, w.total, line)
	}
}

// examples formats cobra examples: one "  kvxfer …" line each, a comment
// line above it when c is not empty.
func examples(pairs ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(pairs); i += 2 {
		if i > 0 {
			b.WriteString("\n")
		}
		if pairs[i] != "" {
			fmt.Fprintf(&b, "  # %s\n", pairs[i])
		}
		fmt.Fprintf(&b, "  %s", pairs[i+1])
	}
	return b.String()
}
