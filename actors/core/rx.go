package core

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Messages an RxSession steps on.
type (
	// RxBegin starts the session: its blocks are allocated.
	RxBegin struct{}
	// RxFrame: a Result, CancelAck or Misaddressed (onMisaddressed) from
	// writer Writer. Invalid, when
	// set, is why the frame failed validation (messages.InvalidFrame):
	// only its naming fields (request, epoch, sender, incarnations) may be
	// read. It fails the request at once, but proves nothing: the writer
	// stays pending and the blocks are quarantined until a proof.
	RxFrame struct {
		Writer  int
		Frame   messages.Frame
		Invalid error
	}
	// RxCancel: the local serving process cancelled the request.
	RxCancel struct{ Reason error }
	// RxTimeout: a session timer fired: the request's deadline (Kind
	// TimerDeadline, or zero), the Cancel re-send period (TimerDrain), or
	// the RequestData re-send backoff (TimerResend).
	RxTimeout struct{ Kind TimerKind }
	// RxSent: the worker tried to hand writer Writer's RequestData to the
	// control plane. Err nil means the control plane took it (it may have
	// reached the writer: the proof rules apply from then on); an error
	// means it did not leave this process, so that writer cannot be
	// writing for this request.
	RxSent struct {
		Writer int
		Err    error
	}
	// RxPeerGone: proof that a writer can write no more for this request:
	// its endpoint is closed, or its process is dead as the backend
	// defines it (docs/membership.md §4).
	RxPeerGone struct {
		Writer int
		Err    error
		// Incarnation is the writer's incarnation the proof is about (0:
		// any): the death of one incarnation proves nothing about another
		// the request was addressed to since (RxAddress).
		Incarnation uint64
	}
	// RxAddress: the shell did not send writer Writer's RequestData (the
	// SendRequestData just emitted) because the writer's Hello names
	// another incarnation than the frame is addressed to — the writer
	// restarted since the request started (or its Hello was not known
	// then): the new incarnation would drop the frame, and the old one's
	// answers are no proof for a request it never got. The RequestData has
	// never left (a writer is sent one only until it leaves), so it is
	// addressed to Incarnation and sent again; on a decided request it
	// never reached the writer (RxSent's refusal).
	RxAddress struct {
		Writer      int
		Incarnation uint64
	}
	// RxSuspect: the control plane suspects a writer (missed heartbeats).
	// It may be alive — partitioned, stalled, slow — so this fails the
	// request logically but proves nothing: the writer stays pending and
	// the blocks are quarantined until a proof (DESIGN.md §3).
	// Incarnation: the Down was of that incarnation of the writer, or an
	// earlier one (Engine.PeerIncarnationDown: its process exited); 0:
	// any. A writer the session addressed to a later incarnation since
	// (a Misaddressed taken while the Down was on its way to the parent,
	// whose table still had the earlier one) is not suspected by it.
	RxSuspect struct {
		Writer      int
		Err         error
		Incarnation uint64 `json:",omitempty"`
	}
	// RxAbandon: the engine is closing. It does not wait for proofs from
	// suspected writers (partitioned or stalled, perhaps for good): once
	// every writer without proof is suspected, the session stops and its
	// blocks stay quarantined — never freed — for the pool's lifetime.
	// Writers that are heard from are still waited for (their CancelAck).
	RxAbandon struct{}
	// RxHeard: the control plane hears writer Writer again, in incarnation
	// Incarnation, after a Down (its heartbeat, a frame of it, its Hello
	// current as a request starts or as the engine closes): a suspicion of missed heartbeats (an RxSuspect
	// of no incarnation) is lifted, and the writer is sent the Cancel
	// again at once, so that a writer that was only partitioned or
	// stalled answers now, not at the Cancel's next re-send, and a
	// closing engine waits for that answer (RxAbandon), within Close's
	// context, instead of leaving the blocks quarantined for the pool's
	// lifetime. It proves nothing and changes no outcome: the blocks stay
	// quarantined until a proof. Ignored for another incarnation than the
	// one the writer was addressed to, an unknown one (0), and a writer
	// suspected on an incarnation's Down (its exit, its goodbye, its
	// record gone), which hearing it does not undo.
	RxHeard struct {
		Writer      int
		Incarnation uint64
	}
	// RxPanic: the session's shell recovered a panic.
	RxPanic struct{ Err error }
	// RxWorkerDead: sender worker Worker spent its restart budget and was
	// stopped; requests whose writers it served fail (their frames now go
	// through another worker).
	RxWorkerDead struct{ Worker int }
)

type writerState uint8

const (
	writerPending   writerState = iota
	writerSucceeded             // Result SUCCESS
	writerStopped               // quiescent: Result not SUCCESS, CancelAck, or gone
)

// RxWriter is one context rank this generation rank expects a result from.
type RxWriter struct {
	Peer   messages.PeerID
	Worker int
	// Request is the RequestData to send it.
	Request *messages.RequestData
	// Bytes is what the writer must write, from this rank's own plan: a
	// SUCCESS reporting any other count fails the request (READY is exact).
	Bytes uint64
	// Incarnation is the writer's incarnation the request is addressed to
	// (0: not known). A frame of another incarnation of the writer is no
	// answer for this request: not its outcome, not a proof.
	Incarnation uint64
	// DroppedBy is the latest incarnation of the writer whose Misaddressed
	// the session took (0: none): one is taken only from a later one, so
	// that each answers a distinct copy of the RequestData
	// (onMisaddressed).
	DroppedBy uint64
}

// delivery is what a session knows of a writer's RequestData.
type delivery uint8

const (
	deliveryNone      delivery = iota // not handed to a worker yet (before RxBegin)
	deliverySending                   // handed to the worker, no answer yet
	deliveryRefused                   // did not leave this process (will be re-sent)
	deliveryDelivered                 // the control plane took it
)

// Re-send backoff for a RequestData the control plane refused (the peer
// not connected yet, its queue full): first after resendFirst, doubling up
// to resendMax, until the deadline.
const (
	resendFirst = 20 * time.Millisecond
	resendMax   = time.Second
)

// Cancel re-sends (RxConfig.CancelResend) keep their period for the first
// cancelFastFor after the first Cancel, then back off, doubling up to
// cancelResendMax. A writer may hold a Cancel unanswered while every
// cancel tombstone slot it has is younger than CancelTombMinAge
// (TxTable.Cancel): a slot ages within CancelTombMinAge of the held
// Cancel's arrival, and the re-send after it is answered, so the prompt
// re-sends cover that twice over (for Cancels that compete for the slots).
// A writer that still answers nothing after that has silenced the request
// (TxTable.Silence: its writes may still land, it answers only once
// proven quiescent, if ever) or is gone: a Cancel every cancelResendMax
// costs such a request next to nothing, where one a period cost a frame a
// second for the life of the session. Writers of every version take the
// same Cancel, whenever it comes.
const (
	cancelFastFor   = 2 * CancelTombMinAge
	cancelResendMax = 30 * time.Second
)

// RxConfig is what an RxSession knows at birth.
type RxConfig struct {
	Request  string
	Epoch    uint64
	Self     messages.PeerID
	Deadline time.Time
	Writers  []RxWriter
	// Blocks are the destination blocks per group the session owns.
	Blocks [][]kvcache.BlockID
	// CallerOwned: the blocks are the framework's; the session's release
	// hands them back through the handle instead of freeing them.
	CallerOwned bool
	// CancelResend is how often a decided session sends Cancel again to
	// writers that have not answered (any frame may be lost), for the
	// first cancelFastFor; then the period doubles up to cancelResendMax
	// (or CancelResend, if longer). 0 sends it once.
	CancelResend time.Duration
	// Incarnation is this rank's (0: not known).
	Incarnation uint64
}

// RxSession is the generation-side state machine of one request.
type RxSession struct {
	cfg     RxConfig
	state   RxState
	err     error
	writers []writerState
	sent    []delivery
	sendErr []error         // the last refusal of each writer's RequestData
	backoff []time.Duration // the next re-send delay of each writer
	resend  bool            // a re-send timer is armed
	// early holds, per writer, a Misaddressed answer that came before the
	// control plane's word that its RequestData left (RxSent): taken when
	// that word comes, dropped if the copy never left. Made on first use.
	early []*messages.Misaddressed
	// cancelArmed: a Cancel re-send timer (TimerDrain) is armed; one
	// chain at most, however many paths ask for a Cancel. cancelFirst is
	// when the first Cancel went, cancelEvery the chain's last period
	// (cancelFastFor).
	cancelArmed bool
	cancelFirst time.Time
	cancelEvery time.Duration
	bytes       uint64
	// payload is READY's: that of the first writer (in Config.Writers'
	// order, the context ranks') whose Result carried one, whatever the
	// order the Results came in; payloadFrom is that writer.
	payload     []byte
	payloadFrom int
	stopped     bool
	handed      bool // blocks handed to the handle (READY)
	// quarantined: the blocks went to quarantine (QuarantineDest): the
	// request failed while a writer may still write.
	quarantined bool
	suspect     []suspicion // writers the control plane suspects, and on what
	abandon     bool        // RxAbandon: stop without the suspects' proofs
	now         time.Time
	eff         []Effect
	spare       []Effect // a step's effects slice handed back (Recycle)
	// StaleFrames counts frames of another epoch or after the writer stopped.
	StaleFrames int
}

// NewRxSession returns a session in REQUESTED.
func NewRxSession(cfg RxConfig) *RxSession {
	n := len(cfg.Writers)
	if n == 1 {
		// One writer (a context instance of one rank, the common case):
		// its five slices of one, in one allocation instead of five.
		one := new(rxOneWriter)
		return &RxSession{cfg: cfg, writers: one.writers[:], sent: one.sent[:], sendErr: one.sendErr[:],
			backoff: one.backoff[:], suspect: one.suspect[:]}
	}
	return &RxSession{cfg: cfg, writers: make([]writerState, n), sent: make([]delivery, n),
		sendErr: make([]error, n), backoff: make([]time.Duration, n), suspect: make([]suspicion, n)}
}

// rxOneWriter holds a one-writer session's per-writer slices (NewRxSession).
type rxOneWriter struct {
	writers [1]writerState
	sent    [1]delivery
	sendErr [1]error
	backoff [1]time.Duration
	suspect [1]suspicion
}

// suspicion is what the control plane suspects a writer on (RxSuspect).
type suspicion uint8

const (
	suspectNone suspicion = iota
	// suspectHeard: missed heartbeats (an RxSuspect of no incarnation),
	// which hearing the writer again lifts (RxHeard).
	suspectHeard
	// suspectDown: a Down of the writer's incarnation — its exit, its
	// goodbye, its record gone (RxSuspect.Incarnation) — which hearing
	// it does not undo.
	suspectDown
)

// Quarantined reports whether the session's blocks are in quarantine.
func (s *RxSession) Quarantined() bool { return s.quarantined }

// Unproven lists the writers that may still write (no proof yet).
func (s *RxSession) Unproven() []int {
	var out []int
	for i, w := range s.writers {
		if w == writerPending {
			out = append(out, i)
		}
	}
	return out
}

// State is the session's state.
func (s *RxSession) State() RxState { return s.state }

// Err is the first terminal error.
func (s *RxSession) Err() error { return s.err }

// Stopped reports whether the session has released or handed its blocks.
func (s *RxSession) Stopped() bool { return s.stopped }

// Blocks are the destination blocks the session holds.
func (s *RxSession) Blocks() [][]kvcache.BlockID { return s.cfg.Blocks }

// WritersQuiescent reports whether no writer may still write.
func (s *RxSession) WritersQuiescent() bool {
	for _, w := range s.writers {
		if w == writerPending {
			return false
		}
	}
	return true
}

// Unreturned takes the effects of a Step that never returned them (a
// panic inside it, after it emitted them) and forgets them: see
// TxSession.Unreturned.
func (s *RxSession) Unreturned() []Effect {
	eff := s.eff
	s.eff = nil
	return eff
}

// Recycle hands back a slice of effects Step returned, once its caller
// has run them and keeps no reference to it: see TxSession.Recycle.
func (s *RxSession) Recycle(eff []Effect) { s.spare = recycled(eff) }

// Step applies one message and returns the effects to execute.
func (s *RxSession) Step(msg any, now time.Time) []Effect {
	s.eff, s.spare, s.now = s.spare[:0], nil, now
	if s.stopped {
		if f, ok := msg.(RxFrame); ok && f.Frame != nil {
			s.StaleFrames++
		}
		return nil
	}
	switch m := msg.(type) {
	case RxBegin:
		if s.state != RxRequested {
			break
		}
		s.state = RxReceiving
		if !s.cfg.Deadline.IsZero() {
			s.emit(StartTimer{Kind: TimerDeadline, At: s.cfg.Deadline})
		}
		for i := range s.cfg.Writers {
			s.sendRequest(i)
		}
		if len(s.cfg.Writers) == 0 {
			s.terminal(RxReady, nil)
		}
	case RxFrame:
		s.onFrame(m)
	case RxCancel:
		err := m.Reason
		if err == nil {
			err = ErrCancelled
		}
		s.terminal(RxCancelled, fmt.Errorf("%w: request %s", err, s.cfg.Request))
	case RxSent:
		s.onSent(m)
	case RxTimeout:
		if m.Kind == TimerResend {
			s.resend = false
			if !s.state.Terminal() {
				for i, d := range s.sent {
					if d == deliveryRefused && s.writers[i] == writerPending {
						s.sendRequest(i)
					}
				}
			}
			break
		}
		if m.Kind == TimerDrain {
			s.cancelArmed = false
		}
		if s.state.Terminal() {
			// The Cancel re-send timer; the deadline after another
			// outcome changes nothing (that outcome armed the re-sends).
			if m.Kind == TimerDrain && s.cfg.CancelResend > 0 {
				s.cancelPending()
			}
			break
		}
		s.terminal(RxTimedOut, fmt.Errorf("%w: request %s%s", ErrTimeout, s.cfg.Request, s.undelivered()))
	case RxAddress:
		s.onAddress(m)
	case RxPeerGone:
		if m.Writer >= 0 && m.Writer < len(s.writers) && s.writers[m.Writer] == writerPending &&
			(m.Incarnation == 0 || s.cfg.Writers[m.Writer].Incarnation == 0 || m.Incarnation == s.cfg.Writers[m.Writer].Incarnation) {
			s.writers[m.Writer] = writerStopped
			s.terminal(RxFailed, fmt.Errorf("%w: request %s writer %s: %w", ErrPeerGone, s.cfg.Request, s.cfg.Writers[m.Writer].Peer, m.Err))
		}
	case RxSuspect:
		if m.Writer >= 0 && m.Writer < len(s.writers) && s.writers[m.Writer] == writerPending &&
			(m.Incarnation == 0 || s.cfg.Writers[m.Writer].Incarnation <= m.Incarnation) {
			if mutFreeOnSuspicion() {
				s.writers[m.Writer] = writerStopped
			}
			s.suspect[m.Writer] = max(s.suspect[m.Writer], suspectHeard)
			if m.Incarnation != 0 {
				s.suspect[m.Writer] = suspectDown
			}
			if m.Err == nil {
				m.Err = errSuspected
			}
			s.terminal(RxFailed, fmt.Errorf("%w: request %s writer %s (suspected, not proven dead): %w", ErrPeerGone, s.cfg.Request, s.cfg.Writers[m.Writer].Peer, m.Err))
		}
	case RxHeard:
		s.onHeard(m)
	case RxAbandon:
		s.abandon = true
		s.terminal(RxCancelled, fmt.Errorf("%w: request %s", ErrClosed, s.cfg.Request))
	case RxPanic:
		s.terminal(RxFailed, fmt.Errorf("%w: request %s: %w", ErrSessionCrashed, s.cfg.Request, m.Err))
	case RxWorkerDead:
		for _, w := range s.cfg.Writers {
			if w.Worker == m.Worker {
				s.terminal(RxFailed, fmt.Errorf("%w: request %s: sender worker %d stopped (restart budget spent): %w",
					ErrWorkerCrashed, s.cfg.Request, m.Worker, ErrEngineFailed))
				break
			}
		}
	}
	s.maybeRelease()
	return s.eff
}

func (s *RxSession) onFrame(m RxFrame) {
	if m.Writer < 0 || m.Writer >= len(s.writers) {
		s.StaleFrames++
		return
	}
	var epoch uint64
	var inc messages.Incarnations
	switch f := m.Frame.(type) {
	case *messages.Result:
		epoch, inc = f.Epoch, f.Incarnations
	case *messages.CancelAck:
		epoch, inc = f.Epoch, f.Incarnations
	case *messages.Misaddressed:
		if m.Invalid == nil {
			s.onMisaddressed(m.Writer, f)
		} else {
			s.StaleFrames++
		}
		return
	default:
		s.StaleFrames++
		return
	}
	if epoch != s.cfg.Epoch || s.writers[m.Writer] != writerPending {
		s.StaleFrames++ // duplicate or stale: idempotent
		return
	}
	if w := s.cfg.Writers[m.Writer].Incarnation; w != 0 && inc.FromIncarnation != 0 && inc.FromIncarnation != w ||
		s.cfg.Incarnation != 0 && inc.ToIncarnation != 0 && inc.ToIncarnation != s.cfg.Incarnation {
		// Another incarnation of the writer (a restart that never heard
		// of this request answers a Cancel "nothing of mine writes"), or
		// addressed to another of this rank: no answer, no proof.
		s.StaleFrames++
		return
	}
	if m.Invalid != nil {
		// The writer's answer, unreadable: another version's, or a broken
		// peer's. The request cannot become READY on it, and it is no
		// proof that the writer is done (DESIGN.md §3): it is asked to
		// stop, and its CancelAck frees the blocks.
		if mutProofFromInvalid() {
			s.writers[m.Writer] = writerStopped
		}
		s.terminal(RxFailed, fmt.Errorf("%w: request %s writer %s sent an invalid %s: %w",
			ErrMismatch, s.cfg.Request, s.cfg.Writers[m.Writer].Peer, frameName(m.Frame), m.Invalid))
		return
	}
	switch f := m.Frame.(type) {
	case *messages.Result:
		s.bytes += f.Bytes
		if want := s.cfg.Writers[m.Writer].Bytes; f.Status == messages.StatusSuccess && f.Bytes != want {
			// The writer is done (a Result is its terminal frame), but it
			// did not write what this rank planned: another prompt length,
			// another layout, a short source. Never READY.
			s.writers[m.Writer] = writerStopped
			s.terminal(RxFailed, fmt.Errorf("%w: request %s writer %s reported SUCCESS with %d bytes written, this rank planned %d",
				ErrMismatch, s.cfg.Request, f.From, f.Bytes, want))
			return
		}
		if f.Status == messages.StatusSuccess {
			s.writers[m.Writer] = writerSucceeded
			if len(f.Payload) > 0 && (s.payload == nil || m.Writer < s.payloadFrom) {
				s.payload, s.payloadFrom = f.Payload, m.Writer
			}
			if s.allSucceeded() {
				s.terminal(RxReady, nil)
			}
			return
		}
		s.writers[m.Writer] = writerStopped
		// A CANCELLED Result is the peer's cancel (ErrPeerCancelled, as on
		// the context side), a FAILED one its failure (ErrPeerFailed).
		st, cause := RxFailed, ErrPeerFailed
		if f.Status == messages.StatusCancelled {
			st, cause = RxCancelled, ErrPeerCancelled
		}
		err := fmt.Errorf("%w: request %s writer %s: %s: %s", cause, s.cfg.Request, f.From, f.Status, f.Error)
		if f.Status == messages.StatusFailed && promptMismatched(f) {
			err = tagged{err, ErrPromptMismatch} // the context side's promptMismatch
		}
		s.terminal(st, err)
	case *messages.CancelAck:
		s.writers[m.Writer] = writerStopped
		s.terminal(RxFailed, fmt.Errorf("%w: request %s: writer %s acknowledged a cancel", ErrPeerCancelled, s.cfg.Request, f.From))
	}
}

// promptMismatched reports whether a FAILED Result is the context side's
// promptMismatch: its ErrorKind says so. A Result of no kind may come
// from a context rank that predates the kind (mixed versions), whose
// error text is all there is: only then are promptMismatchWords looked
// for in it, a fallback to drop once no such rank runs. A kind this
// build does not define (a newer rank's) is not a prompt mismatch, which
// that rank would name.
func promptMismatched(f *messages.Result) bool {
	switch f.ErrorKind {
	case messages.ErrorKindPromptMismatch:
		return true
	case messages.ErrorKindUnspecified:
		return strings.Contains(f.Error, promptMismatchWords) // an older context rank
	}
	return false
}

// frameName names a frame's type for an error text: "Result".
func frameName(f messages.Frame) string {
	switch f.(type) {
	case *messages.Result:
		return "Result"
	case *messages.CancelAck:
		return "CancelAck"
	}
	return fmt.Sprintf("%T", f)
}

func (s *RxSession) allSucceeded() bool {
	for _, w := range s.writers {
		if w != writerSucceeded {
			return false
		}
	}
	return true
}

// sendRequest hands writer i's RequestData to its worker, which answers
// RxSent.
func (s *RxSession) sendRequest(i int) {
	w := s.cfg.Writers[i]
	s.sent[i] = deliverySending
	s.emit(SendRequestData{Writer: i, Worker: w.Worker, To: w.Peer, Frame: w.Request})
}

// onSent records whether a RequestData left. One that did not is re-sent
// with backoff while the request is live; once the outcome is decided, a
// writer whose RequestData never left cannot be writing, so it is
// quiescent for this request.
func (s *RxSession) onSent(m RxSent) {
	if m.Writer < 0 || m.Writer >= len(s.sent) || s.sent[m.Writer] != deliverySending {
		return
	}
	if m.Err == nil {
		s.sent[m.Writer] = deliveryDelivered
		if f := s.takeEarly(m.Writer); f != nil {
			s.onMisaddressed(m.Writer, f)
		}
		return
	}
	s.takeEarly(m.Writer) // that copy never left: the answer is about none
	s.sent[m.Writer] = deliveryRefused
	s.sendErr[m.Writer] = m.Err
	if s.state.Terminal() {
		s.neverReached(m.Writer)
		return
	}
	if RefusedForGood(m.Err) {
		// The control plane refused this frame itself (larger than the
		// writer's frame limit, invalid): sent again it is refused
		// again, so the request fails now with the reason instead of at
		// its deadline. The writer never got it (neverReached, in
		// terminal): it cannot be writing, and owes no CancelAck. It is
		// told all the same, with the reason, so that its own side of
		// the request (a Send waiting for this RequestData) ends now,
		// naming it, instead of at its deadline.
		err := fmt.Errorf("%w: request %s: RequestData for writer %s refused: %w",
			ErrFrameUnsent, s.cfg.Request, s.cfg.Writers[m.Writer].Peer, m.Err)
		s.terminal(RxFailed, err)
		wr := s.cfg.Writers[m.Writer]
		s.emit(SendFrame{Worker: wr.Worker, To: wr.Peer, Frame: &messages.Cancel{
			RequestID: s.cfg.Request, Epoch: s.cfg.Epoch, From: s.cfg.Self,
			Reason:       messages.TruncateText(err.Error(), messages.MaxErrorLen),
			Incarnations: messages.Incarnations{FromIncarnation: s.cfg.Incarnation, ToIncarnation: wr.Incarnation}}})
		return
	}
	d := s.backoff[m.Writer]
	if d == 0 {
		d = resendFirst
	}
	s.backoff[m.Writer] = min(2*d, resendMax)
	if !s.resend {
		s.resend = true
		s.emit(StartTimer{Kind: TimerResend, At: s.now.Add(d)})
	}
}

// RefusedForGood reports whether err, a RequestData's send refusal, is
// about the frame itself (control.ErrFrameRefused: too large for the
// peer or for us; messages.ErrInvalid), which a re-send cannot change,
// rather than about the connection (not up, queue full), which it can.
func RefusedForGood(err error) bool {
	return errors.Is(err, control.ErrFrameRefused) || errors.Is(err, messages.ErrInvalid)
}

// Addressing decides, just before writer e.Writer's RequestData leaves,
// what the writer's latest Hello makes of it: h, or err when the control
// plane knows none now (the writer gone, down, or not heard yet). nil: it
// leaves as addressed. An RxAddress: the Hello names another incarnation
// than the frame's (the writer restarted since the request started): the
// new incarnation would drop the frame, and the old one's answers prove
// nothing for a request it never got, so the shell does not send it and
// the session addresses it anew. An RxSent refusal: no Hello is known
// now, so the frame waits for one (re-sent with backoff), whatever it is
// addressed to. Addressed to no incarnation, an answer from whichever
// incarnation then got it could not be told from the one that did;
// addressed to the incarnation an earlier Hello named, it could reach a
// new incarnation that takes frames before its Hello is read here (a
// restart), which drops it as stale: the frame would have left, so it
// would never be sent again, and the request would be lost at its
// deadline with its blocks quarantined.
func Addressing(e SendRequestData, h *messages.Hello, err error) any {
	switch {
	case err == nil && h != nil && h.Incarnation != 0 && h.Incarnation != e.Frame.ToIncarnation:
		return RxAddress{Writer: e.Writer, Incarnation: h.Incarnation}
	case err != nil:
		return RxSent{Writer: e.Writer, Err: fmt.Errorf("%w: writer %s has no Hello known now, so its incarnation is not known (%w)",
			ErrPeerGone, e.To, err)}
	}
	return nil
}

// errMisaddressed is why a RequestData a Misaddressed answered never
// reached its writer, for a session decided when it came.
var errMisaddressed = errors.New("a later incarnation of the writer got it addressed to an earlier one and dropped it (Misaddressed)")

// onMisaddressed takes writer w's Misaddressed: its RequestData,
// addressed to incarnation f.Addressed, reached incarnation
// f.FromIncarnation, which dropped it. Taken, the writer is addressed to
// f.FromIncarnation from then on, and its RequestData goes again
// (SendRequestData; the parent's table follows, Readdress); on a decided
// request the writer never got it (neverReached, as RxAddress).
//
// It is taken only when every one of these holds, else it changes nothing
// but StaleFrames (an unknown request never reaches a session: the rx
// parent counts it):
//   - it answers this request's epoch, and is addressed to this rank's
//     incarnation;
//   - the writer's RequestData left (deliveryDelivered: the control plane
//     took it; one still deliverySending is not known to have left, one
//     refused never did) and is addressed to f.Addressed, the incarnation
//     the writer is addressed to now;
//   - the writer is pending: no Result or CancelAck of the incarnation it
//     is addressed to was taken (one would show that incarnation got a
//     frame of the request: that Misaddressed is a lie or about another
//     copy), and no proof ended it;
//   - f.FromIncarnation is later than f.Addressed (Validate) and than any
//     incarnation whose Misaddressed was taken for this writer before
//     (DroppedBy).
//
// The one rule (DESIGN.md section 3). Once taken, only the new
// incarnation's answers and proofs count for this writer (onFrame,
// RxPeerGone): a Result, CancelAck or exit proof of f.Addressed can no
// longer free the blocks. That is safe because f.Addressed never got the
// request, so there is nothing of it to prove over: a writer's RequestData
// is handed to the control plane once per addressing — again only while
// it never left (RxSent's refusal, RxAddress) or after a Misaddressed
// taken — and the transport delivers one copy to at most one process. The
// copy this one names left addressed to f.Addressed (deliveryDelivered,
// the writer's incarnation) and f.FromIncarnation got it: so it is not a
// copy f.Addressed got. It is the only copy addressed to f.Addressed that
// is unanswered: a copy addressed to f.Addressed again later (RxAddress,
// from a Hello that still names it) leaves only after this Misaddressed
// is taken, and a Misaddressed of it is taken only from an incarnation
// later than this one's (DroppedBy), which did not get this copy. The
// blocks are freed only on a proof of f.FromIncarnation, to which the
// request goes now, as for any request (or, decided, at once: no
// incarnation got it). The sender is the writer's peer (the rx parent
// routes by request and sender, and the control plane binds a sender to
// its key and Hello's incarnation): a peer cannot speak for another's
// incarnations.
func (s *RxSession) onMisaddressed(w int, f *messages.Misaddressed) {
	wr := s.cfg.Writers[w]
	if s.sent[w] == deliverySending && f.Epoch == s.cfg.Epoch && wr.Request != nil && f.Addressed == wr.Request.ToIncarnation {
		// The answer overtook the worker's word that the copy left (the
		// link hands a frame over before the worker reports it sent, and
		// the restarted writer may answer first): kept for that word. A
		// copy that never left answers nothing, so it is judged then.
		if mutDropEarlyMisaddressed() {
			s.StaleFrames++
			return
		}
		if s.early == nil {
			s.early = make([]*messages.Misaddressed, len(s.sent))
		}
		s.early[w] = f
		return
	}
	if f.Epoch != s.cfg.Epoch || s.cfg.Incarnation == 0 || f.ToIncarnation != s.cfg.Incarnation ||
		s.sent[w] != deliveryDelivered || s.writers[w] != writerPending ||
		wr.Incarnation == 0 || f.Addressed != wr.Incarnation || wr.Request == nil || wr.Request.ToIncarnation != wr.Incarnation ||
		f.FromIncarnation <= f.Addressed || f.FromIncarnation <= wr.DroppedBy {
		s.StaleFrames++
		return
	}
	// Copied, not changed in place (onAddress).
	writers := slices.Clone(s.cfg.Writers)
	nw := &writers[w]
	rd := *nw.Request
	rd.ToIncarnation = f.FromIncarnation
	inc := f.FromIncarnation
	if mutReaddressKeepsPredecessor() {
		inc = f.Addressed
	}
	nw.Request, nw.Incarnation, nw.DroppedBy = &rd, inc, f.FromIncarnation
	s.cfg.Writers = writers
	s.emit(Readdress{Writer: w, Incarnation: inc},
		Log{Level: "info", Msg: fmt.Sprintf("rx session %s: writer %s incarnation %d got the RequestData addressed to incarnation %d and dropped it: addressed to it",
			s.cfg.Request, wr.Peer, f.FromIncarnation, f.Addressed)})
	if s.state.Terminal() {
		s.sent[w] = deliveryRefused
		s.sendErr[w] = fmt.Errorf("%w: writer %s incarnation %d: %w", ErrPeerGone, wr.Peer, f.FromIncarnation, errMisaddressed)
		s.neverReached(w)
		return
	}
	s.sendRequest(w)
}

// takeEarly returns and forgets writer w's early Misaddressed (nil: none).
func (s *RxSession) takeEarly(w int) *messages.Misaddressed {
	if s.early == nil {
		return nil
	}
	f := s.early[w]
	s.early[w] = nil
	return f
}

// onAddress re-addresses a RequestData the shell did not send (RxAddress).
func (s *RxSession) onAddress(m RxAddress) {
	if m.Writer < 0 || m.Writer >= len(s.sent) || s.sent[m.Writer] != deliverySending {
		return
	}
	s.takeEarly(m.Writer) // that copy did not leave
	// Copied, not changed in place: the config handed out (traces, the
	// shell) keeps what it was.
	writers := slices.Clone(s.cfg.Writers)
	w := &writers[m.Writer]
	rd := *w.Request
	rd.ToIncarnation = m.Incarnation
	w.Request, w.Incarnation = &rd, m.Incarnation
	s.cfg.Writers = writers
	if s.state.Terminal() {
		s.sent[m.Writer] = deliveryRefused
		s.neverReached(m.Writer)
		return
	}
	s.sendRequest(m.Writer)
}

// neverReached marks a pending writer whose RequestData never left this
// process (refused, or never handed to a worker: the session was decided
// before RxBegin) as quiescent: it never learnt of the request.
func (s *RxSession) neverReached(i int) {
	if s.writers[i] == writerPending {
		s.writers[i] = writerStopped
		s.emit(Log{Level: "warn", Msg: fmt.Sprintf("rx session %s: RequestData never reached writer %s",
			s.cfg.Request, s.cfg.Writers[i].Peer), Err: s.sendErr[i]})
	}
}

// undelivered names, for an error text, the writers whose RequestData has
// not left this process, with the control plane's last reason.
func (s *RxSession) undelivered() string {
	var b strings.Builder
	for i, d := range s.sent {
		if d == deliveryRefused && s.writers[i] == writerPending {
			fmt.Fprintf(&b, "; RequestData never reached writer %s (%v)", s.cfg.Writers[i].Peer, s.sendErr[i])
		}
	}
	return b.String()
}

// terminal records the first terminal outcome, tells the handle at once,
// and asks every writer still pending to stop.
func (s *RxSession) terminal(to RxState, err error) {
	if s.state.Terminal() {
		return
	}
	s.state = to
	s.err = err
	out := Outcome{Request: s.cfg.Request, Status: to.Status(), OK: to == RxReady, Err: err, Bytes: s.bytes}
	if to == RxReady {
		out.Blocks = s.cfg.Blocks
		out.Payload = s.payload
		s.handed = true
	}
	s.emit(Finish{Outcome: out})
	if to == RxReady {
		return
	}
	s.emit(Log{Level: "warn", Msg: "rx session " + s.cfg.Request + " " + to.String(), Err: err})
	for i, d := range s.sent {
		if d == deliveryRefused || d == deliveryNone {
			s.neverReached(i)
		}
	}
	s.cancelPending()
	if !s.WritersQuiescent() {
		s.quarantine()
	}
}

// maybeAbandon stops a session of a closing engine once every writer
// without proof is suspected: its blocks stay quarantined.
func (s *RxSession) maybeAbandon() {
	if !s.abandon {
		return
	}
	if !s.holdsBlocks() {
		// Nothing of ours can be written (every block a prefix hit): no
		// proof is owed to anyone, whatever the writers do (a writer's
		// engine that closed first never answers).
		s.emit(Log{Level: "info", Msg: fmt.Sprintf("rx session %s: engine closing; it holds no destination blocks, writers %v gave no proof",
			s.cfg.Request, s.Unproven())}, Stop{})
		s.stopped = true
		return
	}
	if !s.quarantined {
		return
	}
	for i, w := range s.writers {
		if w == writerPending && s.suspect[i] == suspectNone {
			return
		}
	}
	s.emit(Log{Level: "warn", Msg: fmt.Sprintf("rx session %s: engine closing, blocks stay quarantined (suspected writers %v, no proof)",
		s.cfg.Request, s.Unproven())}, Stop{})
	s.stopped = true
}

// HoldsBlocks reports whether the request has a destination block at all
// (none when every block was a prefix hit).
func (s *RxSession) HoldsBlocks() bool { return s.holdsBlocks() }

// holdsBlocks reports whether the request has a destination block at all.
func (s *RxSession) holdsBlocks() bool {
	for _, g := range s.cfg.Blocks {
		if len(g) > 0 {
			return true
		}
	}
	return false
}

var errSuspected = errors.New("suspected by the failure detector")

// quarantine moves the blocks of a request that failed without proof into
// quarantine: logically released (counted, bounded), never reused until
// every writer is quiescent.
func (s *RxSession) quarantine() {
	if s.quarantined || s.handed {
		return
	}
	s.quarantined = true
	s.emit(QuarantineDest{Blocks: s.cfg.Blocks, Writers: s.Unproven()})
}

// onHeard lifts writer m.Writer's suspicion of missed heartbeats when the
// control plane hears it again in the incarnation it was addressed to
// (RxHeard), and sends it the Cancel again at once: its answer comes now,
// and a closing engine waits for it (maybeAbandon).
func (s *RxSession) onHeard(m RxHeard) {
	w := m.Writer
	if w < 0 || w >= len(s.writers) || s.writers[w] != writerPending || s.suspect[w] != suspectHeard ||
		m.Incarnation == 0 || s.cfg.Writers[w].Incarnation != m.Incarnation {
		return
	}
	s.suspect[w] = suspectNone
	if s.state.Terminal() && s.sent[w] != deliveryRefused && s.sent[w] != deliveryNone {
		s.cancelTo(w)
	}
}

// cancelTo sends Cancel to writer i.
func (s *RxSession) cancelTo(i int) {
	wr := s.cfg.Writers[i]
	s.emit(SendFrame{Worker: wr.Worker, To: wr.Peer, Frame: &messages.Cancel{
		RequestID: s.cfg.Request, Epoch: s.cfg.Epoch, From: s.cfg.Self, Reason: s.state.String(),
		Incarnations: messages.Incarnations{FromIncarnation: s.cfg.Incarnation, ToIncarnation: wr.Incarnation}}})
}

// cancelPending sends Cancel to every writer still pending and, as any
// frame may be lost, arms a timer to send it again (CancelResend): Cancel
// is idempotent, and a writer that is done with the request (or never
// heard of it) answers CancelAck, so the blocks are not held forever.
func (s *RxSession) cancelPending() {
	sent := false
	for i, w := range s.writers {
		if w == writerPending && s.sent[i] != deliveryRefused && s.sent[i] != deliveryNone {
			s.cancelTo(i)
			sent = true
		}
	}
	if sent && s.cancelFirst.IsZero() {
		s.cancelFirst = s.now
	}
	if sent && s.cfg.CancelResend > 0 && !s.cancelArmed {
		s.cancelArmed = true
		d := s.cfg.CancelResend
		if s.now.Sub(s.cancelFirst) >= cancelFastFor && s.cancelEvery > 0 {
			d = min(2*s.cancelEvery, max(cancelResendMax, s.cfg.CancelResend))
		}
		s.cancelEvery = d
		s.emit(StartTimer{Kind: TimerDrain, At: s.now.Add(d)})
	}
}

// maybeRelease frees destination blocks once the outcome is known and no
// writer may still write; READY blocks belong to the handle instead.
func (s *RxSession) maybeRelease() {
	if !s.state.Terminal() || s.stopped {
		return
	}
	if !s.WritersQuiescent() {
		s.maybeAbandon()
		return
	}
	if !s.handed {
		s.emit(ReleaseDest{Blocks: s.cfg.Blocks, Quarantined: s.quarantined})
	}
	s.emit(Stop{})
	s.stopped = true
}

// emit appends effects to the step's (TxSession.emit).
func (s *RxSession) emit(e ...Effect) {
	if cap(s.eff) == 0 {
		s.eff = make([]Effect, 0, max(emitCap, len(e)))
	}
	s.eff = append(s.eff, e...)
}
