package trace

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

var (
	gen0 = messages.PeerID{Instance: "gen", Rank: 0}
	ctx1 = messages.PeerID{Instance: "ctx", Rank: 1}
	at   = time.Date(2025, 1, 1, 0, 0, 1, 234, time.UTC)
)

// everyMessage is one non-trivial value of every message a session steps
// on (TxPeerRequest without its Route, which does not travel).
func everyMessage() []any {
	boom := errors.New("boom: injected")
	newer := &messages.Result{RequestID: "r", Epoch: 3, From: ctx1} // a status this build does not define
	newer.SetWireStatus(9)
	ops := []actors.OpRef{{Request: "r", Peer: 1, Seq: 2}, {Request: "r", Peer: 0, Seq: 5}}
	return []any{
		actors.TxStart{PromptLen: 100, Deadline: at, Payload: []byte{1, 2, 3}},
		actors.TxStart{PromptLen: 7},
		actors.TxChunk{Chunk: kvcache.Chunk{Start: 32, End: 64, FirstBlock: 2, Last: true},
			Src: []kvcache.BlockRun{{First: 2, IDs: []kvcache.BlockID{7, 9}}, {}}},
		actors.TxChunk{Chunk: kvcache.Chunk{Start: 0, End: 32, Last: true},
			Src: []kvcache.BlockRun{{IDs: []kvcache.BlockID{1, 2}}}, Pinned: true},
		actors.TxFenceFired{Index: 3},
		actors.TxFenceFired{Index: 3, Err: boom},
		actors.TxPeerRequest{Peer: 1, From: gen0, Epoch: 1 << 62, Expected: []int{0, 1}},
		actors.TxPeerRequest{Peer: 1, From: gen0, Epoch: 9, Err: boom},
		actors.TxCompleted{Op: ops[0]},
		actors.TxCompleted{Op: ops[0], Err: boom, Refused: true},
		actors.TxCompleted{Op: ops[0], Err: errors.New("")}, // an empty error text is still an error
		actors.TxFlushed{Peer: 2, Err: boom},
		actors.TxSent{Peer: 1},
		actors.TxSent{Peer: 2, Err: boom},
		actors.TxInDoubt{Ops: ops, Reason: boom},
		actors.TxRetired{Ops: ops},
		actors.TxRetired{Ops: ops, Unproven: true},
		actors.TxCancel{},
		actors.TxCancel{Reason: boom},
		actors.TxPeerCancel{Peer: 1, From: gen0, Epoch: 4},
		actors.TxPeerGone{Peer: gen0},
		actors.TxTimeout{Kind: actors.TimerDrain},
		actors.TxRefused{From: gen0, Why: "layout hash 1, this rank 2"},
		actors.TxPanic{Err: boom},
		actors.RxBegin{},
		actors.RxFrame{Writer: 1, Frame: &messages.Result{RequestID: "r", Epoch: 3, From: ctx1, Status: messages.StatusSuccess,
			Bytes: 1 << 40, Error: "x", Payload: []byte("tok")}},
		actors.RxFrame{Writer: 0, Frame: &messages.CancelAck{RequestID: "r", Epoch: 3, From: ctx1}},
		actors.RxFrame{Writer: 1, Frame: &messages.Result{RequestID: "r", Epoch: 3, From: ctx1}, Invalid: boom},
		actors.RxFrame{Writer: 1, Frame: newer, Invalid: boom},
		actors.RxFrame{Writer: 0, Frame: &messages.Heartbeat{From: ctx1, Seq: 9}},
		actors.RxFrame{Writer: 0, Frame: (*messages.Result)(nil)},
		actors.RxFrame{Writer: 0},
		actors.RxCancel{Reason: boom},
		actors.RxCancel{},
		actors.RxTimeout{},
		actors.RxPeerGone{Writer: 2, Err: boom},
		actors.RxPanic{Err: boom},
		actors.RxSuspect{Writer: 1, Err: boom},
		actors.RxSuspect{Writer: 0},
		actors.RxAbandon{},
		actors.RxHeard{Writer: 1, Incarnation: 7},
	}
}

// sameMsg compares messages with errors by text (replay rebuilds them
// with errors.New).
func sameMsg(a, b any) bool {
	return reflect.DeepEqual(normal(a), normal(b))
}

func normal(m any) any {
	v := reflect.ValueOf(m)
	if v.Kind() != reflect.Struct {
		return m
	}
	out := map[string]any{"type": fmt.Sprintf("%T", m)}
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if err, ok := f.Interface().(error); ok || f.Type() == reflect.TypeFor[error]() {
			if err == nil {
				out[v.Type().Field(i).Name] = "<nil error>"
			} else {
				out[v.Type().Field(i).Name] = "error: " + err.Error()
			}
			continue
		}
		if t, ok := f.Interface().(time.Time); ok {
			out[v.Type().Field(i).Name] = t.UnixNano()
			continue
		}
		out[v.Type().Field(i).Name] = f.Interface()
	}
	return out
}

func TestCodecRoundTrip(t *testing.T) {
	for _, m := range everyMessage() {
		typ, wire := encodeMsg(m, nil, nil)
		raw, err := json.Marshal(wire)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		got, err := decodeMsg(typ, raw)
		if err != nil {
			t.Fatalf("%T %s: %v", m, raw, err)
		}
		if pr, ok := got.(peerRequest); ok {
			got = pr.msg
		}
		if !sameMsg(m, got) {
			t.Errorf("%s %s:\n got %#v\nwant %#v", typ, raw, got, m)
		}
		if te, ok := got.(actors.TxCompleted); ok && m.(actors.TxCompleted).Err != nil && te.Err == nil {
			t.Errorf("%s: a non-nil error came back nil", raw)
		}
	}
}

// TestCodecTxRetiredUnproven: TxRetired's Unproven travels only when
// set, so a proven retirement is written as before, and a line written
// before the field existed decodes as a proven one.
func TestCodecTxRetiredUnproven(t *testing.T) {
	ops := []actors.OpRef{{Request: "r", Peer: 1, Seq: 2}}
	for _, tc := range []struct {
		m    actors.TxRetired
		want string
	}{
		{actors.TxRetired{Ops: ops}, `{"Ops":[{"Request":"r","Peer":1,"Seq":2}]}`},
		{actors.TxRetired{Ops: ops, Unproven: true}, `{"Ops":[{"Request":"r","Peer":1,"Seq":2}],"Unproven":true}`},
	} {
		typ, wire := encodeMsg(tc.m, nil, nil)
		raw, err := json.Marshal(wire)
		if err != nil {
			t.Fatal(err)
		}
		if typ != "TxRetired" || string(raw) != tc.want {
			t.Errorf("%+v: %s %s, want TxRetired %s", tc.m, typ, raw, tc.want)
		}
		got, err := decodeMsg("TxRetired", []byte(tc.want))
		if err != nil {
			t.Fatal(err)
		}
		if !sameMsg(got, tc.m) {
			t.Errorf("%s decoded to %#v, want %#v", tc.want, got, tc.m)
		}
	}
}

// TestCodecCoversFields fails when a message gains a field its wire form
// lacks (or loses one it has): replay would silently drop it.
func TestCodecCoversFields(t *testing.T) {
	pairs := []struct {
		msg, wire any
		// swapped: fields of msg the wire form replaces by others.
		dropped, added []string
	}{
		{actors.TxFenceFired{}, txFenceFired{}, nil, nil},
		{actors.TxPeerRequest{}, txPeerRequest{}, []string{"Route"}, []string{"Hello", "Data"}},
		{actors.TxCompleted{}, txCompleted{}, nil, nil},
		{actors.TxFlushed{}, txFlushed{}, nil, nil},
		{actors.TxSent{}, txSent{}, nil, nil},
		{actors.TxInDoubt{}, txInDoubt{}, nil, nil},
		{actors.TxCancel{}, txCancel{}, nil, nil},
		{actors.TxPanic{}, txPanic{}, nil, nil},
		{actors.RxFrame{}, rxFrame{}, nil, nil},
		{actors.RxCancel{}, rxCancel{}, nil, nil},
		{actors.RxPeerGone{}, rxPeerGone{}, nil, nil},
		{actors.RxPanic{}, rxPanic{}, nil, nil},
		{actors.RxSuspect{}, rxSuspect{}, nil, nil},
	}
	names := func(v any) []string {
		var out []string
		for f := range reflect.TypeOf(v).Fields() {
			out = append(out, f.Name)
		}
		return out
	}
	for _, p := range pairs {
		want := slices.DeleteFunc(names(p.msg), func(n string) bool { return slices.Contains(p.dropped, n) })
		want = append(want, p.added...)
		slices.Sort(want)
		got := names(p.wire)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%T: wire fields %v, want %v", p.msg, got, want)
		}
	}
	// Messages encoded as themselves must hold nothing encoding/json
	// cannot carry.
	for _, m := range everyMessage() {
		typ, wire := encodeMsg(m, nil, nil)
		if reflect.TypeOf(wire) != reflect.TypeOf(m) {
			continue
		}
		for f := range reflect.TypeOf(m).Fields() {
			if k := f.Type.Kind(); k == reflect.Interface || k == reflect.Func || k == reflect.Chan {
				t.Errorf("%s.%s is a %v: give %s a wire form", typ, f.Name, k, typ)
			}
		}
	}
	// So must the birth configs.
	for _, cfg := range []any{actors.TxConfig{}, actors.RxConfig{}, actors.RxWriter{}, actors.EngineInfo{}, actors.Topology{}} {
		for f := range reflect.TypeOf(cfg).Fields() {
			if k := f.Type.Kind(); k == reflect.Interface || k == reflect.Func || k == reflect.Chan {
				t.Errorf("%T.%s is a %v, which a trace cannot record", cfg, f.Name, k)
			}
		}
	}
}

func TestCodecUnknown(t *testing.T) {
	type alien struct{ X int }
	typ, wire := encodeMsg(alien{1}, nil, nil)
	if wire != nil || typ != "trace.alien" {
		t.Fatalf("alien: %q %v", typ, wire)
	}
	m, err := decodeMsg(typ, nil)
	if err != nil || m != (Unknown{Type: "trace.alien"}) {
		t.Fatalf("decode alien: %v %v", m, err)
	}
	if _, err := decodeMsg("TxCompleted", json.RawMessage(`{"Op":7}`)); !errors.Is(err, ErrFormat) {
		t.Fatalf("bad TxCompleted: %v", err)
	}
}
