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
	// FrameToRx: Result and CancelAck go to the rx parent.
	FrameToRx
	// FrameIgnored: a valid frame of a kind no parent takes.
	FrameIgnored
)

// RouteFrame is the listener's step: every field of f is range-checked
// before anything uses it (err says why a frame is FrameRejected), then
// the frame goes to the parent that takes its kind.
func RouteFrame(f messages.Frame) (FrameDest, error) {
	if err := f.Validate(); err != nil {
		return FrameRejected, err
	}
	switch f.(type) {
	case *messages.RequestData, *messages.Cancel:
		return FrameToTx, nil
	case *messages.Result, *messages.CancelAck:
		return FrameToRx, nil
	}
	return FrameIgnored, nil
}
