package core

import "github.com/kvxfer/kvxfer/messages"

// FrameDest is where the listener sends a control frame.
type FrameDest uint8

// Frame destinations.
const (
	// FrameRejected: the frame failed validation (counted, logged, never
	// used).
	FrameRejected FrameDest = iota + 1
	// FrameToTx: RequestData and Cancel go to the tx parent.
	FrameToTx
	// FrameToRx: Result, CancelAck and Misaddressed go to the rx parent.
	FrameToRx
	// FrameIgnored: a valid frame of a kind no parent takes.
	FrameIgnored
	// FrameInvalidToTx: a RequestData that failed validation but names
	// its request and sender validly (messages.RequestData.Named): counted
	// as rejected, and the tx parent answers its sender FAILED with the
	// reason unless the request has a live session (DESIGN.md §6).
	FrameInvalidToTx
	// FrameInvalidToRx: a Result that failed validation but names its
	// request and sender validly (messages.Result.Named): counted as
	// rejected, and the rx parent fails the session of its writer, as no
	// proof that the writer is done.
	FrameInvalidToRx
)

// Invalid reports whether a frame routed to d failed validation.
func (d FrameDest) Invalid() bool {
	return d == FrameRejected || d == FrameInvalidToTx || d == FrameInvalidToRx
}

// RouteFrame is the listener's step: every field of f is range-checked
// before anything uses it (err says why a frame failed), then the frame
// goes to the parent that takes its kind. Of the frames that fail, only
// a RequestData or a Result that names its request goes on (only its
// naming fields are read there); the others are FrameRejected.
func RouteFrame(f messages.Frame) (FrameDest, error) {
	if err := f.Validate(); err != nil {
		switch g := f.(type) {
		case *messages.RequestData:
			if g.Named() == nil {
				return FrameInvalidToTx, err
			}
		case *messages.Result:
			if g.Named() == nil {
				return FrameInvalidToRx, err
			}
		}
		return FrameRejected, err
	}
	switch f.(type) {
	case *messages.RequestData, *messages.Cancel:
		return FrameToTx, nil
	case *messages.Result, *messages.CancelAck, *messages.Misaddressed:
		return FrameToRx, nil
	}
	return FrameIgnored, nil
}
