package messages

import "testing"

// TestTerminal: the frames that end or answer a request, and no other.
func TestTerminal(t *testing.T) {
	for _, c := range []struct {
		f    Frame
		want bool
	}{
		{&Result{}, true}, {&Cancel{}, true}, {&CancelAck{}, true}, {&Misaddressed{}, true},
		{&RequestData{}, false}, {&Hello{}, false}, {&Heartbeat{}, false},
	} {
		if got := Terminal(c.f); got != c.want {
			t.Errorf("Terminal(%T) = %v, want %v", c.f, got, c.want)
		}
	}
}
