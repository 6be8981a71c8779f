package core

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Messages a TxSession steps on. The shell turns handle calls, control
// frames, fence callbacks, worker reports and timers into these.
type (
	// TxStart: Engine.Send was called for the request.
	TxStart struct {
		PromptLen int
		Deadline  time.Time
		Payload   []byte
	}
	// TxChunk: the serving process handed over one prefill chunk; Src
	// holds its source blocks per layer group. Payload, when not nil (on
	// the last chunk only: the handle sets it nowhere else), replaces the
	// payload TxStart gave, an empty one included: what the generation
	// side gets with SUCCESS is often known only when prefill ends (its
	// first token). A pointer: one word on every chunk's message.
	//
	// Pinned: Src's blocks were pinned before the chunk was handed over
	// (the engine's handle pins them in Chunk, so that a Free right after
	// Chunk returns is refused). A session that takes the chunk takes
	// over those pins — it emits no Pin and unpins them as its own; one
	// that does not (its outcome decided, its payload refused) leaves them
	// to whoever pinned them (the shell unpins them at once).
	TxChunk struct {
		Chunk   kvcache.Chunk
		Src     []kvcache.BlockRun
		Payload *[]byte `json:",omitempty"`
		Pinned  bool    `json:",omitempty"`
	}
	// TxFenceFired: chunk Index's KV is written (or its producer failed).
	TxFenceFired struct {
		Index int
		Err   error
	}
	// TxPeerRequest: a generation rank's RequestData, resolved into a
	// route by the shell. Expected lists every generation rank index this
	// context rank must write to for the request. Err is set when the
	// request could not be resolved (bad blocks, mismatched peer).
	TxPeerRequest struct {
		Peer  int
		From  messages.PeerID
		Epoch uint64
		// Incarnation is the sender's (RequestData.FromIncarnation): this
		// stream's frames are addressed to it.
		Incarnation uint64
		// PromptLen is the prompt length the generation rank planned its
		// blocks for; it must equal Send's.
		PromptLen int
		Route     *Route
		Expected  []int
		Err       error
	}
	// TxPinFailed: the shell could not pin chunk Chunk's source blocks of
	// group Group (blocks not allocated, freed, or out of range). Nothing of
	// that group is pinned; the request fails.
	TxPinFailed struct {
		Chunk, Group int
		Err          error
	}
	// TxSubmitted: the worker handed the op's batch to the backend (the
	// post returned); the op is SUBMITTED.
	TxSubmitted struct{ Op OpRef }
	// TxWorkerDead: sender worker Worker spent its restart budget and was
	// stopped. It closed every endpoint before it stopped (that is its
	// Stopping), so no op it held can write any more, but those in InDoubt:
	// their endpoint's close could not prove it (rdma.ErrCloseUnproven).
	// Those in Released (some of InDoubt) had a close that proved at least
	// that the backend reads none of their sources any more
	// (rdma.ErrSourcesReleased), a report the worker stopped before it
	// handled: they go SOURCES_RELEASED, as by TxRetired{Unproven}.
	// What was sent to it after is never posted. Its streams fail.
	TxWorkerDead struct {
		Worker   int
		InDoubt  []OpRef
		Released []OpRef `json:",omitempty"`
	}
	// TxCompleted: a worker reports the exactly-once outcome of an op's
	// batch. Refused means it never reached the backend. Unproven means
	// a close cut it on the wire without proof that it is over
	// (rdma.ErrCloseUnproven): its writes may still land, so the op is in
	// doubt for good, not done.
	TxCompleted struct {
		Op       OpRef
		Err      error
		Refused  bool
		Unproven bool
	}
	// TxFlushed: a worker flushed the endpoint to Peer.
	TxFlushed struct {
		Peer int
		Err  error
	}
	// TxSent: a worker tried to hand stream Peer's terminal frame to the
	// control plane. Err nil means the control plane took it (it is on the
	// wire, or queued on a connection that sends it in order); an error
	// means the frame did not leave this process, so the peer never learns
	// of it from us. A SUCCESS Result that did not leave fails the request:
	// DONE means every peer's Result left.
	TxSent struct {
		Peer int
		Err  error
	}
	// TxInDoubt: a worker lost track of these ops (it crashed).
	TxInDoubt struct {
		Ops    []OpRef
		Reason error
	}
	// TxRetired: a worker closed the endpoint of these ops, and the close
	// has returned: none of them can write any more, so those in doubt are
	// RETIRED (their stream's terminal frame says IN_DOUBT).
	//
	// Unproven: the close cut their writes without proof that they no
	// longer land (rdma.ErrCloseUnproven), but the backend proved that it
	// reads none of their sources any more (rdma.ErrSourcesReleased).
	// Those in doubt go SOURCES_RELEASED: the source pins may go, but their
	// writes may still land at the peer, so their stream ends without a
	// terminal frame (EndStream) — a FAILED or IN_DOUBT Result would let
	// the peer free its pages — and the peer keeps them until its own
	// proof (the writer's proven exit) or quarantines them. (A close that
	// proves nothing at all sends no TxRetired: its ops stay in doubt.)
	TxRetired struct {
		Ops      []OpRef
		Unproven bool `json:",omitempty"`
	}
	// TxCancel: the local serving process cancelled the request.
	TxCancel struct{ Reason error }
	// TxPeerCancel: a generation rank cancelled the request.
	TxPeerCancel struct {
		Peer        int
		From        messages.PeerID
		Epoch       uint64
		Incarnation uint64 // the sender's (Cancel.FromIncarnation)
		// Reason is the Cancel's (validated peer text), named in the
		// error of a session it fails before its RequestData arrived.
		Reason string
	}
	// TxPeerGone: the control plane declared a peer dead (missed
	// heartbeats, out of the etcd cluster, a writer lease lapsed: Why,
	// when told). Its stream fails; ops in flight to it go IN_DOUBT and
	// its endpoint is closed, which retires them.
	// With Incarnation (0: any), only that incarnation of the peer, or
	// an earlier one, is gone: a stream of a later incarnation's
	// RequestData goes on.
	TxPeerGone struct {
		Peer        messages.PeerID
		Why         string `json:",omitempty"`
		Incarnation uint64 `json:",omitempty"`
	}
	// TxTimeout: a session timer fired.
	TxTimeout struct{ Kind TimerKind }
	// TxRefused: a generation rank's RequestData for this request was
	// refused before it reached the session: it did not resolve (another
	// layout, a place its Hello contradicts, …). A frame cannot fail a
	// request not bound to its sender's instance (any peer could send
	// one), so the session goes on; it keeps the first such reason for
	// the error of its deadline, which would otherwise say only that the
	// deadline passed.
	TxRefused struct {
		From messages.PeerID
		Why  string
	}
	// TxPanic: the session's shell recovered a panic.
	TxPanic struct{ Err error }
)

// op is one batch of writes for one stream and one chunk.
type op struct {
	chunk int
	state OpState
	segs  []kvcache.Segment
	bytes uint64
}

type streamPhase uint8

const (
	streamOpen     streamPhase = iota // admitting ops
	streamFlushing                    // last op landed, flush requested
	streamSending                     // SUCCESS Result handed to its worker, waiting for TxSent
	streamFinished                    // terminal frame sent (a SUCCESS Result: and it left)
)

// answered reports whether the stream's terminal frame was handed to its
// worker: nothing more of the stream may be sent.
func (st *stream) answered() bool { return st.phase >= streamSending }

// silences reports whether a frame of the peer's incarnation inc (its
// FromIncarnation; 0: not known) must go unanswered: the stream ended
// silent, and inc is the incarnation it wrote to, an earlier one, or
// either is not known — as TxTable.Silenced rules once the session has
// stopped (SilentPeer.covers). A later incarnation never got a write of
// the stream: it is answered as for any stream.
func (st *stream) silences(inc uint64) bool {
	return st.silent && SilentPeer{PeerID: st.route.Peer, Incarnation: st.peerInc}.covers(st.route.Peer, inc)
}

// stream is the context-side state for one (request, generation rank).
type stream struct {
	peer      int
	epoch     uint64
	peerInc   uint64 // the peer's incarnation its RequestData came from
	promptLen int    // what the peer planned for
	worker    int
	route     *Route
	ops       []op
	admitted  int // chunks considered (an op, or a no-op)
	next      int // next op to submit; ops leave in order
	phase     streamPhase
	bytes     uint64
	retired   bool // some op was retired by closing its endpoint
	cancelled bool // the peer sent Cancel: answer CancelAck
	// silent: the stream ended without a terminal frame (EndStream): some
	// op of it is SOURCES_RELEASED, its writes may still land at the peer,
	// which must get no proof from this rank — not now, not after the
	// session stopped (SilentPeers).
	silent bool
	// doneOps counts ops in BACKEND_DONE, busyOps ops that may still read
	// their source (not SourceQuiescent), cutOps ops in SOURCES_RELEASED:
	// kept by setOp, so that a step does not scan every op (a long request
	// has thousands).
	doneOps, busyOps, cutOps int
}

type chunkRec struct {
	c        kvcache.Chunk
	src      []kvcache.BlockRun
	fired    bool
	fenceErr error
	pinned   bool   // some group's pin is held
	pins     []bool // per group: its Pin is held
}

// TxConfig is what a TxSession knows at birth.
type TxConfig struct {
	Request    string
	Self       messages.PeerID
	Workers    int
	DrainGrace time.Duration
	// Timeout bounds a session that never gets Send or never gets a peer.
	Timeout time.Duration
	// Incarnation is this rank's (0: not known): its frames carry it.
	Incarnation uint64
}

// TxSession is the context-side state machine of one request: its chunks,
// its streams (one per generation rank it writes to) and their ops.
// It is driven only through Step.
type TxSession struct {
	cfg      TxConfig
	state    TxState
	err      error
	started  bool
	promptLn int
	payload  []byte
	deadline time.Time // TxStart's deadline (zero: none)
	// refused is the first RequestData for this request that was refused
	// unresolved (TxRefused), named for the deadline's error.
	refused string
	chunks  []chunkRec
	streams map[int]*stream
	order   []int // stream peers in arrival order (deterministic iteration)
	// expected: the peers whose streams DONE waits for, from the first
	// TxPeerRequest (expectedSet); a few, so a slice.
	expected    []int
	expectedSet bool
	// dead: the sender workers TxWorkerDead named. A stream routed to one
	// is refused: nothing would post its ops or settle them.
	dead    []int
	stopped bool
	eff     []Effect
	// spare is a step's effects slice handed back (Recycle): the next
	// step emits into its storage.
	spare []Effect
	// violations records illegal transitions in builds with the
	// kvxfer_invariants tag (invariants_on.go); it stays nil otherwise.
	violations []string
	// LateCompletions counts completions for ops that were already quiescent.
	LateCompletions int
	// inDoubt counts the ops in IN_DOUBT, kept by setOp (InDoubt).
	inDoubt int
}

// NewTxSession returns a session in INIT.
func NewTxSession(cfg TxConfig) *TxSession {
	if cfg.Workers < 1 {
		cfg.Workers = 1
	}
	return &TxSession{cfg: cfg, streams: map[int]*stream{}}
}

// State is the session's state.
func (s *TxSession) State() TxState { return s.state }

// Err is the first terminal error (nil for DONE).
func (s *TxSession) Err() error { return s.err }

// Stopped reports whether the session released everything and stopped.
func (s *TxSession) Stopped() bool { return s.stopped }

// Unreturned takes the effects of a Step that never returned them (a
// panic inside it, after it emitted them) and forgets them: each of them
// goes with a change the step made to the session, which is not undone
// (a terminal outcome, a stream's terminal frame, the release). Its shell
// runs them after the panic, as the step decided; it calls Unreturned
// after each Step that did return as well, so that it finds nothing there
// but what a panic left.
func (s *TxSession) Unreturned() []Effect {
	eff := s.eff
	s.eff = nil
	return eff
}

// Recycle hands back a slice of effects Step returned, once its caller
// has run them and keeps no reference to the slice or its storage: the
// next Step emits into that storage instead of a new slice's (a step's
// effects slice was an allocation of every step). Optional.
func (s *TxSession) Recycle(eff []Effect) { s.spare = recycled(eff) }

// Init returns the effects of a new session: its orphan deadline.
func (s *TxSession) Init(now time.Time) []Effect {
	if s.cfg.Timeout > 0 {
		return []Effect{StartTimer{Kind: TimerOrphan, At: now.Add(s.cfg.Timeout)}}
	}
	return nil
}

// Step applies one message and returns the effects to execute, in order.
func (s *TxSession) Step(msg any, now time.Time) []Effect {
	s.eff, s.spare = s.spare[:0], nil
	if s.stopped {
		s.afterStop(msg)
		return s.eff
	}
	switch m := msg.(type) {
	case TxStart:
		s.onStart(m, now)
	case TxChunk:
		s.onChunk(m)
	case TxFenceFired:
		s.onFence(m)
	case TxPeerRequest:
		s.onPeerRequest(m)
	case TxCompleted:
		s.onCompleted(m)
	case TxSubmitted:
		if o := s.opOf(m.Op); o != nil && o.state == OpSubmitting {
			s.setOp(m.Op, o, OpSubmitted)
		}
	case TxPinFailed:
		s.onPinFailed(m)
	case TxWorkerDead:
		s.onWorkerDead(m)
	case TxFlushed:
		s.onFlushed(m)
	case TxSent:
		s.onSent(m)
	case TxInDoubt:
		for _, r := range m.Ops {
			if o := s.opOf(r); o != nil && (o.state == OpSubmitting || o.state == OpSubmitted) {
				s.setOp(r, o, OpInDoubt)
			}
		}
		s.fail(TxFailed, m.Reason)
		s.emit(StartTimer{Kind: TimerDrain, At: now.Add(s.cfg.DrainGrace)})
	case TxRetired:
		for _, r := range m.Ops {
			o := s.opOf(r)
			switch {
			case o == nil || o.state != OpInDoubt:
			case m.Unproven:
				s.setOp(r, o, OpSourcesReleased)
			default:
				s.setOp(r, o, OpRetired)
				s.streams[r.Peer].retired = true
			}
		}
	case TxCancel:
		err := m.Reason
		if err == nil {
			err = ErrCancelled
		}
		if s.resultsHandedOver() {
			// Too late to cancel: every peer's SUCCESS Result is on its
			// way (every peer ends READY on it), as for a TxPanic then.
			// The reports that the Results left decide DONE, or fail the
			// request. (A driver that cancels its live requests when its
			// peer says goodbye raced the Result's report: the context
			// side said CANCELLED for a transfer the peer had taken.)
			s.emit(Log{Level: "info", Msg: "tx session " + s.cfg.Request +
				" cancelled after every Result was handed over: its outcome waits for their reports", Err: err})
			break
		}
		s.fail(TxCancelled, err)
	case TxPeerCancel:
		st := s.streams[m.Peer]
		if st != nil && st.silences(m.Incarnation) {
			// Its stream ended silent: its writes may still land, and a
			// CancelAck, of any epoch, is a proof. No answer.
			break
		}
		if st != nil && st.epoch == m.Epoch && !st.silent {
			st.cancelled = true
			s.fail(TxCancelled, fmt.Errorf("%w: request %s by %s", ErrPeerCancelled, s.cfg.Request, st.route.Peer))
			if st.answered() {
				// Its terminal frame was handed over already, every op
				// of it quiescent, but the peer, which cancels, may never
				// have got it (refused for its queue): acknowledge now,
				// as a stopped session would (afterStop). Otherwise the
				// peer's blocks wait for as long as another stream keeps
				// this session alive.
				s.replyTo(m.From, m.Incarnation, &messages.CancelAck{RequestID: s.cfg.Request, Epoch: m.Epoch, From: s.cfg.Self})
			}
			break
		}
		if st == nil {
			// The peer cancelled before its RequestData reached us. That
			// RequestData may still come (Cancel and RequestData can leave
			// on two connections, ordered only within one), and once the
			// peer has our CancelAck it frees the blocks that RequestData
			// names: the session fails, so that no stream it opens from
			// now on writes (onPeerRequest).
			s.fail(TxCancelled, fmt.Errorf("%w: request %s by %s before its RequestData arrived (its reason: %q)",
				ErrPeerCancelled, s.cfg.Request, m.From, m.Reason))
		}
		// Nothing of this session writes that epoch of that peer's
		// blocks, and nothing will: acknowledge at once.
		s.replyTo(m.From, m.Incarnation, &messages.CancelAck{RequestID: s.cfg.Request, Epoch: m.Epoch, From: s.cfg.Self})
	case TxPeerGone:
		s.onPeerGone(m, now)
	case TxTimeout:
		s.onTimeout(m, now)
	case TxRefused:
		if s.refused == "" {
			s.refused = fmt.Sprintf("%s was refused: %s", m.From, m.Why)
		}
	case TxPanic:
		if s.resultsHandedOver() {
			// Every peer's SUCCESS Result was handed to its worker before
			// the panic (or runs again after it, as the step decided):
			// every peer ends READY on it. Failing now would only make
			// this side disagree; the reports that the Results left
			// (TxSent) decide DONE, or fail the request.
			s.emit(Log{Level: "warn", Msg: "tx session " + s.cfg.Request +
				" panicked after every Result was handed over: its outcome waits for their reports", Err: m.Err})
			break
		}
		s.fail(TxFailed, fmt.Errorf("%w: request %s: %w", ErrSessionCrashed, s.cfg.Request, m.Err))
	default:
		s.violate("unknown message %T", msg)
	}
	s.progress()
	if Invariants {
		s.checkCounts()
	}
	return s.eff
}

// checkCounts compares each stream's op counts with its ops (builds with
// the kvxfer_invariants tag).
func (s *TxSession) checkCounts() {
	inDoubt := 0
	for _, p := range s.order {
		st := s.streams[p]
		done, busy, cut := 0, 0, 0
		for i := range st.ops {
			switch st.ops[i].state {
			case OpBackendDone:
				done++
			case OpSourcesReleased:
				cut++
			}
			if !st.ops[i].state.SourceQuiescent() {
				busy++
			}
			if st.ops[i].state == OpInDoubt {
				inDoubt++
			}
		}
		if done != st.doneOps || busy != st.busyOps || cut != st.cutOps {
			s.violate("stream %d: counts done %d busy %d cut %d, ops say done %d busy %d cut %d",
				p, st.doneOps, st.busyOps, st.cutOps, done, busy, cut)
		}
		if st.silent && (st.cutOps == 0 || st.phase != streamFinished) {
			s.violate("stream %d: silent with %d ops SOURCES_RELEASED, phase %d", p, st.cutOps, st.phase)
		}
	}
	if inDoubt != s.inDoubt {
		s.violate("counts %d ops IN_DOUBT, ops say %d", s.inDoubt, inDoubt)
	}
}

func (s *TxSession) onStart(m TxStart, now time.Time) {
	if s.started {
		return
	}
	s.started = true
	s.promptLn = m.PromptLen
	s.payload = m.Payload
	s.deadline = m.Deadline
	if !m.Deadline.IsZero() {
		s.emit(StartTimer{Kind: TimerDeadline, At: m.Deadline})
	}
	if err := s.payloadRefused(); err != nil {
		s.fail(TxFailed, err)
		return
	}
	// RequestData that came before Send: each peer must have planned for
	// the prompt Send describes, or its READY would cover unwritten blocks.
	for _, p := range s.order {
		if st := s.streams[p]; st.promptLen != s.promptLn {
			s.fail(TxFailed, s.promptMismatch(st.route.Peer, st.promptLen))
			return
		}
	}
}

// payloadRefused names the first stream whose generation rank would
// refuse the request's payload (an older version: no
// messages.FeatureLargePayload), or returns nil. The request fails here,
// before its Result leaves: a Result the peer refuses would fail the
// request there while this side reported DONE.
func (s *TxSession) payloadRefused() error {
	for _, p := range s.order {
		if err := s.payloadRefusedBy(s.streams[p].route); err != nil {
			return err
		}
	}
	return nil
}

// payloadRefusedBy is payloadRefused for one route.
func (s *TxSession) payloadRefusedBy(r *Route) error {
	if r == nil || !r.SmallPayload || len(s.payload) <= messages.LegacyMaxPayload {
		return nil
	}
	return fmt.Errorf("%w: request %s: its payload is %d bytes, and generation rank %s takes at most %d (an older version, without large payloads): upgrade it",
		ErrMismatch, s.cfg.Request, len(s.payload), r.Peer, messages.LegacyMaxPayload)
}

// promptMismatch names both prompt lengths of a request whose generation
// rank planned for another prompt than the one Send describes; the error
// matches ErrMismatch and ErrPromptMismatch.
func (s *TxSession) promptMismatch(peer messages.PeerID, theirs int) error {
	return tagged{fmt.Errorf("%w: request %s: generation rank %s "+promptMismatchWords+" %d tokens, Send has %d tokens",
		ErrMismatch, s.cfg.Request, peer, theirs, s.promptLn), ErrPromptMismatch}
}

// promptMismatchWords are in promptMismatch's text. The FAILED Result
// that tells the generation side carries ErrorKindPromptMismatch
// (errorKind), which RxSession matches to ErrPromptMismatch; it looks
// for these words in the Result's Error only when the Result names no
// kind — a context rank that predates the kind, whose text is all there
// is (mixed versions). Keep them in the text while such ranks may run.
// Both ends are in this package.
const promptMismatchWords = "planned a prompt of"

// errorKind is the wire's kind of err, a FAILED Result's cause, for the
// causes the generation side acts on (RxSession.onFrame); any other is
// unspecified.
func errorKind(err error) messages.ErrorKind {
	if errors.Is(err, ErrPromptMismatch) {
		return messages.ErrorKindPromptMismatch
	}
	return messages.ErrorKindUnspecified
}

// tagged is err, which also matches tag (errors.Is) without a word of it
// in the text.
type tagged struct {
	err, tag error
}

func (t tagged) Error() string   { return t.err.Error() }
func (t tagged) Unwrap() []error { return []error{t.err, t.tag} }

func (s *TxSession) onChunk(m TxChunk) {
	if s.state.Terminal() && !mutAdmitAfterDrain() {
		// No op is admitted after the outcome: nothing is pinned, the
		// serving process keeps its pages.
		return
	}
	if m.Payload != nil {
		// Before the chunk's writes are admitted: every Result leaves
		// after them (each stream needs the prompt's last block).
		s.payload = *m.Payload
		if err := s.payloadRefused(); err != nil {
			// Nothing of this chunk is pinned or admitted, as after any
			// outcome.
			s.fail(TxFailed, err)
			return
		}
	}
	idx := len(s.chunks)
	rec := chunkRec{c: m.Chunk, src: m.Src, pins: make([]bool, len(m.Src))}
	for g, run := range m.Src {
		if len(run.IDs) > 0 {
			rec.pins[g], rec.pinned = true, true
			if !m.Pinned {
				s.emit(Pin{Chunk: idx, Group: g, IDs: run.IDs})
			}
		}
	}
	s.chunks = append(s.chunks, rec)
	s.emit(WatchFence{Chunk: idx})
	for _, p := range s.order {
		s.admit(s.streams[p])
	}
}

func (s *TxSession) onFence(m TxFenceFired) {
	if m.Index < 0 || m.Index >= len(s.chunks) || s.chunks[m.Index].fired {
		s.violate("fence %d: unknown or fired twice", m.Index)
		return
	}
	s.chunks[m.Index].fired = true
	s.chunks[m.Index].fenceErr = m.Err
	if m.Err != nil {
		s.fail(TxFailed, fmt.Errorf("%w: request %s chunk %d: %w", ErrFence, s.cfg.Request, m.Index, m.Err))
	}
}

// onWorkerDead retires every op in flight on the dead worker (its endpoints
// were closed before it stopped: proof that they are quiescent, but for the
// ops in m.InDoubt, whose close proved nothing and which stay — or, those
// also in m.Released, go SOURCES_RELEASED) and fails the request if any of
// its streams used it. ADMITTED ops stay for progress(), which makes them
// NOT_SUBMITTED (their chunks stay pinned until their fences fire).
func (s *TxSession) onWorkerDead(m TxWorkerDead) {
	if !slices.Contains(s.dead, m.Worker) {
		s.dead = append(s.dead, m.Worker)
	}
	used := false
	for _, p := range s.order {
		st := s.streams[p]
		if st.worker != m.Worker {
			continue
		}
		used = true
		for i := range st.ops {
			r, o := OpRef{s.cfg.Request, p, i}, &st.ops[i]
			if o.state == OpSubmitting || o.state == OpSubmitted {
				s.setOp(r, o, OpInDoubt)
			}
			switch {
			case o.state != OpInDoubt:
			case slices.Contains(m.Released, r):
				s.setOp(r, o, OpSourcesReleased)
			case !slices.Contains(m.InDoubt, r):
				s.setOp(r, o, OpRetired)
				st.retired = true
			}
		}
		if st.phase == streamFlushing {
			st.phase = streamOpen // no flush will answer: the terminal frame goes out once quiescent
		}
	}
	if used {
		s.fail(TxFailed, fmt.Errorf("%w: request %s: sender worker %d stopped (restart budget spent): %w",
			ErrWorkerCrashed, s.cfg.Request, m.Worker, ErrEngineFailed))
	}
}

// onPinFailed records that a group of a chunk holds no pin (the pool
// refused it, all or nothing) and fails the request: its ops must not read
// pages the serving process does not hold. The ops become NOT_SUBMITTED
// (nothing was posted); the chunk's other pins wait for its fence.
func (s *TxSession) onPinFailed(m TxPinFailed) {
	if m.Chunk < 0 || m.Chunk >= len(s.chunks) || m.Group < 0 || m.Group >= len(s.chunks[m.Chunk].pins) ||
		!s.chunks[m.Chunk].pins[m.Group] {
		s.violate("pin failure for chunk %d group %d: not pinned", m.Chunk, m.Group)
		return
	}
	c := &s.chunks[m.Chunk]
	c.pins[m.Group] = false
	c.pinned = slices.Contains(c.pins, true)
	s.fail(TxFailed, fmt.Errorf("%w: request %s chunk %d (%v) group %d: %w", ErrPin, s.cfg.Request, m.Chunk, c.c, m.Group, m.Err))
}

func (s *TxSession) onPeerRequest(m TxPeerRequest) {
	old := s.streams[m.Peer]
	if old != nil && old.silences(m.Incarnation) {
		// Its stream ended silent: its writes may still land, and a
		// FAILED Result, of any epoch, is a proof. No answer.
		return
	}
	if old != nil && old.epoch == m.Epoch && (m.Err == nil || !mutRejectUnresolvedDuplicate()) {
		// A duplicate RequestData for the same epoch changes nothing, even
		// one that failed to resolve: its stream may have writes in
		// flight, so a FAILED answer would be a false proof.
		return
	}
	if m.Err != nil {
		s.fail(TxFailed, m.Err)
		s.rejectPeer(m, m.Err)
		return
	}
	if old != nil {
		err := fmt.Errorf("%w: request %s: peer %d sent epoch %d after %d", ErrBadRequest, s.cfg.Request, m.Peer, m.Epoch, old.epoch)
		s.fail(TxFailed, err)
		s.rejectPeer(m, err)
		return
	}
	if s.started && m.PromptLen != s.promptLn {
		err := s.promptMismatch(m.From, m.PromptLen)
		s.fail(TxFailed, err)
		s.rejectPeer(m, err)
		return
	}
	if !s.expectedSet {
		s.expected, s.expectedSet = slices.Clone(m.Expected), true
	}
	if !slices.Contains(s.expected, m.Peer) {
		err := fmt.Errorf("%w: request %s: rank %d is not a peer of this rank", ErrBadRequest, s.cfg.Request, m.Peer)
		s.fail(TxFailed, err)
		s.rejectPeer(m, err)
		return
	}
	w := WorkerFor(s.cfg.Request, m.Route.Peer, s.cfg.Workers)
	if slices.Contains(s.dead, w) {
		// Its ops would go to a worker that stopped for good: never
		// posted, never settled, the session never drained.
		err := fmt.Errorf("%w: request %s: sender worker %d for peer %d stopped (restart budget spent): %w",
			ErrWorkerCrashed, s.cfg.Request, w, m.Peer, ErrEngineFailed)
		s.fail(TxFailed, err)
		s.rejectPeer(m, err)
		return
	}
	if err := s.payloadRefusedBy(m.Route); err != nil {
		s.fail(TxFailed, err)
		s.rejectPeer(m, err)
		return
	}
	st := &stream{peer: m.Peer, epoch: m.Epoch, peerInc: m.Incarnation, route: m.Route, promptLen: m.PromptLen, worker: w}
	s.streams[m.Peer] = st
	s.order = append(s.order, m.Peer)
	if s.state.Terminal() {
		// Too late to write: answer at once (nothing was admitted).
		s.finishStream(st)
		return
	}
	if s.state == TxInit {
		s.state = TxReady
	}
	s.admit(st)
}

// afterStop answers what reaches a released session (frames its supervisor
// forwarded before it learnt of the stop): nothing of the session writes
// any more, so a RequestData gets a FAILED Result and a Cancel an ack.
func (s *TxSession) afterStop(msg any) {
	switch m := msg.(type) {
	case TxSent:
		// A failed session does not wait for its SUCCESS Results' reports
		// to stop (maybeRelease). One refused for the frame itself never
		// left: its peer gets the outcome now (onSent, as when live).
		if st := s.streams[m.Peer]; st != nil && st.phase == streamSending && m.Err != nil {
			st.phase = streamFinished
			if RefusedForGood(m.Err) {
				s.replyTo(st.route.Peer, st.peerInc, s.answer(st))
			}
		}
	case TxPeerRequest:
		if st := s.streams[m.Peer]; st != nil && (st.epoch == m.Epoch || st.silences(m.Incarnation)) {
			// A duplicate of a request already answered, or a peer whose
			// stream ended silent: its writes may still land, and a
			// FAILED Result is a proof.
			return
		}
		err := fmt.Errorf("%w: request %s already finished on the context side (%s)", ErrBadRequest, s.cfg.Request, s.state)
		if s.state == TxCancelled {
			// Cancelled here before this peer's RequestData came: the
			// peer's request ends CANCELLED too, as a stream's would.
			s.replyTo(m.From, m.Incarnation, &messages.Result{RequestID: s.cfg.Request, Epoch: m.Epoch, From: s.cfg.Self,
				Status: messages.StatusCancelled, Error: messages.TruncateText(err.Error(), messages.MaxErrorLen)})
			return
		}
		s.rejectPeer(m, err)
	case TxPeerCancel:
		if st := s.streams[m.Peer]; st != nil && st.silences(m.Incarnation) {
			// Its writes may still land: no proof, whatever the epoch.
			return
		}
		s.replyTo(m.From, m.Incarnation, &messages.CancelAck{RequestID: s.cfg.Request, Epoch: m.Epoch, From: s.cfg.Self})
	}
}

// rejectPeer answers a RequestData that opened no stream: nothing was
// admitted for it, so the peer may free its blocks at once.
func (s *TxSession) rejectPeer(m TxPeerRequest, err error) {
	s.replyTo(m.From, m.Incarnation, &messages.Result{RequestID: s.cfg.Request, Epoch: m.Epoch, From: s.cfg.Self,
		Status: messages.StatusFailed, Error: messages.TruncateText(err.Error(), messages.MaxErrorLen), ErrorKind: errorKind(err)})
}

// replyTo sends a frame to a peer that has no stream (a zero From — the
// tests' anonymous peers — gets nothing).
func (s *TxSession) replyTo(to messages.PeerID, toInc uint64, f messages.Frame) {
	if to.Instance == "" {
		return
	}
	stamp(f, messages.Incarnations{FromIncarnation: s.cfg.Incarnation, ToIncarnation: toInc})
	s.emit(SendFrame{Worker: WorkerFor(s.cfg.Request, to, s.cfg.Workers), To: to, Frame: f})
}

// admit turns every chunk the stream has not seen into an op (or a no-op
// when the chunk lies outside what the peer needs).
func (s *TxSession) admit(st *stream) {
	for st.admitted < len(s.chunks) {
		ci := st.admitted
		st.admitted++
		c := s.chunks[ci]
		segs, bytes, err := st.route.Planner.Plan(c.c, c.src, nil)
		if err != nil {
			s.fail(TxFailed, fmt.Errorf("request %s chunk %d for %s: %w", s.cfg.Request, ci, st.route.Peer, err))
			return
		}
		if len(segs) == 0 {
			continue
		}
		st.ops = append(st.ops, op{chunk: ci, state: OpAdmitted, segs: segs, bytes: bytes})
		st.busyOps++
	}
}

func (s *TxSession) onCompleted(m TxCompleted) {
	o := s.opOf(m.Op)
	if o == nil {
		s.violate("completion for unknown op %v", m.Op)
		return
	}
	st := s.streams[m.Op.Peer]
	switch {
	case m.Unproven && (o.state == OpSubmitting || o.state == OpSubmitted):
		s.setOp(m.Op, o, OpInDoubt)
		s.fail(TxFailed, fmt.Errorf("%w: request %s op %v: %w", ErrPeerFailed, s.cfg.Request, m.Op, m.Err))
		return
	case m.Unproven:
		return // in doubt (or settled) already; this proves nothing
	}
	switch o.state {
	case OpSubmitting, OpSubmitted:
		if m.Refused {
			s.setOp(m.Op, o, OpNotSubmitted)
		} else {
			s.setOp(m.Op, o, OpBackendDone)
			if m.Err == nil {
				st.bytes += o.bytes
				s.mutLateSuccess()
			}
		}
		if m.Err != nil {
			s.fail(TxFailed, fmt.Errorf("%w: request %s op %v: %w", ErrPeerFailed, s.cfg.Request, m.Op, m.Err))
		}
	case OpInDoubt:
		// A late completion proves the op quiescent; the logical
		// outcome (already terminal) does not change.
		s.setOp(m.Op, o, OpRetired)
		s.LateCompletions++
	default:
		s.LateCompletions++
	}
}

func (s *TxSession) onFlushed(m TxFlushed) {
	st := s.streams[m.Peer]
	if st == nil || st.phase != streamFlushing {
		return
	}
	if m.Err != nil {
		s.fail(TxFailed, fmt.Errorf("%w: request %s flush to %s: %w", ErrPeerFailed, s.cfg.Request, st.route.Peer, m.Err))
		st.phase = streamOpen // send the failure once quiescent
		return
	}
	if s.state.Terminal() {
		return // the terminal frame goes out in progress()
	}
	s.succeed(st)
}

// succeed sends a stream's Result{SUCCESS}: every op of it is BACKEND_DONE
// and their bytes are proven landed (a flush, or completions that prove
// delivery), so the peer may read them. The stream counts as finished for
// DONE only once its worker reports the frame left (TxSent).
func (s *TxSession) succeed(st *stream) {
	st.phase = streamSending
	if mutDoneOnHandoff() {
		st.phase = streamFinished
	}
	s.emit(SendFrame{Worker: st.worker, To: st.route.Peer, FromStream: true, Peer: st.peer, Frame: &messages.Result{
		RequestID: s.cfg.Request, Epoch: st.epoch, From: s.cfg.Self,
		Status: messages.StatusSuccess, Bytes: st.bytes, Payload: s.payload, Incarnations: s.incs(st),
	}})
}

// resultsHandedOver reports whether the session is undecided with every
// stream the plan expects past its SUCCESS Result's handover (waiting for
// the report that it left, or finished): what every peer learns is
// decided, only those reports are left to decide DONE.
func (s *TxSession) resultsHandedOver() bool {
	if s.state.Terminal() || len(s.expected) == 0 {
		return false
	}
	for _, p := range s.expected {
		if st := s.streams[p]; st == nil || !st.answered() {
			return false
		}
	}
	return true
}

// onSent records whether a stream's SUCCESS Result left this process: one
// that did not fails the request. Refused for the frame itself
// (RefusedForGood: its payload makes it larger than the peer's frame
// limit), it never left and never will, and the stream answers again as
// any stream of a failed request does (finishStream): with a FAILED
// Result, which carries no payload and fits any limit a peer may have
// (messages.MinFrameLimit), so the peer ends its side now, naming the
// reason, and frees its pages on it — every op of the stream is done and
// proven landed. Refused for the connection (queue full, closed), the
// peer waits for a Result that will never come; its deadline or Cancel
// ends its side. Reports about other terminal frames change nothing: the
// outcome is already decided.
func (s *TxSession) onSent(m TxSent) {
	st := s.streams[m.Peer]
	if st == nil || st.phase != streamSending {
		return
	}
	st.phase = streamFinished
	if m.Err == nil {
		return
	}
	if RefusedForGood(m.Err) {
		st.phase = streamOpen // send the failure once quiescent (as onFlushed)
	}
	s.fail(TxFailed, fmt.Errorf("%w: request %s: the Result for %s: %w", ErrFrameUnsent, s.cfg.Request, st.route.Peer, m.Err))
}

func (s *TxSession) onPeerGone(m TxPeerGone, now time.Time) {
	for _, p := range s.order {
		st := s.streams[p]
		if st.route.Peer != m.Peer || st.answered() || (m.Incarnation != 0 && st.peerInc > m.Incarnation) {
			continue
		}
		if m.Why != "" {
			s.fail(TxFailed, fmt.Errorf("%w: request %s: %s %s", ErrPeerGone, s.cfg.Request, m.Peer, m.Why))
		} else {
			s.fail(TxFailed, fmt.Errorf("%w: request %s: %s", ErrPeerGone, s.cfg.Request, m.Peer))
		}
		doubt := false
		for i := range st.ops {
			if o := &st.ops[i]; o.state == OpSubmitting || o.state == OpSubmitted {
				s.setOp(OpRef{s.cfg.Request, p, i}, o, OpInDoubt)
				doubt = true
			}
		}
		if doubt {
			s.emit(CloseEndpoint{Worker: st.worker, Peer: st.peer, Route: st.route})
		}
	}
}

func (s *TxSession) onTimeout(m TxTimeout, now time.Time) {
	switch m.Kind {
	case TimerOrphan:
		if s.started && !s.deadline.IsZero() {
			return // Send came with a deadline of its own, which rules
		}
		s.expire(now)
	case TimerDeadline:
		s.expire(now)
	case TimerDrain:
		// Ops still in doubt after the grace period: close their
		// endpoints, which proves them quiescent.
		for _, p := range s.order {
			st := s.streams[p]
			for i := range st.ops {
				if st.ops[i].state == OpInDoubt {
					s.emit(CloseEndpoint{Worker: st.worker, Peer: st.peer, Route: st.route})
					break
				}
			}
		}
	}
}

// expire applies a passed deadline. A decided outcome (cancel, error) does
// not change, but the deadline still bounds the physical drain: ops in
// flight go IN_DOUBT and their endpoints are closed after the grace.
func (s *TxSession) expire(now time.Time) {
	if s.resultsHandedOver() {
		// Every peer's SUCCESS Result was handed to its worker before the
		// deadline: every peer ends READY on it, and no op is in flight.
		// Failing now would only make this side disagree (as for a
		// TxCancel or TxPanic then); the reports that the Results left,
		// which come at once (a worker's Send does not wait), decide
		// DONE, or fail the request.
		s.emit(Log{Level: "info", Msg: "tx session " + s.cfg.Request +
			" reached its deadline after every Result was handed over: its outcome waits for their reports"})
		return
	}
	err := fmt.Errorf("%w: request %s", ErrTimeout, s.cfg.Request)
	if s.refused != "" && len(s.order) == 0 {
		err = fmt.Errorf("%w: request %s: no generation rank's RequestData resolved here; the one from %s", ErrTimeout, s.cfg.Request, s.refused)
	}
	s.fail(TxFailed, err)
	inDoubt := false
	s.eachOp(func(r OpRef, o *op) {
		if o.state == OpSubmitting || o.state == OpSubmitted {
			s.setOp(r, o, OpInDoubt)
			inDoubt = true
		}
	})
	if inDoubt {
		s.emit(StartTimer{Kind: TimerDrain, At: now.Add(s.cfg.DrainGrace)})
	}
}

// fail records the first terminal outcome; later ones change nothing.
func (s *TxSession) fail(to TxState, err error) {
	if s.state.Terminal() {
		return
	}
	s.state = to
	s.err = err
	s.emit(Decide{Status: to.String(), Err: err},
		Log{Level: "warn", Msg: "tx session " + s.cfg.Request + " " + to.String(), Err: err})
}

// progress submits what can leave, finishes streams and releases the
// session when everything is quiescent.
func (s *TxSession) progress() {
	terminal := s.state.Terminal()
	for _, p := range s.order {
		st := s.streams[p]
		if terminal {
			// Ops that never left never will (nothing is submitted after
			// the outcome): they are NOT_SUBMITTED at once, so the stream
			// answers its peer, which may free its pages, without waiting
			// for a fence that may be late or never fire. Their chunks'
			// source pages stay pinned until the fence fires (Quiescent):
			// the serving process may still be writing them.
			for i := st.next; i < len(st.ops); i++ {
				o := &st.ops[i]
				if o.state == OpAdmitted {
					s.setOp(OpRef{s.cfg.Request, st.peer, i}, o, OpNotSubmitted)
				}
			}
			if !st.answered() && streamQuiescent(st) {
				s.finishStream(st)
			}
			continue
		}
		for st.next < len(st.ops) {
			o := &st.ops[st.next]
			c := s.chunks[o.chunk]
			if !c.fired {
				break
			}
			ref := OpRef{s.cfg.Request, st.peer, st.next}
			s.setOp(ref, o, OpSubmitting)
			s.emit(Submit{Worker: st.worker, Peer: st.peer, Op: ref, Route: st.route, Segments: o.segs, Bytes: o.bytes})
			if s.state == TxReady || s.state == TxInit {
				s.state = TxTransferring
			}
			st.next++
		}
		if st.phase == streamOpen && s.lastSeen(st) && allDone(st) {
			if st.route.CompletionsDeliver {
				s.succeed(st) // the last completion proved delivery: no flush
			} else {
				st.phase = streamFlushing
				s.emit(Flush{Worker: st.worker, Peer: st.peer, Request: s.cfg.Request, Route: st.route})
			}
		}
	}
	if !terminal && len(s.expected) > 0 {
		done := true
		for _, p := range s.expected {
			st := s.streams[p]
			if st == nil || st.phase != streamFinished {
				done = false
				break
			}
		}
		if done {
			s.state = TxDone
			s.emit(Decide{Status: TxDone.String()})
		}
	}
	s.maybeRelease()
}

func (s *TxSession) lastSeen(st *stream) bool {
	if st.admitted == 0 || st.admitted != len(s.chunks) {
		return false
	}
	c := s.chunks[len(s.chunks)-1].c
	return c.Last && (c.Layers.Final() || mutEndBeforeFinalPart()) // a last chunk's earlier layer parts are not the end
}

func allDone(st *stream) bool { return st.doneOps == len(st.ops) }

// streamQuiescent reports whether no op of the stream may still read its
// source; with no op in SOURCES_RELEASED, none may still write either.
func streamQuiescent(st *stream) bool { return st.busyOps == 0 }

// finishStream sends the stream's terminal frame; it is only called when
// every op of the stream is source-quiescent (streamQuiescent). When every
// op is quiescent, the peer may free its pages on that frame. When some op
// is SOURCES_RELEASED its writes may still land, so the stream ends
// without a frame (EndStream): it counts as answered, the session may
// release its source pins and stop, and the peer gets no proof from us
// (it fails the request at its deadline and quarantines its pages until
// the writer's proven exit).
func (s *TxSession) finishStream(st *stream) {
	st.phase = streamFinished
	if st.cutOps > 0 {
		st.silent = true
		s.emit(EndStream{Worker: st.worker, Peer: st.peer},
			Log{Level: "warn", Msg: fmt.Sprintf("tx session %s: stream to %s ends without a terminal frame: %d of its ops were cut by a close that proved their sources released but not their writes over",
				s.cfg.Request, st.route.Peer, st.cutOps)})
		return
	}
	s.emit(SendFrame{Worker: st.worker, To: st.route.Peer, FromStream: true, Peer: st.peer, Frame: s.answer(st)})
}

// answer is the terminal frame of a stream of a decided session whose
// ops are all quiescent: a CancelAck when its peer cancelled, else a
// Result saying the outcome (IN_DOUBT for a stream with ops retired),
// without payload.
func (s *TxSession) answer(st *stream) messages.Frame {
	if st.cancelled {
		return &messages.CancelAck{RequestID: s.cfg.Request, Epoch: st.epoch, From: s.cfg.Self, Incarnations: s.incs(st)}
	}
	status := messages.StatusFailed
	switch {
	case st.retired:
		status = messages.StatusInDoubt
	case s.state == TxCancelled:
		status = messages.StatusCancelled
	}
	text, kind := "", messages.ErrorKindUnspecified
	if s.err != nil {
		text = messages.TruncateText(s.err.Error(), messages.MaxErrorLen)
	}
	if status == messages.StatusFailed {
		kind = errorKind(s.err) // a kind is only for FAILED (Result.Validate)
	}
	return &messages.Result{RequestID: s.cfg.Request, Epoch: st.epoch, From: s.cfg.Self, Status: status, Bytes: st.bytes, Error: text,
		ErrorKind: kind, Incarnations: s.incs(st)}
}

// incs are the incarnations of a stream's frames: from this rank's, to the
// one its peer's RequestData came from.
func (s *TxSession) incs(st *stream) messages.Incarnations {
	return messages.Incarnations{FromIncarnation: s.cfg.Incarnation, ToIncarnation: st.peerInc}
}

// Quiescent reports whether no op of any stream may still touch a source
// page and every pinned chunk's fence has fired: the session may release
// its source pins. An op in SOURCES_RELEASED may still write its peer's
// pages; its stream gives the peer no proof (finishStream).
func (s *TxSession) Quiescent() bool {
	for i := range s.chunks {
		if s.chunks[i].pinned && !s.chunks[i].fired {
			return false
		}
	}
	for _, st := range s.streams {
		if !streamQuiescent(st) {
			return false
		}
	}
	return true
}

func (s *TxSession) maybeRelease() {
	s.mutUnpinEarly()
	if !s.state.Terminal() || s.stopped || !s.Quiescent() {
		return
	}
	for _, st := range s.streams {
		// A SUCCESS Result still waiting for its TxSent does not hold the
		// release of a failed session: its ops are quiescent, and the
		// report may never come (its worker died).
		if !st.answered() {
			return
		}
	}
	for i := range s.chunks {
		s.unpinChunk(&s.chunks[i])
	}
	var bytes uint64
	for _, st := range s.streams {
		bytes += st.bytes
	}
	s.emit(Finish{Outcome: Outcome{Request: s.cfg.Request, Status: s.state.Status(),
		OK: s.state == TxDone, Err: s.err, Bytes: bytes}}, Stop{})
	s.stopped = true
}

// unpinChunk drops every pin the chunk holds.
func (s *TxSession) unpinChunk(c *chunkRec) {
	if !c.pinned {
		return
	}
	c.pinned = false
	for g, run := range c.src {
		if c.pins[g] {
			c.pins[g] = false
			s.emit(Unpin{Group: g, IDs: run.IDs})
		}
	}
}

func (s *TxSession) opOf(r OpRef) *op {
	st := s.streams[r.Peer]
	if st == nil || r.Seq < 0 || r.Seq >= len(st.ops) || r.Request != s.cfg.Request {
		return nil
	}
	return &st.ops[r.Seq]
}

func (s *TxSession) eachOp(f func(OpRef, *op)) {
	for _, p := range s.order {
		st := s.streams[p]
		for i := range st.ops {
			f(OpRef{s.cfg.Request, p, i}, &st.ops[i])
		}
	}
}

func (s *TxSession) setOp(r OpRef, o *op, to OpState) {
	if Invariants && !LegalOpTransition(o.state, to) {
		s.violate("op %v: illegal %v → %v", r, o.state, to)
	}
	if st := s.streams[r.Peer]; st != nil {
		if o.state == OpBackendDone {
			st.doneOps--
		}
		if to == OpBackendDone {
			st.doneOps++
		}
		if o.state == OpSourcesReleased {
			st.cutOps--
		}
		if to == OpSourcesReleased {
			st.cutOps++
		}
		if !o.state.SourceQuiescent() {
			st.busyOps--
		}
		if !to.SourceQuiescent() {
			st.busyOps++
		}
	}
	if o.state == OpInDoubt {
		s.inDoubt--
	}
	if to == OpInDoubt {
		s.inDoubt++
	}
	o.state = to
}

// InDoubt is how many of the session's ops are IN_DOUBT now: posted, and
// neither proven over nor proven to read their source no more (a worker
// crashed or an endpoint was cut under them, or the deadline passed with
// them in flight). Kept as ops change state: O(1).
func (s *TxSession) InDoubt() int { return s.inDoubt }

// OpStates returns every op's state, keyed by reference (for tests, the
// simulator and replay).
func (s *TxSession) OpStates() map[OpRef]OpState {
	out := map[OpRef]OpState{}
	s.eachOp(func(r OpRef, o *op) { out[r] = o.state })
	return out
}

// SilentPeers returns the generation ranks whose streams ended without a
// terminal frame (EndStream), with the incarnation each stream wrote to:
// writes to them may still land. No frame of
// this rank may ever tell them otherwise — no CancelAck, no FAILED Result
// — also once the session has stopped (TxTable.Silence).
func (s *TxSession) SilentPeers() []SilentPeer {
	var out []SilentPeer
	for _, p := range s.order {
		if st := s.streams[p]; st.silent {
			out = append(out, SilentPeer{PeerID: st.route.Peer, Incarnation: st.peerInc})
		}
	}
	return out
}

// PinnedChunks returns the indexes of chunks whose pages are still pinned.
func (s *TxSession) PinnedChunks() []int {
	var out []int
	for i := range s.chunks {
		if s.chunks[i].pinned {
			out = append(out, i)
		}
	}
	return out
}

// emitCap is the room a step's effects slice is made with on its first
// effect: an append to an empty slice grows it 1, 2, 4 — an allocation
// each — and many steps emit two or more (a release: Decide, Unpins,
// Finish, Stop). 2 saved the most allocations per byte in
// BenchmarkRequestOverhead (internal/bench): 3 allocations a request
// for 17 bytes; 4 saved one more for 175 bytes.
const emitCap = 2

// maxSpare bounds the effects slice a session keeps for its next step
// (Recycle): a step that emitted many does not leave a large one held.
const maxSpare = 16

// recycled is eff emptied for reuse, its elements cleared (they hold
// effects that are done with), or nil when it is not worth keeping.
func recycled(eff []Effect) []Effect {
	if cap(eff) == 0 || cap(eff) > maxSpare {
		return nil
	}
	eff = eff[:cap(eff)]
	clear(eff)
	return eff[:0]
}

// emit appends effects to the step's.
func (s *TxSession) emit(e ...Effect) {
	if cap(s.eff) == 0 {
		s.eff = make([]Effect, 0, max(emitCap, len(e)))
	}
	s.eff = append(s.eff, e...)
}
