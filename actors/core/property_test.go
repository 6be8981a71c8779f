package core

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
	"pgregory.net/rapid"
)

// TestProperty_TxInterleavings drives a TxSession through random
// interleavings of everything its environment may deliver — chunks, fences
// in any order, peer requests (good and bad), completions (ok, error,
// refused), flushes, local and peer cancels, deadline and drain timers, a
// worker crash (in doubt, then retired), a session panic — while a model of
// the environment answers its effects the way the shell and the workers
// would. At every step:
//
//   - Violations stays empty; nothing is emitted after Stop;
//   - a terminal state never changes, and Finish reports the first one;
//   - no Pin and no Submit after the outcome; a Submit only for an op whose
//     fence fired, in sequence order per peer;
//   - an Unpin only when every op is quiescent and every watched fence has
//     fired, and only of pinned blocks;
//   - a Flush only when every op of the stream is BACKEND_DONE; a Result
//     SUCCESS only as the answer to that stream's successful flush; any
//     other terminal frame only when the stream's ops are quiescent; one
//     terminal frame per stream;
//   - DONE only once every peer's SUCCESS Result was reported sent
//     (TxSent without an error); one reported unsent fails the request.
//
// At the end everything is drained (fences fired, submits completed,
// in-doubt ops retired, flushes answered, sends reported, the session cancelled if it is
// still undecided): the session must be stopped, every Pin matched by an
// Unpin, and Finish emitted exactly once.
func TestProperty_TxInterleavings(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := newTxModel(rt)
		steps := rapid.IntRange(0, 80).Draw(rt, "steps")
		for range steps {
			m.randomStep()
		}
		m.drain()
		m.checkEnd()
	})
}

type txModel struct {
	t        *rapid.T
	s        *TxSession
	now      time.Time
	expected []int
	routes   map[int]*Route
	prompt   int // see withPrompt
	chunks   []TxChunk
	sent     int
	started  bool

	requested     map[int]bool
	peerCancelled map[int]bool
	watched       map[int]bool
	fired         map[int]bool
	inflight      map[OpRef]bool // submitted; its one completion not yet delivered
	doubted       map[OpRef]bool // the worker may still report it retired
	nextSeq       map[int]int
	flushing      map[int]bool
	timers        map[TimerKind][]time.Time // pending, by kind
	deadline      time.Time                 // TxStart's
	pins          map[pinKey]int
	frames        map[int]int
	success       map[int]bool
	sending       map[int]bool // SUCCESS Result emitted, its TxSent not yet delivered
	left          map[int]bool // TxSent without an error
	finishes      []Outcome
	stopped       bool
	first         TxState
	decided       bool
	mayWrite      map[OpRef]bool // truth: the op's writes may still land
	cut           map[OpRef]bool // truth: cut unproven on the wire
	gone          map[int]bool
	cutPending    map[OpRef]bool
	dead          []int
	pinsOf        []Pin
	pinFailed     map[int]int // chunk → groups whose Pin was refused
	pinned        map[int]int // chunk → groups pinned
}

func newTxModel(rt *rapid.T) *txModel {
	m := &txModel{
		t: rt, now: testEpoch0, routes: map[int]*Route{},
		requested: map[int]bool{}, peerCancelled: map[int]bool{}, watched: map[int]bool{}, fired: map[int]bool{},
		inflight: map[OpRef]bool{}, doubted: map[OpRef]bool{}, nextSeq: map[int]int{}, flushing: map[int]bool{},
		timers: map[TimerKind][]time.Time{}, pins: map[pinKey]int{}, frames: map[int]int{}, success: map[int]bool{},
		sending: map[int]bool{}, left: map[int]bool{}, mayWrite: map[OpRef]bool{}, cut: map[OpRef]bool{}, gone: map[int]bool{}, cutPending: map[OpRef]bool{}, pinFailed: map[int]int{}, pinned: map[int]int{},
	}
	peers := rapid.IntRange(1, 3).Draw(rt, "peers")
	nChunks := rapid.IntRange(1, 4).Draw(rt, "chunks")
	for p := 1; p <= peers; p++ {
		m.expected = append(m.expected, p)
		pl := &fakePlanner{skip: map[int]bool{}, fail: map[int]error{}}
		for c := range nChunks {
			if rapid.IntRange(0, 3).Draw(rt, fmt.Sprintf("skip-p%d-c%d", p, c)) == 0 {
				pl.skip[c*32] = true
			}
		}
		m.routes[p] = &Route{Peer: genPeer(p), AgentAddr: []byte(fmt.Sprintf("gen-%d", p)), Planner: pl,
			CompletionsDeliver: rapid.Bool().Draw(rt, fmt.Sprintf("delivers-%d", p))}
	}
	groups := rapid.IntRange(1, 2).Draw(rt, "groups")
	for c := range nChunks {
		ch := testChunk(c*32, (c+1)*32, c == nChunks-1, groups)
		if groups == 2 && c == 0 && rapid.Bool().Draw(rt, "window") {
			ch.Src[1].IDs = nil // a sliding-window group holds nothing of chunk 0
		}
		m.chunks = append(m.chunks, ch)
	}
	var timeout time.Duration
	if rapid.Bool().Draw(rt, "orphan-timeout") {
		timeout = 30 * time.Second
	}
	m.s = NewTxSession(TxConfig{Request: "r1", Self: messages.PeerID{Instance: "ctx"}, Workers: 2,
		DrainGrace: 5 * time.Second, Timeout: timeout})
	m.apply(nil, m.s.Init(m.now), TxInit)
	return m
}

func sortedRefs(set map[OpRef]bool) []OpRef {
	out := make([]OpRef, 0, len(set))
	for r, ok := range set {
		if ok {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Peer != out[j].Peer {
			return out[i].Peer < out[j].Peer
		}
		return out[i].Seq < out[j].Seq
	})
	return out
}

func sortedInts(set map[int]bool) []int {
	var out []int
	for k, ok := range set {
		if ok {
			out = append(out, k)
		}
	}
	sort.Ints(out)
	return out
}

func (m *txModel) unfired() []int {
	var out []int
	for c := range m.watched {
		if !m.fired[c] {
			out = append(out, c)
		}
	}
	sort.Ints(out)
	return out
}

func (m *txModel) unrequested() []int {
	var out []int
	for _, p := range m.expected {
		if !m.requested[p] {
			out = append(out, p)
		}
	}
	return out
}

// randomStep delivers one message the environment could deliver now.
func (m *txModel) randomStep() {
	rt := m.t
	var actions []string
	add := func(name string, weight int) {
		for range weight {
			actions = append(actions, name)
		}
	}
	if !m.started {
		add("start", 6)
	}
	if m.started && m.sent < len(m.chunks) {
		add("chunk", 8)
	}
	if len(m.unfired()) > 0 {
		add("fence", 8)
	}
	if len(m.unrequested()) > 0 {
		add("request", 6)
	}
	if len(m.inflight) > 0 {
		add("complete", 10)
		add("crash", 1)
		add("foreign-retire", 1)
	}
	if len(m.flushing) > 0 {
		add("flush", 6)
	}
	if len(m.sending) > 0 {
		add("sent", 6)
	}
	if len(m.requested) > 0 {
		add("peer-cancel", 1)
	}
	if len(m.timers[TimerDeadline]) > 0 {
		add("deadline", 1)
	}
	if len(m.timers[TimerDrain]) > 0 {
		add("drain", 3)
	}
	if len(m.timers[TimerOrphan]) > 0 {
		add("orphan", 1)
	}
	if len(m.doubted) > 0 {
		add("retire", 4)
	}
	add("cancel", 1)
	add("peer-gone", 1)
	if len(m.dead) == 0 {
		add("worker-dead", 1)
	}
	if len(m.inflight) > 0 {
		add("cut", 1)
	}
	add("panic", 1)
	add("bad-request", 1)
	add("tick", 1)

	switch a := rapid.SampledFrom(actions).Draw(rt, "action"); a {
	case "start":
		msg := TxStart{PromptLen: 32 * len(m.chunks), Payload: []byte("tok")}
		if rapid.Bool().Draw(rt, "deadline") {
			msg.Deadline = m.now.Add(time.Minute)
			m.deadline = msg.Deadline
		}
		m.started = true
		m.step(msg)
	case "chunk":
		c := m.chunks[m.sent]
		m.sent++
		m.pinsOf = nil
		m.step(c)
		if len(m.pinsOf) > 0 && rapid.IntRange(0, 3).Draw(rt, "pin-fails") == 0 {
			pe := rapid.SampledFrom(m.pinsOf).Draw(rt, "pin")
			for _, id := range pe.IDs {
				m.pins[pinKey{pe.Group, id}]--
			}
			m.pinFailed[pe.Chunk]++
			m.step(TxPinFailed{Chunk: pe.Chunk, Group: pe.Group, Err: errors.New("freed")})
		}
	case "fence":
		c := rapid.SampledFrom(m.unfired()).Draw(rt, "fence")
		var err error
		if rapid.IntRange(0, 7).Draw(rt, "fence-err") == 0 {
			err = errors.New("producer failed")
		}
		m.step(TxFenceFired{Index: c, Err: err})
	case "request":
		p := rapid.SampledFrom(m.unrequested()).Draw(rt, "peer")
		m.requested[p] = true
		m.step(TxPeerRequest{Peer: p, Epoch: 1, Route: m.routes[p], Expected: m.expected})
	case "complete":
		r := rapid.SampledFrom(sortedRefs(m.inflight)).Draw(rt, "op")
		delete(m.inflight, r)
		msg := TxCompleted{Op: r}
		switch rapid.IntRange(0, 5).Draw(rt, "outcome") {
		case 4:
			msg.Err = errors.New("remote write failed")
		case 5:
			msg.Err, msg.Refused = errors.New("post refused"), true
		}
		m.step(msg)
	case "crash":
		// The worker dies: every op it holds is in doubt; its restart
		// will close the endpoints (a later "retire"), and each op's Done
		// still comes, with an error.
		ops := sortedRefs(m.inflight)
		for _, r := range ops {
			m.doubted[r] = true
		}
		m.step(TxInDoubt{Ops: ops, Reason: ErrWorkerCrashed})
	case "foreign-retire":
		// Another session's drain closed a shared endpoint: our op, not in
		// doubt for us, is reported retired; its Done follows.
		r := rapid.SampledFrom(sortedRefs(m.inflight)).Draw(rt, "op")
		m.step(TxRetired{Ops: []OpRef{r}})
	case "retire":
		ops := sortedRefs(m.doubted)
		if !rapid.Bool().Draw(rt, "retire-all") {
			ops = ops[:1]
		}
		for _, r := range ops {
			delete(m.doubted, r)
		}
		m.step(TxRetired{Ops: ops})
	case "flush":
		p := rapid.SampledFrom(sortedInts(m.flushing)).Draw(rt, "peer")
		delete(m.flushing, p)
		var err error
		if rapid.IntRange(0, 3).Draw(rt, "flush-err") == 0 {
			err = errors.New("flush failed")
		}
		m.step(TxFlushed{Peer: p, Err: err})
	case "sent":
		p := rapid.SampledFrom(sortedInts(m.sending)).Draw(rt, "peer")
		delete(m.sending, p)
		var err error
		if rapid.IntRange(0, 3).Draw(rt, "sent-err") == 0 {
			err = errors.New("dial refused")
		} else {
			m.left[p] = true
		}
		m.step(TxSent{Peer: p, Err: err})
		if err != nil && m.s.State() == TxDone {
			rt.Fatalf("DONE after peer %d's Result was reported unsent", p)
		}
	case "peer-cancel":
		p := rapid.SampledFrom(sortedInts(m.requested)).Draw(rt, "peer")
		epoch := uint64(1)
		if rapid.IntRange(0, 3).Draw(rt, "stale-epoch") == 0 {
			epoch = 3 // no stream has it
		} else {
			m.peerCancelled[p] = true
		}
		m.step(TxPeerCancel{Peer: p, Epoch: epoch})
	case "cancel":
		m.step(TxCancel{})
	case "worker-dead":
		w := rapid.IntRange(0, 1).Draw(rt, "dead-worker")
		msg := TxWorkerDead{Worker: w}
		for _, r := range sortedRefs(m.inflight) {
			if WorkerFor("r1", genPeer(r.Peer), 2) != w {
				continue
			}
			delete(m.inflight, r)
			delete(m.doubted, r)
			switch rapid.IntRange(0, 3).Draw(rt, "dead-op") {
			case 0, 1:
				msg.InDoubt = append(msg.InDoubt, r)
				msg.Released = append(msg.Released, r)
				m.cut[r] = true
			default:
				delete(m.mayWrite, r)
			}
		}
		for _, r := range sortedRefs(m.cut) {
			if WorkerFor("r1", genPeer(r.Peer), 2) != w {
				continue
			}
			msg.InDoubt = append(msg.InDoubt, r)
			if m.cutPending[r] {
				delete(m.cutPending, r)
				msg.Released = append(msg.Released, r)
			}
		}
		for p := range m.flushing {
			if WorkerFor("r1", genPeer(p), 2) == w {
				delete(m.flushing, p)
			}
		}
		for p := range m.sending {
			if WorkerFor("r1", genPeer(p), 2) == w {
				delete(m.sending, p)
			}
		}
		m.dead = append(m.dead, w)
		m.step(msg)
	case "peer-gone":
		p := rapid.SampledFrom(m.expected).Draw(rt, "gone-peer")
		m.gone[p] = true
		m.step(TxPeerGone{Peer: genPeer(p)})
	case "cut":
		// The backend cut the op on the wire: its writes may land.
		r := rapid.SampledFrom(sortedRefs(m.inflight)).Draw(rt, "op")
		delete(m.inflight, r)
		delete(m.doubted, r)
		m.cut[r] = true
		m.step(TxCompleted{Op: r, Err: errors.New("cut"), Unproven: true})
		if rapid.Bool().Draw(rt, "sources-released") {
			m.step(TxRetired{Ops: []OpRef{r}, Unproven: true})
		} else {
			m.cutPending[r] = true
		}
	case "deadline":
		m.fireTimer(TimerDeadline)
	case "drain":
		m.fireTimer(TimerDrain)
	case "orphan":
		m.fireTimer(TimerOrphan)
	case "panic":
		m.step(TxPanic{Err: errors.New("nil map")})
	case "bad-request":
		p := rapid.SampledFrom(m.expected).Draw(rt, "peer")
		switch rapid.IntRange(0, 2).Draw(rt, "bad") {
		case 0: // unresolvable
			m.step(TxPeerRequest{Peer: p, Epoch: 1, Err: ErrBadRequest})
		case 1: // not a peer of this rank
			m.step(TxPeerRequest{Peer: 9, Epoch: 1, Route: &Route{Peer: genPeer(9), Planner: &fakePlanner{}}, Expected: m.expected})
		case 2: // a new epoch from a peer (or a first request, if none yet)
			m.requested[p] = true
			old := m.s.streams[p]
			m.step(TxPeerRequest{Peer: p, Epoch: 2, Route: m.routes[p], Expected: m.expected})
			if old != nil && m.s.streams[p] != old {
				m.t.Fatalf("a second RequestData replaced the stream")
			}
		}
	case "tick":
		m.now = m.now.Add(time.Second)
	default:
		rt.Fatalf("unknown action %q", a)
	}
}

// step delivers one message and checks every per-step invariant.
func (m *txModel) step(msg any) {
	before := m.s.State()
	if f, ok := msg.(TxFenceFired); ok {
		m.fired[f.Index] = true
	}
	msg = withPrompt(msg, &m.prompt)
	switch x := msg.(type) {
	case TxCompleted:
		if !x.Unproven {
			delete(m.mayWrite, x.Op)
		}
	case TxRetired:
		if !x.Unproven {
			for _, r := range x.Ops {
				if !m.cut[r] {
					delete(m.mayWrite, r)
				}
			}
		}
	}
	effs := m.s.Step(msg, m.now)
	m.apply(msg, effs, before)
}

func (m *txModel) apply(msg any, effs []Effect, before TxState) {
	rt, s := m.t, m.s
	after := s.State()
	if len(s.Violations()) > 0 {
		rt.Fatalf("%T: violations %v", msg, s.Violations())
	}
	if m.stopped && len(effs) > 0 {
		rt.Fatalf("%T after Stop: %s", msg, fmtEffects(effs))
	}
	if before.Terminal() && after != before {
		rt.Fatalf("%T: terminal %v overwritten by %v", msg, before, after)
	}
	if after.Terminal() && !m.decided {
		m.decided, m.first = true, after
	}
	ops := s.OpStates()
	peerOps := func(p int) []OpState {
		var out []OpState
		for r, st := range ops {
			if r.Peer == p {
				out = append(out, st)
			}
		}
		return out
	}
	unpinned := false
	for i, e := range effs {
		switch e := e.(type) {
		case Pin:
			if before.Terminal() {
				rt.Fatalf("%T: Pin after terminal %v", msg, before)
			}
			for _, id := range e.IDs {
				m.pins[pinKey{e.Group, id}]++
			}
			m.pinsOf = append(m.pinsOf, e)
			m.pinned[e.Chunk]++
		case Unpin:
			unpinned = true
			for _, id := range e.IDs {
				k := pinKey{e.Group, id}
				if m.pins[k] == 0 {
					rt.Fatalf("%T: Unpin of %v, not pinned", msg, k)
				}
				m.pins[k]--
			}
			for r, st := range ops {
				if !st.SourceQuiescent() {
					rt.Fatalf("%T: Unpin while op %v is %v", msg, r, st)
				}
			}
			for _, c := range m.unfired() {
				if m.pinned[c] > m.pinFailed[c] {
					rt.Fatalf("%T: Unpin while pinned chunk %d's fence has not fired", msg, c)
				}
			}
		case WatchFence:
			if m.watched[e.Chunk] {
				rt.Fatalf("%T: chunk %d watched twice", msg, e.Chunk)
			}
			m.watched[e.Chunk] = true
		case Submit:
			if before.Terminal() || after.Terminal() {
				rt.Fatalf("%T: Submit %v around terminal %v → %v", msg, e.Op, before, after)
			}
			st := s.streams[e.Op.Peer]
			if c := st.ops[e.Op.Seq].chunk; !m.fired[c] {
				rt.Fatalf("%T: Submit %v before chunk %d's fence", msg, e.Op, c)
			}
			if e.Op.Seq != m.nextSeq[e.Op.Peer] {
				rt.Fatalf("%T: Submit %v out of order (next %d)", msg, e.Op, m.nextSeq[e.Op.Peer])
			}
			if e.Worker != WorkerFor("r1", genPeer(e.Op.Peer), 2) || e.Route != m.routes[e.Op.Peer] {
				rt.Fatalf("%T: Submit %v to worker %d route %v", msg, e.Op, e.Worker, e.Route)
			}
			m.nextSeq[e.Op.Peer]++
			m.inflight[e.Op] = true
			m.mayWrite[e.Op] = true
		case Flush:
			if m.flushing[e.Peer] {
				rt.Fatalf("%T: second Flush to %d", msg, e.Peer)
			}
			for _, st := range peerOps(e.Peer) {
				if st != OpBackendDone {
					rt.Fatalf("%T: Flush to %d with an op %v", msg, e.Peer, st)
				}
			}
			m.flushing[e.Peer] = true
		case CloseEndpoint:
			// The worker closes the endpoint: every op still in flight
			// on it is retired (reported later), and its Done follows.
			for r := range m.inflight {
				if r.Peer == e.Peer && !m.cut[r] {
					m.doubted[r] = true
				}
			}
		case SendFrame:
			p := int(e.To.Rank)
			for r := range m.mayWrite {
				if r.Peer == p {
					rt.Fatalf("%T: terminal frame %s to %d while op %v may still write", msg, fmtFrame(e.Frame), p, r)
				}
			}
			if f, ok := e.Frame.(*messages.Result); ok && f.Status == messages.StatusSuccess {
				var want uint64
				for _, c := range m.chunks {
					if !m.routes[p].Planner.(*fakePlanner).skip[c.Chunk.Start] {
						want += uint64(c.Chunk.Tokens())
					}
				}
				if f.Bytes != want {
					rt.Fatalf("%T: SUCCESS to %d with %d bytes, planned %d", msg, p, f.Bytes, want)
				}
			}
			m.frames[p]++
			if m.frames[p] > 1 {
				rt.Fatalf("%T: second terminal frame to %d: %s", msg, p, fmtFrame(e.Frame))
			}
			switch f := e.Frame.(type) {
			case *messages.Result:
				if f.Status == messages.StatusSuccess {
					if fl, ok := msg.(TxFlushed); m.routes[p].CompletionsDeliver {
						if after.Terminal() && after != TxDone {
							rt.Fatalf("%T: Result SUCCESS to %d not as the answer to its last completion (state %v)", msg, p, after)
						}
					} else if !ok || fl.Peer != p || fl.Err != nil || after.Terminal() && after != TxDone {
						rt.Fatalf("%T: Result SUCCESS to %d not as the answer to its flush (state %v)", msg, p, after)
					}
					m.success[p] = true
					m.sending[p] = true
				}
			case *messages.CancelAck:
				if !m.peerCancelled[p] {
					rt.Fatalf("%T: CancelAck to %d, which did not cancel", msg, p)
				}
			default:
				rt.Fatalf("%T: frame %s", msg, fmtFrame(f))
			}
			for _, st := range peerOps(p) {
				if !st.Quiescent() {
					rt.Fatalf("%T: terminal frame to %d with an op %v", msg, p, st)
				}
			}
		case StartTimer:
			m.timers[e.Kind] = append(m.timers[e.Kind], e.At)
		case Finish:
			m.finishes = append(m.finishes, e.Outcome)
			if len(m.finishes) > 1 {
				rt.Fatalf("%T: second Finish", msg)
			}
			if e.Outcome.Status != m.first.Status() || e.Outcome.OK != (m.first == TxDone) {
				rt.Fatalf("%T: Finish %s ok=%v, first outcome %v", msg, e.Outcome.Status, e.Outcome.OK, m.first)
			}
			if i+2 != len(effs) || !isStop(effs[i+1]) {
				rt.Fatalf("%T: Finish not followed by Stop at the end: %s", msg, fmtEffects(effs))
			}
		case Stop:
			m.stopped = true
		}
	}
	switch msg := msg.(type) {
	case TxInDoubt:
		for _, r := range msg.Ops {
			if st, ok := ops[r]; ok && (st == OpSubmitting || st == OpSubmitted) {
				rt.Fatalf("%T: op %v still %v", msg, r, st)
			}
		}
	case TxTimeout:
		// Unless it was the orphan timer overtaken by Send's own deadline,
		// a deadline leaves nothing in flight: every such op is in doubt.
		if msg.Kind == TimerDeadline || (msg.Kind == TimerOrphan && (!m.started || m.deadline.IsZero())) {
			for r, st := range ops {
				if st == OpSubmitting || st == OpSubmitted {
					rt.Fatalf("%T: op %v still %v after the deadline", msg, r, st)
				}
			}
		}
	}
	if unpinned && len(s.PinnedChunks()) > 0 {
		rt.Fatalf("%T: chunks %v still pinned after the release", msg, s.PinnedChunks())
	}
	if after == TxDone {
		for _, p := range m.expected {
			if !m.success[p] {
				rt.Fatalf("%T: DONE without SUCCESS to peer %d", msg, p)
			}
			if !m.left[p] {
				rt.Fatalf("%T: DONE before peer %d's Result was reported sent", msg, p)
			}
		}
	}
}

// fireTimer delivers the earliest pending timer of kind, moving the clock
// to its time first (a timer never fires early).
func (m *txModel) fireTimer(kind TimerKind) {
	ts := m.timers[kind]
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	at := ts[0]
	m.timers[kind] = ts[1:]
	if m.now.Before(at) {
		m.now = at
	}
	m.step(TxTimeout{Kind: kind})
}

func isStop(e Effect) bool { _, ok := e.(Stop); return ok }

// drain delivers everything still outstanding until the session stops.
func (m *txModel) drain() {
	for i := 0; !m.stopped; i++ {
		if i > 1000 {
			m.t.Fatalf("no progress: %s", fmtTxState(m.s))
		}
		switch {
		case len(m.unfired()) > 0:
			m.step(TxFenceFired{Index: m.unfired()[0]})
		case len(m.inflight) > 0:
			r := sortedRefs(m.inflight)[0]
			delete(m.inflight, r)
			m.step(TxCompleted{Op: r})
		case len(m.doubted) > 0:
			ops := sortedRefs(m.doubted)
			clear(m.doubted)
			m.step(TxRetired{Ops: ops})
		case len(m.cutPending) > 0:
			ops := sortedRefs(m.cutPending)
			clear(m.cutPending)
			m.step(TxRetired{Ops: ops, Unproven: true})
		case len(m.flushing) > 0:
			p := sortedInts(m.flushing)[0]
			delete(m.flushing, p)
			m.step(TxFlushed{Peer: p})
		case len(m.sending) > 0:
			p := sortedInts(m.sending)[0]
			delete(m.sending, p)
			m.left[p] = true
			m.step(TxSent{Peer: p})
		case m.started && m.sent < len(m.chunks):
			m.sent++
			m.step(m.chunks[m.sent-1])
		case len(m.unrequested()) > 0:
			p := m.unrequested()[0]
			m.requested[p] = true
			m.step(TxPeerRequest{Peer: p, Epoch: 1, Route: m.routes[p], Expected: m.expected})
		case len(m.timers[TimerDrain]) > 0:
			m.fireTimer(TimerDrain)
		case !m.s.State().Terminal():
			m.step(TxCancel{})
		default:
			m.t.Fatalf("stuck: nothing outstanding, not stopped: %s", fmtTxState(m.s))
		}
	}
}

func (m *txModel) checkEnd() {
	rt, s := m.t, m.s
	if !s.Stopped() || !s.Quiescent() {
		rt.Fatalf("end: stopped=%v quiescent=%v: %s", s.Stopped(), s.Quiescent(), fmtTxState(s))
	}
	for k, n := range m.pins {
		if n != 0 {
			rt.Fatalf("end: block %v pinned %d more times than unpinned", k, n)
		}
	}
	if len(m.finishes) != 1 {
		rt.Fatalf("end: %d Finish effects", len(m.finishes))
	}
	for p := range s.streams {
		if m.frames[p] != 1 && !s.streams[p].silent {
			rt.Fatalf("end: peer %d got %d terminal frames", p, m.frames[p])
		}
	}
	if got := m.finishes[0]; (got.Err == nil) != (m.first == TxDone) {
		rt.Fatalf("end: outcome %s with err %v", got.Status, got.Err)
	}
	if m.first == TxDone && !slices.Equal(sortedInts(m.success), m.expected) {
		rt.Fatalf("end: DONE, but SUCCESS only to %v", sortedInts(m.success))
	}
}
