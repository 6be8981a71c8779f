package trace

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// TestTableRecords drives a TxTable's recorder by hand — through a Tee,
// as an engine with both TracePath and a Recorder does — and replays it:
// the calls as the real table answers them replay identically, a
// restarted actor's second table gets its own name, and a recorded output
// the real table does not give is a divergence naming the call.
func TestTableRecords(t *testing.T) {
	self := messages.PeerID{Instance: "ctx", Rank: 0}
	at := time.Unix(100, 0)
	record := func(spawnSecond bool) []byte {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		tr, ok := Tee(w, &plain{}).(actors.TableRecorder)
		if !ok {
			t.Fatal("a Tee does not record tables")
		}
		for range 2 { // the actor restarted: a second table
			tt := tr.Table(self, "tx", actors.TableTx, actors.TableBirth{Tombstones: 4}, at)
			tt.Call("Open", at, actors.TableIn{Request: "r1"}, actors.TableOut{Spawn: true})
			tt.Call("Open", at, actors.TableIn{Request: "r1"}, actors.TableOut{Spawn: spawnSecond, Err: "actors: bad request: request r1 already sent"})
			tt.Call("Close", at, actors.TableIn{}, actors.TableOut{Requests: []string{"r1"}})
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}

	res := replayBytes(t, record(false))
	if !res.Identical() || len(res.Tables) != 2 || res.Calls != 6 || res.CallsMatched != 8 {
		t.Fatalf("replay %+v, divergence %v", res, res.Divergence)
	}
	if res.Tables[0].Actor != "ctx/0/tx" || res.Tables[1].Actor != "ctx/0/tx#2" {
		t.Fatalf("tables %+v", res.Tables)
	}

	res = replayBytes(t, record(true))
	d := res.Divergence
	if d == nil || d.Actor != "ctx/0/tx" || d.Type != "Open" || d.Seq != 2 || d.Field != "out.Spawn" ||
		d.Expected != "true" || d.Got != "(zero: absent)" || d.Input != `{"Request":"r1"}` {
		t.Fatalf("divergence %+v", d)
	}
}

// TestTableInRoundTrip: a table call's inputs, every field set and every
// frame type, come back from their encoding as they were, binary endpoint
// keys included; and TableIn has no field the round trip misses.
func TestTableInRoundTrip(t *testing.T) {
	from := messages.PeerID{Instance: "gen", Rank: 1}
	frames := []messages.Frame{
		&messages.Result{RequestID: "r1", Epoch: 3, From: from, Status: messages.StatusSuccess, Bytes: 4096},
		&messages.CancelAck{RequestID: "r1", Epoch: 3, From: from},
		&messages.Cancel{RequestID: "r1", Epoch: 3, From: from},
		&messages.RequestData{RequestID: "r1", Epoch: 3, From: from, PromptLen: 64},
		&messages.Heartbeat{From: from},
	}
	op := actors.OpRef{Request: "r1", Peer: 1, Seq: 2}
	for _, f := range frames {
		in := actors.TableIn{Request: "r1", Generation: "gen", Err: "boom", RequestData: &messages.RequestData{RequestID: "r2"},
			Cancel: &messages.Cancel{RequestID: "r3"}, Frame: f, Peer: &from, Peers: []core.SilentPeer{{PeerID: from, Incarnation: 5}, {PeerID: messages.PeerID{Instance: "gen", Rank: 2}}},
			Counts: []int{1, 2},
			Allocs: []actors.AllocAnswer{{Blocks: [][]kvcache.BlockID{{1, 2}}}, {Err: "full", OutOfBlocks: true}},
			Op:     &op, Session: "$1/$2", Key: []byte{0xff, 0, 'a'}, Msg: "submit r1/peer1/op2",
			Open: &core.RxOpen{Request: "r1", PromptLen: 64, Context: "ctx", ContextParallel: kvcache.Parallel{TP: 2, PP: 1},
				PrefixHitBlocks: []int{1}, Deadline: time.Unix(5, 6).UTC()},
			Blocks: [][]kvcache.BlockID{{3}}, Inc: 7, Writer: 2}
		raw, err := json.Marshal(encodeTableIn(in))
		if err != nil {
			t.Fatal(err)
		}
		var w wireTableIn
		if err := json.Unmarshal(raw, &w); err != nil {
			t.Fatal(err)
		}
		if got := w.tableIn(); !reflect.DeepEqual(got, in) {
			t.Errorf("%s:\n got %+v\nwant %+v", raw, got, in)
		}
	}
	// Every field of TableIn is set above: one added later must be too.
	if n := reflect.TypeOf(actors.TableIn{}).NumField(); n != 18 {
		t.Errorf("TableIn has %d fields, this test sets 18: set the new ones", n)
	}
}
