package sim

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Config is one simulation run.
type Config struct {
	// Seed determines everything: topology, workload, faults, timings.
	Seed uint64
	// Trace records every message delivered to every actor.
	Trace bool
	// MaxEvents bounds the run (0: a default); hitting it is a failure.
	MaxEvents int
	// SuspectPartitions lets the failure detector declare a partitioned
	// (alive) peer dead, as heartbeats cannot tell the two apart: each
	// side of a long partition hears Engine.PeerDown for the other.
	SuspectPartitions bool
	// CtxWorkerStops lets FaultWorkerDead stop a context rank's worker
	// too (otherwise only generation ranks' workers stop): TestCtxWorkerStop
	// sets it, TestSeeds with -ctx-worker-stops.
	CtxWorkerStops bool
}

// Failure is the first invariant a run broke.
type Failure struct {
	Seed  uint64
	At    time.Duration // virtual time
	Actor string
	Msg   string
}

func (f *Failure) Error() string {
	return fmt.Sprintf("seed %d at %v (%s): %s", f.Seed, f.At, f.Actor, f.Msg)
}

// Result is what one run reports.
type Result struct {
	Seed    uint64
	Failure *Failure
	// Faults[k] counts how often fault kind k fired; Races[r] how often
	// race r was reached.
	Faults [numFaults]int
	Races  [numRaces]int
	// Events is the number of messages delivered.
	Events int
	// Ready, Failed count generation sessions by outcome; TxDone counts
	// context sessions that ended DONE.
	Ready, NotReady, TxDone, TxNotDone int
	// Parts counts the layer parts (not whole chunks) sessions took;
	// ReadyParted the generation sessions READY (every byte checked) for
	// requests some of whose chunks left in several parts.
	Parts, ReadyParted int
	// InvalidFailed counts the live generation sessions a writer's
	// invalid Result decided (FAILED, proving nothing).
	InvalidFailed int
	// MisaddressedAnswered counts the Misaddressed a context rank sent
	// (a RequestData addressed to an earlier incarnation of it, answered
	// as txParent.onMisaddressed does); MisaddressedTaken the ones a
	// generation session took (its Readdress effect); QueuedToNext the
	// frames sent to a context rank while it was down that its next
	// incarnation got (a DEALER's queue, flushed when it reconnects).
	MisaddressedAnswered, MisaddressedTaken, QueuedToNext int
	// CancelsOvertook counts the Cancels that reached a context rank
	// while a RequestData of the same request and epoch, sent before them,
	// was still on its way (another connection: FaultConnRemade,
	// FaultWorkerDead).
	CancelsOvertook int
	// EarlyAnswers counts, per kind of answer (earlyAnswer), the writers'
	// answers a generation session took before its worker's report that
	// the RequestData left (FaultSentLate).
	EarlyAnswers [numEarly]int
	// WrongChunks[w] counts the wrong chunks of kind w that
	// kvcache.ChunkOrder refused.
	WrongChunks [numWrongChunks]int
	// Trace holds the delivered messages when Config.Trace is set.
	Trace []TraceRecord
}

// Summary is a one-line description of the run.
func (r *Result) Summary() string {
	return fmt.Sprintf("seed %d: %d events, gen READY %d / other %d, ctx DONE %d / other %d",
		r.Seed, r.Events, r.Ready, r.NotReady, r.TxDone, r.TxNotDone)
}

// TraceRecord is one delivered message: JSON lines of these are a run's
// trace (DESIGN.md §8).
type TraceRecord struct {
	T     int64  `json:"t_ns"` // virtual time
	Actor string `json:"actor"`
	Seq   int    `json:"seq"` // per-actor sequence number
	Type  string `json:"type"`
	Msg   string `json:"msg"`
}

// epoch0 is virtual time zero on every rank's wall clock (before jumps).
var epoch0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

type event struct {
	at    time.Duration
	seq   uint64
	actor string
	msg   any
	fn    func()
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

type fifoKey struct{ from, to string }

// Sim is one deterministic run: one goroutine, one queue ordered by
// virtual time then sequence number, and the real step functions of every
// session of a context and a generation instance.
type Sim struct {
	// regions are every rank incarnation's pool region, closed when Run
	// ends.
	regions []*kvcache.Region
	cfg     Config
	r       *rand.Rand
	// pr draws how chunks are split into layer parts (world.go drawParts):
	// a stream of its own, so that a seed whose chunks all leave whole
	// runs as it did before chunks could leave in parts.
	pr *rand.Rand
	// or draws the wrong chunks a serving process tries before the right
	// one (chunk_order.go): a stream of its own, so that no other draw
	// moves.
	or *rand.Rand
	// cr draws the control connections' faults and the workers that
	// restart or stop for them (conn.go, worker_stop.go), and the
	// generation side's worker panics: a stream of its own, so that a
	// seed draws its other faults as before they existed.
	cr *rand.Rand
	// sr draws the pipeline stages' split of the layers (world.go
	// drawStages): a stream of its own, so that no other draw moves.
	sr *rand.Rand
	// ur draws the serving processes that hand their chunks unpinned
	// (ctxApp.unpinned): a stream of its own, so that no other draw of a
	// seed whose chunks all leave pinned moves.
	ur *rand.Rand
	// hr draws the backend's batches that hang (FaultHungBatch): a
	// stream of its own, so that no other draw moves.
	hr *rand.Rand
	// xr draws the endpoint closes that prove nothing
	// (FaultCloseUnproven) and what follows them: a stream of its own, so
	// that no other draw of a seed without them moves.
	xr *rand.Rand
	// rr draws which of those closes prove the cut writes' sources
	// released (FaultCloseSourcesReleased): a stream of its own, so that
	// no other draw of a seed moves.
	rr *rand.Rand
	// mr draws what a context rank's restart does to the frames sent to
	// it while it is down (linkSend) and when the proof of the dead
	// incarnation's exit comes (kill): a stream of its own, so that no
	// other draw moves.
	mr *rand.Rand
	// lr draws the generation workers' late reports that a RequestData
	// left (FaultSentLate, gen.go sentLate): a stream of its own, so that
	// no other draw moves.
	lr *rand.Rand
	// fr draws the RequestData the control plane refuses for good
	// (FaultFrameRefused, linkSend); dr the downs of exited incarnations
	// (FaultIncarnationDown, chaos.go incarnationDown): streams of their
	// own, so that no other draw of a seed without them moves.
	fr, dr *rand.Rand
	// yr draws the SUCCESS Results the control plane refuses for good
	// (FaultResultRefused, linkSend): a stream of its own, so that no
	// other draw of a seed without them moves.
	yr *rand.Rand
	// wr draws the workers' connection closes on a Down
	// (FaultDownClosesConn, downCloseConns): a stream of its own.
	wr      *rand.Rand
	vt      time.Duration
	seq     uint64
	q       eventHeap
	fifo    map[fifoKey]time.Duration
	res     *Result
	fail    *Failure
	current string // actor being stepped (for failures)

	actorSeq map[string]int

	faults plan

	layout     kvcache.Layout
	layoutHash uint64
	ctxPar     kvcache.Parallel
	genPar     kvcache.Parallel
	pm         *kvcache.PeerMap
	ctx        []*ctxRank
	gen        []*genRank
	reqs       []*request
	ctxW, genW int
	drainGrace time.Duration
	// cancelResend is RxConfig.CancelResend.
	cancelResend time.Duration
	orphan       time.Duration

	links connTable // the control connections (conn.go)
	// admitted holds the RequestData each context incarnation's listener
	// admitted (admitKey): what that incarnation may have acted on
	// (noteMisaddressed).
	admitted    map[admitKey]bool
	bogusFrames []*messages.RequestData
	batches     []*batch // posted, not yet landed or dropped
	frameSeq    uint64
	bogus       int
	lastStart   time.Duration
	activeEnd   time.Duration // when the last transfer should be over
	calm        bool          // no faults: every request must succeed
}

// Run executes one seed and checks every invariant along the way.
func Run(cfg Config) *Result {
	if cfg.MaxEvents == 0 {
		cfg.MaxEvents = 400_000
	}
	s := &Sim{
		cfg:      cfg,
		r:        rand.New(rand.NewPCG(cfg.Seed, 0x6b767866657200)),
		pr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b767870617274)),
		or:       rand.New(rand.NewPCG(cfg.Seed, 0x6b76786f726472)),
		cr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b7678636f6e6e)),
		sr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b767873746773)),
		ur:       rand.New(rand.NewPCG(cfg.Seed, 0x6b767870696e73)),
		hr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b767868756e67)),
		xr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b7678756e7072)),
		rr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b767872656c73)),
		mr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b76786d697361)),
		lr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b7678736e746c)),
		fr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b767866726d72)),
		dr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b7678696e6364)),
		yr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b767873726672)),
		wr:       rand.New(rand.NewPCG(cfg.Seed, 0x6b7678646e636c)),
		fifo:     map[fifoKey]time.Duration{},
		links:    newConnTable(),
		admitted: map[admitKey]bool{},
		res:      &Result{Seed: cfg.Seed},
	}
	if cfg.Trace {
		s.actorSeq = map[string]int{}
	}
	s.setup()
	for s.fail == nil && len(s.q) > 0 {
		if s.res.Events >= cfg.MaxEvents {
			s.failf("no quiescence after %d events%s", s.res.Events, s.stuck())
			break
		}
		e := heap.Pop(&s.q).(*event)
		s.vt = e.at
		s.res.Events++
		s.current = e.actor
		if cfg.Trace {
			s.record(e)
		}
		e.fn()
	}
	if s.fail == nil {
		s.current = "end"
		s.checkEnd()
	}
	s.res.Failure = s.fail
	// The ranks' regions are mappings outside the Go heap
	// (kvcache.NewHostRegion): unmapped here, or every seed's stays
	// mapped for the process's life. No event runs after the loop.
	for _, r := range s.regions {
		_ = r.Close()
	}
	return s.res
}

func (s *Sim) record(e *event) {
	n := s.actorSeq[e.actor]
	s.actorSeq[e.actor] = n + 1
	s.res.Trace = append(s.res.Trace, TraceRecord{T: int64(e.at), Actor: e.actor, Seq: n,
		Type: fmt.Sprintf("%T", e.msg), Msg: summarize(e.msg)})
}

// at schedules fn (delivering msg to actor) at virtual time t.
func (s *Sim) at(t time.Duration, actor string, msg any, fn func()) *event {
	if t < s.vt {
		t = s.vt
	}
	if end := s.faults.stallEnd(actor, t); end > 0 {
		// The rank is paused: it steps nothing until it resumes.
		s.fired(FaultStall)
		t = end
	}
	s.seq++
	e := &event{at: t, seq: s.seq, actor: actor, msg: msg, fn: fn}
	heap.Push(&s.q, e)
	return e
}

// note records, in a traced run, what happened to actor inside the
// current step (a panic inside a send), as a message of its own.
func (s *Sim) note(actor string, msg any) {
	if s.cfg.Trace {
		s.record(&event{at: s.vt, actor: actor, msg: msg})
	}
}

// after schedules fn d from now.
func (s *Sim) after(d time.Duration, actor string, msg any, fn func()) { s.at(s.vt+d, actor, msg, fn) }

// mail delivers msg from one actor to another after d, never before an
// earlier message on the same (from, to) pair: a mailbox is FIFO per sender.
func (s *Sim) mail(from, to string, d time.Duration, msg any, fn func()) {
	k := fifoKey{from, to}
	t := max(s.vt+d, s.fifo[k])
	s.fifo[k] = t
	s.at(t, to, msg, fn)
}

// hop is the latency of one in-process mailbox hop.
func (s *Sim) hop() time.Duration { return time.Duration(s.r.Int64N(int64(200 * time.Microsecond))) }

func (s *Sim) failf(format string, args ...any) {
	if s.fail != nil {
		return
	}
	s.fail = &Failure{Seed: s.cfg.Seed, At: s.vt, Actor: s.current, Msg: fmt.Sprintf(format, args...)}
}

func (s *Sim) fired(f Fault)  { s.res.Faults[f]++ }
func (s *Sim) reached(r Race) { s.res.Races[r]++ }

// between returns a duration uniformly in [lo, hi).
func (s *Sim) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(s.r.Int64N(int64(hi-lo)))
}

func (s *Sim) chance(p float64) bool { return p > 0 && s.r.Float64() < p }
