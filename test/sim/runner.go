package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sweep is the outcome of many seeds.
type Sweep struct {
	Seeds    int
	Elapsed  time.Duration
	Failures []*Failure // sorted by seed
	// SeedsWithFault[k] and SeedsWithRace[r] count the seeds in which a
	// fault kind fired or a race was reached; FaultsFired[k] counts firings.
	SeedsWithFault [numFaults]int
	FaultsFired    [numFaults]int
	SeedsWithRace  [numRaces]int
	Events         int
	Ready          int
	NotReady       int
	// SeedsWithParts counts the seeds whose sessions took layer parts,
	// Parts those parts, SeedsReadyParted the seeds with a generation
	// session READY for a request handed in parts, ReadyParted those
	// sessions.
	SeedsWithParts, Parts, SeedsReadyParted, ReadyParted int
	// SeedsInvalidFailed counts the seeds in which a writer's invalid
	// Result decided a live session, InvalidFailed those sessions.
	SeedsInvalidFailed, InvalidFailed int
	// SeedsCancelOvertook counts the seeds in which a Cancel overtook its
	// RequestData, CancelsOvertook those Cancels.
	SeedsCancelOvertook, CancelsOvertook int
	// SeedsMisaddressed counts the seeds in which a generation session
	// took a Misaddressed (Result.MisaddressedTaken); MisaddressedAnswered,
	// MisaddressedTaken and QueuedToNext sum the runs' counts.
	SeedsMisaddressed, MisaddressedAnswered, MisaddressedTaken, QueuedToNext int
	// SeedsEarly[k] counts the seeds in which a generation session took
	// an answer of kind k before its worker's report that the RequestData
	// left (FaultSentLate), EarlyAnswers those answers.
	SeedsEarly, EarlyAnswers [numEarly]int
	// SeedsWithWrong[w] counts the seeds in which kvcache.ChunkOrder
	// refused a wrong chunk of kind w, WrongChunks those refusals.
	SeedsWithWrong, WrongChunks [numWrongChunks]int
}

// RunSeeds runs seeds base, base+1, …, base+n-1 on GOMAXPROCS goroutines
// (each seed's simulation is single-threaded) with cfg (its Seed set per
// run) and aggregates them. With
// stopEarly it stops handing out seeds after the first failure.
func RunSeeds(base uint64, n int, stopEarly bool, cfg Config) *Sweep {
	sw := &Sweep{}
	var next atomic.Int64
	var stop atomic.Bool
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				c := cfg
				c.Seed = base + uint64(i)
				res := Run(c)
				mu.Lock()
				sw.add(res)
				mu.Unlock()
				if res.Failure != nil && stopEarly {
					stop.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	sw.Elapsed = time.Since(start)
	slices.SortFunc(sw.Failures, func(a, b *Failure) int {
		switch {
		case a.Seed < b.Seed:
			return -1
		case a.Seed > b.Seed:
			return 1
		}
		return 0
	})
	return sw
}

func (sw *Sweep) add(r *Result) {
	sw.Seeds++
	sw.Events += r.Events
	sw.Ready += r.Ready
	sw.NotReady += r.NotReady
	if r.Failure != nil {
		sw.Failures = append(sw.Failures, r.Failure)
	}
	sw.Parts += r.Parts
	sw.ReadyParted += r.ReadyParted
	if r.Parts > 0 {
		sw.SeedsWithParts++
	}
	if r.ReadyParted > 0 {
		sw.SeedsReadyParted++
	}
	sw.InvalidFailed += r.InvalidFailed
	if r.InvalidFailed > 0 {
		sw.SeedsInvalidFailed++
	}
	sw.CancelsOvertook += r.CancelsOvertook
	sw.MisaddressedAnswered += r.MisaddressedAnswered
	sw.MisaddressedTaken += r.MisaddressedTaken
	sw.QueuedToNext += r.QueuedToNext
	if r.MisaddressedTaken > 0 {
		sw.SeedsMisaddressed++
	}
	if r.CancelsOvertook > 0 {
		sw.SeedsCancelOvertook++
	}
	for k, n := range r.Faults {
		sw.FaultsFired[k] += n
		if n > 0 {
			sw.SeedsWithFault[k]++
		}
	}
	for k, n := range r.Races {
		if n > 0 {
			sw.SeedsWithRace[k]++
		}
	}
	for k, n := range r.EarlyAnswers {
		sw.EarlyAnswers[k] += n
		if n > 0 {
			sw.SeedsEarly[k]++
		}
	}
	for k, n := range r.WrongChunks {
		sw.WrongChunks[k] += n
		if n > 0 {
			sw.SeedsWithWrong[k]++
		}
	}
}

// SeedsPerSecond is the sweep's throughput.
func (sw *Sweep) SeedsPerSecond() float64 { return float64(sw.Seeds) / sw.Elapsed.Seconds() }

// Uncovered lists the fault kinds, races and kinds of wrong chunk reached
// in fewer than one seed in 1,000 (at least one seed when fewer than 1,000
// ran), and READY for a request handed in parts, an invalid Result failing
// a live session, a Cancel overtaking its RequestData, a Misaddressed
// taken, and a Misaddressed, a Result or a CancelAck reaching its session
// before the report that its RequestData left, when they are that rare.
func (sw *Sweep) Uncovered() []string {
	need := max(1, sw.Seeds/1000)
	var out []string
	for k := range numFaults {
		if sw.SeedsWithFault[k] < need {
			out = append(out, fmt.Sprintf("fault %q: %d seeds of %d", Fault(k), sw.SeedsWithFault[k], sw.Seeds))
		}
	}
	for k := range numRaces {
		if sw.SeedsWithRace[k] < need {
			out = append(out, fmt.Sprintf("race %q: %d seeds of %d", Race(k), sw.SeedsWithRace[k], sw.Seeds))
		}
	}
	if sw.SeedsReadyParted < need {
		out = append(out, fmt.Sprintf("layer parts: a request handed in parts ended READY in %d seeds of %d", sw.SeedsReadyParted, sw.Seeds))
	}
	if sw.SeedsInvalidFailed < need {
		out = append(out, fmt.Sprintf("a writer's invalid Result failed a live session in %d seeds of %d", sw.SeedsInvalidFailed, sw.Seeds))
	}
	if sw.SeedsCancelOvertook < need {
		out = append(out, fmt.Sprintf("a Cancel overtook its RequestData in %d seeds of %d", sw.SeedsCancelOvertook, sw.Seeds))
	}
	if sw.SeedsMisaddressed < need {
		out = append(out, fmt.Sprintf("a Misaddressed was taken in %d seeds of %d", sw.SeedsMisaddressed, sw.Seeds))
	}
	// (A CancelAck cannot come first on its own: the Cancel waits in the
	// same worker's mailbox behind the report. It can when the Cancel
	// leaves through another worker, too rarely for a floor.)
	for _, k := range []earlyAnswer{earlyMisaddressed, earlyResult} {
		if sw.SeedsEarly[k] < need {
			out = append(out, fmt.Sprintf("a %s reached its session before the report that its RequestData left in %d seeds of %d", k, sw.SeedsEarly[k], sw.Seeds))
		}
	}
	for k := range numWrongChunks {
		if sw.SeedsWithWrong[k] < need {
			out = append(out, fmt.Sprintf("chunk order: a %s refused in %d seeds of %d", WrongChunk(k), sw.SeedsWithWrong[k], sw.Seeds))
		}
	}
	return out
}

// Report is the sweep's coverage table.
func (sw *Sweep) Report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d seeds in %v: %.0f seeds/s, %d events (%.0f/seed), gen sessions READY %d, other %d, failures %d\n",
		sw.Seeds, sw.Elapsed.Round(time.Millisecond), sw.SeedsPerSecond(), sw.Events, float64(sw.Events)/float64(max(sw.Seeds, 1)),
		sw.Ready, sw.NotReady, len(sw.Failures))
	per := func(n int) float64 { return 1000 * float64(n) / float64(max(sw.Seeds, 1)) }
	fmt.Fprintf(&b, "%-44s %14s %16s\n", "fault kind", "seeds per 1000", "firings per 1000")
	for k := range numFaults {
		fmt.Fprintf(&b, "%-44s %14.1f %16.1f\n", Fault(k), per(sw.SeedsWithFault[k]), per(sw.FaultsFired[k]))
	}
	fmt.Fprintf(&b, "%-44s %14s\n", "race (DESIGN.md §3)", "seeds per 1000")
	for k := range numRaces {
		fmt.Fprintf(&b, "%-44s %14.1f\n", Race(k), per(sw.SeedsWithRace[k]))
	}
	fmt.Fprintf(&b, "%-44s %14s %16s\n", "layer parts", "seeds per 1000", "count per 1000")
	fmt.Fprintf(&b, "%-44s %14.1f %16.1f\n", "parts taken by a session", per(sw.SeedsWithParts), per(sw.Parts))
	fmt.Fprintf(&b, "%-44s %14.1f %16.1f\n", "READY for a request handed in parts", per(sw.SeedsReadyParted), per(sw.ReadyParted))
	fmt.Fprintf(&b, "%-44s %14.1f %16.1f\n", "invalid Result failed a live session", per(sw.SeedsInvalidFailed), per(sw.InvalidFailed))
	fmt.Fprintf(&b, "%-44s %14.1f %16.1f\n", "Cancel overtook its RequestData", per(sw.SeedsCancelOvertook), per(sw.CancelsOvertook))
	fmt.Fprintf(&b, "%-44s %14s %16.1f\n", "frame to a down rank reached its return", "", per(sw.QueuedToNext))
	fmt.Fprintf(&b, "%-44s %14s %16.1f\n", "Misaddressed answered (context rank)", "", per(sw.MisaddressedAnswered))
	fmt.Fprintf(&b, "%-44s %14.1f %16.1f\n", "Misaddressed taken (re-addressed)", per(sw.SeedsMisaddressed), per(sw.MisaddressedTaken))
	fmt.Fprintf(&b, "%-44s %14s %16s\n", "answer before the RequestData's sent report", "seeds per 1000", "count per 1000")
	for k := range numEarly {
		fmt.Fprintf(&b, "%-44s %14.1f %16.1f\n", k, per(sw.SeedsEarly[k]), per(sw.EarlyAnswers[k]))
	}
	fmt.Fprintf(&b, "%-44s %14s %16s\n", "wrong chunk refused (kvcache.ChunkOrder)", "seeds per 1000", "count per 1000")
	for k := range numWrongChunks {
		fmt.Fprintf(&b, "%-44s %14.1f %16.1f\n", WrongChunk(k), per(sw.SeedsWithWrong[k]), per(sw.WrongChunks[k]))
	}
	return b.String()
}

// WriteTrace writes a run's trace as JSON lines to a new file under dir
// (os.TempDir() when empty) and returns its path.
func WriteTrace(dir string, r *Result) (string, error) {
	f, err := os.CreateTemp(dir, fmt.Sprintf("kvxfer-sim-seed%d-*.jsonl", r.Seed))
	if err != nil {
		return "", err
	}
	if err := EncodeTrace(f, r.Trace); err != nil {
		_ = f.Close()
		return "", err
	}
	return f.Name(), f.Close()
}

// EncodeTrace writes trace records as JSON lines.
func EncodeTrace(w io.Writer, trace []TraceRecord) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range trace {
		if err := enc.Encode(&trace[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// FailureKinds groups failures by their message with numbers masked, most
// frequent first, with the first seed of each.
func (sw *Sweep) FailureKinds() []string {
	type kind struct {
		n    int
		seed uint64
	}
	kinds := map[string]*kind{}
	var order []string
	for _, f := range sw.Failures {
		k := masked.ReplaceAllString(maskNumbers(f.Msg), "[#…]")
		if len(k) > 160 {
			k = k[:160]
		}
		if kinds[k] == nil {
			kinds[k] = &kind{seed: f.Seed}
			order = append(order, k)
		}
		kinds[k].n++
	}
	slices.SortStableFunc(order, func(a, b string) int { return kinds[b].n - kinds[a].n })
	out := make([]string, len(order))
	for i, k := range order {
		out[i] = fmt.Sprintf("%5d× (first seed %d) %s", kinds[k].n, kinds[k].seed, k)
	}
	return out
}

var masked = regexp.MustCompile(`\[[# ]*#\]`)

func maskNumbers(s string) string {
	var b strings.Builder
	digit := false
	for _, r := range s {
		if r >= '0' && r <= '9' || digit && (r >= 'a' && r <= 'f' || r == 'x') {
			if !digit {
				b.WriteByte('#')
			}
			digit = true
			continue
		}
		digit = false
		b.WriteRune(r)
	}
	return b.String()
}
