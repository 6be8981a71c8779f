package trace_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/trace"
)

// TestRotatedRunReplaysFileByFile records a real in-process run into one
// rotating Writer with a small bound and replays every file on its own:
// each has the header and both engine records, every session and table
// born in it replays identically, and the sessions and tables born in an
// earlier file (the parents' tables, sessions in flight at the rotation)
// are named and skipped, not reported as a malformed trace. Every request
// is born in exactly one kept file.
func TestRotatedRunReplaysFileByFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.jsonl")
	w, err := trace.Create(path, trace.WithMaxBytes(24<<10), trace.WithRotate(1000))
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, "", w)
	const n = 6
	for i := range n {
		c.transfer(t, fmt.Sprintf("r%d", i), 130, 32, i%2 == 0)
	}
	c.close(t)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	if st.Rotations < 2 || st.Dropped != 0 || st.Truncated {
		t.Fatalf("writer stats %+v: want 2 or more rotations", st)
	}
	files := []string{}
	for i := st.Rotations; i >= 1; i-- {
		files = append(files, fmt.Sprintf("%s.%d", path, i))
	}
	files = append(files, path)
	if _, err := os.Stat(fmt.Sprintf("%s.%d", path, st.Rotations+1)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a file past the %d rotations: %v", st.Rotations, err)
	}
	born := map[string]int{}
	spanned := 0
	for i, f := range files {
		res := replayFile(t, f)
		if !res.Identical() || res.Unclosed || res.Engines != 2 || res.Matched != res.Births+res.Steps || res.CallsMatched != len(res.Tables)+res.Calls {
			var b strings.Builder
			res.Print(&b)
			t.Fatalf("%s on its own:\n%s", filepath.Base(f), b.String())
		}
		// The timeline exports too (the earlier actors' records left out).
		if _, err := trace.ExportPerfettoFile(f, f+".perfetto.json"); err != nil {
			t.Fatalf("export %s: %v", filepath.Base(f), err)
		}
		if res.Part != i+1 && !(i == 0 && res.Part == 0) {
			t.Errorf("%s: part %d, want %d", filepath.Base(f), res.Part, i+1)
		}
		for _, s := range res.Sessions {
			born[s.Side+" "+s.Request]++
		}
		if i > 0 {
			tables := 0
			for _, e := range res.Earlier {
				if e.Table {
					tables++
				} else {
					spanned++
				}
			}
			// The parents and listeners live for the whole run.
			if tables == 0 {
				t.Errorf("%s: no table born in an earlier file: %+v", filepath.Base(f), res.Earlier)
			}
			var b strings.Builder
			res.Print(&b)
			if !strings.Contains(b.String(), "began in an earlier file") {
				t.Errorf("%s: print does not say what began earlier:\n%s", filepath.Base(f), b.String())
			}
		}
	}
	for i := range n {
		for _, side := range []string{"tx", "rx"} {
			if k := fmt.Sprintf("%s r%d", side, i); born[k] != 1 {
				t.Errorf("%s born in %d files, want 1", k, born[k])
			}
		}
	}
	if spanned == 0 {
		t.Errorf("no session spanned a rotation (the bound is too large for the test)")
	}
	t.Logf("%d files, %d sessions spanned a rotation (writer: %+v)", len(files), spanned, st)
}

// TestEngineConfigRotatesItsTrace: kvxfer.Config's TraceMaxBytes and
// TraceKeep bound and rotate the engine's TracePath file (the CLI's
// --trace-max-bytes and --trace-keep), and are refused, named, when
// negative or without a TracePath.
func TestEngineConfigRotatesItsTrace(t *testing.T) {
	dir := t.TempDir()
	l := smallLayout()
	base := func() kvxfer.Config {
		return kvxfer.Config{Instance: "ctx", Parallel: kvcache.Parallel{TP: 1, PP: 1}, Layout: &l, PoolBytes: 4 << 20,
			Workers: 1, Link: control.NewMemLink()}
	}
	for _, c := range []struct {
		edit func(*kvxfer.Config)
		want string
	}{
		{func(c *kvxfer.Config) { c.TraceKeep = 2 }, "TraceKeep = 2 without a TracePath"},
		{func(c *kvxfer.Config) { c.TraceMaxBytes = 1 << 20 }, "TraceMaxBytes = 1048576, TraceKeep = 0 without a TracePath"},
		{func(c *kvxfer.Config) { c.TracePath, c.TraceKeep = filepath.Join(dir, "a"), -1 }, "TraceKeep = -1"},
		{func(c *kvxfer.Config) { c.TracePath, c.TraceMaxBytes = filepath.Join(dir, "b"), -5 }, "TraceMaxBytes = -5"},
	} {
		cfg := base()
		c.edit(&cfg)
		e, err := kvxfer.Start(context.Background(), cfg)
		if err == nil {
			_ = e.Close(context.Background())
		}
		if !errors.Is(err, kvxfer.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrConfig naming it", c.want, err)
		}
	}
	path := filepath.Join(dir, "ctx.jsonl")
	ctx, gen := base(), base()
	ctx.TracePath, ctx.TraceMaxBytes, ctx.TraceKeep = path, 16<<10, 2
	link := &tapLink{MemLink: control.NewMemLink(), rds: map[string]*messages.RequestData{}}
	ctx.Link, gen.Link, gen.Instance = link, link, "gen"
	c := &cluster{l: l, ctxPar: ctx.Parallel, genPar: gen.Parallel, link: link}
	for _, cfg := range []kvxfer.Config{ctx, gen} {
		e, err := kvxfer.Start(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Instance == "ctx" {
			c.ctx = append(c.ctx, e)
		} else {
			c.gen = append(c.gen, e)
		}
	}
	t.Cleanup(func() { c.close(t) })
	for i := range 6 {
		c.transfer(t, fmt.Sprintf("r%d", i), 130, 32, i%2 == 0)
	}
	c.close(t)
	for _, f := range []string{path + ".2", path + ".1", path} {
		res := replayFile(t, f)
		if !res.Identical() || res.Unclosed || res.Truncated || res.Engines != 1 {
			var b strings.Builder
			res.Print(&b)
			t.Fatalf("%s:\n%s", filepath.Base(f), b.String())
		}
	}
	if _, err := os.Stat(path + ".3"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a third old file with TraceKeep 2: %v", err)
	}
}
