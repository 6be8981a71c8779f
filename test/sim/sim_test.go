package sim

import (
	"bytes"
	"crypto/sha256"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/actors"
)

var (
	flagSeeds    = flag.Int("seeds", defaultSeeds, "number of seeds TestSeeds runs")
	flagBase     = flag.Uint64("seedbase", 1, "first seed TestSeeds runs")
	flagSeed     = flag.Int64("seed", -1, "the seed TestSeed runs and traces (-1: check determinism on seed 1)")
	flagSuspect  = flag.Bool("suspect-partitions", false, "let the failure detector declare partitioned peers dead (Config.SuspectPartitions)")
	flagCtxStops = flag.Bool("ctx-worker-stops", false, "let FaultWorkerDead stop context ranks' workers too (Config.CtxWorkerStops; TestCtxWorkerStop runs defaultSeeds seeds with it)")
	flagMutation = flag.String("mutation", "", "turn one actors.Mutations switch on for TestSeed and TestSeeds: "+strings.Join(mutationNames(), ", "))
)

func mutationNames() []string {
	var out []string
	for _, m := range mutations {
		out = append(out, m.name)
	}
	return out
}

// setMutation turns a switch on for the rest of the test.
func setMutation(t *testing.T, name string) {
	t.Helper()
	if name == "" {
		return
	}
	for _, m := range mutations {
		if m.name == name {
			*m.on = true
			t.Cleanup(func() { *m.on = false })
			return
		}
	}
	t.Fatalf("unknown -mutation %q (known: %s; the switches exist only with -tags kvxfer_invariants)", name, strings.Join(mutationNames(), ", "))
}

func reproduce(seed uint64) string {
	tags := ""
	if actors.Invariants {
		// The failure may be an invariant violation or a mutation: both
		// exist only in this build.
		tags = "-tags kvxfer_invariants "
	}
	cmd := fmt.Sprintf("go test %s./test/sim -run 'TestSeed$' -seed=%d -v", tags, seed)
	if *flagSuspect {
		cmd += " -suspect-partitions"
	}
	if *flagCtxStops {
		cmd += " -ctx-worker-stops"
	}
	if *flagMutation != "" {
		cmd += " -mutation=" + *flagMutation
	}
	return cmd
}

// reportFailure re-runs a failing seed with the trace on, saves the trace
// and reports the seed, the command that reproduces it and the trace file.
func reportFailure(t *testing.T, f *Failure) {
	t.Helper()
	res := Run(Config{Seed: f.Seed, Trace: true, SuspectPartitions: *flagSuspect, CtxWorkerStops: *flagCtxStops})
	path, err := WriteTrace("", res)
	if err != nil {
		path = "(not written: " + err.Error() + ")"
	}
	t.Errorf("%v\n\treproduce: %s\n\ttrace: %s", f, reproduce(f.Seed), path)
}

// TestSeeds runs many seeds (-seeds, default 2,000; 200 under -race),
// fails on the first few failing seeds, and, over 1,000 seeds or more,
// checks that every fault kind, every DESIGN.md §3 race and every kind of
// wrong chunk (WrongChunk) was reached in at least one seed in 1,000.
func TestSeeds(t *testing.T) {
	setMutation(t, *flagMutation)
	sw := RunSeeds(*flagBase, *flagSeeds, false, Config{SuspectPartitions: *flagSuspect, CtxWorkerStops: *flagCtxStops})
	t.Log("\n" + sw.Report())
	if len(sw.Failures) > 0 {
		t.Log("failures by kind:\n" + strings.Join(sw.FailureKinds(), "\n"))
	}
	for i, f := range sw.Failures {
		if i == 3 {
			t.Errorf("… and %d more failing seeds", len(sw.Failures)-3)
			break
		}
		reportFailure(t, f)
	}
	// Coverage is asked of 1,000 seeds or more: a kind reached in 1 seed
	// in 100 is absent from 200 seeds one time in seven, and any change
	// to what a seed does moves which seeds reach it (the race slice, 200
	// seeds, lost its two Misaddressed-first seeds to new faults drawn on
	// others' streams). The runs of 2,000 seeds check it.
	if *flagMutation == "" && sw.Seeds >= 1000 {
		for _, u := range sw.Uncovered() {
			t.Errorf("coverage: %s (need at least 1 in 1,000)", u)
		}
	}
}

// TestSeed runs one seed (-seed) with the trace on and writes the trace.
// Without -seed it checks that a run is deterministic: the same seed twice
// gives the same trace.
func TestSeed(t *testing.T) {
	setMutation(t, *flagMutation)
	if *flagSeed < 0 {
		for seed := uint64(1); seed <= 20; seed++ {
			a, b := Run(Config{Seed: seed, Trace: true}), Run(Config{Seed: seed, Trace: true})
			if ha, hb := traceHash(t, a), traceHash(t, b); ha == hb {
				continue
			}
			for i := range min(len(a.Trace), len(b.Trace)) {
				if a.Trace[i] != b.Trace[i] {
					t.Fatalf("seed %d is not deterministic: message %d is\n\t%+v\nthen\n\t%+v", seed, i, a.Trace[i], b.Trace[i])
				}
			}
			t.Fatalf("seed %d is not deterministic: %d vs %d messages", seed, len(a.Trace), len(b.Trace))
		}
		return
	}
	res := Run(Config{Seed: uint64(*flagSeed), Trace: true, SuspectPartitions: *flagSuspect, CtxWorkerStops: *flagCtxStops})
	path, err := WriteTrace("", res)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s\ntrace (%d messages): %s", res.Summary(), len(res.Trace), path)
	if res.Failure != nil {
		t.Fatalf("%v\n\treproduce: %s", res.Failure, reproduce(res.Failure.Seed))
	}
}

func traceHash(t *testing.T, r *Result) [32]byte {
	var b bytes.Buffer
	if err := EncodeTrace(&b, r.Trace); err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b.Bytes())
}
