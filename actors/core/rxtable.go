package core

import (
	"container/list"
	"fmt"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// RxTable is the rx parent's state and decisions, without I/O: the
// writers and epoch of each started request, the peers the control plane
// declared dead (until they speak again), and the plan of a request's
// writers — who must write what, through which worker, asked by which
// RequestData. The parent's shell (actors) allocates blocks, spawns and
// stops sessions and asks the control plane whether a down peer is heard
// again; the simulator (test/sim) drives the same table.
type RxTable struct {
	self    messages.PeerID
	layout  kvcache.Layout
	par     kvcache.Parallel
	rank    kvcache.Rank
	workers int
	seq     uint64
	entries map[string]*rxEntry
	down    map[messages.PeerID]bool
	// inc is this rank's incarnation; incs the latest heard of each writer
	// (its Hello or its frames): a request is addressed to it.
	//
	// incs is bounded: writing counts the started requests each peer
	// writes for, and idle lists the peers in incs that write for none,
	// least recently learnt or idle first; past maxIdleIncs of them the
	// first is forgotten, so that writers that come and go (ever new
	// identities, a restart under a new name) do not grow it for good. A
	// frame of a peer neither known nor writing teaches nothing (Route).
	// Forgetting loses nothing a started request needs — routing reads
	// the requests' own writers (entries), never incs — and for the next
	// request the shell learns each writer's latest Hello again (Writers);
	// a RequestData addressed to no incarnation (0) waits for that Hello
	// before it leaves (docs/membership.md).
	inc     uint64
	incs    map[messages.PeerID]uint64
	writing map[messages.PeerID]int
	idle    map[messages.PeerID]*list.Element
	idleLRU *list.List // of messages.PeerID, least recently idle first
	// gone is the latest incarnation of each writer proven exited
	// (Exited): a request is never addressed to it or an earlier one.
	gone map[messages.PeerID]uint64
	// maps caches the peer map of each context parallelism seen (a peer
	// map depends only on the layout and the two parallelisms).
	maps map[kvcache.Parallel]peerMap
}

type peerMap struct {
	pm  *kvcache.PeerMap
	err error
}

type rxEntry struct {
	epoch uint64
	// writers: the request's writers, in writer-index order, each with
	// the incarnation its RequestData is addressed to (0: not known). A
	// request has a few (its context ranks): a slice, searched, costs less
	// than two maps a request.
	writers []rxEntryWriter
	// writersBuf backs writers for a request of one writer: no slice to
	// allocate per request.
	writersBuf [1]rxEntryWriter
}

type rxEntryWriter struct {
	peer messages.PeerID
	inc  uint64
}

// writer is peer's writer index and addressed incarnation.
func (e *rxEntry) writer(peer messages.PeerID) (index int, inc uint64, ok bool) {
	for i, w := range e.writers {
		if w.peer == peer {
			return i, w.inc, true
		}
	}
	return 0, 0, false
}

// NewRxTable returns the table of generation rank rank of a parallelism
// par, whose engine is self and has workers sender workers.
func NewRxTable(self messages.PeerID, l kvcache.Layout, par kvcache.Parallel, rank kvcache.Rank, workers int) *RxTable {
	return &RxTable{self: self, layout: l, par: par, rank: rank, workers: max(workers, 1),
		entries: map[string]*rxEntry{}, down: map[messages.PeerID]bool{}, maps: map[kvcache.Parallel]peerMap{},
		incs: map[messages.PeerID]uint64{}, writing: map[messages.PeerID]int{},
		idle: map[messages.PeerID]*list.Element{}, idleLRU: list.New(), gone: map[messages.PeerID]uint64{}}
}

// SetIncarnation sets this rank's incarnation: RequestData carry it.
func (t *RxTable) SetIncarnation(inc uint64) { t.inc = inc }

// Learn records that peer's incarnation is at least inc (its Hello, or a
// frame it sent); requests started from then on are addressed to it.
func (t *RxTable) Learn(peer messages.PeerID, inc uint64) {
	if inc > t.incs[peer] {
		t.incs[peer] = inc
		t.noteIdle(peer)
	}
}

// maxIdleIncs bounds the incarnations RxTable keeps of peers that write
// for no started request (incs): as many as the control link's directory
// holds peers (control/zmq's maxPeers).
const maxIdleIncs = 4096

// noteIdle lists peer as idle (last) when it has an incarnation and
// writes for no started request, and forgets the first idle peers' past
// maxIdleIncs.
func (t *RxTable) noteIdle(peer messages.PeerID) {
	if _, known := t.incs[peer]; !known || t.writing[peer] > 0 {
		return
	}
	if el := t.idle[peer]; el != nil {
		t.idleLRU.MoveToBack(el) // heard again
		return
	}
	t.idle[peer] = t.idleLRU.PushBack(peer)
	for t.idleLRU.Len() > maxIdleIncs {
		old := t.idleLRU.Remove(t.idleLRU.Front()).(messages.PeerID)
		delete(t.idle, old)
		delete(t.incs, old)
	}
}

// notIdle takes peer off the idle list.
func (t *RxTable) notIdle(peer messages.PeerID) {
	if el := t.idle[peer]; el != nil {
		t.idleLRU.Remove(el)
		delete(t.idle, peer)
	}
}

// unref drops e's writers from writing; each that writes for no started
// request any more becomes idle.
func (t *RxTable) unref(e *rxEntry) {
	for _, w := range e.writers {
		if t.writing[w.peer]--; t.writing[w.peer] <= 0 {
			delete(t.writing, w.peer)
			t.noteIdle(w.peer)
		}
	}
}

// Writers lists o's writers: before Start the shell asks the control
// plane for each one's latest Hello (Learn keeps the newest incarnation).
// Every time, not only for a writer whose incarnation is unknown: a
// writer that restarted without this engine learning of its exit (on
// another host, or in the same process: no pidfd proof) sends nothing on
// its own, and its new incarnation drops every frame addressed to the
// old one, so a table that kept the old incarnation would fail each
// later request at its deadline.
func (t *RxTable) Writers(o RxOpen) []messages.PeerID {
	ranks, _, err := t.writers(o)
	if err != nil {
		return nil
	}
	out := make([]messages.PeerID, 0, len(ranks))
	for _, r := range ranks {
		out = append(out, o.peer(r))
	}
	return out
}

// Readdress records that writer w of request was addressed to incarnation
// inc since it started (RxAddress: the writer restarted before its
// RequestData left), so that an exit proof of inc applies to it and one of
// the incarnation it first had does not. It reports whether inc is proven
// exited already (Exited came first, when no request was addressed to
// it): the shell then applies that proof to this writer, which no later
// proof would (each incarnation exits once).
func (t *RxTable) Readdress(request string, w int, inc uint64) (exited bool) {
	e := t.entries[request]
	if e == nil || w < 0 || w >= len(e.writers) {
		return false
	}
	e.writers[w].inc = inc
	g := t.gone[e.writers[w].peer]
	return g != 0 && inc != 0 && inc <= g
}

// Incarnation is the latest incarnation known of peer (0: none).
func (t *RxTable) Incarnation(peer messages.PeerID) uint64 { return t.incs[peer] }

// RxOpen is what a request's start needs of Engine.Receive.
type RxOpen struct {
	Request         string
	PromptLen       int
	Context         string
	ContextParallel kvcache.Parallel
	// PrefixHitBlocks[g]: leading blocks of group g already held.
	PrefixHitBlocks []int
	Deadline        time.Time
}

// maxPeerMaps bounds the peer maps RxTable keeps, one per context
// parallelism a caller named (a serving fleet has a few).
const maxPeerMaps = 64

// writers are the context ranks that write to this rank for o.
func (t *RxTable) writers(o RxOpen) ([]kvcache.Rank, *kvcache.PeerMap, error) {
	m, ok := t.maps[o.ContextParallel]
	if !ok {
		m.pm, m.err = kvcache.NewPeerMap(t.layout, o.ContextParallel, t.par)
		// Errors are not kept, nor maps past the bound: every distinct
		// parallelism a caller names must not grow the table for good.
		if m.err == nil && len(t.maps) < maxPeerMaps {
			t.maps[o.ContextParallel] = m
		}
	}
	pm, err := m.pm, m.err
	if err != nil {
		return nil, nil, fmt.Errorf("%w: request %s: %w", ErrBadRequest, o.Request, err)
	}
	return pm.WritersOf(t.rank), pm, nil
}

func (o RxOpen) peer(r kvcache.Rank) messages.PeerID {
	return messages.PeerID{Instance: o.Context, Rank: int32(o.ContextParallel.Index(r))}
}

// DownWriters lists o's writers the control plane declared dead and has
// not heard since: the shell asks the control plane about each and calls
// Heard for those it hears, before Start.
func (t *RxTable) DownWriters(o RxOpen) []messages.PeerID {
	ranks, _, err := t.writers(o)
	if err != nil {
		return nil
	}
	var out []messages.PeerID
	for _, r := range ranks {
		if p := o.peer(r); t.down[p] {
			out = append(out, p)
		}
	}
	return out
}

// Start plans request o over its destination blocks at now: the epoch,
// and for each writer its peer, worker, the bytes it must write (from this
// rank's own plan: every destination block of every group it carries
// layers of) and its RequestData. It fails — and records nothing — when
// the two parallelisms do not fit the layout, or when a writer is down:
// were it to come back, it must not write into blocks this request no
// longer owns, so no RequestData may leave.
func (t *RxTable) Start(o RxOpen, blocks [][]kvcache.BlockID, now time.Time) (epoch uint64, writers []RxWriter, err error) {
	t.seq++
	ranks, pm, err := t.writers(o)
	if err != nil {
		return 0, nil, err
	}
	for _, r := range ranks {
		if p := o.peer(r); t.down[p] {
			return 0, nil, fmt.Errorf("%w: request %s: writer %s is down", ErrPeerGone, o.Request, p)
		}
	}
	l := t.layout
	epoch = uint64(now.UnixNano())<<8 | t.seq&0xff
	groups := make([]messages.GroupDest, len(l.Groups))
	for g, grp := range l.Groups {
		hit := 0
		if g < len(o.PrefixHitBlocks) {
			hit = o.PrefixHitBlocks[g]
		}
		first, _ := kvcache.NeededRange(o.PromptLen, grp.Window, l.TokensPerBlock, hit)
		ids := make([]int32, len(blocks[g]))
		for i, b := range blocks[g] {
			ids[i] = int32(b)
		}
		groups[g] = messages.GroupDest{First: int32(first), Blocks: ids}
	}
	var deadline int64
	if !o.Deadline.IsZero() {
		deadline = o.Deadline.UnixNano()
	}
	e := &rxEntry{epoch: epoch}
	if len(ranks) <= len(e.writersBuf) {
		e.writers = e.writersBuf[:len(ranks)]
	} else {
		e.writers = make([]rxEntryWriter, len(ranks))
	}
	for i, r := range ranks {
		peer := o.peer(r)
		e.writers[i] = rxEntryWriter{peer: peer, inc: t.incs[peer]}
		var want uint64
		if link, ok := pm.Link(r, t.rank); ok {
			for g := range blocks {
				want += uint64(len(blocks[g])) * link.BytesPerBlock(l, g)
			}
		}
		writers = append(writers, RxWriter{Peer: peer, Worker: WorkerFor(o.Request, peer, t.workers), Bytes: want,
			Incarnation: t.incs[peer],
			Request: &messages.RequestData{RequestID: o.Request, Epoch: epoch, From: t.self,
				Incarnations: messages.Incarnations{FromIncarnation: t.inc, ToIncarnation: t.incs[peer]},
				// A writer's incarnation that drops it may answer
				// Misaddressed even before it heard this rank's Hello.
				Features:    messages.FeatureMisaddressed,
				GenParallel: messages.Parallel{TP: int32(t.par.TP), PP: int32(t.par.PP), Stages: t.par.Stages},
				GenTP:       int32(t.rank.TP), GenPP: int32(t.rank.PP),
				PromptLen: int32(o.PromptLen), Groups: groups, DeadlineUnixNano: deadline}})
	}
	if old := t.entries[o.Request]; old != nil {
		t.unref(old) // the shell starts no request twice; were it to, count it once
	}
	for _, w := range e.writers {
		t.writing[w.peer]++
		t.notIdle(w.peer)
	}
	t.entries[o.Request] = e
	return epoch, writers, nil
}

// RxRouteVerdict is what becomes of a Result or CancelAck.
type RxRouteVerdict uint8

// Route verdicts.
const (
	// RxRouteDeliver: to the request's session, as its writer's frame.
	RxRouteDeliver RxRouteVerdict = iota + 1
	// RxRouteStale: no started request of that id (finished, or never).
	RxRouteStale
	// RxRouteNotWriter: the sender is not a writer of the request.
	RxRouteNotWriter
)

// Route classifies a Result or CancelAck from its sender; with
// RxRouteDeliver, writer is the sender's writer index. Any frame from a
// peer shows it alive: it leaves the down set. A frame teaches its
// sender's incarnation when the sender writes for a started request or
// its incarnation is known; one of any other peer teaches nothing (incs:
// every identity a peer names would be kept).
func (t *RxTable) Route(f messages.Frame) (v RxRouteVerdict, writer int) {
	from := f.Sender()
	delete(t.down, from)
	if _, known := t.incs[from]; known || t.writing[from] > 0 {
		t.Learn(from, FromIncarnation(f))
	}
	return t.Lookup(f)
}

// Lookup classifies a frame as Route does but changes nothing: for a
// Result that failed validation (messages.InvalidFrame), which shows
// nothing about its sender, not even that it is alive.
func (t *RxTable) Lookup(f messages.Frame) (v RxRouteVerdict, writer int) {
	e := t.entries[f.Request()]
	if e == nil {
		return RxRouteStale, 0
	}
	w, _, ok := e.writer(f.Sender())
	if !ok {
		return RxRouteNotWriter, 0
	}
	return RxRouteDeliver, w
}

// RxWriterRef names one writer of one started request.
type RxWriterRef struct {
	Request string
	Writer  int
}

// PeerDown records that the control plane declared incarnation inc of
// peer dead (0: the peer, whichever incarnation) and returns the writers
// it was, by request: those addressed to inc, to an earlier incarnation,
// or to none known. A request addressed to a later incarnation is not
// that one's (a restarted writer whose Hello came before the Down of the
// incarnation it replaced), and the peer is down for new requests only
// while this table knows no later incarnation of it.
func (t *RxTable) PeerDown(peer messages.PeerID, inc uint64) []RxWriterRef {
	if inc == 0 {
		t.down[peer] = true
		return t.WriterRefs(peer)
	}
	if t.incs[peer] <= inc {
		t.down[peer] = true
	}
	var out []RxWriterRef
	for _, id := range t.Live() {
		if w, winc, ok := t.entries[id].writer(peer); ok && winc <= inc {
			out = append(out, RxWriterRef{Request: id, Writer: w})
		}
	}
	return out
}

// WriterRefs returns the writers peer is, by started request.
func (t *RxTable) WriterRefs(peer messages.PeerID) []RxWriterRef {
	var out []RxWriterRef
	for _, id := range t.Live() {
		if w, _, ok := t.entries[id].writer(peer); ok {
			out = append(out, RxWriterRef{Request: id, Writer: w})
		}
	}
	return out
}

// Exited records the proof that incarnation inc of peer can write no more
// (its process is gone as the backend defines it) and returns the writers
// it was, by request: only requests addressed to that incarnation — the
// death of one incarnation proves nothing about another. inc 0 means the
// peer has no incarnations: every request of it. The incarnation is
// forgotten, so the next request asks for the peer's Hello again.
func (t *RxTable) Exited(peer messages.PeerID, inc uint64) []RxWriterRef {
	if t.incs[peer] == inc {
		delete(t.incs, peer)
		t.notIdle(peer)
	}
	if inc > t.gone[peer] {
		t.gone[peer] = inc
	}
	return t.Addressed(peer, inc)
}

// Addressed returns the writers incarnation inc of peer is, by request not
// stopped yet (live, or failed and still draining or quarantined); inc 0:
// every incarnation. It changes nothing.
func (t *RxTable) Addressed(peer messages.PeerID, inc uint64) []RxWriterRef {
	var out []RxWriterRef
	for _, id := range t.Live() {
		e := t.entries[id]
		if w, winc, ok := e.writer(peer); ok && (inc == 0 || winc == inc) {
			out = append(out, RxWriterRef{Request: id, Writer: w})
		}
	}
	return out
}

// ExitedWriters lists o's writers whose incarnation this table knows is
// one proven exited (Exited) or earlier: a RequestData addressed to it
// would never be answered, and its blocks would be quarantined without a
// proof ever to come. The shell fails such a request before Start, as for
// a down writer (no RequestData leaves).
func (t *RxTable) ExitedWriters(o RxOpen) []messages.PeerID {
	ranks, _, err := t.writers(o)
	if err != nil {
		return nil
	}
	var out []messages.PeerID
	for _, r := range ranks {
		p := o.peer(r)
		if g, inc := t.gone[p], t.incs[p]; g != 0 && inc != 0 && inc <= g {
			out = append(out, p)
		}
	}
	return out
}

// DownPeers lists the peers the control plane declared down and this table
// has not heard since, sorted.
func (t *RxTable) DownPeers() []messages.PeerID {
	out := make([]messages.PeerID, 0, len(t.down))
	for p := range t.down {
		out = append(out, p)
	}
	slices.SortFunc(out, comparePeers)
	return out
}

// IsDown reports whether peer is in the down set (declared down, not heard
// since).
func (t *RxTable) IsDown(peer messages.PeerID) bool { return t.down[peer] }

// Heard takes peer out of the down set: the control plane hears it again.
func (t *RxTable) Heard(peer messages.PeerID) { delete(t.down, peer) }

// Stopped forgets a request whose session released everything; its
// writers that write for no other become idle (incs).
func (t *RxTable) Stopped(request string) {
	if e := t.entries[request]; e != nil {
		t.unref(e)
		delete(t.entries, request)
	}
}

// Started reports whether request has a started session.
func (t *RxTable) Started(request string) bool { return t.entries[request] != nil }

// Live returns the started requests, sorted.
func (t *RxTable) Live() []string {
	out := make([]string, 0, len(t.entries))
	for id := range t.entries {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
