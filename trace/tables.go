package trace

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/messages"
)

// wireTableIn is an actors.TableIn with its frame tagged by type.
type wireTableIn struct {
	actors.TableIn
	Frame *wireFrame `json:",omitempty"`
}

func encodeTableIn(in actors.TableIn) wireTableIn {
	return wireTableIn{TableIn: in, Frame: encodeFrame(in.Frame)}
}

func (w wireTableIn) tableIn() actors.TableIn {
	in := w.TableIn
	in.Frame = w.Frame.frame()
	return in
}

var _ actors.TableRecorder = (*Writer)(nil)

// Table implements actors.TableRecorder: it records the table's birth
// and returns the recorder of its calls. Its actor path is
// "ENGINE/NAME"; a second table under one path (the actor restarted) is
// "ENGINE/NAME#2", and so on.
func (w *Writer) Table(engine messages.PeerID, name, kind string, b actors.TableBirth, at time.Time) actors.TableTracer {
	actor := engine.String() + "/" + name
	w.mu.Lock()
	if w.tables == nil {
		w.tables = map[string]int{}
	}
	w.tables[actor]++
	if n := w.tables[actor]; n > 1 {
		actor = fmt.Sprintf("%s#%d", actor, n)
	}
	w.mu.Unlock()
	raw, err := json.Marshal(b)
	if err != nil {
		w.fail(err)
		return nil
	}
	w.writeRecord(&Record{Kind: KindTable, Actor: actor, Engine: engine.String(), T: at.UnixNano(), Type: kind, Msg: raw})
	return &tableRec{w: w, actor: actor}
}

// tableRec records one table's calls; its methods run on the table's
// actor only.
type tableRec struct {
	w     *Writer
	actor string
	seq   int
}

func (t *tableRec) Call(method string, at time.Time, in actors.TableIn, out actors.TableOut) {
	t.seq++
	rin, err := json.Marshal(encodeTableIn(in))
	if err != nil {
		t.w.fail(err)
		return
	}
	rout, err := json.Marshal(out)
	if err != nil {
		t.w.fail(err)
		return
	}
	t.w.writeRecord(&Record{Kind: KindCall, Actor: t.actor, Seq: t.seq, T: at.UnixNano(), Type: method, Msg: rin, Out: rout})
}

// Table implements actors.TableRecorder for a Tee: tables go to the
// trace (and to the other recorder when it records tables too).
func (t *tee) Table(engine messages.PeerID, name, kind string, b actors.TableBirth, at time.Time) actors.TableTracer {
	var a, o actors.TableTracer
	if r, ok := t.t.(actors.TableRecorder); ok {
		a = r.Table(engine, name, kind, b, at)
	}
	if r, ok := t.r.(actors.TableRecorder); ok {
		o = r.Table(engine, name, kind, b, at)
	}
	switch {
	case a == nil:
		return o
	case o == nil:
		return a
	}
	return teeTable{a, o}
}

type teeTable struct{ a, b actors.TableTracer }

func (t teeTable) Call(method string, at time.Time, in actors.TableIn, out actors.TableOut) {
	t.a.Call(method, at, in, out)
	t.b.Call(method, at, in, out)
}
