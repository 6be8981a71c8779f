package kvxfer_test

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// scrapeClient keeps no connection alive, so that no transport goroutine
// outlives a test (goleak).
var scrapeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// samples are one scrape: value by series key, the key being the name and
// the labels but engine, sorted ("kvxfer_sessions{side=tx,state=READY}").
type samples map[string]float64

var labelPair = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// scrape GETs /metrics from e over HTTP and checks that every kvxfer
// series carries e's engine label.
func scrape(t *testing.T, e *kvxfer.Engine, engine string) samples {
	t.Helper()
	resp, err := scrapeClient.Get("http://" + e.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", engine, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: status %d", engine, resp.StatusCode)
	}
	out := samples{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		series, val := line[:sp], line[sp+1:]
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			t.Fatalf("scrape %s: %q: %v", engine, line, err)
		}
		name, labels := series, ""
		if i := strings.IndexByte(series, '{'); i >= 0 {
			name, labels = series[:i], series[i:]
		}
		var kv []string
		eng := ""
		for _, m := range labelPair.FindAllStringSubmatch(labels, -1) {
			if m[1] == "engine" {
				eng = m[2]
				continue
			}
			kv = append(kv, m[1]+"="+m[2])
		}
		if strings.HasPrefix(name, "kvxfer_") && eng != engine {
			t.Fatalf("scrape %s: %q has engine %q", engine, line, eng)
		}
		sort.Strings(kv)
		out[name+"{"+strings.Join(kv, ",")+"}"] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// get is the value of name with the label pairs kv (name, value, …); a
// missing series fails the test.
func (s samples) get(t *testing.T, name string, kv ...string) float64 {
	t.Helper()
	var pairs []string
	for i := 0; i+1 < len(kv); i += 2 {
		pairs = append(pairs, kv[i]+"="+kv[i+1])
	}
	sort.Strings(pairs)
	key := name + "{" + strings.Join(pairs, ",") + "}"
	v, ok := s[key]
	if !ok {
		t.Fatalf("no series %s", key)
	}
	return v
}

// sum adds every series of name.
func (s samples) sum(name string) float64 {
	n := 0.0
	for k, v := range s {
		if strings.HasPrefix(k, name+"{") {
			n += v
		}
	}
	return n
}

// metricsPair starts a context and a generation engine (TP1 each) with
// metrics on free ports of 127.0.0.1.
func metricsPair(t *testing.T, l kvcache.Layout) *cluster {
	t.Helper()
	one := kvcache.Parallel{TP: 1, PP: 1}
	c := &cluster{link: control.NewMemLink(), ctxPar: one, genPar: one}
	for _, inst := range []string{"ctx", "gen"} {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 4 << 20,
			Workers: 2, Link: c.link, TransferTimeout: 20 * time.Second, MetricsAddr: "127.0.0.1:0"})
		if err != nil {
			t.Fatalf("start %s: %v", inst, err)
		}
		if e.MetricsAddr() == "" || strings.HasSuffix(e.MetricsAddr(), ":0") {
			t.Fatalf("%s: MetricsAddr %q is not a bound address", inst, e.MetricsAddr())
		}
		if inst == "ctx" {
			c.ctx = append(c.ctx, e)
		} else {
			c.gen = append(c.gen, e)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, e := range append(c.ctx, c.gen...) {
			if err := e.Close(ctx); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})
	return c
}

// flight is one request between the pair, every chunk handed over with a
// fence that has not fired yet.
type flight struct {
	c      *cluster
	tx     *kvxfer.TxHandle
	rx     *kvxfer.RxHandle
	src    [][]kvcache.BlockID
	fences []*kvxfer.ManualFence
	chunks int
}

func begin(t *testing.T, c *cluster, l kvcache.Layout, id string, promptLen, chunkTokens int) *flight {
	t.Helper()
	f := &flight{c: c}
	var err error
	if f.rx, err = c.gen[0].Receive(context.Background(), kvxfer.ReceiveRequest{ID: id, PromptLen: promptLen, Context: "ctx"}); err != nil {
		t.Fatal(err)
	}
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = l.BlocksFor(promptLen)
	}
	if f.src, err = c.ctx[0].Pools().Alloc(counts); err != nil {
		t.Fatal(err)
	}
	if f.tx, err = c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: id, PromptLen: promptLen}); err != nil {
		t.Fatal(err)
	}
	chunks, err := kvcache.Chunks(promptLen, chunkTokens, l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chunks {
		runs := ch.Runs(l.TokensPerBlock, f.src)
		fence := &kvxfer.ManualFence{}
		if err := f.tx.Chunk(ch, runs, fence); err != nil {
			t.Fatal(err)
		}
		f.fences = append(f.fences, fence)
	}
	f.chunks = len(chunks)
	return f
}

func (f *flight) fire() {
	for _, fence := range f.fences {
		fence.Fire(nil)
	}
}

// wait returns both outcomes and frees what the request held.
func (f *flight) wait(t *testing.T) (tx, rx kvxfer.Outcome) {
	t.Helper()
	tx, rx = waitOutcome(t, f.tx.Done()), waitOutcome(t, f.rx.Done())
	if err := f.c.ctx[0].Pools().Free(f.src); err != nil {
		t.Fatal(err)
	}
	if rx.OK {
		if err := f.c.gen[0].FreeBlocks(rx.Blocks); err != nil {
			t.Fatal(err)
		}
	}
	return tx, rx
}

// eventually polls cond until it holds (the gauges of a session that just
// stopped may trail its handle by a message).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}

// TestMetrics_Transfer scrapes both engines over HTTP before, during and
// after one transfer: bytes on both sides move by the outcome's bytes, one
// duration per side with its outcome, one chunk-to-write latency per op,
// sessions and ops by state while the fences are held and back to zero
// after, pinned blocks while held.
func TestMetrics_Transfer(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	ce, ge := c.ctx[0], c.gen[0]
	c0, g0 := scrape(t, ce, "ctx/0"), scrape(t, ge, "gen/0")
	for _, s := range []samples{c0, g0} {
		if n := s.sum("kvxfer_sessions") + s.sum("kvxfer_ops") + s.get(t, "kvxfer_ops_in_doubt"); n != 0 {
			t.Fatalf("an idle engine has %v sessions and ops", n)
		}
	}

	f := begin(t, c, l, "m1", 100, 32)
	eventually(t, "sessions and ops while the fences are held", func() bool {
		cs, gs := scrape(t, ce, "ctx/0"), scrape(t, ge, "gen/0")
		return cs.get(t, "kvxfer_sessions", "side", "tx", "state", "READY") == 1 &&
			cs.get(t, "kvxfer_ops", "state", "ADMITTED") == float64(f.chunks) &&
			cs.get(t, "kvxfer_pool_blocks", "group", "full", "state", "pinned") == float64(l.BlocksFor(100)) &&
			gs.get(t, "kvxfer_sessions", "side", "rx", "state", "RECEIVING") == 1
	})
	f.fire()
	tx, rx := f.wait(t)
	if !tx.OK || !rx.OK {
		t.Fatalf("outcomes %s %v / %s %v", tx.Status, tx.Err, rx.Status, rx.Err)
	}
	if tx.Bytes == 0 || rx.Bytes != tx.Bytes {
		t.Fatalf("outcome bytes tx %d rx %d", tx.Bytes, rx.Bytes)
	}
	var c1, g1 samples
	eventually(t, "sessions back to zero", func() bool {
		c1, g1 = scrape(t, ce, "ctx/0"), scrape(t, ge, "gen/0")
		return c1.sum("kvxfer_sessions")+c1.sum("kvxfer_ops")+g1.sum("kvxfer_sessions") == 0
	})
	delta := func(s1, s0 samples, name string, kv ...string) float64 {
		return s1.get(t, name, kv...) - s0.get(t, name, kv...)
	}
	for _, chk := range []struct {
		what      string
		got, want float64
	}{
		{"tx bytes", delta(c1, c0, "kvxfer_bytes_transferred_total", "side", "tx"), float64(tx.Bytes)},
		{"rx bytes", delta(g1, g0, "kvxfer_bytes_transferred_total", "side", "rx"), float64(rx.Bytes)},
		{"tx DONE durations", delta(c1, c0, "kvxfer_transfer_duration_seconds_count", "side", "tx", "outcome", "DONE"), 1},
		{"rx READY durations", delta(g1, g0, "kvxfer_transfer_duration_seconds_count", "side", "rx", "outcome", "READY"), 1},
		{"chunk writes", delta(c1, c0, "kvxfer_chunk_write_latency_seconds_count"), float64(f.chunks)},
		{"ops posted", delta(c1, c0, "kvxfer_ops_posted_total"), float64(f.chunks)},
		{"tx failures", c1.sum("kvxfer_failures_total") - c0.sum("kvxfer_failures_total"), 0},
		{"rx failures", g1.sum("kvxfer_failures_total") - g0.sum("kvxfer_failures_total"), 0},
		{"pinned after", c1.get(t, "kvxfer_pool_blocks", "group", "full", "state", "pinned"), 0},
		{"worker restarts", c1.get(t, "kvxfer_worker_restarts_total"), 0},
	} {
		if chk.got != chk.want {
			t.Errorf("%s moved by %v, want %v", chk.what, chk.got, chk.want)
		}
	}
	if d := c1.get(t, "kvxfer_transfer_duration_seconds_sum", "side", "tx", "outcome", "DONE"); d <= 0 {
		t.Errorf("tx duration sum %v", d)
	}
	checkNoLeaks(t, c)
}

// TestMetrics_Failures: a cancel on either side moves the failures of both
// sides with their reasons (and the durations with the outcome); an
// invalid frame and a heartbeat miss are counted.
func TestMetrics_Failures(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	ce, ge := c.ctx[0], c.gen[0]
	c0, g0 := scrape(t, ce, "ctx/0"), scrape(t, ge, "gen/0")

	// ready waits until the context side holds the request's stream.
	ready := func() {
		eventually(t, "the context side has the request", func() bool {
			return scrape(t, ce, "ctx/0").get(t, "kvxfer_sessions", "side", "tx", "state", "READY") == 1
		})
	}
	// The context side cancels: its failure is "cancelled", the
	// generation side's is the writer's CANCELLED result,
	// "peer_cancelled".
	f := begin(t, c, l, "c1", 100, 32)
	ready()
	f.tx.Cancel()
	f.fire()
	tx, rx := f.wait(t)
	if tx.Status != kvxfer.StatusCancelled || rx.Status != kvxfer.StatusCancelled || !errors.Is(rx.Err, kvxfer.ErrPeerCancelled) {
		t.Fatalf("outcomes %s %v / %s %v, want both CANCELLED, the generation side's ErrPeerCancelled", tx.Status, tx.Err, rx.Status, rx.Err)
	}
	// The generation side cancels: "cancelled" there, "peer_cancelled" on
	// the context side.
	f = begin(t, c, l, "c2", 100, 32)
	ready()
	f.rx.Cancel()
	eventually(t, "the context side heard the cancel", func() bool {
		return scrape(t, ce, "ctx/0").get(t, "kvxfer_failures_total", "side", "tx", "reason", "peer_cancelled") == 1
	})
	f.fire()
	if tx, rx = f.wait(t); tx.Status != kvxfer.StatusCancelled || rx.Status != kvxfer.StatusCancelled {
		t.Fatalf("outcomes %s %v / %s %v", tx.Status, tx.Err, rx.Status, rx.Err)
	}

	// An invalid frame is rejected at the listener; a peer declared down
	// is a heartbeat miss.
	conn, err := c.link.Dial(messages.PeerID{Instance: "ctx", Rank: 0})
	if err != nil {
		t.Fatal(err)
	}
	bad := &messages.RequestData{RequestID: "neg", Epoch: 1, From: messages.PeerID{Instance: "evil"},
		GenParallel: messages.Parallel{TP: 1, PP: 1}, PromptLen: 32, Groups: []messages.GroupDest{{Blocks: []int32{-5}}, {Blocks: []int32{-5}}}}
	if err := conn.Send(bad); err != nil {
		t.Fatal(err)
	}
	ce.PeerDown(messages.PeerID{Instance: "gen", Rank: 0})

	var c1, g1 samples
	eventually(t, "failures, rejections and misses counted", func() bool {
		c1, g1 = scrape(t, ce, "ctx/0"), scrape(t, ge, "gen/0")
		return c1.get(t, "kvxfer_frames_rejected_total", "reason", "invalid") == c0.get(t, "kvxfer_frames_rejected_total", "reason", "invalid")+1 &&
			c1.sum("kvxfer_sessions")+g1.sum("kvxfer_sessions") == 0
	})
	for _, chk := range []struct {
		what      string
		got, want float64
	}{
		{"tx cancelled", c1.get(t, "kvxfer_failures_total", "side", "tx", "reason", "cancelled") - c0.get(t, "kvxfer_failures_total", "side", "tx", "reason", "cancelled"), 1},
		{"tx peer_cancelled", c1.get(t, "kvxfer_failures_total", "side", "tx", "reason", "peer_cancelled") - c0.get(t, "kvxfer_failures_total", "side", "tx", "reason", "peer_cancelled"), 1},
		{"rx cancelled", g1.get(t, "kvxfer_failures_total", "side", "rx", "reason", "cancelled") - g0.get(t, "kvxfer_failures_total", "side", "rx", "reason", "cancelled"), 1},
		{"rx peer_cancelled", g1.get(t, "kvxfer_failures_total", "side", "rx", "reason", "peer_cancelled") - g0.get(t, "kvxfer_failures_total", "side", "rx", "reason", "peer_cancelled"), 1},
		{"tx failures", c1.sum("kvxfer_failures_total") - c0.sum("kvxfer_failures_total"), 2},
		{"rx failures", g1.sum("kvxfer_failures_total") - g0.sum("kvxfer_failures_total"), 2},
		{"tx CANCELLED durations", c1.get(t, "kvxfer_transfer_duration_seconds_count", "side", "tx", "outcome", "CANCELLED"), 2},
		{"heartbeat misses", c1.get(t, "kvxfer_heartbeat_misses_total", "peer", "gen/0"), 1},
		{"ops after", c1.sum("kvxfer_ops"), 0},
	} {
		if chk.got != chk.want {
			t.Errorf("%s: %v, want %v", chk.what, chk.got, chk.want)
		}
	}
	checkNoLeaks(t, c)
}

// TestMetrics_Off: with MetricsAddr empty there is no set and no server.
func TestMetrics_Off(t *testing.T) {
	l := smallLayout()
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "quiet", Layout: &l, PoolBytes: 1 << 20, Link: control.NewMemLink()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	if e.MetricsAddr() != "" || e.Metrics() != nil {
		t.Fatalf("metrics on without MetricsAddr: %q", e.MetricsAddr())
	}
}

// TestMetrics_ServerLifetime: a malformed address is a config error, a
// busy one fails Start without leaking, and Close stops the server.
func TestMetrics_ServerLifetime(t *testing.T) {
	l := smallLayout()
	link := control.NewMemLink()
	_, err := kvxfer.Start(context.Background(), kvxfer.Config{Layout: &l, MetricsAddr: "no-port", Link: link})
	if !errors.Is(err, kvxfer.ErrConfig) || !strings.Contains(err.Error(), "no-port") {
		t.Fatalf("malformed MetricsAddr: %v", err)
	}
	e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "a", Layout: &l, PoolBytes: 1 << 20, Link: link, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	addr := e.MetricsAddr()
	if _, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: "b", Layout: &l, PoolBytes: 1 << 20, Link: link, MetricsAddr: addr}); err == nil {
		t.Fatalf("a second engine bound %s", addr)
	}
	scrape(t, e, "a/0")
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if resp, err := scrapeClient.Get("http://" + addr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatal("metrics still served after Close")
	}
}

// TestMetrics_QueuedTimeout: a request that times out while it waits for
// destination blocks (it never gets a session) still counts its failure
// and its duration.
func TestMetrics_QueuedTimeout(t *testing.T) {
	l := smallLayout()
	c := metricsPair(t, l)
	ge := c.gen[0]
	held := holdFreeBlocks(t, ge)
	rx, err := ge.Receive(context.Background(), kvxfer.ReceiveRequest{ID: "q1", PromptLen: 64, Context: "ctx", Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, rx.Done()); o.Status != kvxfer.StatusTimedOut {
		t.Fatalf("outcome %s %v", o.Status, o.Err)
	}
	if err := ge.Pools().Free(held); err != nil {
		t.Fatal(err)
	}
	s := scrape(t, ge, "gen/0")
	if n := s.get(t, "kvxfer_failures_total", "side", "rx", "reason", "timeout"); n != 1 {
		t.Errorf("failures{rx,timeout} = %v", n)
	}
	if n := s.get(t, "kvxfer_transfer_duration_seconds_count", "side", "rx", "outcome", "TIMED_OUT"); n != 1 {
		t.Errorf("TIMED_OUT durations = %v", n)
	}
	if d := s.get(t, "kvxfer_transfer_duration_seconds_sum", "side", "rx", "outcome", "TIMED_OUT"); d < 0.015 {
		t.Errorf("TIMED_OUT duration %vs, want ≥ the 20ms it waited", d)
	}
	if n := s.sum("kvxfer_sessions"); n != 0 {
		t.Errorf("sessions %v", n)
	}
}
