package core

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

// TestRouteFrame: a frame that fails validation is rejected with its
// reason — but a RequestData or Result that names its request goes on to
// its parent as invalid; the others go to the parent that takes their
// kind.
func TestRouteFrame(t *testing.T) {
	from := messages.PeerID{Instance: "p"}
	rd := &messages.RequestData{RequestID: "r", From: from, GenParallel: messages.Parallel{TP: 1, PP: 1},
		Groups: []messages.GroupDest{{Blocks: []int32{0}}}}
	for _, c := range []struct {
		f    messages.Frame
		want FrameDest
	}{
		{rd, FrameToTx},
		{&messages.Cancel{RequestID: "r", From: from}, FrameToTx},
		{&messages.Result{RequestID: "r", From: from, Status: messages.StatusSuccess}, FrameToRx},
		{&messages.CancelAck{RequestID: "r", From: from}, FrameToRx},
		{&messages.Result{RequestID: "r", From: from}, FrameInvalidToRx}, // no status
		{&messages.Result{RequestID: "", From: from}, FrameRejected},
		{&messages.RequestData{RequestID: "r", From: from}, FrameInvalidToTx}, // no parallelism, no groups
		{&messages.RequestData{RequestID: "r"}, FrameRejected},
		{&messages.Cancel{RequestID: "", From: from}, FrameRejected},
		{&messages.CancelAck{RequestID: "r"}, FrameRejected},
		{&messages.Heartbeat{From: from}, FrameIgnored},
	} {
		got, err := RouteFrame(c.f)
		if got != c.want {
			t.Errorf("%T %+v: %v (%v), want %v", c.f, c.f, got, err, c.want)
		}
		if got.Invalid() != (err != nil) || (err != nil && !errors.Is(err, messages.ErrInvalid)) {
			t.Errorf("%T: dest %v with error %v", c.f, got, err)
		}
	}
}
