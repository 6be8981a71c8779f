package actors

import (
	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/messages"
)

// The pure steps, their messages, effects, states and sentinels live in
// package core (no protoactor, no zmq, no cgo); these aliases keep the
// names under actors for the shells' users.

// Types of package core.
type (
	CloseEndpoint   = core.CloseEndpoint
	Decide          = core.Decide
	Effect          = core.Effect
	EndStream       = core.EndStream
	Finish          = core.Finish
	Flush           = core.Flush
	Log             = core.Log
	OpRef           = core.OpRef
	OpState         = core.OpState
	Outcome         = core.Outcome
	Pin             = core.Pin
	Planner         = core.Planner
	ReleaseDest     = core.ReleaseDest
	Route           = core.Route
	RxBegin         = core.RxBegin
	RxCancel        = core.RxCancel
	RxConfig        = core.RxConfig
	RxFrame         = core.RxFrame
	RxPanic         = core.RxPanic
	RxPeerGone      = core.RxPeerGone
	RxSuspect       = core.RxSuspect
	RxAbandon       = core.RxAbandon
	RxHeard         = core.RxHeard
	QuarantineDest  = core.QuarantineDest
	RxSent          = core.RxSent
	RxAddress       = core.RxAddress
	Readdress       = core.Readdress
	RxSession       = core.RxSession
	RxState         = core.RxState
	RxTimeout       = core.RxTimeout
	RxWorkerDead    = core.RxWorkerDead
	RxWriter        = core.RxWriter
	SendFrame       = core.SendFrame
	SendRequestData = core.SendRequestData
	StartTimer      = core.StartTimer
	Status          = core.Status
	Stop            = core.Stop
	Submit          = core.Submit
	TimerKind       = core.TimerKind
	TxCancel        = core.TxCancel
	TxChunk         = core.TxChunk
	TxCompleted     = core.TxCompleted
	TxConfig        = core.TxConfig
	TxFenceFired    = core.TxFenceFired
	TxFlushed       = core.TxFlushed
	TxSent          = core.TxSent
	TxInDoubt       = core.TxInDoubt
	TxPanic         = core.TxPanic
	TxPeerCancel    = core.TxPeerCancel
	TxPeerGone      = core.TxPeerGone
	TxPeerRequest   = core.TxPeerRequest
	TxPinFailed     = core.TxPinFailed
	TxRetired       = core.TxRetired
	TxSession       = core.TxSession
	TxStart         = core.TxStart
	TxState         = core.TxState
	TxSubmitted     = core.TxSubmitted
	TxTimeout       = core.TxTimeout
	TxRefused       = core.TxRefused
	TxWorkerDead    = core.TxWorkerDead
	Unpin           = core.Unpin
	WatchFence      = core.WatchFence
)

// Constants of package core.
const (
	OpAdmitted        = core.OpAdmitted
	OpBackendDone     = core.OpBackendDone
	OpInDoubt         = core.OpInDoubt
	OpNotSubmitted    = core.OpNotSubmitted
	OpRetired         = core.OpRetired
	OpSourcesReleased = core.OpSourcesReleased
	OpSubmitted       = core.OpSubmitted
	OpSubmitting      = core.OpSubmitting
	RxCancelled       = core.RxCancelled
	RxFailed          = core.RxFailed
	RxReady           = core.RxReady
	RxReceiving       = core.RxReceiving
	RxRequested       = core.RxRequested
	RxTimedOut        = core.RxTimedOut
	StatusCancelled   = core.StatusCancelled
	StatusDone        = core.StatusDone
	StatusFailed      = core.StatusFailed
	StatusReady       = core.StatusReady
	StatusTimedOut    = core.StatusTimedOut
	StatusUnknown     = core.StatusUnknown
	TimerDeadline     = core.TimerDeadline
	TimerDrain        = core.TimerDrain
	TimerOrphan       = core.TimerOrphan
	TimerResend       = core.TimerResend
	TxCancelled       = core.TxCancelled
	TxDone            = core.TxDone
	TxFailed          = core.TxFailed
	TxInit            = core.TxInit
	TxReady           = core.TxReady
	TxTransferring    = core.TxTransferring
	Invariants        = core.Invariants
)

// Sentinel errors of package core (the same values).
var (
	ErrTimeout        = core.ErrTimeout
	ErrCancelled      = core.ErrCancelled
	ErrPeerCancelled  = core.ErrPeerCancelled
	ErrPeerFailed     = core.ErrPeerFailed
	ErrFence          = core.ErrFence
	ErrWorkerCrashed  = core.ErrWorkerCrashed
	ErrSessionCrashed = core.ErrSessionCrashed
	ErrBadChunk       = core.ErrBadChunk
	ErrBadRequest     = core.ErrBadRequest
	ErrPeerGone       = core.ErrPeerGone
	ErrClosed         = core.ErrClosed
	ErrEngineFailed   = core.ErrEngineFailed
	ErrPin            = core.ErrPin
	ErrMismatch       = core.ErrMismatch
	ErrPromptMismatch = core.ErrPromptMismatch
	ErrFrameUnsent    = core.ErrFrameUnsent
)

// LegalOpTransition reports whether from → to is allowed (core.LegalOpTransition).
func LegalOpTransition(from, to OpState) bool { return core.LegalOpTransition(from, to) }

// WorkerFor is the one routing function from (request, peer) to a worker
// (core.WorkerFor).
func WorkerFor(request string, peer messages.PeerID, workers int) int {
	return core.WorkerFor(request, peer, workers)
}

// NewTxSession returns a session in INIT (core.NewTxSession).
func NewTxSession(cfg TxConfig) *TxSession { return core.NewTxSession(cfg) }

// NewRxSession returns a session in REQUESTED (core.NewRxSession).
func NewRxSession(cfg RxConfig) *RxSession { return core.NewRxSession(cfg) }
