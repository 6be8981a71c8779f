package sim

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Fault is one kind of fault the simulator injects. A seed chooses which
// kinds are enabled and their parameters; a kind counts as fired in a seed
// when it actually changed what some actor saw.
type Fault uint8

// Fault kinds.
const (
	// FaultWorkerPanic: a sender worker panics and restarts: a context
	// rank's (its ops go IN_DOUBT, its endpoints are closed, then they are
	// retired, then its control connections), or a generation rank's (its
	// control connections are closed); now and then inside the send of a
	// stream's terminal frame, which may or may not have left and which
	// its session hears was not sent, or of a RequestData or a Cancel,
	// which may or may not have left and of which nobody hears.
	FaultWorkerPanic Fault = iota
	// FaultPeerDeathBeforePost: a rank dies before any write to or from it
	// was posted.
	FaultPeerDeathBeforePost
	// FaultPeerDeathDuringPost: a rank dies with writes to or from it in
	// flight.
	FaultPeerDeathDuringPost
	// FaultPeerDeathAfterPost: a rank dies after writes to or from it were
	// posted and have all settled.
	FaultPeerDeathAfterPost
	// FaultPeerReturn: a dead rank comes back (a fresh incarnation).
	FaultPeerReturn
	// FaultDrop: a control frame is lost.
	FaultDrop
	// FaultDuplicate: a control frame is delivered twice.
	FaultDuplicate
	// FaultReorder: frames to one receiver, on different connections, are
	// delivered in another order than they were sent (per-connection FIFO
	// holds, as with ZeroMQ over TCP).
	FaultReorder
	// FaultDelay: a control frame (and those behind it on its connection)
	// is held back for a long time.
	FaultDelay
	// FaultPartition: the link between a context and a generation rank is
	// cut and later healed (frames and writes wait for the heal).
	FaultPartition
	// FaultLateCompletion: a backend completion arrives after the
	// session's deadline.
	FaultLateCompletion
	// FaultBatchFailure: a posted batch fails without writing.
	FaultBatchFailure
	// FaultPartialWrite: a posted batch writes only some of its bytes, then
	// fails.
	FaultPartialWrite
	// FaultRegistration: the backend refuses a batch before it reaches the
	// wire (remote registration unusable).
	FaultRegistration
	// FaultCancelCtx: the context side's serving process cancels.
	FaultCancelCtx
	// FaultCancelGen: the generation side's serving process cancels.
	FaultCancelGen
	// FaultClockJump: a rank's wall clock jumps forward or backward.
	FaultClockJump
	// FaultMalformed: a malformed or unresolvable control frame arrives.
	FaultMalformed
	// FaultSessionPanic: a session's shell recovers a panic.
	FaultSessionPanic
	// FaultFence: a chunk's fence fails (the producer failed).
	FaultFence
	// FaultPromptMismatch: a generation rank's Receive names another
	// prompt length than the context side's Send (issue 14): its
	// RequestData reaches a context rank whose Send disagrees.
	FaultPromptMismatch
	// FaultNeverConnected: a Receive names a writer that cannot be reached
	// for the whole request (a context instance that does not exist, or a
	// control connection that refuses every frame): its RequestData never
	// leaves (issue 14).
	FaultNeverConnected
	// FaultControlRefused: the control connection refuses a frame for a
	// while (send queue full, peer not connected yet); a refused
	// RequestData is re-sent with backoff.
	FaultControlRefused
	// FaultPinRefused: the serving process frees a source block before it
	// hands the block's chunk (its own bug): TxHandle.Chunk's pin is
	// refused, nothing is handed over, and it cancels the request. (It
	// also tries to free a block after Chunk returned: the pool must
	// refuse, the block being pinned from then on.)
	FaultPinRefused
	// FaultQuarantine: a generation rank quarantined the blocks of a
	// request that failed while a writer had given no proof of its end
	// (suspicion, deadline, cancel without an ack).
	FaultQuarantine
	// FaultStall: a context rank (a writer process) is paused — SIGSTOP,
	// a GC pause, a frozen container — for longer than the failure
	// detector's timeout, then resumes: its actors step nothing while it
	// is paused, frames to it wait, writes it had posted either land on
	// time (RDMA: the NIC goes on) or after the resume (shm: a memcpy
	// stopped midway), and the generation side suspects it meanwhile.
	FaultStall
	// FaultClockDrift: ranks' clocks run fast or slow, within
	// ±maxDriftPPM of virtual time (on top of clock jumps).
	FaultClockDrift
	// FaultWriterLease: context ranks hold writer leases on generation
	// ranks (core.PeerLeases), renewed by heartbeats and frames; a lease
	// that lapses (a partition, a stall, heartbeats that stopped) fences
	// the writer from that peer (TxPeerGone). Counted when one lapses.
	FaultWriterLease
	// FaultResultUnsent: a context rank's control plane refuses its
	// frames to a generation rank for a while (the peer cannot be
	// dialled, its backlog is full): a stream's terminal frame does not
	// leave, its worker reports it (TxSent), and a SUCCESS Result that
	// did not leave fails the request instead of DONE. Counted when a
	// frame is refused.
	FaultResultUnsent
	// FaultConnRemade: control frames between two engines keep their
	// order only within one connection (a worker's DEALER to a peer), and
	// a worker remakes its connections after a restart or a send error
	// (actors/worker.go): a sender worker with frames in flight restarts
	// (either side), and a closed connection's frames leave late, within
	// its linger — frames of the new connection overtake them — or the
	// tail of them is lost. Counted when a frame arrives after a frame of
	// a newer connection of the same worker to the same peer, or is lost.
	FaultConnRemade
	// FaultWorkerDead: a sender worker (either side) spends its restart
	// budget and stops for good: its sessions fail (TxWorkerDead,
	// RxWorkerDead), frames routed to it go through the next live worker
	// (another connection), ops for it are never posted, and the engine
	// refuses new work.
	FaultWorkerDead
	// FaultSessionPinRefused: FaultPinRefused on a serving process that
	// hands its chunks unpinned (TxChunk.Pinned false; Sim.ur draws
	// which): the session's own Pin is refused, it hears TxPinFailed, and
	// the request fails.
	FaultSessionPinRefused
	// FaultHungBatch: a posted batch never completes on its own (its
	// peer alive but not progressing, a wedged queue pair): it neither
	// lands nor fails until its endpoint is closed, which completes it
	// with rdma.ErrEndpointClosed (or the peer's death is detected).
	// Only a close bounds such an op's drain: a session whose deadline
	// passed, or whose peer was declared gone, must close the endpoint.
	FaultHungBatch
	// FaultCloseUnproven: a context rank's endpoint close cuts writes on
	// the wire without proof that they are over (rdma.ErrCloseUnproven:
	// the peer alive but not progressing past the close timeout): the
	// cut batches complete with that error (TxCompleted.Unproven), no op
	// is retired, a worker that stops names them (TxWorkerDead.InDoubt),
	// and the cut writes may still land. Their ops stay in doubt for
	// good, holding their pins and their peers' blocks, until the
	// writer's process exits (a supervisor restarts it: its pool
	// deregistration fails busy), which the peers' exit proofs settle.
	FaultCloseUnproven
	// FaultCloseSourcesReleased: a FaultCloseUnproven close that also
	// proves the backend reads none of the cut writes' sources any more
	// (rdma.ErrSourcesReleased, as UCX's completed forced close): what the
	// cut batches write may still land (from the bytes they had read at
	// the cut), their ops are retired unproven (TxRetired.Unproven), and
	// their sessions release their source pins and end those streams
	// without a terminal frame. Drawn per such close from a stream of its
	// own (Sim.rr).
	FaultCloseSourcesReleased
	// FaultCutLandsLate: a write cut by a FaultCloseUnproven close lands
	// lateCut or more after the cut: past the deadlines, drain graces,
	// Cancel re-sends and stops that came meanwhile (its landing is drawn
	// anew at the cut: landCut).
	FaultCutLandsLate
	// FaultSentLate: a generation rank's sender worker hands a
	// RequestData to the control link, which puts it on the wire at once,
	// and is then held up (descheduled: a loaded machine, a GC pause)
	// before it reports the send to the session (RxSent): the context
	// rank's answer — a Misaddressed, a Result, a CancelAck — may reach
	// the session first, as on a real link. The worker steps nothing
	// else meanwhile. Drawn from a stream of its own (Sim.lr); counted
	// when an answer of the writer reached the session before the report.
	FaultSentLate
	// FaultFrameRefused: the control plane refuses a generation rank's
	// RequestData for the frame itself (control.ErrFrameRefused: past the
	// writer's advertised MaxFrameBytes, as control/zmq's
	// ErrFrameTooLarge), at its first send, a re-send after a refusal
	// for the connection, or a send re-addressed to a restarted writer:
	// sent again it would be refused again, so the session fails the
	// request at once (ErrFrameUnsent naming the refusal), counts that
	// writer never reached (it owes no CancelAck) and sends it a Cancel
	// carrying the reason, which ends the writer's session (or refuses
	// its Send) naming it. Drawn from a stream of its own (Sim.fr);
	// counted when a live session steps such a refusal.
	FaultFrameRefused
	// FaultFrameRefusedOthersLeft: FaultFrameRefused while another
	// writer's RequestData of the same request had left (that writer
	// may be writing): its blocks wait for its proof.
	FaultFrameRefusedOthersLeft
	// FaultIncarnationDown: a rank's process exits and a peer on the
	// other side of the same host takes that incarnation down at once
	// (its pidfd: Engine.PeerIncarnationDown(peer, inc, "exited …"), which
	// is no proof that its writes are over): the context side's sessions
	// with a stream to that incarnation (or an earlier one) fail, their
	// ops in doubt; the generation side's requests addressed to it are
	// suspected (RxSuspect: blocks quarantined until a proof). Drawn from
	// a stream of its own (Sim.dr); counted per Down a live rank hears.
	FaultIncarnationDown
	// FaultIncarnationDownReplaced: FaultIncarnationDown heard after the
	// rank's next incarnation booted: it must leave that incarnation's
	// requests alone.
	FaultIncarnationDownReplaced
	// FaultResultRefused: the control plane refuses a context rank's
	// SUCCESS Result for the frame itself (control.ErrFrameRefused: its
	// payload past the generation rank's advertised MaxFrameBytes, as
	// control/zmq's ErrFrameTooLarge): it never left, so the session
	// fails the request naming the refusal and answers that stream again
	// in the same step with its outcome — a FAILED (or CANCELLED,
	// IN_DOUBT) Result without payload, or a CancelAck —, which the
	// generation side takes as the proof it is (live, or stopped when its
	// report reaches it). Drawn from a stream of its own (Sim.yr);
	// counted when a session steps such a refusal.
	FaultResultRefused
	// FaultDownClosesConn: a rank hears that a peer is down (missed
	// heartbeats, its exit, a goodbye) and each of its sender workers
	// closes its connection to that peer (actors/worker.go
	// workerPeerDown), with frames still in flight on it: they leave late
	// within the linger, or the tail of them is lost
	// (FaultDownClosesConnLost). Frames of the next connection may
	// overtake them here, which the real worker prevents (it holds them
	// until the old connection closed): a superset of its orders. Drawn
	// from a stream of its own (Sim.wr); counted per connection closed
	// with frames in flight.
	FaultDownClosesConn
	// FaultDownClosesConnLost: a frame lost at such a close.
	FaultDownClosesConnLost
	// FaultHeardAgain: a context rank declared down (a stall, a partition
	// the failure detector suspected) is heard again as it ends
	// (Engine.PeerAlive): the generation rank's sessions it writes for
	// hear RxHeard, and those that suspected it of missed heartbeats send
	// it the Cancel again at once. Counted when such a rank has sessions.
	FaultHeardAgain

	numFaults
)

var faultNames = [numFaults]string{
	"worker panic+restart", "peer death before post", "peer death during post", "peer death after post",
	"peer death then return", "control dropped", "control duplicated", "control reordered", "control delayed",
	"partition then heal", "completion after deadline", "batch failure", "partial write", "registration failure",
	"cancel (context side)", "cancel (generation side)", "clock jump", "malformed control frame",
	"session panic", "fence failure", "prompt length mismatch", "writer never connected",
	"control refused, RequestData re-sent", "pin refused (source freed)",
	"blocks quarantined (no proof)", "writer stalled past suspicion", "clock drift", "writer lease lapsed",
	"context frame refused (Result not sent)",
	"connection remade, older frames late or lost", "worker stopped (restart budget spent)",
	"session's pin refused (chunk handed unpinned)",
	"batch hung until its endpoint closed",
	"endpoint close unproven, writer restarted",
	"endpoint close unproven, sources released",
	"cut write landed 100+ ms after the cut",
	"answer before its RequestData's sent report",
	"RequestData refused for good (frame)",
	"RequestData refused for good, another's left",
	"peer incarnation down (exit, no proof)",
	"incarnation down after its successor booted",
	"SUCCESS Result refused for good (frame)",
	"connection closed on a Down, frames in flight",
	"frame lost at a Down's connection close",
	"suspect heard again (its heartbeat)",
}

func (f Fault) String() string { return faultNames[f] }

// Race is one of the races DESIGN.md §3 rules out by construction.
type Race uint8

// Races.
const (
	// RaceCancelWhileFence: a cancel arrives while an op waits for its
	// fence.
	RaceCancelWhileFence Race = iota
	// RaceFailWhileReading: one peer's write fails while another peer's
	// write still reads the same source pages.
	RaceFailWhileReading
	// RaceAdmitAfterDrain: a chunk arrives after the session decided its
	// outcome (admission would race the drain).
	RaceAdmitAfterDrain
	// RaceSubmitAfterFail: a worker posts an op after another path failed
	// its session.
	RaceSubmitAfterFail
	// RaceLateCompletion: a backend completion arrives after a timeout put
	// its op IN_DOUBT.
	RaceLateCompletion
	// RaceWorkerPanicSubmitted: a worker panics with ops SUBMITTED.
	RaceWorkerPanicSubmitted

	numRaces
)

var raceNames = [numRaces]string{
	"cancel while an op waits for its fence", "write fails while another reads the pages",
	"chunk after the outcome (admit vs drain)", "worker posts an op its session already failed",
	"late completion after a timeout", "worker panics with ops SUBMITTED",
}

func (r Race) String() string { return raceNames[r] }

// window is a virtual-time interval [from, to).
type window struct{ from, to time.Duration }

func (w window) overlaps(a, b time.Duration) bool { return a < w.to && b >= w.from }

// death is one rank's death (and, when back > 0, its return).
type death struct {
	gen  bool // a generation rank (else a context rank)
	rank int
	at   time.Duration
	back time.Duration // return time; 0 = stays dead
}

// partition cuts the link between one context rank and one generation rank.
type partition struct {
	ctx, gen int
	w        window
}

// stall pauses context rank ctx during w (FaultStall); prefix is the
// prefix of its actors' names ("ctx1.").
type stall struct {
	ctx    int
	prefix string
	w      window
}

// maxDriftPPM is the clock drift margin: a rank's clock runs at most 2 %
// fast or slow.
const maxDriftPPM = 20_000

// refusal makes generation rank gen's control connections to context rank
// ctx refuse every frame during w (Send fails: the frame never leaves).
type refusal struct {
	gen, ctx int
	w        window
	forever  bool // for the whole run: the writer is never connected
}

// plan is the faults one seed injects.
type plan struct {
	on [numFaults]bool

	pDrop, pDup, pDelay, pReorder float64
	pBatchFail, pPartial, pLate   float64
	pFence                        float64

	crashes    []time.Duration // worker panics (rank and worker drawn at the time)
	deaths     []death
	partitions []partition
	regWindows []window // registration failures on one context rank
	regRank    int
	jumps      []time.Duration
	malformed  []time.Duration
	sessPanics []time.Duration
	cancelCtx  float64 // per request and rank: probability of a cancel
	cancelGen  float64
	// mismatch is the probability that a request's generation side plans
	// for another prompt length than its context side sends.
	mismatch float64
	// ghost is the probability, per request and generation rank, that the
	// Receive names a context instance that does not exist.
	ghost    float64
	refusals []refusal
	// unsent: windows in which context rank ctx's frames to generation
	// rank gen are refused (FaultResultUnsent).
	unsent []refusal
	// pPinRefuse is the probability, per chunk, that the serving process
	// frees one of its source blocks before the session pins it.
	pPinRefuse float64
	stalls     []stall
	// leaseTTL > 0: writer leases (FaultWriterLease), renewed by a
	// heartbeat of each generation rank every beat until beatsEnd.
	leaseTTL, beat, beatsEnd time.Duration
	// driftPPM[i]: the clock drift of context rank i, then of generation
	// rank i-ctxRanks, in parts per million.
	driftPPM []int64
	// remakes: restarts of a worker with frames in flight
	// (FaultConnRemade); stops: a worker stopped for good
	// (FaultWorkerDead).
	remakes, stops []time.Duration
	// pHung is the probability that a posted batch hangs
	// (FaultHungBatch).
	pHung float64
	// pUnproven is the probability that a context rank's close of an
	// endpoint with writes on the wire proves nothing
	// (FaultCloseUnproven).
	pUnproven float64
	// pSentLate is the probability that a generation worker's report
	// that a RequestData left comes late (FaultSentLate); sentLateMis:
	// the report of one that a Misaddressed will answer always does
	// (with the fault, and in three seeds in four without it: the
	// order CI caught the engine out on, too rare otherwise).
	pSentLate   float64
	sentLateMis bool
	// pFrameRefused is the probability that a RequestData's send is
	// refused for the frame itself (FaultFrameRefused).
	pFrameRefused float64
	// incDown: a rank's exit takes its incarnation down at once on the
	// other side's ranks (FaultIncarnationDown).
	incDown bool
	// pResultRefused is the probability that a SUCCESS Result's send is
	// refused for the frame itself (FaultResultRefused).
	pResultRefused float64
	// downCloses: a Down closes the workers' connections to the peer
	// (FaultDownClosesConn).
	downCloses bool
}

// stallEnd returns when the stalls that hold actor at t end (stalls of
// one rank that overlap are one pause), or 0. It is monotone in t, so
// delaying events to it keeps every FIFO order.
func (p *plan) stallEnd(actor string, t time.Duration) time.Duration {
	end := time.Duration(0)
	for moved := true; moved; {
		moved = false
		for _, st := range p.stalls {
			if t >= st.w.from && t < st.w.to && len(actor) >= len(st.prefix) && actor[:len(st.prefix)] == st.prefix {
				t, end, moved = st.w.to, st.w.to, true
			}
		}
	}
	return end
}

// newPlan draws the seed's faults: each kind is enabled with some
// probability, then its parameters are drawn.
func newPlan(r *rand.Rand, ctxRanks, genRanks int, active, horizon time.Duration, density float64) plan {
	var p plan
	// The connection faults, from FaultConnRemade on, are drawn from a
	// stream of their own (drawConnFaults).
	for f := range FaultConnRemade {
		p.on[f] = r.Float64() < density
	}
	// Most faults strike while transfers run; some at any time.
	at := func() time.Duration {
		if r.IntN(4) > 0 {
			return time.Duration(r.Int64N(int64(active)))
		}
		return time.Duration(r.Int64N(int64(horizon)))
	}
	// A peer death is one fault whose flavour (before, during, after
	// posting) is decided by when it strikes.
	if p.on[FaultPeerDeathBeforePost] || p.on[FaultPeerDeathDuringPost] || p.on[FaultPeerDeathAfterPost] {
		n := 1 + r.IntN(2)
		for range n {
			d := death{gen: r.IntN(2) == 0, at: at()}
			if d.gen {
				d.rank = r.IntN(genRanks)
			} else {
				d.rank = r.IntN(ctxRanks)
			}
			if p.on[FaultPeerReturn] || r.IntN(3) == 0 {
				d.back = d.at + time.Millisecond + time.Duration(r.Int64N(int64(40*time.Millisecond)))
			}
			p.deaths = append(p.deaths, d)
		}
	}
	if p.on[FaultWorkerPanic] {
		for range 1 + r.IntN(4) {
			p.crashes = append(p.crashes, at())
		}
	}
	if p.on[FaultDrop] {
		p.pDrop = 0.02 + 0.1*r.Float64()
	}
	if p.on[FaultDuplicate] {
		p.pDup = 0.05 + 0.2*r.Float64()
	}
	if p.on[FaultDelay] {
		p.pDelay = 0.05 + 0.2*r.Float64()
	}
	if p.on[FaultReorder] {
		p.pReorder = 0.2 + 0.5*r.Float64()
	}
	if p.on[FaultPartition] {
		for range 1 + r.IntN(2) {
			from := at()
			p.partitions = append(p.partitions, partition{ctx: r.IntN(ctxRanks), gen: r.IntN(genRanks),
				w: window{from, from + time.Millisecond + time.Duration(r.Int64N(int64(80*time.Millisecond)))}})
		}
	}
	if p.on[FaultLateCompletion] {
		p.pLate = 0.05 + 0.2*r.Float64()
	}
	if p.on[FaultBatchFailure] {
		p.pBatchFail = 0.05 + 0.15*r.Float64()
	}
	if p.on[FaultPartialWrite] {
		p.pPartial = 0.05 + 0.15*r.Float64()
	}
	if p.on[FaultRegistration] {
		p.regRank = r.IntN(ctxRanks)
		for range 1 + r.IntN(2) {
			from := time.Duration(r.Int64N(int64(active)))
			p.regWindows = append(p.regWindows, window{from, from + time.Millisecond + time.Duration(r.Int64N(int64(30*time.Millisecond)))})
		}
	}
	if p.on[FaultCancelCtx] {
		p.cancelCtx = 0.2 + 0.5*r.Float64()
	}
	if p.on[FaultCancelGen] {
		p.cancelGen = 0.2 + 0.5*r.Float64()
	}
	if p.on[FaultClockJump] {
		for range 1 + r.IntN(2) {
			p.jumps = append(p.jumps, at())
		}
	}
	if p.on[FaultMalformed] {
		for range 1 + r.IntN(4) {
			p.malformed = append(p.malformed, at())
		}
	}
	if p.on[FaultSessionPanic] {
		for range 1 + r.IntN(2) {
			p.sessPanics = append(p.sessPanics, at())
		}
	}
	if p.on[FaultFence] {
		p.pFence = 0.05 + 0.1*r.Float64()
	}
	if p.on[FaultPromptMismatch] {
		p.mismatch = 0.2 + 0.5*r.Float64()
	}
	if p.on[FaultNeverConnected] {
		// Either some Receives name a context instance that does not
		// exist, or one link refuses every frame for the whole run.
		if r.IntN(2) == 0 {
			p.ghost = 0.1 + 0.4*r.Float64()
		} else {
			p.refusals = append(p.refusals, refusal{gen: r.IntN(genRanks), ctx: r.IntN(ctxRanks),
				w: window{0, 1 << 62}, forever: true})
		}
	}
	if p.on[FaultControlRefused] {
		for range 1 + r.IntN(3) {
			from := at()
			p.refusals = append(p.refusals, refusal{gen: r.IntN(genRanks), ctx: r.IntN(ctxRanks),
				w: window{from, from + time.Millisecond + time.Duration(r.Int64N(int64(60*time.Millisecond)))}})
		}
	}
	if p.on[FaultPinRefused] {
		p.pPinRefuse = 0.05 + 0.15*r.Float64()
	}
	if p.on[FaultStall] {
		for range 1 + r.IntN(2) {
			from, c := at(), r.IntN(ctxRanks)
			// Longer than the failure detector's timeout (2–15 ms here).
			p.stalls = append(p.stalls, stall{ctx: c, prefix: fmt.Sprintf("ctx%d.", c),
				w: window{from, from + 20*time.Millisecond + time.Duration(r.Int64N(int64(100*time.Millisecond)))}})
		}
	}
	if p.on[FaultWriterLease] {
		p.beat = time.Millisecond + time.Duration(r.Int64N(int64(3*time.Millisecond)))
		p.leaseTTL = 3*p.beat + time.Duration(r.Int64N(int64(20*time.Millisecond)))
		p.beatsEnd = horizon + 300*time.Millisecond
	}
	if p.on[FaultResultUnsent] {
		for range 1 + r.IntN(3) {
			from := at()
			p.unsent = append(p.unsent, refusal{gen: r.IntN(genRanks), ctx: r.IntN(ctxRanks),
				w: window{from, from + time.Millisecond + time.Duration(r.Int64N(int64(60*time.Millisecond)))}})
		}
	}
	if p.on[FaultClockDrift] {
		for range ctxRanks + genRanks {
			p.driftPPM = append(p.driftPPM, r.Int64N(2*maxDriftPPM+1)-maxDriftPPM)
		}
	}
	return p
}

// drawConnFaults draws the connection faults (FaultConnRemade,
// FaultWorkerDead) from their own stream r (Sim.cr) with the seed's
// density, at times drawn as newPlan's.
func (p *plan) drawConnFaults(r *rand.Rand, active, horizon time.Duration, density float64) {
	at := func() time.Duration {
		if r.IntN(4) > 0 {
			return time.Duration(r.Int64N(int64(active)))
		}
		return time.Duration(r.Int64N(int64(horizon)))
	}
	for f := FaultConnRemade; f <= FaultWorkerDead; f++ {
		p.on[f] = r.Float64() < density
	}
	if p.on[FaultConnRemade] {
		for range 1 + r.IntN(4) {
			p.remakes = append(p.remakes, at())
		}
	}
	if p.on[FaultWorkerDead] {
		p.stops = append(p.stops, at())
	}
}

// drawHung draws FaultHungBatch from its own stream r (Sim.hr) with the
// seed's density.
func (p *plan) drawHung(r *rand.Rand, density float64) {
	if p.on[FaultHungBatch] = r.Float64() < density; p.on[FaultHungBatch] {
		p.pHung = 0.05 + 0.2*r.Float64()
	}
}

// drawUnproven draws FaultCloseUnproven from its own stream r (Sim.xr)
// with the seed's density.
func (p *plan) drawUnproven(r *rand.Rand, density float64) {
	if p.on[FaultCloseUnproven] = r.Float64() < density; p.on[FaultCloseUnproven] {
		p.pUnproven = 0.3 + 0.6*r.Float64()
	}
}

// drawSentLate draws FaultSentLate from its own stream r (Sim.lr) with
// the seed's density.
func (p *plan) drawSentLate(r *rand.Rand, density float64) {
	if p.on[FaultSentLate] = r.Float64() < density; p.on[FaultSentLate] {
		p.pSentLate = 0.2 + 0.6*r.Float64()
	}
	p.sentLateMis = p.on[FaultSentLate] || density > 0 && r.IntN(4) != 0
}

// drawFrameRefused draws FaultFrameRefused from its own stream r
// (Sim.fr) with the seed's density.
func (p *plan) drawFrameRefused(r *rand.Rand, density float64) {
	if r.Float64() < density {
		p.pFrameRefused = 0.03 + 0.2*r.Float64()
	}
}

// drawResultRefused draws FaultResultRefused from its own stream r
// (Sim.yr) with the seed's density.
func (p *plan) drawResultRefused(r *rand.Rand, density float64) {
	if r.Float64() < density {
		p.pResultRefused = 0.05 + 0.3*r.Float64()
	}
}

// drawDownCloses draws FaultDownClosesConn from its own stream r
// (Sim.wr) with the seed's density.
func (p *plan) drawDownCloses(r *rand.Rand, density float64) {
	p.downCloses = r.Float64() < density
}

// drawIncDown draws FaultIncarnationDown from its own stream r (Sim.dr)
// with the seed's density.
func (p *plan) drawIncDown(r *rand.Rand, density float64) {
	p.incDown = r.Float64() < density
}

// partitioned returns the end of the partition between ctx rank c and gen
// rank g that overlaps [a, b], or 0.
func (p *plan) partitioned(c, g int, a, b time.Duration) time.Duration {
	var end time.Duration
	for _, pt := range p.partitions {
		if pt.ctx == c && pt.gen == g && pt.w.overlaps(a, b) {
			end = max(end, pt.w.to)
		}
	}
	return end
}

// refused reports whether generation rank g's control connections to
// context rank c refuse frames at t, and whether for the whole run.
func (p *plan) refused(g, c int, t time.Duration) (refused, forever bool) {
	for _, rf := range p.refusals {
		if rf.gen == g && rf.ctx == c && t >= rf.w.from && t < rf.w.to {
			refused, forever = true, forever || rf.forever
		}
	}
	return refused, forever
}

// unsentAt reports whether context rank c's frames to generation rank g
// are refused at t.
func (p *plan) unsentAt(c, g int, t time.Duration) bool {
	for _, rf := range p.unsent {
		if rf.ctx == c && rf.gen == g && t >= rf.w.from && t < rf.w.to {
			return true
		}
	}
	return false
}

func (p *plan) registrationDown(rank int, t time.Duration) bool {
	if rank != p.regRank {
		return false
	}
	for _, w := range p.regWindows {
		if t >= w.from && t < w.to {
			return true
		}
	}
	return false
}
