package core

import (
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Effect is one thing a step asks its shell to do. Effects are plain data;
// a step never performs I/O itself.
type Effect interface{ effect() }

// Pin pins source blocks of one layer group of chunk Chunk (context side),
// all or nothing. A refusal comes back to the session as TxPinFailed.
type Pin struct {
	Chunk int
	Group int
	IDs   []kvcache.BlockID
}

// Unpin drops pins taken by Pin.
type Unpin struct {
	Group int
	IDs   []kvcache.BlockID
}

// WatchFence asks the shell to report TxFenceFired for a chunk once the
// chunk's fence fires.
type WatchFence struct{ Chunk int }

// Submit hands one op's batch to the stream's worker.
type Submit struct {
	Worker   int
	Peer     int
	Op       OpRef
	Route    *Route
	Segments []kvcache.Segment
	Bytes    uint64
}

// Flush asks a worker to flush its endpoint to a peer and report TxFlushed.
type Flush struct {
	Worker  int
	Peer    int
	Request string
	Route   *Route
}

// CloseEndpoint asks a worker to close its endpoint to a peer (retiring
// every in-doubt op on it) and report the retired ops.
type CloseEndpoint struct {
	Worker int
	Peer   int
	Route  *Route
}

// SendFrame sends a control frame to a peer through a worker, after
// everything queued on that worker before it.
type SendFrame struct {
	Worker int
	To     messages.PeerID
	Frame  messages.Frame
	// FromStream marks a peer stream's terminal frame (Result, CancelAck)
	// on the context side: the shell hands it to stream Peer's actor,
	// which sends it after the stream's data, once its ops are settled.
	FromStream bool
	Peer       int
}

// EndStream ends stream Peer without a terminal frame (context side):
// some op of it was cut by a close that proved its sources released but
// not its writes over (OpSourcesReleased), so the peer must get no frame
// that it would take as proof. The stream's actor stops once its ops are
// settled, as after a terminal frame, and sends nothing.
type EndStream struct {
	Worker int
	Peer   int
}

// SendRequestData sends writer Writer's RequestData (generation side)
// through a worker, which reports to the session whether the control plane
// took it (RxSent).
type SendRequestData struct {
	Writer int
	Worker int
	To     messages.PeerID
	Frame  *messages.RequestData
}

// Readdress tells the rx parent that writer Writer of the session's
// request is addressed to incarnation Incarnation from now on (a
// Misaddressed taken: RxSession.onMisaddressed), so that the exit proofs
// and downs it matches follow (RxTable.Readdress). The session's own
// checks take only that incarnation's answers already.
type Readdress struct {
	Writer      int
	Incarnation uint64
}

// TimerKind names a session timer.
type TimerKind uint8

// Timer kinds.
const (
	// TimerDeadline is a request's own deadline (Send's, or Receive's).
	TimerDeadline TimerKind = iota + 1
	// TimerDrain bounds how long in-doubt ops may take before their
	// endpoints are closed (rx: the Cancel re-send period).
	TimerDrain
	// TimerOrphan bounds a tx session that never gets Send (it was opened
	// by a peer's RequestData); Send's own deadline supersedes it.
	TimerOrphan
	// TimerResend re-sends RequestData the control plane refused (rx).
	TimerResend
)

// StartTimer asks the shell to deliver a Timeout message of Kind at At.
type StartTimer struct {
	Kind TimerKind
	At   time.Time
}

// Decide tells the handle the session's logical outcome the moment it is
// decided, before the drain: the serving process can stop computing
// chunks. Finish, after the release, still carries the final Outcome.
type Decide struct {
	Status string
	Err    error
}

// Finish reports a session's outcome to its handle.
type Finish struct{ Outcome Outcome }

// ReleaseDest returns destination blocks to the generation pool: every
// writer is quiescent. Quarantined: they are in quarantine
// (QuarantineDest came first), so they leave it (Pool.ReleaseQuarantine).
type ReleaseDest struct {
	Blocks      [][]kvcache.BlockID
	Quarantined bool
}

// QuarantineDest moves a failed request's destination blocks into
// quarantine (Pool.Quarantine): the request is over, but Writers (indices)
// have given no proof that their writes are (DESIGN.md §3). They are not
// reused until a ReleaseDest with Quarantined set.
type QuarantineDest struct {
	Blocks  [][]kvcache.BlockID
	Writers []int
}

// Stop stops the session actor; it has released everything it held.
type Stop struct{}

// Log is a structured log line.
type Log struct {
	Level string
	Msg   string
	Err   error
}

func (Pin) effect()             {}
func (Unpin) effect()           {}
func (WatchFence) effect()      {}
func (Submit) effect()          {}
func (Flush) effect()           {}
func (CloseEndpoint) effect()   {}
func (SendFrame) effect()       {}
func (EndStream) effect()       {}
func (SendRequestData) effect() {}
func (Readdress) effect()       {}
func (StartTimer) effect()      {}
func (Finish) effect()          {}
func (Decide) effect()          {}
func (ReleaseDest) effect()     {}
func (QuarantineDest) effect()  {}
func (Stop) effect()            {}
func (Log) effect()             {}

// Outcome is a session's terminal result as its handle sees it.
type Outcome struct {
	Request string
	// Status is the outcome: DONE or READY (success), FAILED, CANCELLED
	// or TIMED_OUT.
	Status Status
	OK     bool
	Err    error
	Bytes  uint64
	// Blocks are the destination blocks per group of a READY request; the
	// handle owns them from then on.
	Blocks [][]kvcache.BlockID
	// Payload is the context side's opaque payload on READY.
	Payload []byte
}
