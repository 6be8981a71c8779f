package trace_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/trace"
)

// smallLayout is a two-group layout (full + sliding window), as in the
// root package's tests.
func smallLayout() kvcache.Layout {
	return kvcache.Layout{Name: "test", Layers: 4, KVHeads: 4, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: []kvcache.LayerGroup{
			{Name: "full", Layers: []int{0, 2}},
			{Name: "swa", Layers: []int{1, 3}, Window: 40},
		}}
}

// cluster is a context instance and a generation instance in this
// process over an in-memory link and the loopback backend, traced.
type cluster struct {
	l        kvcache.Layout
	ctx, gen []*kvxfer.Engine
	ctxPar   kvcache.Parallel
	genPar   kvcache.Parallel
	closed   bool
	link     *tapLink
}

// tapLink is a MemLink that keeps the RequestData frames the context
// instance receives (a test forges answers to them) and lets a test
// deliver a frame to a peer as it is (MemLink does not encode it).
type tapLink struct {
	*control.MemLink
	mu  sync.Mutex
	rds map[string]*messages.RequestData
}

func (l *tapLink) Listen(self *messages.Hello, deliver func(messages.Frame)) (control.Listener, error) {
	if self.From.Instance != "ctx" {
		return l.MemLink.Listen(self, deliver)
	}
	return l.MemLink.Listen(self, func(f messages.Frame) {
		if rd, ok := f.(*messages.RequestData); ok {
			l.mu.Lock()
			l.rds[rd.RequestID] = rd
			l.mu.Unlock()
		}
		deliver(f)
	})
}

func (l *tapLink) requestData(id string) *messages.RequestData {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rds[id]
}

// startCluster starts the engines; each traces to its own file under dir
// (Config.TracePath) unless shared is set, which they all record into.
func startCluster(t *testing.T, ctxPar, genPar kvcache.Parallel, dir string, shared *trace.Writer) *cluster {
	t.Helper()
	link := &tapLink{MemLink: control.NewMemLink(), rds: map[string]*messages.RequestData{}}
	c := &cluster{l: smallLayout(), ctxPar: ctxPar, genPar: genPar, link: link}
	start := func(inst string, p kvcache.Parallel, i int) *kvxfer.Engine {
		cfg := kvxfer.Config{Instance: inst, Parallel: p, Rank: p.RankAt(i), Layout: &c.l, PoolBytes: 4 << 20,
			Workers: 2, Link: link, TransferTimeout: 20 * time.Second, DrainGrace: 200 * time.Millisecond}
		if shared != nil {
			cfg.Recorder = shared
		} else {
			cfg.TracePath = filepath.Join(dir, fmt.Sprintf("%s-%d.jsonl", inst, i))
		}
		e, err := kvxfer.Start(context.Background(), cfg)
		if err != nil {
			t.Fatalf("start %s rank %d: %v", inst, i, err)
		}
		return e
	}
	for i := 0; i < ctxPar.Size(); i++ {
		c.ctx = append(c.ctx, start("ctx", ctxPar, i))
	}
	for i := 0; i < genPar.Size(); i++ {
		c.gen = append(c.gen, start("gen", genPar, i))
	}
	t.Cleanup(func() { c.close(t) })
	return c
}

// close closes every engine, which flushes their traces.
func (c *cluster) close(t *testing.T) {
	t.Helper()
	if c.closed {
		return
	}
	c.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, e := range append(c.ctx, c.gen...) {
		if err := e.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	}
}

func wait(t *testing.T, ch <-chan kvxfer.Outcome) kvxfer.Outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(30 * time.Second):
		t.Fatal("no outcome within 30s")
	}
	return kvxfer.Outcome{}
}

// request is one request in flight on every rank of the cluster.
type request struct {
	c    *cluster
	id   string
	pl   int
	rxs  []*kvxfer.RxHandle
	txs  []*kvxfer.TxHandle
	srcs [][][]kvcache.BlockID
}

func (c *cluster) receive(t *testing.T, r *request) {
	t.Helper()
	for _, g := range c.gen {
		h, err := g.Receive(context.Background(), kvxfer.ReceiveRequest{ID: r.id, PromptLen: r.pl, Context: "ctx", ContextParallel: c.ctxPar})
		if err != nil {
			t.Fatalf("receive %s: %v", r.id, err)
		}
		r.rxs = append(r.rxs, h)
	}
}

func (c *cluster) send(t *testing.T, r *request) {
	t.Helper()
	for _, e := range c.ctx {
		counts := make([]int, len(c.l.Groups))
		for g := range counts {
			if len(e.Shape().Layers[g]) > 0 {
				counts[g] = c.l.BlocksFor(r.pl)
			}
		}
		src, err := e.Pools().Alloc(counts)
		if err != nil {
			t.Fatalf("alloc source: %v", err)
		}
		h, err := e.Send(context.Background(), kvxfer.SendRequest{ID: r.id, PromptLen: r.pl, Payload: []byte("tok")})
		if err != nil {
			t.Fatalf("send %s: %v", r.id, err)
		}
		r.srcs = append(r.srcs, src)
		r.txs = append(r.txs, h)
	}
}

// chunk hands chunk ch to every context rank with a fence each, and
// returns the fences.
func (c *cluster) chunk(t *testing.T, r *request, ch kvcache.Chunk) []*kvxfer.ManualFence {
	t.Helper()
	var fences []*kvxfer.ManualFence
	for i := range c.ctx {
		f := &kvxfer.ManualFence{}
		if err := r.txs[i].Chunk(ch, ch.Runs(c.l.TokensPerBlock, r.srcs[i]), f); err != nil {
			t.Fatalf("chunk %v: %v", ch, err)
		}
		fences = append(fences, f)
	}
	return fences
}

// finish waits for every outcome, frees every block and returns the
// outcomes' statuses ("tx:DONE", "rx:READY", …).
func (c *cluster) finish(t *testing.T, r *request) []string {
	t.Helper()
	var out []string
	for i, h := range r.txs {
		o := wait(t, h.Done())
		out = append(out, "tx:"+o.Status.String())
		if err := c.ctx[i].Pools().Free(r.srcs[i]); err != nil {
			t.Fatalf("free source: %v", err)
		}
	}
	for i, h := range r.rxs {
		o := wait(t, h.Done())
		out = append(out, "rx:"+o.Status.String())
		if o.OK {
			if err := c.gen[i].FreeBlocks(o.Blocks); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

// transfer moves one request in chunks; it must succeed everywhere.
func (c *cluster) transfer(t *testing.T, id string, pl, chunkTokens int, rxFirst bool) {
	t.Helper()
	r := &request{c: c, id: id, pl: pl}
	if rxFirst {
		c.receive(t, r)
	}
	c.send(t, r)
	if !rxFirst {
		c.receive(t, r)
	}
	chunks, err := kvcache.Chunks(pl, chunkTokens, c.l.TokensPerBlock)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chunks {
		for _, f := range c.chunk(t, r, ch) {
			f.Fire(nil)
		}
	}
	for _, s := range c.finish(t, r) {
		if s != "tx:DONE" && s != "rx:READY" {
			t.Fatalf("%s: %s", id, s)
		}
	}
}

// scenarios drives a mix of outcomes through a 1×1 cluster: successes in
// both orders, a cancel by the generation side while a fence is held, a
// failed fence, and a session the engine's Close cancels.
func scenarios(t *testing.T, c *cluster) (orphan *kvxfer.TxHandle) {
	t.Helper()
	for i, pl := range []int{100, 16, 64, 130} {
		c.transfer(t, fmt.Sprintf("ok-%d", i), pl, 32, i%2 == 0)
	}

	// Cancelled by the generation side while the first chunk's fence is
	// held: the context side acknowledges only after the fence fires.
	r := &request{c: c, id: "cancelled", pl: 96}
	c.receive(t, r)
	c.send(t, r)
	fences := c.chunk(t, r, kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0})
	r.rxs[0].Cancel()
	// The cancel and the fence race to the context side; both orders end
	// CANCELLED there, and both replay.
	for _, f := range fences {
		f.Fire(nil)
	}
	got := c.finish(t, r)
	if got[0] == "tx:DONE" || got[1] == "rx:READY" {
		t.Fatalf("cancelled: %v", got)
	}

	// A fence that fails, on the second chunk: both sides fail. The first
	// chunk's op is seen posted before the second fails, so the context
	// session holds its stream when it fails and drains it before its
	// FAILED Result (the path this part records). A RequestData that came
	// after the failure would be answered FAILED at once instead (by the
	// session, which lives until its parent poisons it).
	r = &request{c: c, id: "bad-fence", pl: 48}
	c.receive(t, r)
	c.send(t, r)
	posted := c.ctx[0].Stats().OpsPosted
	for _, f := range c.chunk(t, r, kvcache.Chunk{Start: 0, End: 32, FirstBlock: 0}) {
		f.Fire(nil)
	}
	checkFor(t, 10*time.Second, func() bool { return c.ctx[0].Stats().OpsPosted > posted })
	for _, f := range c.chunk(t, r, kvcache.Chunk{Start: 32, End: 48, FirstBlock: 2, Last: true}) {
		f.Fire(errors.New("prefill kernel failed"))
	}
	got = c.finish(t, r)
	if got[0] != "tx:FAILED" || got[1] != "rx:FAILED" {
		t.Fatalf("bad fence: %v", got)
	}

	// A writer's Result that fails validation (a status this version does
	// not know), forged here: the generation side fails at once and
	// frees the blocks only on the writer's CancelAck (the context side
	// never heard a Send for it: its session, waiting for one, ends
	// CANCELLED).
	if len(c.ctx) == 1 && len(c.gen) == 1 {
		r = &request{c: c, id: "unreadable", pl: 32}
		c.receive(t, r)
		checkFor(t, 10*time.Second, func() bool { return c.link.requestData(r.id) != nil })
		conn, err := c.link.Dial(c.gen[0].Hello().From)
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.Send(&messages.Result{RequestID: r.id, Epoch: c.link.requestData(r.id).Epoch,
			From: c.ctx[0].Hello().From, Status: 99}); err != nil {
			t.Fatal(err)
		}
		if got := c.finish(t, r); got[0] != "rx:FAILED" {
			t.Fatalf("unreadable: %v", got)
		}
		checkFor(t, 10*time.Second, func() bool { return c.gen[0].Pools().Used()+c.gen[0].Pools().Quarantined() == 0 })
	}

	// An orphan the engine's Close cancels.
	h, err := c.ctx[0].Send(context.Background(), kvxfer.SendRequest{ID: "orphan", PromptLen: 32})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// checkFor polls cond until it holds or d passes (integration tests only).
func checkFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(time.Millisecond)
	}
}

func replayFile(t *testing.T, path string) *trace.Result {
	t.Helper()
	res, err := trace.ReplayFile(path)
	if err != nil {
		t.Fatalf("replay %s: %v", path, err)
	}
	return res
}

func requireIdentical(t *testing.T, path string, res *trace.Result) {
	t.Helper()
	if !res.Identical() {
		var b strings.Builder
		res.Print(&b)
		t.Fatalf("replay of %s diverged:\n%s", path, b.String())
	}
	if res.Matched != res.Births+res.Steps || res.Steps == 0 {
		t.Fatalf("%s: %d births + %d steps, %d matched", path, res.Births, res.Steps, res.Matched)
	}
}

// recordScenarios records the scenarios on a 1×1 cluster and returns the
// two trace files (ctx, gen).
func recordScenarios(t *testing.T) (ctxTrace, genTrace string) {
	t.Helper()
	dir := t.TempDir()
	c := startCluster(t, kvcache.Parallel{TP: 1, PP: 1}, kvcache.Parallel{TP: 1, PP: 1}, dir, nil)
	orphan := scenarios(t, c)
	c.close(t)
	if o := wait(t, orphan.Done()); o.Status != actors.StatusCancelled || !errors.Is(o.Err, actors.ErrClosed) {
		t.Fatalf("orphan: %s %v", o.Status, o.Err)
	}
	return filepath.Join(dir, "ctx-0.jsonl"), filepath.Join(dir, "gen-0.jsonl")
}

// TestReplayInProcess records a real in-process run (two engines, memory
// link, loopback backend, every outcome kind) with Config.TracePath and
// replays both traces identically.
func TestReplayInProcess(t *testing.T) {
	ctxTrace, genTrace := recordScenarios(t)
	want := map[string]map[string]string{
		ctxTrace: {"ok-0": "DONE", "ok-1": "DONE", "ok-2": "DONE", "ok-3": "DONE", "cancelled": "CANCELLED", "bad-fence": "FAILED", "orphan": "CANCELLED",
			"unreadable": "CANCELLED"},
		genTrace: {"ok-0": "READY", "ok-1": "READY", "ok-2": "READY", "ok-3": "READY", "cancelled": "CANCELLED", "bad-fence": "FAILED",
			"unreadable": "FAILED"},
	}
	for _, path := range []string{ctxTrace, genTrace} {
		res := replayFile(t, path)
		requireIdentical(t, path, res)
		got := map[string]string{}
		for _, s := range res.Sessions {
			got[s.Request] = s.State
			if !s.Stopped {
				t.Errorf("%s: session %s %s did not stop", path, s.Side, s.Request)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want[path]) {
			t.Errorf("%s: final states %v, want %v", path, got, want[path])
		}
		var b strings.Builder
		res.Print(&b)
		t.Logf("%s: %d records, %d sessions, %d births + %d steps replayed identically\n%s",
			filepath.Base(path), res.Records, len(res.Sessions), res.Births, res.Steps, b.String())
	}
}

// TestReplaySharedWriter records six engines (TP2 → TP4) into one Writer
// passed as Config.Recorder and replays the one file identically.
func TestReplaySharedWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.jsonl")
	w, err := trace.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, kvcache.Parallel{TP: 2, PP: 1}, kvcache.Parallel{TP: 4, PP: 1}, "", w)
	for i, pl := range []int{100, 16, 130} {
		c.transfer(t, fmt.Sprintf("r%d", i), pl, 32, i%2 == 0)
	}
	c.close(t)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	res := replayFile(t, path)
	requireIdentical(t, path, res)
	// 3 requests × (2 ctx + 4 gen ranks).
	if res.Engines != 6 || len(res.Sessions) != 18 {
		t.Fatalf("%d engines, %d sessions; want 6 and 18", res.Engines, len(res.Sessions))
	}
	t.Logf("%d records, %d sessions on %d engines, %d births + %d steps replayed identically (writer: %+v)",
		res.Records, len(res.Sessions), res.Engines, res.Births, res.Steps, w.Stats())
}

// line is a trace line as a generic object, for corrupting it.
type line map[string]any

func readLines(t *testing.T, path string) []line {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []line
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		// Numbers stay text: times, epochs and hashes exceed float64's
		// 53 bits.
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.UseNumber()
		var l line
		if err := d.Decode(&l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

func writeLines(t *testing.T, path string, lines []line) {
	t.Helper()
	var b bytes.Buffer
	for _, l := range lines {
		j, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(j, '\n'))
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func seqOf(l line) int {
	if s, ok := l["seq"].(json.Number); ok {
		n, _ := s.Int64()
		return int(n)
	}
	return 0
}

// TestReplayFindsCorruption changes one record of a real trace at a time
// and checks that replay reports the divergence at that actor and
// sequence number, naming the field.
func TestReplayFindsCorruption(t *testing.T) {
	ctxTrace, genTrace := recordScenarios(t)
	type corruption struct {
		name  string
		path  string
		pick  func(l line) bool
		apply func(l line) line // nil: delete the record
		field string            // the divergence's field (prefix)
		// next: the divergence shows at the actor's next record.
		next bool
	}
	completion := func(l line) bool {
		return l["type"] == "TxCompleted" && l["msg"].(map[string]any)["Err"] == nil
	}
	cases := []corruption{
		{name: "completion error", path: ctxTrace, pick: completion, field: "state",
			apply: func(l line) line { l["msg"].(map[string]any)["Err"] = "injected: backend write failed"; return l }},
		{name: "result status", path: genTrace, field: "state",
			pick: func(l line) bool { return l["type"] == "RxFrame" && strings.Contains(fmt.Sprint(l["msg"]), "Status:1") },
			apply: func(l line) line {
				l["msg"].(map[string]any)["Frame"].(map[string]any)["Result"].(map[string]any)["Status"] = 2
				return l
			}},
		{name: "recorded digest", path: ctxTrace, pick: completion, field: "ops",
			apply: func(l line) line {
				post := l["post"].(map[string]any)
				post["ops"] = strings.ReplaceAll(post["ops"].(string), "D", "S")
				return l
			}},
		{name: "recorded effect", path: genTrace, field: "eff[0]",
			pick: func(l line) bool { return l["type"] == "RxBegin" },
			apply: func(l line) line {
				post := l["post"].(map[string]any)
				post["eff"].([]any)[0] = "StartTimer deadline at=1"
				return l
			}},
		{name: "hello layout hash", path: ctxTrace, field: "resolve err",
			pick: func(l line) bool { return l["type"] == "TxPeerRequest" },
			apply: func(l line) line {
				l["msg"].(map[string]any)["Hello"].(map[string]any)["LayoutHash"] = 12345
				return l
			}},
		{name: "deleted record", path: ctxTrace, pick: completion, apply: nil, field: "seq", next: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lines := readLines(t, tc.path)
			at := -1
			for i, l := range lines {
				if l["kind"] == "step" && tc.pick(l) {
					at = i
					break
				}
			}
			if at < 0 {
				t.Fatalf("no record to corrupt in %s", tc.path)
			}
			actor, seq := lines[at]["actor"].(string), seqOf(lines[at])
			if tc.apply != nil {
				lines[at] = tc.apply(lines[at])
			} else {
				lines = append(lines[:at], lines[at+1:]...)
				seq++ // the next record of the actor is the first out of sequence
			}
			bad := filepath.Join(t.TempDir(), "bad.jsonl")
			writeLines(t, bad, lines)
			res := replayFile(t, bad)
			d := res.Divergence
			if d == nil {
				t.Fatalf("replay of a corrupted trace found no divergence")
			}
			if d.Actor != actor || d.Seq != seq || !strings.HasPrefix(d.Field, tc.field) {
				t.Fatalf("divergence %v; want actor %s seq %d field %s", d, actor, seq, tc.field)
			}
			if res.Diverged != 1 {
				t.Errorf("%d sessions diverged, want 1", res.Diverged)
			}
			var b strings.Builder
			res.Print(&b)
			if !strings.Contains(b.String(), "DIVERGED") || !strings.Contains(b.String(), actor) {
				t.Errorf("printed result does not report the divergence:\n%s", b.String())
			}
			t.Logf("%s: %v", tc.name, d)
		})
	}
}

// TestReplayMalformed: a file that is not a trace is an error, not a
// divergence.
func TestReplayMalformed(t *testing.T) {
	for name, body := range map[string]string{
		"empty":      "",
		"not json":   "hello\n",
		"no header":  `{"kind":"step","actor":"a","seq":1,"t":1,"type":"TxStart"}` + "\n",
		"version":    `{"kind":"trace","version":99,"t":1}` + "\n",
		"orphan":     `{"kind":"trace","version":1,"t":1}` + "\n" + `{"kind":"step","actor":"a","seq":1,"t":1,"type":"TxStart"}` + "\n",
		"kind":       `{"kind":"trace","version":1,"t":1}` + "\n" + `{"kind":"mystery","t":1}` + "\n",
		"bad engine": `{"kind":"trace","version":1,"t":1}` + "\n" + `{"kind":"engine","engine":"x/0","t":1,"msg":[1]}` + "\n",
	} {
		_, err := trace.Replay(strings.NewReader(body))
		if !errors.Is(err, trace.ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
}

// TestReplayBadBirth: a session whose birth cannot be rebuilt diverges at
// its birth; the others still replay.
func TestReplayBadBirth(t *testing.T) {
	body := `{"kind":"trace","version":1,"t":1}
{"kind":"birth","actor":"a","engine":"e/0","side":"sideways","request":"r","t":1,"type":"TxConfig","msg":{},"post":{"state":"INIT"}}
{"kind":"step","actor":"a","seq":1,"t":2,"type":"TxCancel","msg":{},"post":{"state":"CANCELLED"}}
{"kind":"birth","actor":"b","engine":"e/0","side":"tx","request":"s","t":1,"type":"TxConfig","msg":{"Request":"s"},"post":{"state":"INIT"}}
`
	res, err := trace.Replay(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	d := res.Divergence
	if d == nil || d.Actor != "a" || d.Type != "birth" || d.Field != "birth" || res.Diverged != 1 || res.Matched != 1 {
		t.Fatalf("%+v %+v", res, d)
	}
}
