package core

import (
	"errors"

	"github.com/kvxfer/kvxfer/rdma"
)

// Sentinel errors of the engine's actors.
var (
	ErrTimeout        = errors.New("actors: transfer deadline passed")
	ErrCancelled      = errors.New("actors: cancelled")
	ErrPeerCancelled  = errors.New("actors: cancelled by peer")
	ErrPeerFailed     = errors.New("actors: peer reported failure")
	ErrFence          = errors.New("actors: chunk fence failed")
	ErrWorkerCrashed  = errors.New("actors: sender worker crashed")
	ErrSessionCrashed = errors.New("actors: session crashed")
	ErrBadChunk       = errors.New("actors: bad chunk")
	ErrBadRequest     = errors.New("actors: bad request")
	// ErrPeerGone is the one "peer gone" sentinel of the engine
	// (rdma.ErrPeerGone; control.ErrPeerGone is the same value): a
	// session that fails because a peer died matches it with errors.Is
	// whichever layer noticed.
	ErrPeerGone = rdma.ErrPeerGone
	ErrClosed   = errors.New("actors: engine closed")
	// ErrEngineFailed: a sender worker spent its restart budget and was
	// stopped (its requests failed and drained), or a top-level actor of
	// the engine panicked (its live requests go on and drain): the engine
	// refuses new work (Close it and start another).
	ErrEngineFailed = errors.New("actors: engine failed")
	ErrPin          = errors.New("actors: source blocks not pinned")
	// ErrMismatch: the two sides disagree about a request (prompt length,
	// bytes written against bytes planned, layout) or about the protocol
	// (a writer's Result that fails validation).
	ErrMismatch = errors.New("actors: context and generation disagree")
	// ErrPromptMismatch: the two sides planned different prompt lengths
	// for a request (their request lists differ). The context side's
	// error matches it and ErrMismatch; the generation side's, from the
	// context side's FAILED Result (its ErrorKindPromptMismatch), matches
	// it and ErrPeerFailed. It adds no words to the error's text.
	ErrPromptMismatch = errors.New("actors: the two sides planned different prompt lengths")
	// ErrFrameUnsent: a request's control frame did not leave this process
	// (the control plane refused it: the peer could not be dialled, its
	// connection closed, its backlog full); the error wraps why.
	ErrFrameUnsent = errors.New("actors: control frame not sent")
)
