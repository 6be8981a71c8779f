package trace

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
)

// TestReplayNamesAMessageTypeItDoesNotKnow: a step whose message type
// replay does not know — written by a newer kvxfer, or by one whose codec
// did not encode it (testdata/v2-gen.jsonl names RxAbandon
// "core.RxAbandon") — is not replayed: it is a divergence naming the type
// and the record's line, on either side, as an unknown table method is.
// (Before, the type was stepped as trace.Unknown, which an RxSession
// ignores and a TxSession only counts in builds with invariants: a step
// that changed nothing a digest shows "matched", and the trace replayed
// "identical" though that step was never checked.)
func TestReplayNamesAMessageTypeItDoesNotKnow(t *testing.T) {
	type alien struct{ X int }
	const typ = "trace.alien"
	for _, side := range []string{SideRx, SideTx} {
		t.Run(side, func(t *testing.T) {
			var buf bytes.Buffer
			w := NewWriter(&buf)
			if side == SideRx {
				driveRx(w, "gen/0/$1/$2", rxConfig("r"), actors.RxBegin{}, alien{1}, success("r"))
			} else {
				cfg := actors.TxConfig{Request: "r", Self: ctx1, Workers: 2}
				s := actors.NewTxSession(cfg)
				st := w.Session("ctx/1/$1/$2", actors.Birth{Engine: ctx1, At: at, Tx: &cfg})
				st.Stepped(s, s.Init(at))
				for i, m := range []any{actors.TxStart{PromptLen: 16}, alien{1}, actors.TxTimeout{Kind: actors.TimerOrphan}} {
					now := at.Add(time.Duration(i+1) * time.Millisecond)
					st.Record(m, now)
					st.Stepped(s, s.Step(m, now))
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			line := 0
			for i, l := range strings.Split(buf.String(), "\n") {
				if strings.Contains(l, `"type":"`+typ+`"`) {
					line = i + 1
				}
			}
			if line == 0 {
				t.Fatalf("no %s step in the trace:\n%s", typ, buf.String())
			}
			res := replayBytes(t, buf.Bytes())
			var out strings.Builder
			res.Print(&out)
			d := res.Divergence
			if d == nil || d.Type != typ || d.Line != line || d.Seq != 2 || d.Field != "type" || !strings.Contains(d.Got, typ) {
				t.Fatalf("replay of a %s step at line %d: divergence %+v, want one naming the type and the line:\n%s", typ, line, d, out.String())
			}
			if res.Diverged != 1 || res.Matched != 2 || !strings.Contains(out.String(), typ) {
				t.Errorf("%d diverged, %d matched (want 1, the birth and the step before it):\n%s", res.Diverged, res.Matched, out.String())
			}
		})
	}
}
