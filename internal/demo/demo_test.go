package demo

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/internal/cpustat"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmabench"
	"github.com/kvxfer/kvxfer/trace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSmallDemo runs the demo workload scaled down: both modes must verify
// every byte and leak no block.
func TestSmallDemo(t *testing.T) {
	rep := runOK(t, Options{Model: "Llama-3.1-8B", Requests: 4, MinTokens: 64, MaxTokens: 300, ChunkTokens: 64,
		PoolBytes: 64 << 20, Compute: 0, Workers: 2, Concurrency: 2, Seed: 7, TokensPerBlock: 16})
	// The raw baseline is measured in the same run, at one chunk's size
	// (64 tokens of Llama-3.1-8B: 8 MiB), and printed with the ratios.
	if rep.Raw == nil {
		t.Fatalf("no raw baseline: %v", rep.RawErr)
	}
	if want := uint64(64 * 128 << 10); rep.Raw.SizeBytes != want || rep.Raw.Backend != "loopback" || rep.Raw.BytesPerSec <= 0 {
		t.Fatalf("raw baseline %+v, want loopback at %d bytes", *rep.Raw, want)
	}
	var out strings.Builder
	rep.Print(&out)
	wants := []string{"baseline, same run: raw loopback at one chunk (8.0 MiB)", "pipelined: GB/s / raw "}
	if _, err := cpustat.Read(); err == nil {
		wants = append(wants, "CPU time the host took (steal): raw ")
	}
	for _, want := range wants {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDemoTraces: --trace records each engine of each mode into a file of
// its own, and each replays identical (every session and table step the
// run took reproduces its digest), ending with its end record.
func TestDemoTraces(t *testing.T) {
	dir := t.TempDir()
	o := Options{Model: "Llama-3.1-8B", Requests: 2, MinTokens: 64, MaxTokens: 200, ChunkTokens: 64,
		PoolBytes: 64 << 20, Workers: 2, Concurrency: 2, Seed: 3, TokensPerBlock: 16, TraceDir: dir}
	runOK(t, o)
	files := o.TraceFiles()
	if len(files) != 2*len(Modes) {
		t.Fatalf("trace files %v, want one per engine of each mode", files)
	}
	for _, f := range files {
		res, err := trace.ReplayFile(f)
		if err != nil {
			t.Fatalf("replay %s: %v", f, err)
		}
		if !res.Identical() || len(res.Sessions) < o.Requests || res.Unclosed || res.TornLine != 0 {
			t.Errorf("replay %s: identical %t, %d sessions, unclosed %t, torn line %d; want identical, %d sessions or more, closed",
				f, res.Identical(), len(res.Sessions), res.Unclosed, res.TornLine, o.Requests)
		}
	}
}

func TestCheckBlockDetectsCorruption(t *testing.T) {
	b := make([]byte, 4096)
	FillBlock(b, 1, 0, 3)
	if !CheckBlock(b, 1, 0, 3) {
		t.Fatal("fresh block does not check")
	}
	if CheckBlock(b, 1, 0, 4) {
		t.Fatal("block of another index checks")
	}
	b[4095] ^= 1
	if CheckBlock(b, 1, 0, 3) {
		t.Fatal("flipped bit not detected")
	}
}

// TestFillRangeWritesThePattern: the simulated device's fill (non-temporal
// stores on amd64) writes word k = seed + k*step into exactly the words of
// [lo, hi), whatever their count and offset, and nothing outside them.
func TestFillRangeWritesThePattern(t *testing.T) {
	const words = 64
	for _, r := range [][2]int{{0, 0}, {0, 8}, {8, 16}, {0, 56}, {24, 512}, {8, 8 * words}, {0, 8 * words}} {
		b := make([]byte, 8*words)
		for i := range b {
			b[i] = 0xAB
		}
		fillRange(b, 2, 1, 5, r[0], r[1])
		s := seed(2, 1, 5)
		for k := range words {
			got := binary.LittleEndian.Uint64(b[8*k:])
			want := uint64(0xABABABABABABABAB)
			if 8*k >= r[0] && 8*k < r[1] {
				want = s + uint64(k)*patternStep
			}
			if got != want {
				t.Fatalf("fillRange [%d, %d): word %d = %#x, want %#x", r[0], r[1], k, got, want)
			}
		}
	}
	// A block of several pieces (fillPiece words each) and a part.
	b := make([]byte, 8*(2*fillPiece+3))
	FillBlock(b, 2, 1, 5)
	if !CheckBlock(b, 2, 1, 5) {
		t.Fatal("FillBlock's block of several pieces does not check")
	}
}

// TestOfferedLoadLine: the report says what the prefill offers the backend
// against the raw rate measured in the same run, and which side of it the
// run is on.
func TestOfferedLoadLine(t *testing.T) {
	for _, c := range []struct {
		concurrency, devices int
		want                 string
	}{
		{4, 0, "offered: 4 prefill device(s) × one chunk per 15ms = 17.90 GB/s, 3.0x raw, above the raw rate"},
		{4, 1, "offered: 1 prefill device(s) × one chunk per 15ms = 4.47 GB/s, 0.8x raw, below the raw rate"},
		{4, 2, "offered: 2 prefill device(s) × one chunk per 15ms = 8.95 GB/s, 1.5x raw, above the raw rate"},
		{1, 4, "offered: 1 prefill device(s) × one chunk per 15ms = 4.47 GB/s, 0.8x raw, below the raw rate"},
	} {
		r := Report{Options: Options{Concurrency: c.concurrency, PrefillDevices: c.devices, Compute: 15 * time.Millisecond},
			Raw:  &rdmabench.Result{Backend: "loopback", SizeBytes: 64 << 20, BytesPerSec: 5.965e9},
			Rows: []Row{{Mode: "pipelined", BytesPerSec: 3e9, ExposedP50: 20 * time.Millisecond}}}
		var out strings.Builder
		r.printRaw(&out)
		if !strings.Contains(out.String(), c.want) {
			t.Fatalf("concurrency %d, devices %d: report lacks %q:\n%s", c.concurrency, c.devices, c.want, out.String())
		}
	}
	// What the devices did: GB/s over the share of the wall they were busy.
	r := Report{Options: Options{Concurrency: 4, PrefillDevices: 1, Compute: 15 * time.Millisecond},
		Raw: &rdmabench.Result{Backend: "loopback", SizeBytes: 64 << 20, BytesPerSec: 6e9},
		Rows: []Row{{Mode: "pipelined", BytesPerSec: 3.6e9, ExposedP50: 2 * time.Millisecond,
			ChunkCompute: 16 * time.Millisecond, DeviceBusy: 0.9}}}
	var out strings.Builder
	r.printRaw(&out)
	want := "pipelined prefill: a chunk held its device 16ms (p50); the devices wrote 4.00 GB/s of KV while computing (0.67x raw) and were busy 90% of the wall"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("report lacks %q:\n%s", want, out.String())
	}
}

// TestStealLine: the report says how much CPU time the host took during
// the raw baseline and each mode, and says nothing where that is unknown.
func TestStealLine(t *testing.T) {
	r := Report{Raw: &rdmabench.Result{Backend: "loopback", SizeBytes: 64 << 20, BytesPerSec: 6e9}, RawSteal: 0.02,
		Rows: []Row{{Mode: "pipelined", BytesPerSec: 3e9, Steal: 0.214}, {Mode: "after-prefill", BytesPerSec: 3e9, Steal: 0}}}
	var out strings.Builder
	r.printRaw(&out)
	want := "CPU time the host took (steal): raw 2%, pipelined 21%, after-prefill 0%"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("report lacks %q:\n%s", want, out.String())
	}
	for _, unknown := range []Report{
		{Raw: r.Raw, RawSteal: -1, Rows: r.Rows},
		{Raw: r.Raw, RawSteal: 0.02, Rows: []Row{{Mode: "pipelined", BytesPerSec: 3e9, Steal: -1}}},
	} {
		out.Reset()
		unknown.printRaw(&out)
		if strings.Contains(out.String(), "steal") {
			t.Fatalf("steal unknown, yet the report says:\n%s", out.String())
		}
	}
}

// computeProbe counts the chunks computing at once, per mode.
type computeProbe struct {
	mu       sync.Mutex
	now, max map[string]int
	chunks   int
}

func (*computeProbe) Record(string, any, time.Time)           {}
func (*computeProbe) Agent(_ string, a rdma.Agent) rdma.Agent { return a }
func (p *computeProbe) Mark(e ProbeEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch e.Kind {
	case ProbeCompute:
		p.now[e.Mode]++
		p.max[e.Mode] = max(p.max[e.Mode], p.now[e.Mode])
		p.chunks++
	case ProbeComputed:
		p.now[e.Mode]--
	}
}

// runSmall runs a small demo (6 requests of 64..256 tokens, 64-token
// chunks of 2 ms, 4 in flight on one prefill device) observed by p, and
// wants every byte verified and no block leaked.
func runSmall(t *testing.T, p Probe) (Options, Report) {
	t.Helper()
	o := Options{Model: "Llama-3.1-8B", Requests: 6, MinTokens: 64, MaxTokens: 256, ChunkTokens: 64,
		PoolBytes: 64 << 20, Compute: 2 * time.Millisecond, Workers: 2, Concurrency: 4, PrefillDevices: 1,
		Seed: 7, TokensPerBlock: 16, Probe: p}
	return o, runOK(t, o)
}

// runOK runs the demo with o and wants both modes to have moved bytes,
// every one of them verified, and no block leaked.
func runOK(t *testing.T, o Options) Report {
	t.Helper()
	rep, err := Run(context.Background(), o, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("report not OK: %+v", rep.Rows)
	}
	for _, row := range rep.Rows {
		if row.Bytes == 0 || row.BytesVerified != row.Bytes || row.Mismatches != 0 {
			t.Fatalf("%s: bytes %d verified %d mismatches %d", row.Mode, row.Bytes, row.BytesVerified, row.Mismatches)
		}
	}
	return rep
}

// TestPrefillDevicesAreShared: with one simulated prefill device the
// requests in flight compute their chunks one at a time, in both modes,
// and every chunk is still computed and verified.
func TestPrefillDevicesAreShared(t *testing.T) {
	p := &computeProbe{now: map[string]int{}, max: map[string]int{}}
	runSmall(t, p)
	if p.chunks == 0 {
		t.Fatal("no chunk computed")
	}
	for _, mode := range []string{"pipelined", "after-prefill"} {
		if got := p.max[mode]; got != 1 {
			t.Fatalf("%s: %d chunks computed at once with one prefill device", mode, got)
		}
		if p.now[mode] != 0 {
			t.Fatalf("%s: %d computes never ended", mode, p.now[mode])
		}
	}
}

// TestLayerPartsDemo: with each chunk handed in layer parts (more parts than
// layer groups, uneven against Llama's 32 layers) every byte still arrives
// and verifies in both modes, and nothing leaks.
func TestLayerPartsDemo(t *testing.T) {
	rep := runOK(t, Options{Model: "Llama-3.1-8B", Requests: 3, MinTokens: 64, MaxTokens: 200, ChunkTokens: 64,
		PoolBytes: 64 << 20, Compute: time.Millisecond, Workers: 2, Concurrency: 2, PrefillDevices: 1, LayerParts: 5,
		Seed: 3, TokensPerBlock: 16})
	if rep.LayerParts != 5 {
		t.Fatalf("chunks left in %d layer parts, want 5", rep.LayerParts)
	}
}

// markProbe keeps every mark.
type markProbe struct {
	mu sync.Mutex
	ev []ProbeEvent
}

func (*markProbe) Record(string, any, time.Time)           {}
func (*markProbe) Agent(_ string, a rdma.Agent) rdma.Agent { return a }
func (p *markProbe) Mark(e ProbeEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ev = append(p.ev, e)
}

// TestDemoTimesTransfersNotChecks: the wall clock behind GB/s ends at the
// last transfer's end, before the last byte check; the prefill figures are
// each chunk's time on its device.
func TestDemoTimesTransfersNotChecks(t *testing.T) {
	p := &markProbe{}
	o, rep := runSmall(t, p)
	for _, row := range rep.Rows {
		var start, lastReady, lastVerify time.Time
		for _, e := range p.ev {
			if e.Mode != row.Mode {
				continue
			}
			switch e.Kind {
			case ProbeModeStart:
				start = e.At
			case ProbeReady:
				lastReady = later(lastReady, e.At)
			case ProbeVerify:
				lastVerify = later(lastVerify, e.At)
			}
		}
		end := start.Add(row.Wall)
		if end.Before(lastReady) || !end.Before(lastVerify) {
			t.Errorf("%s: wall ends %v after the start; the last READY is at %v, the last check starts at %v",
				row.Mode, row.Wall, lastReady.Sub(start), lastVerify.Sub(start))
		}
		if row.ChunkCompute < o.Compute {
			t.Errorf("%s: a chunk held its device %v (p50), less than its compute %v", row.Mode, row.ChunkCompute, o.Compute)
		}
		if row.DeviceBusy <= 0 || row.DeviceBusy > 1 {
			t.Errorf("%s: devices busy %.3f of the wall, want (0, 1]", row.Mode, row.DeviceBusy)
		}
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// TestReportOfATinyRun: a run too small to hide anything says so in words,
// and figures below a millisecond are in µs, not rounded to 0s. Before,
// the table said "hidden -465.9%" and the baseline "one chunk's transfer
// 0s" beside a ratio to it.
func TestReportOfATinyRun(t *testing.T) {
	r := Report{Options: Options{Concurrency: 1, PrefillDevices: 1, Compute: 2 * time.Microsecond},
		Raw:      &rdmabench.Result{Backend: "loopback", SizeBytes: 4 << 10, BytesPerSec: 5e9},
		RawSteal: -1,
		Rows: []Row{
			{Mode: "pipelined", Requests: 1, BytesPerSec: 1e9, ExposedP50: 3200 * time.Nanosecond, ExposedP99: 3200 * time.Nanosecond, Hidden: -4.659, Steal: -1},
			{Mode: "after-prefill", Requests: 1, BytesPerSec: 1e9, ExposedP50: 560 * time.Nanosecond, ExposedP99: 560 * time.Nanosecond, Steal: -1},
		}}
	var out strings.Builder
	r.Print(&out)
	for _, want := range []string{
		"3.2µs", "0.6µs",
		"hidden none: pipelined took longer than after prefill (its exposed window 5.7x, the median request's)",
		"one chunk's transfer 0.8µs",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	for _, bad := range []string{"-465.9%", " 0s"} {
		if strings.Contains(out.String(), bad) {
			t.Errorf("report says %q:\n%s", bad, out.String())
		}
	}
	// A run that hid some says how much.
	r.Rows[0].Hidden = 0.75
	out.Reset()
	r.Print(&out)
	if !strings.Contains(out.String(), " 75.0% ") || strings.Contains(out.String(), "hidden none") {
		t.Errorf("a run that hid 75%%:\n%s", out.String())
	}
}

// TestOfferedAdviceWithOneDevice: above the raw rate with one prefill
// device, the advice does not say "fewer --prefill-devices". Before, it
// did.
func TestOfferedAdviceWithOneDevice(t *testing.T) {
	for _, c := range []struct {
		devices int
		want    string
	}{
		{1, "(a longer --compute, or a smaller --chunk-tokens, to see the overlap)"},
		{2, "(fewer --prefill-devices, a longer --compute, or a smaller --chunk-tokens, to see the overlap)"},
	} {
		r := Report{Options: Options{Concurrency: 4, PrefillDevices: c.devices, Compute: time.Millisecond},
			Raw:  &rdmabench.Result{Backend: "loopback", SizeBytes: 64 << 20, BytesPerSec: 6e9},
			Rows: []Row{{Mode: "pipelined", BytesPerSec: 3e9, ExposedP50: 20 * time.Millisecond}}}
		var out strings.Builder
		r.printRaw(&out)
		if !strings.Contains(out.String(), "above the raw rate") || !strings.Contains(out.String(), c.want) {
			t.Errorf("%d device(s): report lacks %q:\n%s", c.devices, c.want, out.String())
		}
	}
}

// TestReportJSON: the report's JSON names every field in snake_case with
// its unit, and its options are those the run used (the model's block
// size, not 0). Before, it had Go's names ("Wall", "Timeout": nanoseconds
// unsaid) and tokens_per_block 0.
func TestReportJSON(t *testing.T) {
	rep := runOK(t, Options{Model: "Llama-3.1-8B", Requests: 1, MinTokens: 64, MaxTokens: 64, ChunkTokens: 64,
		PoolBytes: 64 << 20, Workers: 1, Concurrency: 1, Seed: 1})
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Options map[string]any   `json:"options"`
		Rows    []map[string]any `json:"rows"`
		Raw     map[string]any   `json:"raw"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Options["tokens_per_block"] != float64(32) || doc.Options["timeout_ns"] != float64(defaultTimeout) || doc.Options["backend"] != "loopback" {
		t.Errorf("options %v: want tokens_per_block 32, timeout_ns %d, backend loopback (the run's)", doc.Options, defaultTimeout)
	}
	if _, ok := doc.Options["compute_ns"]; !ok {
		t.Errorf("options %v: no compute_ns", doc.Options)
	}
	if len(doc.Rows) != 2 {
		t.Fatalf("rows %v", doc.Rows)
	}
	for _, k := range []string{"wall_ns", "exposed_p50_ns", "exposed_p99_ns", "bytes_per_sec", "hidden_fraction", "bytes_verified", "leaked_blocks"} {
		if _, ok := doc.Rows[0][k]; !ok {
			t.Errorf("row %v: no %s", doc.Rows[0], k)
		}
	}
	for _, part := range []map[string]any{doc.Options, doc.Rows[0], doc.Raw} {
		for k := range part {
			if k != strings.ToLower(k) {
				t.Errorf("key %q is not snake_case", k)
			}
		}
	}
}

// TestDemoNamesItsTimeout: a --timeout too short for the requests fails
// the run with an error that is the timeout (errors.Is ErrTimeout) and
// names --timeout, not only "cancelled by peer" (the generation side's
// deadline passed first and cancelled the request). (Checked to fail
// without abandon's check: "... CANCELLED: actors: cancelled by peer".
// Under load every chunk may be handed over before the cancel: the
// request's failure then wraps both sides' causes; a CI run's "rx
// TIMED_OUT (...), tx CANCELLED (...), want a timeout" was that path
// formatting them with %v.)
func TestDemoNamesItsTimeout(t *testing.T) {
	_, err := Run(context.Background(), Options{Model: "Llama-3.1-8B", Requests: 1, MinTokens: 300, MaxTokens: 300, ChunkTokens: 64,
		PoolBytes: 64 << 20, Compute: time.Millisecond, Workers: 2, Concurrency: 1, Seed: 7, TokensPerBlock: 16, Timeout: time.Nanosecond}, nil)
	if err == nil || !errors.Is(err, kvxfer.ErrTimeout) {
		t.Fatalf("demo with a 1ns timeout: %v, want a timeout", err)
	}
	if !strings.Contains(err.Error(), "deadline") {
		t.Errorf("demo with a 1ns timeout: %v, want it to say a deadline passed", err)
	}
}

// TestVerifyCountsWhatThePromptNeeds: a request's check takes the bytes it
// should move from the layout, not from the engine's outcome: an outcome
// short of a block (a plan that dropped the prompt's last block), or one
// that counts other bytes, is a mismatch, though every block it has checks.
// (Found in a review: with one block fewer allocated per group, the demo
// printed every byte verified; checked to fail with bytes taken from the
// outcome and no count check.)
func TestVerifyCountsWhatThePromptNeeds(t *testing.T) {
	ge, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "verify-gen", Model: "Llama-3.1-8B", TokensPerBlock: 16,
		PoolBytes: 64 << 20, Workers: 1, Link: control.NewMemLink()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ge.Close(context.Background()) })
	l := ge.Layout()
	const promptLen, req = 40, 3 // 3 blocks of 16 tokens, the last partial
	counts := make([]int, len(l.Groups))
	var want uint64
	for g, grp := range l.Groups {
		first, end := kvcache.NeededRange(promptLen, grp.Window, l.TokensPerBlock, 0)
		counts[g] = end - first
		want += uint64(end-first) * ge.Pools().Geometry(g).BlockBytes
	}
	blocks, err := ge.Pools().Alloc(counts)
	if err != nil {
		t.Fatal(err)
	}
	for g, grp := range l.Groups {
		first, _ := kvcache.NeededRange(promptLen, grp.Window, l.TokensPerBlock, 0)
		for bi, id := range blocks[g] {
			FillBlock(blockBytes(ge, g, id), req, g, first+bi)
		}
	}
	whole := kvxfer.Outcome{OK: true, Blocks: blocks, Bytes: want}
	if b, v, m := verifyOutcome(ge, l, promptLen, req, whole); b != want || v != want || m != 0 {
		t.Fatalf("a whole outcome: bytes %d, verified %d, %d mismatches; want %d, %d, 0", b, v, m, want, want)
	}
	short := whole
	short.Blocks = [][]kvcache.BlockID{blocks[0][:len(blocks[0])-1]}
	short.Blocks = append(short.Blocks, blocks[1:]...)
	short.Bytes = want - ge.Pools().Geometry(0).BlockBytes
	if b, v, m := verifyOutcome(ge, l, promptLen, req, short); b != want || v == want || m == 0 {
		t.Fatalf("an outcome short of the prompt's last block: bytes %d, verified %d, %d mismatches; want %d, less verified, a mismatch", b, v, m, want)
	}
	miscounted := whole
	miscounted.Bytes = want - 1
	if _, _, m := verifyOutcome(ge, l, promptLen, req, miscounted); m == 0 {
		t.Fatal("an outcome counting other bytes than the prompt's: no mismatch")
	}
	if err := ge.Pools().Free(blocks); err != nil {
		t.Fatal(err)
	}
}
