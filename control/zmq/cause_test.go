package zmq

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"
)

// TestConnWatchSetsTheCause: every path of connWatch that sets
// PeerState.Reason sets the matching Cause with it, and one that clears
// the reason clears the cause: callers (node, the kvxfer command) decide
// by the Cause, and the Reason's words are free to change. Each step
// also checks the reason's words as they are today, so a path whose
// cause and reason part ways shows here. (Checked to fail without the
// Cause set in step, hungUp, stalled and set: every cause stayed
// CauseNone.)
func TestConnWatchSetsTheCause(t *testing.T) {
	t0 := time.Unix(100, 0)
	const epipe = 0x20
	type step struct {
		at    time.Duration
		ev    zmq4.Event // 0: a stalled check at at
		value int
		conn  ConnState
		cause Cause
		why   string
	}
	for _, c := range []struct {
		name   string
		secure bool
		steps  []step
	}{
		{"refused, then accepted", true, []step{
			{0, zmq4.EVENT_CONNECT_RETRIED, 111, ConnConnecting, CauseRefused, "nothing accepts connections there"},
			{time.Second, zmq4.EVENT_CONNECTED, 0, ConnConnecting, CauseNone, ""},
			{2 * time.Second, zmq4.EVENT_HANDSHAKE_SUCCEEDED, 0, ConnUp, CauseNone, ""},
			{3 * time.Second, zmq4.EVENT_DISCONNECTED, 0, ConnDown, CauseNone, ""},
			{4 * time.Second, zmq4.EVENT_CONNECT_RETRIED, 111, ConnDown, CauseRefused, "nothing accepts connections there"},
		}},
		{"mechanism mismatch (CURVE here)", true, []step{
			{0, zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL, protocolErrorMechanismMismatch, ConnHandshakeFailed, CauseMechanismMismatch, "security mechanism mismatch: we use CURVE"},
		}},
		{"mechanism mismatch (insecure here)", false, []step{
			{0, zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL, protocolErrorMechanismMismatch, ConnHandshakeFailed, CauseMechanismMismatch, "security mechanism mismatch: we are insecure"},
		}},
		{"cryptographic error", true, []step{
			{0, zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL, protocolErrorCryptographic, ConnHandshakeFailed, CauseCryptographic, "cryptographic error"},
		}},
		{"another protocol error", true, []step{
			{0, zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL, 0x10000001, ConnHandshakeFailed, CauseProtocol, "protocol error 0x10000001"},
		}},
		{"key refused", true, []step{
			{0, zmq4.EVENT_HANDSHAKE_FAILED_AUTH, 400, ConnHandshakeFailed, CauseKeyRefused, "the peer refused our key"},
		}},
		{"hung up (no detail)", true, []step{
			{0, zmq4.EVENT_HANDSHAKE_FAILED_NO_DETAIL, epipe, ConnHandshakeFailed, CauseHungUp, "hung up during the handshake (broken pipe)"},
		}},
		{"hung up (disconnected in the handshake)", false, []step{
			{0, zmq4.EVENT_CONNECTED, 0, ConnConnecting, CauseNone, ""},
			{time.Millisecond, zmq4.EVENT_DISCONNECTED, 0, ConnHandshakeFailed, CauseHungUp, "hung up during the handshake"},
		}},
		{"a named failure outlasts a hang-up, cause and all", true, []step{
			{0, zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL, protocolErrorMechanismMismatch, ConnHandshakeFailed, CauseMechanismMismatch, "security mechanism mismatch"},
			{time.Second, zmq4.EVENT_HANDSHAKE_FAILED_NO_DETAIL, epipe, ConnHandshakeFailed, CauseMechanismMismatch, "security mechanism mismatch"},
			{namedHold + 2*time.Second, zmq4.EVENT_HANDSHAKE_FAILED_NO_DETAIL, epipe, ConnHandshakeFailed, CauseHungUp, "hung up"},
			{namedHold + 3*time.Second, zmq4.EVENT_HANDSHAKE_SUCCEEDED, 0, ConnUp, CauseNone, ""},
		}},
		{"stalled, then the handshake timed out", true, []step{
			{0, zmq4.EVENT_CONNECTED, 0, ConnConnecting, CauseNone, ""},
			{handshakeStall, 0, 0, ConnConnecting, CauseStalled, "nothing there completed a ZeroMQ handshake"},
			{handshakeTimeout, zmq4.EVENT_DISCONNECTED, 0, ConnHandshakeFailed, CauseHandshakeTimeout, "(the handshake timed out)"},
		}},
		{"stalled, then hung up", true, []step{
			{0, zmq4.EVENT_CONNECTED, 0, ConnConnecting, CauseNone, ""},
			{handshakeStall, 0, 0, ConnConnecting, CauseStalled, "nothing there completed a ZeroMQ handshake"},
			{2 * handshakeStall, zmq4.EVENT_HANDSHAKE_FAILED_NO_DETAIL, epipe, ConnHandshakeFailed, CauseHungUp, "hung up"},
		}},
	} {
		w := connWatch{secure: c.secure, state: PeerState{Conn: ConnConnecting, Endpoint: "tcp://127.0.0.1:5555"}}
		for i, s := range c.steps {
			if s.ev == 0 {
				w.stalled(t0.Add(s.at))
			} else {
				w.step(s.ev, s.value, t0.Add(s.at))
			}
			st := w.state
			if st.Conn != s.conn || st.Cause != s.cause || (s.why == "") != (st.Reason == "") || !strings.Contains(st.Reason, s.why) {
				t.Errorf("%s, step %d: %v cause %v reason %q, want %v cause %v with %q",
					c.name, i, st.Conn, st.Cause, st.Reason, s.conn, s.cause, s.why)
				break
			}
			if (st.Cause == CauseNone) != (st.Reason == "") {
				t.Errorf("%s, step %d: cause %v with reason %q", c.name, i, st.Cause, st.Reason)
			}
		}
	}
}

// TestHandshakeErrorCarriesTheCause: PeerState.Err's error says what it
// said before (ErrHandshakeFailed, the endpoint, the reason) and, wrapped
// as node wraps it, still tells its Cause (CauseOf); an error without a
// failed handshake's state tells CauseNone.
func TestHandshakeErrorCarriesTheCause(t *testing.T) {
	st := PeerState{Conn: ConnHandshakeFailed, Cause: CauseMechanismMismatch, Reason: "any words", Endpoint: "ipc://x"}
	err := fmt.Errorf("node: handshake with peer failed: gen/0 at ipc://x: %w", st.Err())
	if !errors.Is(err, ErrHandshakeFailed) {
		t.Errorf("%v is not ErrHandshakeFailed", err)
	}
	if want := "control/zmq: handshake failed with ipc://x: any words"; st.Err().Error() != want {
		t.Errorf("Err() = %q, want %q", st.Err(), want)
	}
	if got := CauseOf(err); got != CauseMechanismMismatch {
		t.Errorf("CauseOf = %v, want %v", got, CauseMechanismMismatch)
	}
	if got := CauseOf(errors.New("control/zmq: handshake failed with ipc://x: security mechanism mismatch: we use CURVE")); got != CauseNone {
		t.Errorf("CauseOf(text only) = %v, want none", got)
	}
	if err := (PeerState{Conn: ConnUp}).Err(); err != nil {
		t.Errorf("Err() of an up connection = %v", err)
	}
	for c := CauseNone; c <= CauseProtocol; c++ {
		if s := c.String(); strings.HasPrefix(s, "Cause(") {
			t.Errorf("cause %d has no name", c)
		}
	}
}
