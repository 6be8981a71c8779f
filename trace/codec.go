package trace

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// Wire forms of the session messages that hold an error, a frame or a
// route. Field names are the Go field names; an error is its text (absent
// when nil). Every other message is encoded as the Go value.
type (
	txFenceFired struct {
		Index int
		Err   *string `json:",omitempty"`
	}
	// txPeerRequest replaces Route by what built it.
	txPeerRequest struct {
		Peer      int
		From      messages.PeerID
		Epoch     uint64
		PromptLen int                   `json:",omitempty"`
		Expected  []int                 `json:",omitempty"`
		Err       *string               `json:",omitempty"`
		Hello     *messages.Hello       `json:",omitempty"`
		Data      *messages.RequestData `json:",omitempty"`
		// Incarnation is the generation sender's (absent in traces
		// recorded before incarnations).
		Incarnation uint64 `json:",omitempty"`
	}
	txCompleted struct {
		Op       actors.OpRef
		Err      *string `json:",omitempty"`
		Refused  bool    `json:",omitempty"`
		Unproven bool    `json:",omitempty"`
	}
	txFlushed struct {
		Peer int
		Err  *string `json:",omitempty"`
	}
	txSent struct {
		Peer int
		Err  *string `json:",omitempty"`
	}
	txPinFailed struct {
		Chunk, Group int
		Err          *string `json:",omitempty"`
	}
	rxSent struct {
		Writer int
		Err    *string `json:",omitempty"`
	}
	txInDoubt struct {
		Ops    []actors.OpRef
		Reason *string `json:",omitempty"`
	}
	txCancel struct {
		Reason *string `json:",omitempty"`
	}
	txPanic struct {
		Err *string `json:",omitempty"`
	}
	rxFrame struct {
		Writer  int
		Frame   *wireFrame
		Invalid *string `json:",omitempty"`
	}
	rxCancel struct {
		Reason *string `json:",omitempty"`
	}
	rxPeerGone struct {
		Writer      int
		Err         *string `json:",omitempty"`
		Incarnation uint64  `json:",omitempty"`
	}
	rxPanic struct {
		Err *string `json:",omitempty"`
	}
	rxSuspect struct {
		Writer      int
		Err         *string `json:",omitempty"`
		Incarnation uint64  `json:",omitempty"`
	}
)

// wireFrame is a messages.Frame tagged with its type.
type wireFrame struct {
	Type        string
	Result      *messages.Result      `json:",omitempty"`
	CancelAck   *messages.CancelAck   `json:",omitempty"`
	Cancel      *messages.Cancel      `json:",omitempty"`
	RequestData *messages.RequestData `json:",omitempty"`
	Hello       *messages.Hello       `json:",omitempty"`
	Heartbeat   *messages.Heartbeat   `json:",omitempty"`
	// Misaddressed: steps of builds before it leave it out.
	Misaddressed *messages.Misaddressed `json:",omitempty"`
	// WireStatus is a Result's status as it came when this build does
	// not define it (messages.Result.WireStatus, which Validate names and
	// encoding/json does not carry); absent otherwise, and in traces of
	// builds before it.
	WireStatus int32 `json:",omitempty"`
}

// Unknown stands for a message or frame of a type this package does not
// know. A message of such a type is a divergence in replay (its session
// is not replayed past it); a frame is stepped as is, in its RxFrame (an
// RxSession counts a stale frame).
type Unknown struct{ Type string }

// Validate, Request and Sender make Unknown a messages.Frame.
func (Unknown) Validate() error { return errors.New("trace: unknown frame") }

// Request implements messages.Frame.
func (Unknown) Request() string { return "" }

// Sender implements messages.Frame.
func (Unknown) Sender() messages.PeerID { return messages.PeerID{} }

func errText(err error) *string {
	if err == nil {
		return nil
	}
	s := err.Error()
	return &s
}

func textErr(s *string) error {
	if s == nil {
		return nil
	}
	return errors.New(*s)
}

func encodeFrame(f messages.Frame) *wireFrame {
	switch f := f.(type) {
	case nil:
		return nil
	case *messages.Result:
		w := &wireFrame{Type: "Result", Result: f}
		if f != nil {
			w.WireStatus = f.WireStatus()
		}
		return w
	case *messages.CancelAck:
		return &wireFrame{Type: "CancelAck", CancelAck: f}
	case *messages.Cancel:
		return &wireFrame{Type: "Cancel", Cancel: f}
	case *messages.RequestData:
		return &wireFrame{Type: "RequestData", RequestData: f}
	case *messages.Hello:
		return &wireFrame{Type: "Hello", Hello: f}
	case *messages.Heartbeat:
		return &wireFrame{Type: "Heartbeat", Heartbeat: f}
	case *messages.Misaddressed:
		return &wireFrame{Type: "Misaddressed", Misaddressed: f}
	default:
		return &wireFrame{Type: fmt.Sprintf("%T", f)}
	}
}

// frame rebuilds the frame; a known type without a body is that type's
// nil pointer, as it was recorded.
func (w *wireFrame) frame() messages.Frame {
	if w == nil {
		return nil
	}
	switch w.Type {
	case "Result":
		if w.Result != nil && w.WireStatus != 0 {
			w.Result.SetWireStatus(w.WireStatus)
		}
		return w.Result
	case "CancelAck":
		return w.CancelAck
	case "Cancel":
		return w.Cancel
	case "RequestData":
		return w.RequestData
	case "Hello":
		return w.Hello
	case "Heartbeat":
		return w.Heartbeat
	case "Misaddressed":
		return w.Misaddressed
	}
	return Unknown{Type: w.Type}
}

// encodeMsg returns a session message's type name and wire form. A
// TxPeerRequest takes the Hello and RequestData that built its route.
func encodeMsg(msg any, hello *messages.Hello, rd *messages.RequestData) (string, any) {
	switch m := msg.(type) {
	case actors.TxStart:
		return "TxStart", m
	case actors.TxChunk:
		return "TxChunk", m
	case actors.TxFenceFired:
		return "TxFenceFired", txFenceFired{Index: m.Index, Err: errText(m.Err)}
	case actors.TxPeerRequest:
		return "TxPeerRequest", txPeerRequest{Peer: m.Peer, From: m.From, Epoch: m.Epoch, PromptLen: m.PromptLen, Expected: m.Expected,
			Err: errText(m.Err), Hello: hello, Data: rd, Incarnation: m.Incarnation}
	case actors.TxCompleted:
		return "TxCompleted", txCompleted{Op: m.Op, Err: errText(m.Err), Refused: m.Refused, Unproven: m.Unproven}
	case actors.TxFlushed:
		return "TxFlushed", txFlushed{Peer: m.Peer, Err: errText(m.Err)}
	case actors.TxSent:
		return "TxSent", txSent{Peer: m.Peer, Err: errText(m.Err)}
	case actors.TxSubmitted:
		return "TxSubmitted", m
	case actors.TxPinFailed:
		return "TxPinFailed", txPinFailed{Chunk: m.Chunk, Group: m.Group, Err: errText(m.Err)}
	case actors.RxSent:
		return "RxSent", rxSent{Writer: m.Writer, Err: errText(m.Err)}
	case actors.TxWorkerDead:
		return "TxWorkerDead", m
	case actors.RxWorkerDead:
		return "RxWorkerDead", m
	case actors.TxInDoubt:
		return "TxInDoubt", txInDoubt{Ops: m.Ops, Reason: errText(m.Reason)}
	case actors.TxRetired:
		return "TxRetired", m
	case actors.TxCancel:
		return "TxCancel", txCancel{Reason: errText(m.Reason)}
	case actors.TxPeerCancel:
		return "TxPeerCancel", m
	case actors.TxPeerGone:
		return "TxPeerGone", m
	case actors.TxTimeout:
		return "TxTimeout", m
	case actors.TxRefused:
		return "TxRefused", m
	case actors.TxPanic:
		return "TxPanic", txPanic{Err: errText(m.Err)}
	case actors.RxBegin:
		return "RxBegin", m
	case actors.RxFrame:
		return "RxFrame", rxFrame{Writer: m.Writer, Frame: encodeFrame(m.Frame), Invalid: errText(m.Invalid)}
	case actors.RxCancel:
		return "RxCancel", rxCancel{Reason: errText(m.Reason)}
	case actors.RxTimeout:
		return "RxTimeout", m
	case actors.RxPeerGone:
		return "RxPeerGone", rxPeerGone{Writer: m.Writer, Err: errText(m.Err), Incarnation: m.Incarnation}
	case actors.RxPanic:
		return "RxPanic", rxPanic{Err: errText(m.Err)}
	case actors.RxSuspect:
		return "RxSuspect", rxSuspect{Writer: m.Writer, Err: errText(m.Err), Incarnation: m.Incarnation}
	case actors.RxAbandon:
		return "RxAbandon", m
	case actors.RxHeard:
		return "RxHeard", m
	case actors.RxAddress:
		return "RxAddress", m
	}
	return fmt.Sprintf("%T", msg), nil
}

// peerRequest is a decoded TxPeerRequest before replay resolves its route.
type peerRequest struct {
	msg   actors.TxPeerRequest
	hello *messages.Hello
	rd    *messages.RequestData
}

// decodeMsg rebuilds a session message from its type name and wire form.
// A TxPeerRequest comes back as a peerRequest (its Route not yet built);
// a type it does not know comes back as Unknown.
func decodeMsg(typ string, raw json.RawMessage) (any, error) {
	var out any
	var err error
	switch typ {
	case "TxStart":
		out, err = decodeAs[actors.TxStart](raw)
	case "TxChunk":
		out, err = decodeAs[actors.TxChunk](raw)
	case "TxFenceFired":
		var w txFenceFired
		if err = unmarshal(raw, &w); err == nil {
			out = actors.TxFenceFired{Index: w.Index, Err: textErr(w.Err)}
		}
	case "TxPeerRequest":
		var w txPeerRequest
		if err = unmarshal(raw, &w); err == nil {
			out = peerRequest{msg: actors.TxPeerRequest{Peer: w.Peer, From: w.From, Epoch: w.Epoch, PromptLen: w.PromptLen,
				Expected: w.Expected, Err: textErr(w.Err), Incarnation: w.Incarnation}, hello: w.Hello, rd: w.Data}
		}
	case "TxCompleted":
		var w txCompleted
		if err = unmarshal(raw, &w); err == nil {
			out = actors.TxCompleted{Op: w.Op, Err: textErr(w.Err), Refused: w.Refused, Unproven: w.Unproven}
		}
	case "TxFlushed":
		var w txFlushed
		if err = unmarshal(raw, &w); err == nil {
			out = actors.TxFlushed{Peer: w.Peer, Err: textErr(w.Err)}
		}
	case "TxSent":
		var w txSent
		if err = unmarshal(raw, &w); err == nil {
			out = actors.TxSent{Peer: w.Peer, Err: textErr(w.Err)}
		}
	case "TxSubmitted":
		out, err = decodeAs[actors.TxSubmitted](raw)
	case "TxPinFailed":
		var w txPinFailed
		if err = unmarshal(raw, &w); err == nil {
			out = actors.TxPinFailed{Chunk: w.Chunk, Group: w.Group, Err: textErr(w.Err)}
		}
	case "TxWorkerDead":
		out, err = decodeAs[actors.TxWorkerDead](raw)
	case "RxWorkerDead":
		out, err = decodeAs[actors.RxWorkerDead](raw)
	case "RxSent":
		var w rxSent
		if err = unmarshal(raw, &w); err == nil {
			out = actors.RxSent{Writer: w.Writer, Err: textErr(w.Err)}
		}
	case "TxInDoubt":
		var w txInDoubt
		if err = unmarshal(raw, &w); err == nil {
			out = actors.TxInDoubt{Ops: w.Ops, Reason: textErr(w.Reason)}
		}
	case "TxRetired":
		out, err = decodeAs[actors.TxRetired](raw)
	case "TxCancel":
		var w txCancel
		if err = unmarshal(raw, &w); err == nil {
			out = actors.TxCancel{Reason: textErr(w.Reason)}
		}
	case "TxPeerCancel":
		out, err = decodeAs[actors.TxPeerCancel](raw)
	case "TxPeerGone":
		out, err = decodeAs[actors.TxPeerGone](raw)
	case "TxTimeout":
		out, err = decodeAs[actors.TxTimeout](raw)
	case "TxRefused":
		out, err = decodeAs[actors.TxRefused](raw)
	case "TxPanic":
		var w txPanic
		if err = unmarshal(raw, &w); err == nil {
			out = actors.TxPanic{Err: textErr(w.Err)}
		}
	case "RxBegin":
		out, err = decodeAs[actors.RxBegin](raw)
	case "RxFrame":
		var w rxFrame
		if err = unmarshal(raw, &w); err == nil {
			out = actors.RxFrame{Writer: w.Writer, Frame: w.Frame.frame(), Invalid: textErr(w.Invalid)}
		}
	case "RxCancel":
		var w rxCancel
		if err = unmarshal(raw, &w); err == nil {
			out = actors.RxCancel{Reason: textErr(w.Reason)}
		}
	case "RxTimeout":
		out, err = decodeAs[actors.RxTimeout](raw)
	case "RxPeerGone":
		var w rxPeerGone
		if err = unmarshal(raw, &w); err == nil {
			out = actors.RxPeerGone{Writer: w.Writer, Err: textErr(w.Err), Incarnation: w.Incarnation}
		}
	case "RxPanic":
		var w rxPanic
		if err = unmarshal(raw, &w); err == nil {
			out = actors.RxPanic{Err: textErr(w.Err)}
		}
	case "RxSuspect":
		var w rxSuspect
		if err = unmarshal(raw, &w); err == nil {
			out = actors.RxSuspect{Writer: w.Writer, Err: textErr(w.Err), Incarnation: w.Incarnation}
		}
	case "RxAbandon":
		out, err = decodeAs[actors.RxAbandon](raw)
	case "RxHeard":
		out, err = decodeAs[actors.RxHeard](raw)
	case "RxAddress":
		out, err = decodeAs[actors.RxAddress](raw)
	default:
		return Unknown{Type: typ}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, typ, err)
	}
	return out, nil
}

func decodeAs[T any](raw json.RawMessage) (T, error) {
	var v T
	err := unmarshal(raw, &v)
	return v, err
}

// unmarshal decodes raw into v; an absent message is the zero value.
func unmarshal(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return json.Unmarshal(raw, v)
}
