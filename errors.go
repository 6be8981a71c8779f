package kvxfer

import (
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
)

// Status is a request's outcome: StatusDone (context side) or StatusReady
// (generation side) on success, else StatusFailed, StatusCancelled or
// StatusTimedOut. Outcome.Status carries it.
type Status = actors.Status

// LayoutMismatchError is the ErrMismatch of a peer whose Hello names
// another model or layout (Engine.CheckPeer, a RequestData from it): the
// peer, its model and this engine's, for errors.As.
type LayoutMismatchError = actors.LayoutMismatchError

// TooManyBlocksError is the ErrConfig of a PoolBytes that holds more
// blocks of a layer group than a Hello may name (messages.MaxBlocks), for
// errors.As: a caller that sized the pool itself can name what it sized
// it from, with Blocks, rather than PoolBytes.
type TooManyBlocksError struct {
	PoolBytes uint64 // the pool refused
	Blocks    uint64 // the blocks per layer group it would hold
	SetBytes  uint64 // one block of every layer group
}

func (e *TooManyBlocksError) Error() string {
	return fmt.Sprintf("%v: PoolBytes = %d holds %d blocks per layer group (a block of every group is %d bytes), at most %d (messages.MaxBlocks): use a smaller pool or more TokensPerBlock",
		ErrConfig, e.PoolBytes, e.Blocks, e.SetBytes, messages.MaxBlocks)
}

// Unwrap is ErrConfig.
func (e *TooManyBlocksError) Unwrap() error { return ErrConfig }

// Outcomes.
const (
	StatusDone      = actors.StatusDone
	StatusReady     = actors.StatusReady
	StatusFailed    = actors.StatusFailed
	StatusCancelled = actors.StatusCancelled
	StatusTimedOut  = actors.StatusTimedOut
)

// Errors an embedder matches with errors.Is. An Outcome's Err, and every
// error the engine returns, wraps the sentinel of its cause all the way
// from the layer that found it.
var (
	// ErrRequestFailed: the request's outcome is already decided (failed,
	// timed out or cancelled); TxHandle.Chunk returns it so that prefill
	// can stop. The error also wraps the outcome's cause.
	ErrRequestFailed = errors.New("kvxfer: request failed")
	// ErrNotStarted: a method was called on an Engine that Start did not
	// return (the zero Engine, a nil *Engine), or on a TxHandle or
	// RxHandle that Send or Receive did not return (nil, or the zero
	// value): there is nothing to act on. The error names the method.
	// Methods without an error return a zero result instead (each says
	// which).
	ErrNotStarted = errors.New("kvxfer: not started")
	// ErrSendOnly: Receive on an engine started with Config.SendOnly.
	ErrSendOnly = errors.New("kvxfer: send-only engine cannot receive")
	// ErrPeerGone: a peer died or could not be reached (one sentinel for
	// the control plane, the data plane and the sessions).
	ErrPeerGone = rdma.ErrPeerGone
	// ErrTimeout: the request's deadline passed.
	ErrTimeout = actors.ErrTimeout
	// ErrCancelled: the request was cancelled on this side.
	ErrCancelled = actors.ErrCancelled
	// ErrPeerCancelled: the peer cancelled the request (on the generation
	// side, a context rank's CANCELLED Result: the outcome is
	// StatusCancelled).
	ErrPeerCancelled = actors.ErrPeerCancelled
	// ErrPeerFailed: a peer failed the request (on the generation side, a
	// context rank's FAILED Result, its reason in the message), or the
	// data plane failed a write to the peer (on the context side).
	ErrPeerFailed = actors.ErrPeerFailed
	// ErrFence: a chunk's Fence reported an error (or panicked in
	// OnReady): its KV may not be written, and the request fails.
	ErrFence = actors.ErrFence
	// ErrClosed: the engine is closed. Send, Receive and Pools().Alloc
	// after Close are refused with it, and the requests Close cancelled
	// end with it.
	ErrClosed = actors.ErrClosed
	// ErrUndrained: Close could not drain every request by its ctx's end,
	// or a receive keeps its destination blocks quarantined (its writers
	// suspected, with no proof that their writes are over), or a sender
	// worker did not stop within 10 s of Close (stuck in a control send
	// or a backend call: its endpoints' writes are not proven over); the
	// error names the requests, or the worker and its peers. The pool
	// memory stays mapped.
	ErrUndrained = actors.ErrUndrained
	// ErrWorkerStuck is wrapped beside ErrUndrained when a sender worker
	// did not stop within 10 s of Close: it may still be inside a backend
	// call, so the data-plane agent stays open (and the memory mapped)
	// for the rest of the process.
	ErrWorkerStuck = actors.ErrWorkerStuck
	// ErrMismatch: the two sides disagree about the request (prompt
	// length, bytes written against bytes planned, layout) or about the
	// protocol (a writer's Result that fails validation, such as a status
	// this version does not know).
	ErrMismatch = actors.ErrMismatch
	// ErrPromptMismatch: the two sides planned different prompt lengths
	// for a request (their request lists differ). On the context side the
	// request's error matches it and ErrMismatch; on the generation side,
	// told by the context side's FAILED Result, it and ErrPeerFailed.
	ErrPromptMismatch = actors.ErrPromptMismatch
	// ErrFrameUnsent: a request's control frame did not leave this process
	// (the peer could not be dialled, its connection closed); on the
	// context side, a SUCCESS Result that did not leave fails the request.
	ErrFrameUnsent = actors.ErrFrameUnsent
	// ErrBadRequest: a request the engine cannot take (its id, prompt
	// length, blocks or parallelism), named in the error.
	ErrBadRequest = actors.ErrBadRequest
	// ErrEngineFailed: a sender worker spent its restart budget (its
	// requests failed and drained), or one of the engine's top-level
	// actors panicked (its live requests go on and drain): the engine
	// refuses new work, naming why; close it and start another.
	ErrEngineFailed = actors.ErrEngineFailed
	// ErrWorkerCrashed: a sender worker crashed under the request.
	ErrWorkerCrashed = actors.ErrWorkerCrashed
	// ErrPin: a chunk's source blocks could not be pinned.
	ErrPin = actors.ErrPin
	// ErrBadChunk: a chunk is misaligned, out of order or after the last.
	ErrBadChunk = actors.ErrBadChunk
	// ErrMisalignedChunk: a non-final chunk ends mid-block.
	ErrMisalignedChunk = kvcache.ErrMisalignedChunk
	// ErrMissingSource: a chunk's source blocks do not cover it.
	ErrMissingSource = kvcache.ErrMissingSource
)
