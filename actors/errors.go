package actors

import "errors"

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
	ErrPeerGone       = errors.New("actors: peer gone")
	ErrClosed         = errors.New("actors: engine closed")
	ErrUnknownRequest = errors.New("actors: unknown request")
)
