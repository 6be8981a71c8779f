package main

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/proc"
	"github.com/kvxfer/kvxfer/node"
)

// roleOptions runs `kvxfer <role> args...` up to the role's run, which it
// replaces, and returns the options the run would have been given.
func roleOptions(t *testing.T, role string, args ...string) (proc.Options, error) {
	t.Helper()
	a := newApp()
	var got proc.Options
	root := &cobra.Command{Use: "kvxfer", SilenceUsage: true, SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return a.setupLog(cmd) }}
	root.PersistentFlags().StringVar(&a.configFile, "config", "", "")
	config.AddFlags(root.PersistentFlags(), nil, config.LogLevel)
	peer := map[string]string{"ctx": "gen", "gen": "ctx"}[role]
	root.AddCommand(newRoleCmd(a, role, "test", "", func(_ context.Context, o proc.Options, _ *cobra.Command) error {
		got = o
		return nil
	}, role, peer))
	root.SetArgs(append([]string{role}, args...))
	err := root.Execute()
	return got, err
}

// etcdArgs are the flags of a rank found through etcd (nothing connects
// before the run), on a 32-layer model.
var etcdArgs = []string{"--insecure", "--bind", "tcp://127.0.0.1:0", "--discovery", "etcd://127.0.0.1:2379", "--cluster", "c",
	"--model", "Llama-3.1-8B", "--pool", "64MiB"}

// TestPPStagesFlags: kvxfer ctx and gen say a pipeline split other than
// kvxfer's default, their own (--pp, --pp-rank, --pp-stages) and the
// peer's (--peer-pp, --peer-pp-stages), and it reaches the node's config
// and its peers; a bad value is refused before anything starts, naming
// the flag and its value. (Checked to fail without the flags: "unknown
// flag: --pp".)
func TestPPStagesFlags(t *testing.T) {
	o, err := roleOptions(t, "ctx", append([]string{"--pp", "2", "--pp-rank", "1", "--pp-stages", "15,17"}, etcdArgs...)...)
	if err != nil {
		t.Fatal(err)
	}
	if want := (node.Parallel{TP: 1, PP: 2, Stages: "15,17"}); o.Parallel != want || o.Rank != (node.Rank{TP: 0, PP: 1}) {
		t.Errorf("ctx: parallel %v rank %+v, want %v rank pp1", o.Parallel, o.Rank, want)
	}
	o, err = roleOptions(t, "gen", append([]string{"--peer-pp", "2", "--peer-pp-stages", "15,17"}, etcdArgs...)...)
	if err != nil {
		t.Fatal(err)
	}
	if want := (node.Parallel{TP: 1, PP: 2, Stages: "15,17"}); o.PeerParallel != want || o.Parallel != (node.Parallel{TP: 1, PP: 1}) {
		t.Errorf("gen: peer parallel %v, own %v; want %v, TP1/PP1", o.PeerParallel, o.Parallel, want)
	}
	if got := proc.ContextParallel(o); got.Stages != "15,17" || got.PP != 2 {
		t.Errorf("gen receives with ContextParallel %v, want the peer's split 15,17", got)
	}

	for _, c := range []struct {
		role string
		args []string
		want string
	}{
		{"ctx", []string{"--pp", "2", "--pp-stages", "15,x"}, `--pp-stages = "15,x": kvcache: bad parallelism: Stages "15,x": stage 1's layer count "x"`},
		{"ctx", []string{"--pp", "2", "--pp-stages", "15, 17"}, `--pp-stages = "15, 17": kvcache: bad parallelism`},
		{"ctx", []string{"--pp", "2", "--pp-stages", "32"}, `--pp-stages = "32": 1 stages, --pp = 2: give one layer count per pipeline stage`},
		{"ctx", []string{"--pp-stages", "16,16"}, `--pp-stages = "16,16": 2 stages, --pp = 1`},
		{"ctx", []string{"--pp", "2", "--pp-stages", "15,18"}, `--pp-stages = "15,18": 33 layers in all, model Llama-3.1-8B has 32`},
		{"gen", []string{"--peer-pp", "2", "--peer-pp-stages", "8,8,16"}, `--peer-pp-stages = "8,8,16": 3 stages, --peer-pp = 2`},
		{"gen", []string{"--peer-pp", "2", "--peer-pp-stages", "1,2"}, `--peer-pp-stages = "1,2": 3 layers in all, model Llama-3.1-8B has 32`},
		{"ctx", []string{"--pp", "2", "--pp-rank", "2"}, "--pp-rank = 2: want 0..1 (--pp = 2)"},
		{"ctx", []string{"--pp", "0"}, "--pp = 0: must be ≥ 1"},
		{"gen", []string{"--peer-pp", "-1"}, "--peer-pp = -1: must be ≥ 1"},
	} {
		if _, err := roleOptions(t, c.role, append(c.args, etcdArgs...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %v: %v, want an error containing %q", c.role, c.args, err, c.want)
		}
	}
	static := []string{"--insecure", "--bind", "tcp://127.0.0.1:0", "--peer-endpoint", "tcp://127.0.0.1:1"}
	for _, c := range []struct {
		role string
		args []string
		want string
	}{
		{"ctx", []string{"--pp", "2"}, "--pp = 2, --peer-pp = 1: more than one rank per instance needs --discovery etcd://"},
		{"gen", []string{"--peer-pp", "2"}, "--pp = 1, --peer-pp = 2: more than one rank per instance needs --discovery etcd://"},
		{"gen", []string{"--pp", "0"}, "--pp = 0, --peer-pp = 1: must be ≥ 1"},
	} {
		if _, err := roleOptions(t, c.role, append(c.args, static...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %v: %v, want an error containing %q", c.role, c.args, err, c.want)
		}
	}
}
