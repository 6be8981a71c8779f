package trace

import (
	"bytes"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
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
