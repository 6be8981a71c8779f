package actors

import (
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Messages an RxSession steps on.
type (
	// RxBegin starts the session: its blocks are allocated.
	RxBegin struct{}
	// RxFrame: a Result or CancelAck from writer Writer.
	RxFrame struct {
		Writer int
		Frame  messages.Frame
	}
	// RxCancel: the local serving process cancelled the request.
	RxCancel struct{ Reason error }
	// RxTimeout: the request's deadline passed.
	RxTimeout struct{}
	// RxPeerGone: a writer's endpoint is closed or its process is dead;
	// it can write no more.
	RxPeerGone struct {
		Writer int
		Err    error
	}
	// RxPanic: the session's shell recovered a panic.
	RxPanic struct{ Err error }
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
}

// RxConfig is what an RxSession knows at birth.
type RxConfig struct {
	Request  string
	Epoch    uint64
	Self     messages.PeerID
	Deadline time.Time
	Writers  []RxWriter
	// Blocks are the destination blocks per group the session owns.
	Blocks [][]kvcache.BlockID
	// CancelResend is how often a decided session sends Cancel again to
	// writers that have not answered (any frame may be lost); 0 sends it
	// once.
	CancelResend time.Duration
}

// RxSession is the generation-side state machine of one request.
type RxSession struct {
	cfg     RxConfig
	state   RxState
	err     error
	writers []writerState
	bytes   uint64
	payload []byte
	stopped bool
	handed  bool // blocks handed to the handle (READY)
	now     time.Time
	eff     []Effect
	// StaleFrames counts frames of another epoch or after the writer stopped.
	StaleFrames int
}

// NewRxSession returns a session in REQUESTED.
func NewRxSession(cfg RxConfig) *RxSession {
	return &RxSession{cfg: cfg, writers: make([]writerState, len(cfg.Writers))}
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

// Step applies one message and returns the effects to execute.
func (s *RxSession) Step(msg any, now time.Time) []Effect {
	s.eff, s.now = nil, now
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
			s.eff = append(s.eff, StartTimer{Kind: TimerDeadline, At: s.cfg.Deadline})
		}
		for _, w := range s.cfg.Writers {
			s.eff = append(s.eff, SendFrame{Worker: w.Worker, To: w.Peer, Frame: w.Request})
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
	case RxTimeout:
		if s.state.Terminal() {
			// The resend timer (or the deadline after another outcome).
			if s.cfg.CancelResend > 0 {
				s.cancelPending()
			}
			break
		}
		s.terminal(RxTimedOut, fmt.Errorf("%w: request %s", ErrTimeout, s.cfg.Request))
	case RxPeerGone:
		if m.Writer >= 0 && m.Writer < len(s.writers) && s.writers[m.Writer] == writerPending {
			s.writers[m.Writer] = writerStopped
			s.terminal(RxFailed, fmt.Errorf("%w: request %s writer %s: %v", ErrPeerGone, s.cfg.Request, s.cfg.Writers[m.Writer].Peer, m.Err))
		}
	case RxPanic:
		s.terminal(RxFailed, fmt.Errorf("%w: request %s: %v", ErrSessionCrashed, s.cfg.Request, m.Err))
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
	switch f := m.Frame.(type) {
	case *messages.Result:
		epoch = f.Epoch
	case *messages.CancelAck:
		epoch = f.Epoch
	default:
		s.StaleFrames++
		return
	}
	if epoch != s.cfg.Epoch || s.writers[m.Writer] != writerPending {
		s.StaleFrames++ // duplicate or stale: idempotent
		return
	}
	switch f := m.Frame.(type) {
	case *messages.Result:
		s.bytes += f.Bytes
		if f.Status == messages.StatusSuccess {
			s.writers[m.Writer] = writerSucceeded
			if len(f.Payload) > 0 {
				s.payload = f.Payload
			}
			if s.allSucceeded() {
				s.terminal(RxReady, nil)
			}
			return
		}
		s.writers[m.Writer] = writerStopped
		st := RxFailed
		if f.Status == messages.StatusCancelled {
			st = RxCancelled
		}
		s.terminal(st, fmt.Errorf("%w: request %s writer %s: %s: %s", ErrPeerFailed, s.cfg.Request, f.From, f.Status, f.Error))
	case *messages.CancelAck:
		s.writers[m.Writer] = writerStopped
		s.terminal(RxFailed, fmt.Errorf("%w: request %s: writer %s acknowledged a cancel", ErrPeerCancelled, s.cfg.Request, f.From))
	}
}

func (s *RxSession) allSucceeded() bool {
	for _, w := range s.writers {
		if w != writerSucceeded {
			return false
		}
	}
	return true
}

// terminal records the first terminal outcome, tells the handle at once,
// and asks every writer still pending to stop.
func (s *RxSession) terminal(to RxState, err error) {
	if s.state.Terminal() {
		return
	}
	s.state = to
	s.err = err
	out := Outcome{Request: s.cfg.Request, Status: to.String(), OK: to == RxReady, Err: err, Bytes: s.bytes}
	if to == RxReady {
		out.Blocks = s.cfg.Blocks
		out.Payload = s.payload
		s.handed = true
	}
	s.eff = append(s.eff, Finish{Outcome: out})
	if to == RxReady {
		return
	}
	s.eff = append(s.eff, Log{Level: "warn", Msg: "rx session " + s.cfg.Request + " " + to.String(), Err: err})
	s.cancelPending()
}

// cancelPending sends Cancel to every writer still pending and, as any
// frame may be lost, arms a timer to send it again (CancelResend): Cancel
// is idempotent, and a writer that is done with the request (or never
// heard of it) answers CancelAck, so the blocks are not held forever.
func (s *RxSession) cancelPending() {
	sent := false
	for i, w := range s.writers {
		if w == writerPending {
			wr := s.cfg.Writers[i]
			s.eff = append(s.eff, SendFrame{Worker: wr.Worker, To: wr.Peer, Frame: &messages.Cancel{
				RequestID: s.cfg.Request, Epoch: s.cfg.Epoch, From: s.cfg.Self, Reason: s.state.String()}})
			sent = true
		}
	}
	if sent && s.cfg.CancelResend > 0 {
		s.eff = append(s.eff, StartTimer{Kind: TimerDrain, At: s.now.Add(s.cfg.CancelResend)})
	}
}

// maybeRelease frees destination blocks once the outcome is known and no
// writer may still write; READY blocks belong to the handle instead.
func (s *RxSession) maybeRelease() {
	if !s.state.Terminal() || s.stopped || !s.WritersQuiescent() {
		return
	}
	if !s.handed {
		s.eff = append(s.eff, ReleaseDest{Blocks: s.cfg.Blocks})
	}
	s.eff = append(s.eff, Stop{})
	s.stopped = true
}
