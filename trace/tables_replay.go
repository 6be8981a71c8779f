package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TableResult is one parent's, listener's or worker's table after replay.
type TableResult struct {
	Actor string `json:"actor"`
	Kind  string `json:"kind"`
	// Calls is the number of calls replayed.
	Calls    int  `json:"calls"`
	Diverged bool `json:"diverged,omitempty"`
}

// replayedTable is one table being replayed: the real core table, driven
// by the recorded calls.
type replayedTable struct {
	res   TableResult
	tx    *core.TxTable
	rx    *core.RxTable
	queue *core.AllocQueue[string]
	// worker's sessions are actor ids, its endpoints their keys, and what
	// waits behind a Connect the names actors.WorkerMsg gives.
	worker *core.WorkerTable[string, string]
	seq    int
	dead   bool
}

func (t *replayedTable) diverge(res *Result, rec *Record, field, expected, got string) {
	t.dead = true
	t.res.Diverged = true
	res.Diverged++
	if res.Divergence == nil {
		typ := rec.Type
		if rec.Kind == KindTable {
			typ = "birth"
		}
		res.Divergence = &Divergence{Actor: rec.Actor, Session: t.res.Kind, Seq: rec.Seq, Type: typ, Line: rec.Line,
			Field: field, Expected: expected, Got: got, Input: oneLine(string(rec.Msg), 400)}
	}
}

// tableBirth makes the table a "table" record describes.
func (t *replayedTable) birth(rec *Record, res *Result) {
	var b actors.TableBirth
	if err := unmarshal(rec.Msg, &b); err != nil {
		t.diverge(res, rec, "decode", "a TableBirth", err.Error())
		return
	}
	switch rec.Type {
	case actors.TableTx:
		t.tx = core.NewTxTable(b.Tombstones)
		t.tx.SetOrphanLimit(b.OrphanLimit)
	case actors.TableRx:
		if b.Layout == nil {
			t.diverge(res, rec, "birth", "a layout", "none")
			return
		}
		t.rx = core.NewRxTable(b.Self, *b.Layout, b.Parallel, b.Rank, b.Workers)
		t.rx.SetIncarnation(b.Incarnation)
	case actors.TableAlloc:
		t.queue = &core.AllocQueue[string]{}
	case actors.TableRoute:
	case actors.TableWorker:
		t.worker = core.NewWorkerTable[string, string]()
	default:
		t.diverge(res, rec, "birth", "a table kind", rec.Type)
		return
	}
	res.CallsMatched++
}

// call replays one recorded call on the table and compares its outputs
// with the recorded ones.
func (t *replayedTable) call(rec *Record, res *Result) {
	if rec.Seq != t.seq+1 {
		t.diverge(res, rec, "seq", fmt.Sprint(t.seq+1), seqGap(rec.Seq, t.seq))
		return
	}
	t.seq = rec.Seq
	t.res.Calls++
	var w wireTableIn
	if err := unmarshal(rec.Msg, &w); err != nil {
		t.diverge(res, rec, "decode", "a TableIn", err.Error())
		return
	}
	var want actors.TableOut
	if err := unmarshal(rec.Out, &want); err != nil {
		t.diverge(res, rec, "decode", "a TableOut", err.Error())
		return
	}
	got, err := t.do(rec, w.tableIn())
	if err != nil {
		t.diverge(res, rec, "call", "a call this table replays", err.Error())
		return
	}
	if want.Down == nil {
		got.Down = nil // a Route of a build before it: no down bit to compare
	}
	if field, e, g, ok := diffOut(want, got); !ok {
		if names := verdictNames[t.res.Kind]; names != nil && (field == "Verdict" || field == "Dest") {
			e, g = named(e, names), named(g, names)
		}
		t.diverge(res, rec, "out."+field, e, g)
		return
	}
	res.CallsMatched++
}

func textError(s string) error {
	if s == "" {
		return nil
	}
	return errors.New(s)
}

// allocError is a recorded pool answer: its text, and whether it was
// kvcache.ErrOutOfBlocks (the queue waits on that one).
type allocError struct {
	text string
	oob  bool
}

func (e *allocError) Error() string        { return e.text }
func (e *allocError) Is(target error) bool { return e.oob && target == kvcache.ErrOutOfBlocks }

// do makes the call rec names on the table.
func (t *replayedTable) do(rec *Record, in actors.TableIn) (out actors.TableOut, err error) {
	m := rec.Type
	wrong := func() (actors.TableOut, error) {
		return out, fmt.Errorf("%s has no recorded method %q", t.res.Kind, m)
	}
	switch {
	case t.tx != nil:
		tb := t.tx
		switch m {
		case "Open":
			spawn, err := tb.Open(in.Request, in.Generation)
			out.Spawn, out.Err = spawn, actors.ErrText(err)
		case "RequestData":
			if in.RequestData == nil {
				return out, errors.New("no frame recorded for RequestData")
			}
			v, bound := tb.RequestData(in.RequestData)
			out.Verdict, out.Bound = int(v), bound
		case "Resolved":
			if in.RequestData == nil {
				return out, errors.New("no frame recorded for Resolved")
			}
			out.Refuse, out.Spawn = tb.Resolved(in.RequestData, textError(in.Err))
		case "Cancel":
			if in.Cancel == nil {
				return out, errors.New("no frame recorded for Cancel")
			}
			out.Deliver, out.NotBound, out.Hold = tb.Cancel(in.Cancel, time.Unix(0, rec.T))
		case "Silence":
			tb.Silence(in.Request, in.Peers)
		case "Stopped":
			tb.Stopped(in.Request)
		case "Close":
			out.Requests = tb.Close()
		default:
			return wrong()
		}
	case t.rx != nil:
		tb := t.rx
		switch m {
		case "DownWriters", "Start":
			if in.Open == nil {
				return out, fmt.Errorf("no request recorded for %s", m)
			}
			if m == "DownWriters" {
				out.Peers = tb.DownWriters(*in.Open)
				break
			}
			epoch, writers, err := tb.Start(*in.Open, in.Blocks, time.Unix(0, rec.T))
			out.Epoch, out.Writers, out.Err = epoch, writers, actors.ErrText(err)
		case "Learn", "Exited":
			if in.Peer == nil {
				return out, fmt.Errorf("no peer recorded for %s", m)
			}
			if m == "Learn" {
				tb.Learn(*in.Peer, in.Inc)
				break
			}
			out.Refs = tb.Exited(*in.Peer, in.Inc)
		case "Readdress":
			out.OK = tb.Readdress(in.Request, in.Writer, in.Inc)
		case "Heard", "PeerDown":
			if in.Peer == nil {
				return out, fmt.Errorf("no peer recorded for %s", m)
			}
			if m == "Heard" {
				tb.Heard(*in.Peer)
				break
			}
			out.Refs = tb.PeerDown(*in.Peer, in.Inc)
		case "Route", "Lookup":
			if in.Frame == nil {
				return out, fmt.Errorf("no frame recorded for %s", m)
			}
			route := tb.Lookup
			if m == "Route" {
				route = tb.Route
				down := tb.IsDown(in.Frame.Sender())
				out.Down = &down
			}
			v, w := route(in.Frame)
			out.Verdict, out.Writer = int(v), w
		case "Stopped":
			tb.Stopped(in.Request)
		case "Started":
			out.OK = tb.Started(in.Request)
		default:
			return wrong()
		}
	case t.queue != nil:
		q := t.queue
		switch m {
		case "Push":
			q.Push(in.Request, in.Counts, in.Request)
		case "Remove":
			_, out.OK = q.Remove(in.Request)
		case "Clear":
			out.Requests = q.Clear()
		case "Drain":
			asked := 0
			q.Drain(func([]int) ([][]kvcache.BlockID, error) {
				if asked == len(in.Allocs) {
					// Asked more often than recorded: stop the queue here;
					// the started list then differs from the recorded one.
					asked++
					return nil, kvcache.ErrOutOfBlocks
				}
				a := in.Allocs[asked]
				asked++
				if a.Err != "" {
					return nil, &allocError{text: a.Err, oob: a.OutOfBlocks}
				}
				return a.Blocks, nil
			}, func(id string, _ [][]kvcache.BlockID) {
				out.Started = append(out.Started, actors.AllocStarted{Request: id})
			}, func(id string, err error) {
				out.Started = append(out.Started, actors.AllocStarted{Request: id, Err: err.Error()})
			})
			if asked != len(in.Allocs) {
				return out, fmt.Errorf("the queue asked the pool %d times in Drain, %d recorded", asked, len(in.Allocs))
			}
		default:
			return wrong()
		}
	case t.worker != nil:
		wt := t.worker
		key := string(in.Key)
		switch m {
		case "Admit":
			if in.Op == nil {
				return out, errors.New("no op recorded for Admit")
			}
			wt.Admit(*in.Op, in.Session, key)
		case "Settle":
			if in.Op == nil {
				return out, errors.New("no op recorded for Settle")
			}
			wt.Settle(*in.Op)
		case "Endpoint":
			_, out.Open, out.Queued = wt.Endpoint(key, in.Msg)
		case "Connecting":
			wt.Connecting(key, in.Msg)
		case "Connected":
			for _, w := range wt.Connected(key, key, textError(in.Err)) {
				out.Waiting = append(out.Waiting, w.(string))
			}
		case "Close":
			_, retired, ok := wt.Close(key)
			out.Retired, out.OK = retired, ok
		case "Restart":
			refused, doubt, keys := wt.Restart(func(m any) bool { return strings.HasPrefix(m.(string), "submit ") })
			out.Refused, out.Doubt = refused, doubt
			for _, k := range keys {
				out.Keys = append(out.Keys, []byte(k))
			}
		default:
			return wrong()
		}
	default:
		if t.res.Kind != actors.TableRoute || m != "RouteFrame" {
			return wrong()
		}
		if in.Frame == nil {
			return out, errors.New("no frame recorded for RouteFrame")
		}
		dest, err := core.RouteFrame(in.Frame)
		out.Dest, out.Err = int(dest), actors.ErrText(err)
	}
	return out, nil
}

// diffOut compares two call outputs by their encodings and names the
// first field that differs.
func diffOut(want, got actors.TableOut) (field, expected, gotS string, ok bool) {
	wb, err1 := json.Marshal(want)
	gb, err2 := json.Marshal(got)
	if err1 != nil || err2 != nil {
		return "encode", fmt.Sprint(err1), fmt.Sprint(err2), false
	}
	if bytes.Equal(wb, gb) {
		return "", "", "", true
	}
	var wm, gm map[string]json.RawMessage
	_ = json.Unmarshal(wb, &wm)
	_ = json.Unmarshal(gb, &gm)
	keys := map[string]bool{}
	for k := range wm {
		keys[k] = true
	}
	for k := range gm {
		keys[k] = true
	}
	first := ""
	for k := range keys {
		if !bytes.Equal(wm[k], gm[k]) && (first == "" || k < first) {
			first = k
		}
	}
	if first == "" {
		return "", string(wb), string(gb), false
	}
	return first, orNone(wm[first]), orNone(gm[first]), false
}

func orNone(b json.RawMessage) string {
	if len(b) == 0 {
		return "(zero: absent)"
	}
	return string(b)
}

// verdictNames name each table's verdicts (TableOut.Verdict, or Dest for
// RouteFrame) in a divergence.
var verdictNames = map[string]map[string]string{
	actors.TableTx: {
		fmt.Sprint(int(core.RequestDataResolve)):  "resolve",
		fmt.Sprint(int(core.RequestDataStale)):    "stale",
		fmt.Sprint(int(core.RequestDataNotBound)): "not bound",
		fmt.Sprint(int(core.RequestDataShed)):     "shed (orphan limit)",
		fmt.Sprint(int(core.RequestDataClosing)):  "closing",
		fmt.Sprint(int(core.RequestDataSilenced)): "silenced",
	},
	actors.TableRx: {
		fmt.Sprint(int(core.RxRouteDeliver)):   "deliver",
		fmt.Sprint(int(core.RxRouteStale)):     "stale",
		fmt.Sprint(int(core.RxRouteNotWriter)): "not a writer",
	},
	actors.TableRoute: {
		fmt.Sprint(int(core.FrameRejected)):    "rejected",
		fmt.Sprint(int(core.FrameToTx)):        "to tx",
		fmt.Sprint(int(core.FrameToRx)):        "to rx",
		fmt.Sprint(int(core.FrameIgnored)):     "ignored",
		fmt.Sprint(int(core.FrameInvalidToTx)): "invalid, to tx",
		fmt.Sprint(int(core.FrameInvalidToRx)): "invalid, to rx",
	},
}

func named(v string, names map[string]string) string {
	if n, ok := names[v]; ok {
		return v + " (" + n + ")"
	}
	return v
}
