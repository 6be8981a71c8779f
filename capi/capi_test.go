package capi

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/metrics"
	"github.com/kvxfer/kvxfer/node"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const tinyLayout = `"layout":{"layers":2,"kv_heads":2,"head_dim":4,"dtype_bytes":2,"tokens_per_block":16}`

func open(t *testing.T, instance string) *Engine {
	t.Helper()
	e, h, err := Open(fmt.Sprintf(`{"instance":%q,%s,"pool_bytes":65536,"workers":2}`, instance, tinyLayout), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if h == 0 || h != e.Handle() {
		t.Fatalf("handle %d, engine says %d", h, e.Handle())
	}
	return e
}

func waitFor(t *testing.T, e *Engine, h uint64) Event {
	t.Helper()
	evs := make([]Event, 4)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n := e.Poll(evs, 100*time.Millisecond)
		for _, ev := range evs[:n] {
			if ev.Request == h {
				return ev
			}
			t.Fatalf("event for request %d while waiting for %d", ev.Request, h)
		}
	}
	t.Fatalf("no event for request %d in 10 s", h)
	return Event{}
}

func TestCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Status
	}{
		{nil, OK},
		{fmt.Errorf("chunk: %w", kvxfer.ErrMisalignedChunk), ErrBadChunk},
		{fmt.Errorf("%w: request r is FAILED: %w", kvxfer.ErrRequestFailed, kvxfer.ErrTimeout), ErrRequestFailed},
		{fmt.Errorf("outcome: %w", kvxfer.ErrTimeout), ErrTimeout},
		{fmt.Errorf("x: %w", ErrFenceFailed), ErrFence},
		{fmt.Errorf("x: %w", kvcache.ErrOutOfBlocks), ErrOutOfBlocks},
		// A Result that did not leave, even when the worker crashed in the send.
		{fmt.Errorf("%w: the Result for gen/0: %w", kvxfer.ErrFrameUnsent, kvxfer.ErrWorkerCrashed), ErrPeerGone},
		{errorf(ErrBufferTooSmall, "small"), ErrBufferTooSmall},
		// A request its engine's close cancelled (actors' ErrClosed).
		{fmt.Errorf("%w: request r", actors.ErrClosed), ErrClosed},
		{errors.New("unmapped"), ErrInternal},
		// A peer's failure is the peer's, not a bug here.
		{fmt.Errorf("%w: request r writer ctx/0: FAILED: it disagreed", actors.ErrPeerFailed), ErrPeerFailed},
		{fmt.Errorf("%w: %w", actors.ErrPeerFailed, kvxfer.ErrPeerCancelled), ErrPeerCancelled},
		// A Receive on a send-only engine: the node's refusal and the
		// engine's own (Config.SendOnly) are the caller's mistake alike.
		{fmt.Errorf("%w: request r", node.ErrSendOnly), ErrBadRequest},
		{fmt.Errorf("%w: request r", kvxfer.ErrSendOnly), ErrBadRequest},
	} {
		if got := Code(c.err); got != c.want {
			t.Errorf("Code(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if s := ErrPeerFailed.String(); s != "KVXFER_ERR_PEER_FAILED" {
		t.Errorf("ErrPeerFailed.String() = %q", s)
	}
	if s := ErrFence.String(); s != "KVXFER_ERR_FENCE" {
		t.Errorf("ErrFence.String() = %q", s)
	}
}

func TestParseConfigNamesWhatIsWrong(t *testing.T) {
	for _, c := range []struct{ js, needle string }{
		{``, "empty"},
		{`{"model":`, "unexpected EOF"},
		{`{"modle":"x"}`, "modle"},
		{`{"tp":"two"}`, "tp"},
		{`{"model":"x"} {}`, "after the object"},
	} {
		_, err := ParseConfig(c.js)
		if Code(err) != ErrConfig || !strings.Contains(err.Error(), c.needle) {
			t.Errorf("ParseConfig(%q) = %v, want a config error naming %q", c.js, err, c.needle)
		}
	}
	c, err := ParseConfig(`{"instance":"a","tp":2,"transfer_timeout_ms":1500}`)
	if err != nil || c.TP != 2 || c.TransferTimeoutMs != 1500 {
		t.Fatalf("%+v %v", c, err)
	}
}

// TestTransferFenceAndHandles: a fenced transfer end to end, a fence fires
// once, a handle of the wrong kind is refused naming it, and releasing
// and closing leave the table empty.
func TestTransferFenceAndHandles(t *testing.T) {
	base := HandleCount()
	p, d := open(t, "capi-p"), open(t, "capi-d")
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	rx, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "capi-p"}, UserData: 5})
	if err != nil {
		t.Fatal(err)
	}
	tx, th, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "r", PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LookupRequest(p.Handle()); Code(err) != ErrBadHandle || !strings.Contains(err.Error(), "engine") {
		t.Fatalf("an engine handle as a request: %v", err)
	}
	if err := tx.Release(); Code(err) != ErrNotFinished {
		t.Fatalf("release before the outcome: %v", err)
	}
	f, err := tx.Chunk(0, 32, true, []kvcache.BlockRun{{First: 0, IDs: src}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := FenceReady(f); err != nil {
		t.Fatal(err)
	}
	if err := FenceReady(f); Code(err) != ErrBadHandle {
		t.Fatalf("second FenceReady: %v", err)
	}
	if ev := waitFor(t, p, th); ev.Outcome != OutcomeDone || ev.Error != OK {
		t.Fatalf("tx %+v", ev)
	}
	ev := waitFor(t, d, rh)
	if ev.Outcome != OutcomeReady || ev.UserData != 5 || ev.Bytes != 2*p.Info().BytesPerToken*16 {
		t.Fatalf("rx %+v, want READY of %d bytes", ev, 2*p.Info().BytesPerToken*16)
	}
	ids, first, err := rx.Blocks(0)
	if err != nil || first != 0 || len(ids) != 2 {
		t.Fatalf("blocks %v first %d: %v", ids, first, err)
	}
	if err := d.FreeBlocks(0, ids); err != nil {
		t.Fatal(err)
	}
	if err := p.FreeBlocks(0, src); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Request{tx, rx} {
		if err := r.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LookupRequest(th); Code(err) != ErrBadHandle {
		t.Fatalf("released request still found: %v", err)
	}
	closeBoth(t, p, d)
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}

// TestCloseFailsUnfiredFences: Close does not wait forever on a fence the
// caller never fires; it fails it, drains, and releases every handle.
func TestCloseFailsUnfiredFences(t *testing.T) {
	base := HandleCount()
	// The sender serves metrics: the test reads its session gauges.
	p, _, err := Open(`{"instance":"capi-p2",`+tinyLayout+`,"pool_bytes":65536,"workers":2,"metrics_addr":"127.0.0.1:0"}`, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := open(t, "capi-d2")
	src, err := p.AllocBlocks(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: "r", PromptLen: 32, Context: "capi-p2"}}); err != nil {
		t.Fatal(err)
	}
	tx, _, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "r", PromptLen: 32}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := tx.Chunk(0, 32, true, []kvcache.BlockRun{{First: 0, IDs: src}}, true)
	if err != nil {
		t.Fatal(err)
	}
	// Close only once the receiver's RequestData has reached the sender's
	// session (it leaves INIT): closed earlier, the sender's engine is gone
	// with the RequestData still in flight, nothing can prove the writer
	// quiescent, and the receiver's Close rightly reports the session
	// undrained rather than free its blocks.
	waitTxPastInit(t, p)
	closeBoth(t, p, d)
	if err := FenceReady(f); Code(err) != ErrBadHandle {
		t.Fatalf("fence after close: %v", err)
	}
	if _, _, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: "late", PromptLen: 32}}); Code(err) != ErrClosed {
		t.Fatalf("send after close: %v", err)
	}
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}

func TestBenchGoMovesEveryByte(t *testing.T) {
	p, d := open(t, "capi-bp"), open(t, "capi-bd")
	_, moved, err := BenchGo(p, d, 100, 32, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * 7 * 16 * p.Info().BytesPerToken; moved != want {
		t.Fatalf("moved %d bytes, want %d", moved, want)
	}
	// One engine as both ends is named at once (it waited a minute).
	if _, _, err := BenchGo(p, p, 100, 32, 1); Code(err) != ErrInvalidArgument || !strings.Contains(err.Error(), "same engine") {
		t.Fatalf("BenchGo(p, p): %v, want INVALID_ARGUMENT naming the same engine", err)
	}
	closeBoth(t, p, d)
}

// A negative iteration count is refused naming it: it ran no transfer and
// returned OK with 0 bytes in 0 s, a benchmark result that measured
// nothing. Nothing is allocated for it.
func TestBenchGoNegativeItersRefused(t *testing.T) {
	p, d := open(t, "capi-bni-p"), open(t, "capi-bni-d")
	defer closeBoth(t, p, d)
	_, _, err := BenchGo(p, d, 100, 32, -3)
	if Code(err) != ErrInvalidArgument || !strings.Contains(fmt.Sprint(err), "iters = -3") {
		t.Fatalf("BenchGo with iters -3: %v (%v), want KVXFER_ERR_INVALID_ARGUMENT naming iters = -3", err, Code(err))
	}
	if n, err := p.UsedBlocks(0); err != nil || n != 0 {
		t.Fatalf("after the refused bench: %d blocks used (%v), want 0", n, err)
	}
}

// A prompt the pool cannot hold is refused before anything is planned for
// it: BenchGo listed every chunk of the prompt first, 64 bytes each, so
// that kvxfer_bench_go(src, dst, INT32_MAX, tokens_per_block, 1) asked the
// runtime for gigabytes (tens of them at one token per block: a fatal out
// of memory, the caller's process gone) before the pool said it was too
// small.
func TestBenchGoHugePromptAllocatesNothing(t *testing.T) {
	p, d := open(t, "capi-bhp"), open(t, "capi-bhd")
	defer closeBoth(t, p, d)
	const prompt = 1 << 25 // 2M chunks of 16 tokens: 128 MiB of plan
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := BenchGo(p, d, prompt, 16, 1)
	runtime.ReadMemStats(&after)
	if Code(err) != ErrOutOfBlocks {
		t.Fatalf("BenchGo of a %d-token prompt over a 64-block pool: %v (%v), want KVXFER_ERR_OUT_OF_BLOCKS", prompt, err, Code(err))
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
		t.Fatalf("BenchGo allocated %d bytes before refusing a prompt its pool cannot hold", got)
	}
}

// A group whose pool cannot give the source blocks leaves the groups
// before it as they were: BenchGo returned before it deferred freeing
// what it had allocated, and group 0's blocks stayed allocated for good.
func TestBenchGoPartialAllocFreesNothingLeft(t *testing.T) {
	const two = `"layout":{"layers":2,"kv_heads":2,"head_dim":4,"dtype_bytes":2,"tokens_per_block":16,` +
		`"groups":[{"name":"a","layers":[0]},{"name":"b","layers":[1]}]},"pool_bytes":65536,"workers":2}`
	var es [2]*Engine
	for i, inst := range []string{"capi-bpa-p", "capi-bpa-d"} {
		e, _, err := Open(fmt.Sprintf(`{"instance":%q,%s`, inst, two), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		es[i] = e
	}
	p, d := es[0], es[1]
	defer closeBoth(t, p, d)
	gi, err := p.Group(1)
	if err != nil {
		t.Fatal(err)
	}
	held, err := p.AllocBlocks(1, gi.Blocks-1) // group 1 has one block free
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := BenchGo(p, d, 64, 16, 1); Code(err) != ErrOutOfBlocks {
		t.Fatalf("BenchGo with group 1 full: %v (%v), want KVXFER_ERR_OUT_OF_BLOCKS", err, Code(err))
	}
	if n, err := p.UsedBlocks(0); err != nil || n != 0 {
		t.Fatalf("group 0 after the refused bench: %d blocks used (%v), want 0", n, err)
	}
	if err := p.FreeBlocks(1, held); err != nil {
		t.Fatal(err)
	}
}

// A request id that is not UTF-8 is refused by Send and Receive, naming
// it. Both took it, and between nodes every frame naming the request
// failed to encode (proto3 strings are UTF-8): the receive's RequestData
// never left, and both sides waited for the transfer deadline, the send
// side holding its chunks' pins, with TIMEOUT and no word of the cause.
func TestRequestIDNotUTF8Refused(t *testing.T) {
	p, d := open(t, "capi-utf8id-p"), open(t, "capi-utf8id-d")
	defer closeBoth(t, p, d)
	const id = "bad-\xff"
	_, _, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: 16}})
	if Code(err) != ErrBadRequest || !strings.Contains(err.Error(), `"bad-\xff": request id is not valid UTF-8`) {
		t.Fatalf("send: %v (%v), want KVXFER_ERR_BAD_REQUEST naming the id", err, Code(err))
	}
	_, _, err = d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: 16, Context: "capi-utf8id-p"}})
	if Code(err) != ErrBadRequest || !strings.Contains(err.Error(), `"bad-\xff": request id is not valid UTF-8`) {
		t.Fatalf("receive: %v (%v), want KVXFER_ERR_BAD_REQUEST naming the id", err, Code(err))
	}
}

// waitTxPastInit polls e's session gauges until a tx session has left INIT
// (its RequestData arrived).
func waitTxPastInit(t *testing.T, e *Engine) {
	t.Helper()
	sessions := e.Inner().Metrics().Sessions
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0.0
		for _, st := range []string{"READY", "TRANSFERRING", "DONE", "FAILED", "CANCELLED"} {
			var m dto.Metric
			if err := sessions.WithLabelValues(metrics.SideTx, st).Write(&m); err != nil {
				t.Fatal(err)
			}
			n += m.GetGauge().GetValue()
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no tx session left INIT within 10s: the RequestData never arrived")
		}
		runtime.Gosched()
	}
}

func closeBoth(t *testing.T, es ...*Engine) {
	t.Helper()
	for _, e := range es {
		if err := e.Close(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkReceiveSend is the cost of opening both sides of a request from
// Go (the actor round trips kvxfer_receive and kvxfer_send make), for
// comparison with the same calls from Python (make bench-python).
func BenchmarkReceiveSend(b *testing.B) {
	cfg := `{"instance":%q,` + tinyLayout + `,"pool_bytes":1048576,"workers":2}`
	p, _, err := Open(fmt.Sprintf(cfg, "bench-rs-p"), nil, 0)
	if err != nil {
		b.Fatal(err)
	}
	d, _, err := Open(fmt.Sprintf(cfg, "bench-rs-d"), nil, 0)
	if err != nil {
		b.Fatal(err)
	}
	evs := make([]Event, 8)
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprint("rs-", i)
		rx, _, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "bench-rs-p"}})
		if err != nil {
			b.Fatal(err)
		}
		tx, _, err := p.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: 32}})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		tx.Cancel()
		rx.Cancel()
		for _, e := range []*Engine{p, d} {
			for e.Poll(evs, 10*time.Millisecond) == 0 {
			}
		}
		_ = tx.Release()
		_ = rx.Release()
		b.StartTimer()
	}
	_ = p.Close(5 * time.Second)
	_ = d.Close(5 * time.Second)
}

// BenchmarkTransferPhases drives bench_kvxfer.py --tiny's transfer from Go
// (a 1 KiB/token layout, 2048-token prompts, 512-token chunks) and reports
// the mean µs per request of each call, beside the Python-driven breakdown
// bench_kvxfer.py prints.
func BenchmarkTransferPhases(b *testing.B) {
	cfg := `{"instance":%q,"layout":{"layers":4,"kv_heads":2,"head_dim":32,"dtype_bytes":2,"tokens_per_block":16},` +
		`"pool_bytes":536870912,"transfer_timeout_ms":60000}`
	p, _, err := Open(fmt.Sprintf(cfg, "bench-ph-p"), nil, 0)
	if err != nil {
		b.Fatal(err)
	}
	d, _, err := Open(fmt.Sprintf(cfg, "bench-ph-d"), nil, 0)
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := BenchGo(p, d, 2048, 512, 10); err != nil { // warm-up
		b.Fatal(err)
	}
	var ph Phases
	b.ResetTimer()
	_, moved, err := benchGo(p, d, 2048, 512, b.N, &ph)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(moved) / int64(b.N))
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
	b.ReportMetric(us(ph.Receive), "receive-µs/req")
	b.ReportMetric(us(ph.Send), "send-µs/req")
	b.ReportMetric(us(ph.Chunk), "chunks-µs/req")
	b.ReportMetric(us(ph.Ready), "readies-µs/req")
	b.ReportMetric(us(ph.WaitDone), "wait-done-µs/req")
	b.ReportMetric(us(ph.WaitReady), "wait-ready-µs/req")
	b.ReportMetric(us(ph.Free), "free-blocks-µs/req")
	b.ReportMetric(us(ph.Release), "release-µs/req")
	_ = p.Close(5 * time.Second)
	_ = d.Close(5 * time.Second)
}

// TestCloseRacingOpens: Close while other goroutines keep opening requests
// returns, every open either succeeds (and its request is released by
// Close) or is refused with KVXFER_ERR_CLOSED, and no handle is left. One
// refusal more is right once the generation engine closes: its Close
// cancels the receives that ran ahead of the sends, and the context side
// then refuses a Send of such a request as cancelled by its generation
// instance (KVXFER_ERR_PEER_CANCELLED; or, had its session ended another
// way, KVXFER_ERR_BAD_REQUEST, "already sent"); seen under load.
func TestCloseRacingOpens(t *testing.T) {
	base := HandleCount()
	p, d := open(t, "capi-race-p"), open(t, "capi-race-d")
	var closing atomic.Bool
	var opened [2]atomic.Int64
	done := make(chan error, 2)
	for k, e := range []*Engine{p, d} {
		go func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("race-%d", i)
				var err error
				if k == 0 {
					_, _, err = e.Send(SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: 32}})
				} else {
					_, _, err = e.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: 32, Context: "capi-race-p"}})
				}
				switch {
				case Code(err) == ErrClosed:
					done <- nil
					return
				case k == 0 && closing.Load() && (Code(err) == ErrPeerCancelled || Code(err) == ErrBadRequest && strings.Contains(err.Error(), "already sent")):
					continue
				case err != nil:
					done <- fmt.Errorf("open %s: %v (code %v)", id, err, Code(err))
					return
				}
				opened[k].Add(1)
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for opened[0].Load() < 20 || opened[1].Load() < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("opened %d sends and %d receives in 10 s", opened[0].Load(), opened[1].Load())
		}
		runtime.Gosched()
	}
	closing.Store(true)
	closeBoth(t, d, p) // the generation side first: its cancels reach a live context side
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}

// TestEngineConfigEnvFillsWhatJSONLeaves: KVXFER_WORKERS and
// KVXFER_BACKEND apply only where the JSON gives no value, an empty
// variable counts as unset, and a bad one is named.
func TestEngineConfigEnvFillsWhatJSONLeaves(t *testing.T) {
	t.Setenv("KVXFER_WORKERS", "3")
	t.Setenv("KVXFER_BACKEND", "shm")
	for _, c := range []struct {
		js      string
		workers int
		backend string
	}{
		{`{}`, 3, "shm"},
		{`{"workers":2}`, 2, "shm"},
		{`{"backend":"loopback"}`, 3, "loopback"},
		{`{"workers":5,"backend":"loopback"}`, 5, "loopback"},
	} {
		cfg, err := ParseConfig(c.js)
		if err != nil {
			t.Fatal(err)
		}
		kc, err := cfg.engineConfig()
		if err != nil || kc.Workers != c.workers || kc.Backend != c.backend {
			t.Errorf("%s: workers %d backend %q (%v), want %d %q", c.js, kc.Workers, kc.Backend, err, c.workers, c.backend)
		}
	}
	t.Setenv("KVXFER_WORKERS", "")
	t.Setenv("KVXFER_BACKEND", "")
	if kc, err := (Config{}).engineConfig(); err != nil || kc.Workers != 0 || kc.Backend != "" {
		t.Errorf("empty variables: workers %d backend %q (%v), want them unset", kc.Workers, kc.Backend, err)
	}
	t.Setenv("KVXFER_WORKERS", "zero")
	if _, err := (Config{}).engineConfig(); err == nil || !strings.Contains(err.Error(), `KVXFER_WORKERS = "zero"`) {
		t.Errorf("KVXFER_WORKERS=zero: %v, want it named", err)
	}
}

// TestNodeEnvFillsWhatJSONLeaves: a node's JSON gets the same treatment
// as an engine's (fillFromEnv): the variables fill unset fields only, and
// a worker count below 1 from the environment is named — by OpenNode,
// before anything opens.
func TestNodeEnvFillsWhatJSONLeaves(t *testing.T) {
	t.Setenv("KVXFER_WORKERS", "3")
	t.Setenv("KVXFER_BACKEND", "shm")
	for _, c := range []struct {
		cfg     node.Config
		workers int
		backend string
	}{
		{node.Config{}, 3, "shm"},
		{node.Config{Workers: 2, Backend: "ucx"}, 2, "ucx"},
	} {
		cfg := c.cfg
		if err := fillFromEnv(&cfg.Workers, &cfg.Backend); err != nil || cfg.Workers != c.workers || cfg.Backend != c.backend {
			t.Errorf("%+v: workers %d backend %q (%v), want %d %q", c.cfg, cfg.Workers, cfg.Backend, err, c.workers, c.backend)
		}
	}
	t.Setenv("KVXFER_WORKERS", "0")
	if _, _, err := OpenNode(`{"instance":"gen","model":"Llama-3.1-8B","insecure":true,"bind":"tcp://127.0.0.1:0"}`); Code(err) != ErrConfig ||
		!strings.Contains(err.Error(), `KVXFER_WORKERS = "0"`) {
		t.Errorf("OpenNode with KVXFER_WORKERS=0: %v, want a config error naming it", err)
	}
	if _, err := (Config{}).engineConfig(); Code(err) != ErrConfig || !strings.Contains(err.Error(), `KVXFER_WORKERS = "0"`) {
		t.Errorf("an engine's config with KVXFER_WORKERS=0: %v, want a config error naming it", err)
	}
}

// TestGCFloorEnvNamed: a KVXFER_GC_FLOOR the library cannot read fails an
// engine's and a node's open as a config error naming it.
func TestGCFloorEnvNamed(t *testing.T) {
	t.Setenv("KVXFER_GC_FLOOR", "lots")
	if _, err := (Config{}).engineConfig(); Code(err) != ErrConfig || !strings.Contains(err.Error(), `KVXFER_GC_FLOOR="lots"`) {
		t.Errorf("an engine's config with KVXFER_GC_FLOOR=lots: %v, want a config error naming it", err)
	}
	if _, _, err := OpenNode(`{"instance":"gen","model":"Llama-3.1-8B","insecure":true,"bind":"tcp://127.0.0.1:0"}`); Code(err) != ErrConfig ||
		!strings.Contains(err.Error(), `KVXFER_GC_FLOOR="lots"`) {
		t.Errorf("OpenNode with KVXFER_GC_FLOOR=lots: %v, want a config error naming it", err)
	}
}

// A request reports its outcome to the caller only once its event exists:
// Release (Blocks, Payload, FreeBlocks) says NOT_FINISHED until then, as
// the header promises, so that no event ever names a released handle.
// Each receive here is cancelled and released as soon as Release lets it;
// its event must then already be there to poll. (Checked to fail: with
// Outcome reading only the outcome, a Release succeeded while Poll still
// found nothing.)
func TestReleaseWaitsForTheEvent(t *testing.T) {
	base := HandleCount()
	d := open(t, "capi-early")
	evs := make([]Event, 4)
	for i := range 300 {
		rx, rh, err := d.Receive(ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: fmt.Sprintf("r%d", i), PromptLen: 32,
			Context: "capi-nobody"}})
		if err != nil {
			t.Fatal(err)
		}
		rx.Cancel()
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := rx.Release()
			if err == nil {
				break
			}
			if Code(err) != ErrNotFinished || time.Now().After(deadline) {
				t.Fatalf("release of %d: %v", rh, err)
			}
			runtime.Gosched()
		}
		n := d.Poll(evs, 0)
		if n != 1 || evs[0].Request != rh {
			t.Fatalf("receive %d: Release succeeded, then Poll found %v: its event did not exist yet", i, evs[:n])
		}
	}
	closeBoth(t, d)
	if n := HandleCount(); n != base {
		t.Fatalf("%d handles left, want %d", n, base)
	}
}
