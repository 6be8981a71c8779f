package actors

import (
	"errors"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
)

// TableRecorder is what a Tracer may also be, to record the steps of the
// tx and rx parents, the listener and the sender workers (DESIGN.md §8):
// every call their shells make on a pure table (core.TxTable,
// core.RxTable, core.AllocQueue, core.RouteFrame, core.WorkerTable) that
// decides or changes something, with its inputs, its outputs and the
// shell's clock. Package trace implements it.
type TableRecorder interface {
	// Table is called when a shell makes a table (an actor's start or
	// restart), before any call on it, with its engine, the actor's name
	// in the engine ("tx", "rx", "rx/queue", "listener", "worker-1"), the
	// table's kind (one of the Table* constants) and what it is made
	// from. It may return nil to leave it untraced.
	Table(engine messages.PeerID, name, kind string, birth TableBirth, at time.Time) TableTracer
}

// TableTracer records one table's calls. Its methods are called from the
// table's actor only, one at a time.
type TableTracer interface {
	// Call is called after each call with the method's name, the clock,
	// its inputs and its outputs.
	Call(method string, at time.Time, in TableIn, out TableOut)
}

// Table kinds.
const (
	TableTx     = "TxTable"
	TableRx     = "RxTable"
	TableAlloc  = "AllocQueue"
	TableRoute  = "RouteFrame"
	TableWorker = "WorkerTable"
)

// TableBirth is what a table is made from (the fields its kind uses).
type TableBirth struct {
	Tombstones int `json:",omitempty"`
	// OrphanLimit is the tx table's SetOrphanLimit (0: none).
	OrphanLimit int              `json:",omitempty"`
	Self        messages.PeerID  `json:",omitzero"`
	Layout      *kvcache.Layout  `json:",omitempty"`
	Parallel    kvcache.Parallel `json:",omitzero"`
	Rank        kvcache.Rank     `json:",omitzero"`
	Workers     int              `json:",omitempty"`
	// Incarnation is this rank's incarnation (the rx table's SetIncarnation).
	Incarnation uint64 `json:",omitempty"`
}

// TableIn is a table call's inputs (the fields its method takes). Frames
// are whole; a worker's session is its actor's id, an endpoint key its
// bytes, a message queued behind a Connect a line naming it (WorkerMsg).
type TableIn struct {
	Request     string                `json:",omitempty"`
	Generation  string                `json:",omitempty"`
	Err         string                `json:",omitempty"`
	RequestData *messages.RequestData `json:",omitempty"`
	Cancel      *messages.Cancel      `json:",omitempty"`
	// Frame is the frame the listener or the rx table routed (package
	// trace encodes it with its type).
	Frame  messages.Frame      `json:"-"`
	Open   *core.RxOpen        `json:",omitempty"`
	Blocks [][]kvcache.BlockID `json:",omitempty"`
	Peer   *messages.PeerID    `json:",omitempty"`
	// Peers are the generation ranks of a TxTable Silence, each with the
	// incarnation its stream wrote to (none in traces that predate it:
	// 0, every incarnation).
	Peers  []core.SilentPeer `json:",omitempty"`
	Counts []int             `json:",omitempty"`
	// Allocs are what the pool answered, in order, during an
	// AllocQueue.Drain.
	Allocs  []AllocAnswer `json:",omitempty"`
	Op      *core.OpRef   `json:",omitempty"`
	Session string        `json:",omitempty"`
	Key     []byte        `json:",omitempty"`
	Msg     string        `json:",omitempty"`
	// Inc is the peer incarnation of an RxTable Learn, Exited or
	// Readdress; Writer the writer index of a Readdress.
	Inc    uint64 `json:",omitempty"`
	Writer int    `json:",omitempty"`
}

// AllocAnswer is one answer of the pool during a Drain.
type AllocAnswer struct {
	Blocks      [][]kvcache.BlockID `json:",omitempty"`
	Err         string              `json:",omitempty"`
	OutOfBlocks bool                `json:",omitempty"`
}

// AllocStarted is one request a Drain started (Err empty) or failed.
type AllocStarted struct {
	Request string
	Err     string `json:",omitempty"`
}

// TableOut is a table call's outputs (the fields its method returns).
type TableOut struct {
	Spawn    bool                      `json:",omitempty"`
	Err      string                    `json:",omitempty"`
	Verdict  int                       `json:",omitempty"`
	Bound    string                    `json:",omitempty"`
	Refuse   bool                      `json:",omitempty"`
	Deliver  bool                      `json:",omitempty"`
	NotBound bool                      `json:",omitempty"`
	Hold     bool                      `json:",omitempty"`
	Requests []string                  `json:",omitempty"`
	Peers    []messages.PeerID         `json:",omitempty"`
	Epoch    uint64                    `json:",omitempty"`
	Writers  []core.RxWriter           `json:",omitempty"`
	Writer   int                       `json:",omitempty"`
	Refs     []core.RxWriterRef        `json:",omitempty"`
	Started  []AllocStarted            `json:",omitempty"`
	OK       bool                      `json:",omitempty"`
	Open     bool                      `json:",omitempty"`
	Queued   bool                      `json:",omitempty"`
	Waiting  []string                  `json:",omitempty"`
	Retired  []core.SessionOps[string] `json:",omitempty"`
	Refused  []core.SessionOps[string] `json:",omitempty"`
	Doubt    []core.SessionOps[string] `json:",omitempty"`
	Keys     [][]byte                  `json:",omitempty"`
	Dest     int                       `json:",omitempty"`
	// Down is an RxTable Route's: whether the frame's sender was in the
	// down set when it came (the frame takes it out, and the shell tells
	// the sender's requests that it is heard). Nothing else records it: a
	// late frame clears what PeerDown set before a later call shows it.
	// Absent in traces of builds before it (replay then compares none).
	Down *bool `json:",omitempty"`
}

// tableTracer opens the tracer of a table the shell makes, or nil when
// the engine's recorder does not record tables.
func (env *shellEnv) tableTracer(name, kind string, b TableBirth) TableTracer {
	tr, ok := env.tracer.(TableRecorder)
	if !ok {
		return nil
	}
	return tr.Table(env.self, name, kind, b, env.clock.Now())
}

// ptr points at a copy of v: taking the address of a parameter in the
// traced branch would move the parameter to the heap on every call,
// traced or not.
func ptr[T any](v T) *T { return &v }

// ErrText is an error's text, "" for nil (how table calls record errors).
func ErrText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// txTable is the tx parent's core.TxTable, recording its calls when
// traced.
type txTable struct {
	*core.TxTable
	tr    TableTracer
	clock Clock
	pub   *orphanStats // where publish stores the orphans (nil: nowhere)
}

func (env *shellEnv) txTable(tombstones, orphans int) txTable {
	t := txTable{TxTable: core.NewTxTable(tombstones), clock: env.clock, pub: &env.orphans,
		tr: env.tableTracer("tx", TableTx, TableBirth{Tombstones: tombstones, OrphanLimit: orphans})}
	t.SetOrphanLimit(orphans)
	return t
}

func (t *txTable) Open(request, generation string) (bool, error) {
	spawn, err := t.TxTable.Open(request, generation)
	t.publish()
	if t.tr != nil {
		t.tr.Call("Open", t.clock.Now(), TableIn{Request: request, Generation: generation}, TableOut{Spawn: spawn, Err: ErrText(err)})
	}
	return spawn, err
}

func (t *txTable) RequestData(rd *messages.RequestData) (core.RequestDataVerdict, string) {
	v, bound := t.TxTable.RequestData(rd)
	if t.tr != nil {
		t.tr.Call("RequestData", t.clock.Now(), TableIn{RequestData: rd}, TableOut{Verdict: int(v), Bound: bound})
	}
	return v, bound
}

func (t *txTable) Resolved(rd *messages.RequestData, err error) (bool, bool) {
	refuse, spawn := t.TxTable.Resolved(rd, err)
	t.publish()
	if t.tr != nil {
		t.tr.Call("Resolved", t.clock.Now(), TableIn{RequestData: rd, Err: ErrText(err)}, TableOut{Refuse: refuse, Spawn: spawn})
	}
	return refuse, spawn
}

func (t *txTable) Cancel(m *messages.Cancel, now time.Time) (bool, bool, bool) {
	deliver, notBound, hold := t.TxTable.Cancel(m, now)
	if t.tr != nil {
		t.tr.Call("Cancel", now, TableIn{Cancel: m}, TableOut{Deliver: deliver, NotBound: notBound, Hold: hold})
	}
	return deliver, notBound, hold
}

func (t *txTable) Silence(request string, peers []core.SilentPeer) {
	if len(peers) == 0 {
		return // nothing to record: no change
	}
	t.TxTable.Silence(request, peers)
	if t.tr != nil {
		t.tr.Call("Silence", t.clock.Now(), TableIn{Request: request, Peers: peers}, TableOut{})
	}
}

func (t *txTable) Stopped(request string) {
	t.TxTable.Stopped(request)
	t.publish()
	if t.tr != nil {
		t.tr.Call("Stopped", t.clock.Now(), TableIn{Request: request}, TableOut{})
	}
}

func (t *txTable) Close() []string {
	live := t.TxTable.Close()
	if t.tr != nil {
		t.tr.Call("Close", t.clock.Now(), TableIn{}, TableOut{Requests: live})
	}
	return live
}

// rxTable is the rx parent's core.RxTable, recording its calls when
// traced.
type rxTable struct {
	*core.RxTable
	tr    TableTracer
	clock Clock
}

func (env *shellEnv) rxTable(topo Topology, workers int, inc uint64) rxTable {
	l := topo.Layout
	t := core.NewRxTable(env.self, topo.Layout, topo.Parallel, topo.Rank, workers)
	t.SetIncarnation(inc)
	return rxTable{RxTable: t, clock: env.clock,
		tr: env.tableTracer("rx", TableRx, TableBirth{Self: env.self, Layout: &l, Parallel: topo.Parallel, Rank: topo.Rank,
			Workers: workers, Incarnation: inc})}
}

func (t *rxTable) Learn(peer messages.PeerID, inc uint64) {
	t.RxTable.Learn(peer, inc)
	if t.tr != nil {
		t.tr.Call("Learn", t.clock.Now(), TableIn{Peer: ptr(peer), Inc: inc}, TableOut{})
	}
}

func (t *rxTable) Readdress(request string, w int, inc uint64) bool {
	exited := t.RxTable.Readdress(request, w, inc)
	if t.tr != nil {
		t.tr.Call("Readdress", t.clock.Now(), TableIn{Request: request, Writer: w, Inc: inc}, TableOut{OK: exited})
	}
	return exited
}

func (t *rxTable) Exited(peer messages.PeerID, inc uint64) []core.RxWriterRef {
	out := t.RxTable.Exited(peer, inc)
	if t.tr != nil {
		t.tr.Call("Exited", t.clock.Now(), TableIn{Peer: ptr(peer), Inc: inc}, TableOut{Refs: out})
	}
	return out
}

func (t *rxTable) DownWriters(o core.RxOpen) []messages.PeerID {
	out := t.RxTable.DownWriters(o)
	if t.tr != nil {
		t.tr.Call("DownWriters", t.clock.Now(), TableIn{Open: ptr(o)}, TableOut{Peers: out})
	}
	return out
}

func (t *rxTable) Heard(peer messages.PeerID) {
	t.RxTable.Heard(peer)
	if t.tr != nil {
		t.tr.Call("Heard", t.clock.Now(), TableIn{Peer: ptr(peer)}, TableOut{})
	}
}

func (t *rxTable) Start(o core.RxOpen, blocks [][]kvcache.BlockID, now time.Time) (uint64, []core.RxWriter, error) {
	epoch, writers, err := t.RxTable.Start(o, blocks, now)
	if t.tr != nil {
		t.tr.Call("Start", now, TableIn{Open: ptr(o), Blocks: blocks}, TableOut{Epoch: epoch, Writers: writers, Err: ErrText(err)})
	}
	return epoch, writers, err
}

func (t *rxTable) Route(f messages.Frame) (core.RxRouteVerdict, int) {
	if t.tr == nil {
		return t.RxTable.Route(f)
	}
	down := t.IsDown(f.Sender())
	v, w := t.RxTable.Route(f)
	t.tr.Call("Route", t.clock.Now(), TableIn{Frame: f}, TableOut{Verdict: int(v), Writer: w, Down: ptr(down)})
	return v, w
}

func (t *rxTable) Lookup(f messages.Frame) (core.RxRouteVerdict, int) {
	v, w := t.RxTable.Lookup(f)
	if t.tr != nil {
		t.tr.Call("Lookup", t.clock.Now(), TableIn{Frame: f}, TableOut{Verdict: int(v), Writer: w})
	}
	return v, w
}

func (t *rxTable) PeerDown(peer messages.PeerID, inc uint64) []core.RxWriterRef {
	refs := t.RxTable.PeerDown(peer, inc)
	if t.tr != nil {
		t.tr.Call("PeerDown", t.clock.Now(), TableIn{Peer: ptr(peer), Inc: inc}, TableOut{Refs: refs})
	}
	return refs
}

func (t *rxTable) Stopped(request string) {
	t.RxTable.Stopped(request)
	if t.tr != nil {
		t.tr.Call("Stopped", t.clock.Now(), TableIn{Request: request}, TableOut{})
	}
}

func (t *rxTable) Started(request string) bool {
	ok := t.RxTable.Started(request)
	if t.tr != nil {
		t.tr.Call("Started", t.clock.Now(), TableIn{Request: request}, TableOut{OK: ok})
	}
	return ok
}

// allocQueue is the rx parent's core.AllocQueue, recording its calls when
// traced (a queued request is named by its id).
type allocQueue struct {
	*core.AllocQueue[*rxOpenReq]
	tr    TableTracer
	clock Clock
}

func (env *shellEnv) allocQueue() allocQueue {
	return allocQueue{AllocQueue: &core.AllocQueue[*rxOpenReq]{}, clock: env.clock,
		tr: env.tableTracer("rx/queue", TableAlloc, TableBirth{})}
}

func (q *allocQueue) Push(id string, counts []int, v *rxOpenReq) {
	q.AllocQueue.Push(id, counts, v)
	if q.tr != nil {
		q.tr.Call("Push", q.clock.Now(), TableIn{Request: id, Counts: counts}, TableOut{})
	}
}

func (q *allocQueue) Remove(id string) (*rxOpenReq, bool) {
	v, ok := q.AllocQueue.Remove(id)
	if q.tr != nil {
		q.tr.Call("Remove", q.clock.Now(), TableIn{Request: id}, TableOut{OK: ok})
	}
	return v, ok
}

func (q *allocQueue) Clear() []*rxOpenReq {
	out := q.AllocQueue.Clear()
	if q.tr != nil {
		ids := make([]string, len(out))
		for i, r := range out {
			ids[i] = r.req.ID
		}
		q.tr.Call("Clear", q.clock.Now(), TableIn{}, TableOut{Requests: ids})
	}
	return out
}

func (q *allocQueue) Drain(alloc func(counts []int) ([][]kvcache.BlockID, error),
	start func(v *rxOpenReq, blocks [][]kvcache.BlockID), fail func(v *rxOpenReq, err error)) {
	if q.tr == nil {
		q.AllocQueue.Drain(alloc, start, fail)
		return
	}
	at := q.clock.Now()
	var in TableIn
	var out TableOut
	q.AllocQueue.Drain(func(counts []int) ([][]kvcache.BlockID, error) {
		blocks, err := alloc(counts)
		in.Allocs = append(in.Allocs, AllocAnswer{Blocks: blocks, Err: ErrText(err), OutOfBlocks: errors.Is(err, kvcache.ErrOutOfBlocks)})
		return blocks, err
	}, func(v *rxOpenReq, blocks [][]kvcache.BlockID) {
		out.Started = append(out.Started, AllocStarted{Request: v.req.ID})
		start(v, blocks)
	}, func(v *rxOpenReq, err error) {
		out.Started = append(out.Started, AllocStarted{Request: v.req.ID, Err: ErrText(err)})
		fail(v, err)
	})
	q.tr.Call("Drain", at, in, out)
}

// routeFrame is the listener's step, recorded when tr is set.
func routeFrame(tr TableTracer, clock Clock, f messages.Frame) (core.FrameDest, error) {
	dest, err := core.RouteFrame(f)
	if tr != nil {
		tr.Call("RouteFrame", clock.Now(), TableIn{Frame: f}, TableOut{Dest: int(dest), Err: ErrText(err)})
	}
	return dest, err
}

// workerTable is a sender worker's core.WorkerTable, recording its calls
// when traced.
type workerTable struct {
	*core.WorkerTable[*actor.PID, rdma.Endpoint]
	tr    TableTracer
	clock Clock
}

func (env *shellEnv) workerTable(idx int) workerTable {
	return workerTable{WorkerTable: core.NewWorkerTable[*actor.PID, rdma.Endpoint](), clock: env.clock,
		tr: env.tableTracer("worker-"+strconv.Itoa(idx), TableWorker, TableBirth{})}
}

// WorkerMsg names a message a worker queues behind a Connect: "submit
// OP", "flush PEER" or "close PEER" (a replayed WorkerTable.Restart drops
// the submits).
func WorkerMsg(m any) string {
	switch m := m.(type) {
	case *workerSubmit:
		return "submit " + m.Op.String()
	case *workerFlush:
		return "flush " + m.Route.Peer.String()
	case *workerClose:
		return "close " + m.Route.Peer.String()
	}
	return "?"
}

func sessionsOps(in []core.SessionOps[*actor.PID]) []core.SessionOps[string] {
	out := make([]core.SessionOps[string], len(in))
	for i, so := range in {
		out[i] = core.SessionOps[string]{Session: pidName(so.Session), Ops: so.Ops}
	}
	return out
}

func pidName(p *actor.PID) string {
	if p == nil {
		return ""
	}
	return p.Id
}

// Admit, Settle and Endpoint run once or twice per op: they stay small
// enough to inline, the recording out of line.

func (t *workerTable) Admit(op core.OpRef, session *actor.PID, key string) {
	t.WorkerTable.Admit(op, session, key)
	if t.tr != nil {
		t.recordAdmit(op, session, key)
	}
}

func (t *workerTable) recordAdmit(op core.OpRef, session *actor.PID, key string) {
	t.tr.Call("Admit", t.clock.Now(), TableIn{Op: &op, Session: pidName(session), Key: []byte(key)}, TableOut{})
}

func (t *workerTable) Settle(op core.OpRef) {
	t.WorkerTable.Settle(op)
	if t.tr != nil {
		t.recordSettle(op)
	}
}

func (t *workerTable) recordSettle(op core.OpRef) {
	t.tr.Call("Settle", t.clock.Now(), TableIn{Op: &op}, TableOut{})
}

func (t *workerTable) Endpoint(key string, m any) (ep rdma.Endpoint, open, queued bool) {
	ep, open, queued = t.WorkerTable.Endpoint(key, m)
	if t.tr != nil {
		t.recordEndpoint(key, m, open, queued)
	}
	return ep, open, queued
}

func (t *workerTable) recordEndpoint(key string, m any, open, queued bool) {
	t.tr.Call("Endpoint", t.clock.Now(), TableIn{Key: []byte(key), Msg: WorkerMsg(m)}, TableOut{Open: open, Queued: queued})
}

func (t *workerTable) Connecting(key string, m any) {
	t.WorkerTable.Connecting(key, m)
	if t.tr != nil {
		t.tr.Call("Connecting", t.clock.Now(), TableIn{Key: []byte(key), Msg: WorkerMsg(m)}, TableOut{})
	}
}

func (t *workerTable) Connected(key string, ep rdma.Endpoint, err error) []any {
	waiting := t.WorkerTable.Connected(key, ep, err)
	if t.tr != nil {
		names := make([]string, len(waiting))
		for i, m := range waiting {
			names[i] = WorkerMsg(m)
		}
		t.tr.Call("Connected", t.clock.Now(), TableIn{Key: []byte(key), Err: ErrText(err)}, TableOut{Waiting: names})
	}
	return waiting
}

func (t *workerTable) Close(key string) (rdma.Endpoint, []core.SessionOps[*actor.PID], bool) {
	ep, retired, ok := t.WorkerTable.Close(key)
	if t.tr != nil {
		t.tr.Call("Close", t.clock.Now(), TableIn{Key: []byte(key)}, TableOut{Retired: sessionsOps(retired), OK: ok})
	}
	return ep, retired, ok
}

func (t *workerTable) Restart(isSubmit func(any) bool) (refused, doubt []core.SessionOps[*actor.PID], keys []string) {
	refused, doubt, keys = t.WorkerTable.Restart(isSubmit)
	if t.tr != nil {
		bk := make([][]byte, len(keys))
		for i, k := range keys {
			bk[i] = []byte(k)
		}
		t.tr.Call("Restart", t.clock.Now(), TableIn{}, TableOut{Refused: sessionsOps(refused), Doubt: sessionsOps(doubt), Keys: bk})
	}
	return refused, doubt, keys
}
