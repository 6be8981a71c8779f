package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/internal/demo"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmabench"
)

// DemoLoad runs the demo (both modes) with a probe on every step of every
// chunk and breaks each mode's time down: per chunk, fence → the session
// sees it → the worker posts → the copy starts (after the jobs queued
// ahead on the same endpoint) → the copy ends → the session learns it;
// per request, the last completion → flushed → the generation session
// gets the Result → READY; around it, the process's CPU (getrusage) and
// the memory traffic of the fills, copies and byte checks.
type DemoLoadResult struct {
	Options demo.Options
	Report  demo.Report
	Modes   []ModeLoad
	// Raw is the loopback backend alone at one chunk's size (one segment
	// per batch), measured before and after the demo in the same run
	// (rdmabench.Measure, alternating with Go's copy; medians).
	Raw []rdmabench.Result
	// ChunkBytes is one chunk's KV (group 0's blocks of ChunkTokens).
	ChunkBytes uint64
}

// RawBytesPerSec is the median of the raw loopback samples.
func (r DemoLoadResult) RawBytesPerSec() float64 {
	var xs []float64
	for _, x := range r.Raw {
		xs = append(xs, x.BytesPerSec)
	}
	if len(xs) == 0 {
		return 0
	}
	return rdmabench.Median(xs)
}

// ModeLoad is one mode's breakdown.
type ModeLoad struct {
	Mode string
	Wall time.Duration
	// CPU is user + system time of the process over the mode's window.
	User, Sys time.Duration
	// Busy time summed over the window: the CPU's writing of KV
	// (simulated prefill), the backend's copies, the demo's byte checks.
	Fill, Copy, Verify time.Duration
	// CopyAlone is the wall time during which a copy ran while no fill
	// and no check did; CopyShared while one of them also ran.
	CopyAlone, CopyShared time.Duration
	// Bytes moved by each (copies read and write theirs).
	FillBytes, CopyBytes, VerifyBytes uint64
	Endpoints                         int
	// Chunks: every chunk's stages. Last: each request's exposed path
	// (its last chunk's stages, then the finish).
	Chunks   []ChunkStages
	Requests []RequestStages
}

// ChunkStages are one chunk's stage durations (pipelined: measured from
// its fence).
type ChunkStages struct {
	Request string
	Chunk   int
	// FenceHop: the fence fired → the session stepped on it.
	FenceHop time.Duration
	// ToPost: the session → the worker posted the batch (session step,
	// mailbox hop to the worker, the worker's step).
	ToPost time.Duration
	// QueueOwn, QueueOther: posted → the copy started, behind this
	// request's earlier chunks and behind other requests' chunks on the
	// same endpoint (one copier goroutine per endpoint).
	QueueOwn, QueueOther time.Duration
	// Copy: the copy itself; Rate its bytes per second.
	Copy  time.Duration
	Bytes uint64
	// Back: the copy ended → the session stepped on TxCompleted (backend
	// callback → worker → session).
	Back time.Duration
}

// RequestStages is one request's exposed window (last fence → READY)
// split by stage.
type RequestStages struct {
	Request string
	Chunks  int
	Exposed time.Duration
	Last    ChunkStages
	// Flush: TxCompleted of the last op → TxFlushed (session → worker →
	// endpoint flush → worker → session); 0 where the backend's
	// completions prove delivery (rdma.Delivering: no flush).
	Flush time.Duration
	// ToResult: TxFlushed (or, with no flush, the last op's TxCompleted)
	// → the generation session stepped on the Result (session → worker →
	// control link → listener → session).
	ToResult time.Duration
	// ToReady: the Result → Receive's caller woke with READY.
	ToReady time.Duration
	// Admission: waiting for the generation side's room and source blocks
	// before the first chunk's prefill.
	Admission time.Duration
	Verify    time.Duration
}

// DemoLoad runs the demo with o (Probe and Started are set here, and whole
// chunks: LayerParts 1) and returns its report with the breakdown.
func DemoLoad(ctx context.Context, o demo.Options) (DemoLoadResult, error) {
	p := &demoProbe{geom: map[string]kvcache.PoolGeometry{}}
	o.Probe = p
	// The breakdown matches one op per chunk and stream: whole chunks.
	o.LayerParts = 1
	started := o.Started
	o.Started = func(mode string, ce, ge *kvxfer.Engine) {
		p.mu.Lock()
		p.geom[mode] = ce.Pools().Geometry(0)
		p.mu.Unlock()
		if started != nil {
			started(mode, ce, ge)
		}
	}
	res := DemoLoadResult{Options: o}
	l, err := kvcache.Preset(o.Model)
	if err != nil {
		return res, err
	}
	if o.TokensPerBlock > 0 {
		l.TokensPerBlock = o.TokensPerBlock
	}
	res.ChunkBytes = uint64(o.ChunkTokens/l.TokensPerBlock) * uint64(l.BlockBytes(0))
	raw := func() error {
		m, err := rdmabench.Measure("loopback", rdmabench.Shape{SegmentBytes: res.ChunkBytes, Segments: 1},
			rdmabench.Config{Rounds: 3, MinBytes: 16 * res.ChunkBytes})
		res.Raw = append(res.Raw, m)
		return err
	}
	if err := raw(); err != nil {
		return res, err
	}
	res.Report, err = demo.Run(ctx, o, nil)
	if err != nil {
		return res, err
	}
	if err := raw(); err != nil {
		return res, err
	}
	for _, row := range res.Report.Rows {
		res.Modes = append(res.Modes, p.analyse(row.Mode))
	}
	return res, nil
}

// ---- the probe ----

type recorded struct {
	actor string
	at    time.Time
	msg   any
}

type postRec struct {
	mode       string
	ep         int
	post, done time.Time
	bytes, src uint64 // src: the first segment's source offset
}

type modeCPU struct {
	start, end syscall.Rusage
}

type demoProbe struct {
	mu     sync.Mutex
	recs   []recorded
	marks  []demo.ProbeEvent
	posts  []*postRec
	eps    int
	rusage map[string]*modeCPU
	geom   map[string]kvcache.PoolGeometry // context pool group 0, by mode
}

var _ demo.Probe = (*demoProbe)(nil)

func (p *demoProbe) Record(actor string, msg any, at time.Time) {
	switch msg.(type) {
	case actors.TxChunk, actors.TxFenceFired, actors.TxSubmitted, actors.TxCompleted, actors.TxFlushed, actors.RxFrame:
	default:
		return
	}
	p.mu.Lock()
	p.recs = append(p.recs, recorded{actor, at, msg})
	p.mu.Unlock()
}

func (p *demoProbe) Mark(e demo.ProbeEvent) {
	var ru syscall.Rusage
	if e.Kind == demo.ProbeModeStart || e.Kind == demo.ProbeModeEnd {
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marks = append(p.marks, e)
	if p.rusage == nil {
		p.rusage = map[string]*modeCPU{}
	}
	switch e.Kind {
	case demo.ProbeModeStart:
		p.rusage[e.Mode] = &modeCPU{start: ru}
	case demo.ProbeModeEnd:
		if c := p.rusage[e.Mode]; c != nil {
			c.end = ru
		}
	}
}

func (p *demoProbe) Agent(mode string, a rdma.Agent) rdma.Agent {
	return &probeAgent{Agent: a, p: p, mode: mode}
}

// probeAgent observes each endpoint's posts and completions.
type probeAgent struct {
	rdma.Agent
	p    *demoProbe
	mode string
}

// CompletionsDeliver is the wrapped agent's (rdma.Delivering): the probe
// calls a batch's Done after the wrapped one's.
func (a *probeAgent) CompletionsDeliver() bool { return rdma.CompletionsDeliver(a.Agent) }

func (a *probeAgent) Connect(peer []byte) (rdma.Endpoint, error) {
	ep, err := a.Agent.Connect(peer)
	if err != nil {
		return nil, err
	}
	a.p.mu.Lock()
	a.p.eps++
	id := a.p.eps
	a.p.mu.Unlock()
	return &probeEndpoint{Endpoint: ep, a: a, id: id}, nil
}

type probeEndpoint struct {
	rdma.Endpoint
	a  *probeAgent
	id int
}

func (e *probeEndpoint) Post(b rdma.Batch) error {
	r := &postRec{mode: e.a.mode, ep: e.id}
	for _, s := range b.Segments {
		r.bytes += s.Len
	}
	if len(b.Segments) > 0 {
		r.src = b.Segments[0].Src
	}
	done := b.Done
	b.Done = func(err error) {
		r.done = time.Now()
		done(err)
	}
	r.post = time.Now()
	if err := e.Endpoint.Post(b); err != nil {
		return err
	}
	e.a.p.mu.Lock()
	e.a.p.posts = append(e.a.p.posts, r)
	e.a.p.mu.Unlock()
	return nil
}

// ---- analysis ----

type chunkTimes struct {
	fence, fenceSeen, submitted, completed time.Time
	post                                   *postRec
}

type reqTimes struct {
	chunks                                     []*chunkTimes
	admit, allocated, firstCompute             time.Time
	lastFence, flushed, result, ready, verify0 time.Time
	verify1                                    time.Time
}

func (p *demoProbe) analyse(mode string) ModeLoad {
	p.mu.Lock()
	defer p.mu.Unlock()
	ml := ModeLoad{Mode: mode}
	reqs := map[string]*reqTimes{}
	req := func(id string) *reqTimes {
		r := reqs[id]
		if r == nil {
			r = &reqTimes{}
			reqs[id] = r
		}
		return r
	}
	chunk := func(r *reqTimes, k int) *chunkTimes {
		for len(r.chunks) <= k {
			r.chunks = append(r.chunks, &chunkTimes{})
		}
		return r.chunks[k]
	}
	var t0, t1 time.Time
	var spans []busySpan
	computeAt := map[[2]any]time.Time{}
	for _, e := range p.marks {
		if e.Mode != mode {
			continue
		}
		switch e.Kind {
		case demo.ProbeModeStart:
			t0 = e.At
		case demo.ProbeModeEnd:
			t1 = e.At
		case demo.ProbeAdmit:
			req(e.Request).admit = e.At
		case demo.ProbeAllocated:
			req(e.Request).allocated = e.At
		case demo.ProbeCompute:
			computeAt[[2]any{e.Request, e.Chunk}] = e.At
			if r := req(e.Request); r.firstCompute.IsZero() {
				r.firstCompute = e.At
			}
		case demo.ProbeFilled:
			spans = append(spans, busySpan{computeAt[[2]any{e.Request, e.Chunk}], e.At, spanFill})
			ml.FillBytes += e.Bytes
		case demo.ProbeFence:
			r := req(e.Request)
			chunk(r, e.Chunk).fence = e.At
			r.lastFence = e.At
		case demo.ProbeReady:
			req(e.Request).ready = e.At
		case demo.ProbeVerify:
			req(e.Request).verify0 = e.At
		case demo.ProbeVerified:
			r := req(e.Request)
			r.verify1 = e.At
			spans = append(spans, busySpan{r.verify0, e.At, spanVerify})
			ml.VerifyBytes += e.Bytes
		}
	}
	if c := p.rusage[mode]; c != nil {
		ml.User = time.Duration(syscall.TimevalToNsec(c.end.Utime) - syscall.TimevalToNsec(c.start.Utime))
		ml.Sys = time.Duration(syscall.TimevalToNsec(c.end.Stime) - syscall.TimevalToNsec(c.start.Stime))
	}
	ml.Wall = t1.Sub(t0)
	// Session actor paths → requests, from the messages that name them.
	pathReq := map[string]string{}
	for _, r := range p.recs {
		switch m := r.msg.(type) {
		case actors.TxSubmitted:
			pathReq[r.actor] = m.Op.Request
		case actors.TxCompleted:
			pathReq[r.actor] = m.Op.Request
		}
	}
	for _, r := range p.recs {
		id, ok := pathReq[r.actor]
		switch m := r.msg.(type) {
		case actors.TxFenceFired:
			if ok && mode == modeOf(id) {
				chunk(req(id), m.Index).fenceSeen = r.at
			}
		case actors.TxSubmitted:
			if mode == modeOf(m.Op.Request) {
				chunk(req(m.Op.Request), m.Op.Seq).submitted = r.at
			}
		case actors.TxCompleted:
			if mode == modeOf(m.Op.Request) {
				chunk(req(m.Op.Request), m.Op.Seq).completed = r.at
			}
		case actors.TxFlushed:
			if ok && mode == modeOf(id) {
				req(id).flushed = r.at
			}
		case actors.RxFrame:
			if res, isRes := m.Frame.(*messages.Result); isRes && mode == modeOf(res.RequestID) {
				req(res.RequestID).result = r.at
			}
		}
	}
	// Match posts to chunks by the region offset of their first source
	// block: the chunk whose TxChunk named that block last before the post
	// (a block is reused only after its request freed it, after its ops).
	type handed struct {
		id string
		k  int
		at time.Time
	}
	geom := p.geom[mode]
	byOff := map[uint64][]handed{}
	seq := map[string]int{}
	for _, r := range p.recs {
		m, ok := r.msg.(actors.TxChunk)
		id, known := pathReq[r.actor]
		if !ok || !known || modeOf(id) != mode || len(m.Src) == 0 || len(m.Src[0].IDs) == 0 {
			continue
		}
		off := geom.Offset + uint64(m.Src[0].IDs[0])*geom.BlockBytes
		byOff[off] = append(byOff[off], handed{id, seq[r.actor], r.at})
		seq[r.actor]++
	}
	var posts []*postRec
	epSeen := map[int]bool{}
	for _, pr := range p.posts {
		if pr.mode == mode {
			posts = append(posts, pr)
			epSeen[pr.ep] = true
		}
	}
	ml.Endpoints = len(epSeen)
	sort.Slice(posts, func(a, b int) bool { return posts[a].post.Before(posts[b].post) })
	postOf := map[*postRec]handed{}
	for _, pr := range posts {
		var best *handed
		for i, h := range byOff[pr.src] {
			if !h.at.After(pr.post) {
				best = &byOff[pr.src][i]
			}
		}
		if best != nil {
			postOf[pr] = *best
			chunk(reqs[best.id], best.k).post = pr
		}
	}
	// Copy starts: per endpoint, a job starts when it is posted or when the
	// one before it ended, whichever is later.
	byEP := map[int][]*postRec{}
	for _, pr := range posts {
		byEP[pr.ep] = append(byEP[pr.ep], pr)
	}
	startOf := map[*postRec]time.Time{}
	for _, list := range byEP {
		var prev time.Time
		for _, pr := range list {
			st := pr.post
			if prev.After(st) {
				st = prev
			}
			startOf[pr] = st
			prev = pr.done
			spans = append(spans, busySpan{st, pr.done, spanCopy})
			ml.CopyBytes += pr.bytes
		}
	}
	stages := func(id string, k int, c *chunkTimes) (ChunkStages, bool) {
		s := ChunkStages{Request: id, Chunk: k}
		fence := c.fence
		if fence.IsZero() { // after prefill: every chunk's KV was written by the last fence
			fence = reqs[id].lastFence
		}
		if c.post == nil || fence.IsZero() || c.completed.IsZero() {
			return s, false
		}
		pr := c.post
		st := startOf[pr]
		if c.fenceSeen.IsZero() || pr.post.Before(c.fenceSeen) {
			// Handed over with its fence fired (after prefill): the
			// session posts on TxChunk.
			s.ToPost = pr.post.Sub(fence)
		} else {
			s.FenceHop = c.fenceSeen.Sub(fence)
			s.ToPost = pr.post.Sub(c.fenceSeen)
		}
		// Split the queueing by whose copies ran in [post, start].
		for _, q := range byEP[pr.ep] {
			if q == pr {
				break
			}
			a, b := maxTime(startOf[q], pr.post), minTime(q.done, st)
			if b.After(a) {
				if postOf[q].id == id {
					s.QueueOwn += b.Sub(a)
				} else {
					s.QueueOther += b.Sub(a)
				}
			}
		}
		s.Copy = pr.done.Sub(st)
		s.Bytes = pr.bytes
		s.Back = c.completed.Sub(pr.done)
		return s, true
	}
	ids := make([]string, 0, len(reqs))
	for id := range reqs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r := reqs[id]
		for k, c := range r.chunks {
			if s, ok := stages(id, k, c); ok {
				ml.Chunks = append(ml.Chunks, s)
			}
		}
		if len(r.chunks) == 0 {
			continue
		}
		last := len(r.chunks) - 1
		rs := RequestStages{Request: id, Chunks: len(r.chunks), Exposed: r.ready.Sub(r.lastFence),
			Admission: r.firstCompute.Sub(r.admit), Verify: r.verify1.Sub(r.verify0)}
		rs.Last, _ = stages(id, last, r.chunks[last])
		flushed := r.flushed
		if lc := r.chunks[last]; !lc.completed.IsZero() {
			if flushed.IsZero() {
				flushed = lc.completed // no flush: the completion proved delivery
			}
			rs.Flush = flushed.Sub(lc.completed)
		}
		rs.ToResult = r.result.Sub(flushed)
		rs.ToReady = r.ready.Sub(r.result)
		ml.Requests = append(ml.Requests, rs)
	}
	// Busy times and how copies overlapped the CPU's other memory work.
	for _, s := range spans {
		d := s.b.Sub(s.a)
		switch s.kind {
		case spanFill:
			ml.Fill += d
		case spanCopy:
			ml.Copy += d
		case spanVerify:
			ml.Verify += d
		}
	}
	ml.CopyAlone, ml.CopyShared = copyOverlap(spans)
	return ml
}

// busySpan is a stretch of memory-bound work: a fill, a copy or a check.
type busySpan struct {
	a, b time.Time
	kind int // spanFill, spanCopy, spanVerify
}

const (
	spanFill = iota
	spanCopy
	spanVerify
)

// copyOverlap sweeps spans: the wall time during which a copy ran and no
// other kind of span did, and during which a copy ran beside another kind.
func copyOverlap(spans []busySpan) (alone, shared time.Duration) {
	type ev struct {
		at    time.Time
		copy  bool
		delta int
	}
	var evs []ev
	for _, s := range spans {
		if !s.b.After(s.a) {
			continue
		}
		c := s.kind == spanCopy
		evs = append(evs, ev{s.a, c, 1}, ev{s.b, c, -1})
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	var copies, others int
	var prev time.Time
	for _, e := range evs {
		if copies > 0 {
			if others > 0 {
				shared += e.at.Sub(prev)
			} else {
				alone += e.at.Sub(prev)
			}
		}
		prev = e.at
		if e.copy {
			copies += e.delta
		} else {
			others += e.delta
		}
	}
	return alone, shared
}

func modeOf(id string) string {
	for i := len(id) - 1; i >= 0; i-- {
		if id[i] == '-' {
			return id[:i]
		}
	}
	return id
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// ---- printing ----

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// Print writes the breakdown tables.
func (r DemoLoadResult) Print(w io.Writer) {
	r.Report.Print(w)
	raw := r.RawBytesPerSec()
	oneChunk := time.Duration(float64(r.ChunkBytes) / raw * float64(time.Second))
	fmt.Fprintf(w, "\nraw loopback at %d MiB (one chunk), before and after: %s GB/s (median %.2f): one chunk %s ms\n",
		r.ChunkBytes>>20, rawList(r.Raw), raw/1e9, ms(oneChunk))
	if len(r.Report.Rows) > 0 {
		p := r.Report.Rows[0]
		fmt.Fprintf(w, "ratios: demo %s GB/s / raw %.2f; exposed p50 / one chunk %.2f; hidden %.1f%%\n",
			p.Mode, p.BytesPerSec/raw, float64(p.ExposedP50)/float64(oneChunk), p.Hidden*100)
	}
	for _, m := range r.Modes {
		fmt.Fprintf(w, "\n== %s: wall %s ms, CPU user %s + sys %s ms = %.2f of 2 CPUs, %d endpoints\n",
			m.Mode, ms(m.Wall), ms(m.User), ms(m.Sys), float64(m.User+m.Sys)/float64(m.Wall), m.Endpoints)
		gb := func(b uint64, d time.Duration) float64 { return float64(b) / d.Seconds() / 1e9 }
		fmt.Fprintf(w, "busy (summed over goroutines): fill %s ms (%.1f GB/s each), copy %s ms (%.1f GB/s each), verify %s ms (%.1f GB/s each)\n",
			ms(m.Fill), gb(m.FillBytes, m.Fill), ms(m.Copy), gb(m.CopyBytes, m.Copy), ms(m.Verify), gb(m.VerifyBytes, m.Verify))
		traffic := 2*m.FillBytes + 2*m.CopyBytes + m.VerifyBytes // stores write-allocate; copies read and write
		fmt.Fprintf(w, "memory traffic estimate: %.1f GB in the window = %.1f GB/s (fill 2x, copy 2x, verify 1x bytes); copy ran %s ms alone, %s ms beside a fill or check\n",
			float64(traffic)/1e9, gb(traffic, m.Wall), ms(m.CopyAlone), ms(m.CopyShared))
		col := func(name string, f func(ChunkStages) time.Duration, cs []ChunkStages) string {
			var ds []time.Duration
			for _, c := range cs {
				ds = append(ds, f(c))
			}
			if len(ds) == 0 {
				return ""
			}
			return fmt.Sprintf("%-34s %9s %9s %9s\n", name, ms(quantile(ds, 0.5)), ms(quantile(ds, 0.99)), ms(sum(ds)/time.Duration(len(ds))))
		}
		stageRows := func(cs []ChunkStages) string {
			return col("fence → session (hop)", func(c ChunkStages) time.Duration { return c.FenceHop }, cs) +
				col("session → posted (hop + worker)", func(c ChunkStages) time.Duration { return c.ToPost }, cs) +
				col("queued behind own earlier chunks", func(c ChunkStages) time.Duration { return c.QueueOwn }, cs) +
				col("queued behind other requests", func(c ChunkStages) time.Duration { return c.QueueOther }, cs) +
				col("copy", func(c ChunkStages) time.Duration { return c.Copy }, cs) +
				col("landed → session (2 hops)", func(c ChunkStages) time.Duration { return c.Back }, cs)
		}
		fmt.Fprintf(w, "\nevery chunk (%d), ms:                   p50       p99      mean\n", len(m.Chunks))
		fmt.Fprint(w, stageRows(m.Chunks))
		var last []ChunkStages
		var exp, fl, tr, rd, ad, vf []time.Duration
		for _, q := range m.Requests {
			last = append(last, q.Last)
			exp, fl, tr, rd = append(exp, q.Exposed), append(fl, q.Flush), append(tr, q.ToResult), append(rd, q.ToReady)
			ad, vf = append(ad, q.Admission), append(vf, q.Verify)
		}
		row := func(name string, ds []time.Duration) string {
			return fmt.Sprintf("%-34s %9s %9s %9s\n", name, ms(quantile(ds, 0.5)), ms(quantile(ds, 0.99)), ms(sum(ds)/time.Duration(max(len(ds), 1))))
		}
		fmt.Fprintf(w, "\nexposed window (last fence → READY), %d requests, ms: p50 p99 mean\n", len(m.Requests))
		fmt.Fprint(w, stageRows(last))
		fmt.Fprint(w, row("last completion → flushed", fl), row("flushed → Result at gen session", tr),
			row("Result → READY", rd), row("= exposed", exp), row("(admission wait, not exposed)", ad), row("(verify, after READY)", vf))
		fmt.Fprintf(w, "\nper request, ms:\n%-18s %6s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "request", "chunks", "exposed", "qown", "qother", "copy", "hops",
			"flush", "result", "ready", "admit")
		rs := slices.Clone(m.Requests)
		sort.Slice(rs, func(a, b int) bool { return rs[a].Chunks < rs[b].Chunks })
		for _, q := range rs {
			l := q.Last
			fmt.Fprintf(w, "%-18s %6d %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", q.Request, q.Chunks, ms(q.Exposed), ms(l.QueueOwn), ms(l.QueueOther),
				ms(l.Copy), ms(l.FenceHop+l.ToPost+l.Back), ms(q.Flush), ms(q.ToResult), ms(q.ToReady), ms(q.Admission))
		}
	}
}

func rawList(rs []rdmabench.Result) string {
	var b []byte
	for i, r := range rs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = fmt.Appendf(b, "%.2f", r.BytesPerSec/1e9)
	}
	return string(b)
}

func sum(ds []time.Duration) time.Duration {
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s
}
