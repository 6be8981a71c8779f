package core

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/messages"
)

// TestRouteFrame: a frame that fails validation is rejected with its
// reason; the others go to the parent that takes their kind.
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
		{&messages.Result{RequestID: "r", From: from}, FrameRejected}, // no status
		{&messages.Cancel{RequestID: "", From: from}, FrameRejected},
	} {
		got, err := RouteFrame(c.f)
		if got != c.want {
			t.Errorf("%T %+v: %v (%v), want %v", c.f, c.f, got, err, c.want)
		}
		if (got == FrameRejected) != (err != nil) || (err != nil && !errors.Is(err, messages.ErrInvalid)) {
			t.Errorf("%T: dest %v with error %v", c.f, got, err)
		}
	}
}
