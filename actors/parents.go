package actors

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/core"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/internal/hoptrace"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// newOpenReply is an open request's reply, waiting for its answer.
func newOpenReply[T any]() openReply[T] { return openReply[T]{done: make(chan struct{}, 1)} }

// answer gives the caller its answer; a request is answered once.
func (o *openReply[T]) answer(r T) {
	o.r = r
	o.done <- struct{}{}
}

// Messages to the tx and rx supervisors.
type (
	txOpenReq struct {
		request    string
		start      TxStart
		generation string // the generation instance, when Send names it
		handle     *Handle
		reply      openReply[txOpenReply]
	}
	txOpenReply struct {
		pid *actor.PID
		err error
	}
	rxOpenReq struct {
		req    RxRequest
		handle *Handle
		reply  openReply[rxOpenReply]
		at     time.Time // when Receive was called
		// deadline fires rxQueueTimeout while the request waits for
		// blocks; stopped once it leaves the queue, so that a finished
		// request (and a closed engine) holds no timer until its deadline.
		deadline Timer
	}
	rxOpenReply struct {
		err error
	}
	closeReq struct{ drained chan struct{} }
	// openReply carries a supervisor's one answer to an open request
	// (txOpenReq, rxOpenReq) back to the caller in awaitOpen: answer
	// writes r, then signals done. It lives in the request message, and
	// done is a channel of empty structs: one allocation, where a
	// buffered channel of the answer took two (its buffer holds
	// pointers, so it is allocated apart from the channel).
	openReply[T any] struct {
		r    T
		done chan struct{}
	}
	// peerDown: the control plane declared a peer dead, for why (how
	// it knows: "missed its heartbeats", "is out of etcd cluster …").
	// inc: that incarnation of it, or an earlier one (0: any).
	peerDown struct {
		peer messages.PeerID
		why  string
		inc  uint64
	}
	// peerAlive: a peer's heartbeat (Engine.PeerAlive); leaseTick: the
	// earliest writer lease may have lapsed.
	peerAlive struct{ peer messages.PeerID }
	leaseTick struct{}
	// writerExited: proof that a writer process can write no more.
	// Answered (ctx.Respond) with how many requests it concerned.
	writerExited struct {
		peer messages.PeerID
		inc  uint64
		how  string
	}
	// writerRequests asks how many requests are addressed to incarnation
	// inc of writer peer and not finished here (live, or failed and
	// draining or quarantined); answered with an int.
	writerRequests struct {
		peer messages.PeerID
		inc  uint64
	}
	// workerDead: a sender worker was stopped for good.
	workerDead struct {
		worker int
		// inDoubt: its ops whose endpoint's close proved nothing, by
		// session (each hears of its own only: workerDead.tx)
		inDoubt []core.SessionOps[*actor.PID]
		// released: those of inDoubt whose close proved their sources
		// released, a report the worker stopped before it handled
		released []core.SessionOps[*actor.PID]
	}
	// blocksFreed wakes the rx supervisor's allocation queue.
	blocksFreed struct{}
	// parentCrash makes a parent (or the senders) panic: crash injection,
	// sent only by kvxfer_invariants builds (Engine.CrashParent).
	parentCrash struct{}
	// rxQueueTimeout: the deadline of queued request q (its id; q tells
	// it from a later request reusing the id, should this one have left
	// the queue while the timer's callback was on its way).
	rxQueueTimeout struct {
		request string
		q       *rxOpenReq
	}
)

// RxRequest is what the generation side asks for.
type RxRequest struct {
	ID        string
	PromptLen int
	// Context is the context instance and its parallelism.
	Context         string
	ContextParallel kvcache.Parallel
	// PrefixHitBlocks[g] is the number of leading blocks of group g the
	// receiver already holds (prefix reuse); nil for none.
	PrefixHitBlocks []int
	// Blocks, when set, are the destination blocks the framework allocated,
	// per layer group: exactly the needed range's count (after prefix hits
	// and windows). kvxfer then neither allocates nor frees them: the handle
	// says when the framework may reuse them (Released).
	Blocks   [][]kvcache.BlockID
	Deadline time.Time
}

type sessionTable struct {
	pids     map[string]*actor.PID
	closing  chan struct{}
	draining bool
}

func (t *sessionTable) list(side string) []string {
	out := make([]string, 0, len(t.pids))
	for id := range t.pids {
		out = append(out, side+":"+id)
	}
	return out
}

func (t *sessionTable) maybeDrained() {
	if t.draining && len(t.pids) == 0 && t.closing != nil {
		close(t.closing)
		t.closing = nil
	}
}

// recent remembers a value for each of the last ids put in it, at most
// a bound: past it the oldest goes. take and forget are O(1): a slot of
// order whose seq is not its id's entry's is stale (the id was taken, or
// put again since) and evicts nothing when it is the oldest.
type recent[T any] struct {
	byID  map[string]recentEntry[T]
	order []recentSlot // oldest first
	seq   uint64
}

type recentEntry[T any] struct {
	v   T
	seq uint64
}

type recentSlot struct {
	id  string
	seq uint64
}

// put keeps v for id, within bound slots; an id already kept keeps its slot.
func (u *recent[T]) put(id string, v T, bound int) {
	if u.byID == nil {
		u.byID = map[string]recentEntry[T]{}
	}
	if e, ok := u.byID[id]; ok {
		u.byID[id] = recentEntry[T]{v: v, seq: e.seq}
		return
	}
	if len(u.order) >= bound {
		if old := u.order[0]; u.byID[old.id].seq == old.seq {
			delete(u.byID, old.id)
		}
		u.order = u.order[1:]
	}
	u.seq++
	u.order = append(u.order, recentSlot{id: id, seq: u.seq})
	u.byID[id] = recentEntry[T]{v: v, seq: u.seq}
}

func (u *recent[T]) get(id string) (T, bool) {
	e, ok := u.byID[id]
	return e.v, ok
}

// take returns id's value, if any, and forgets it.
func (u *recent[T]) take(id string) (T, bool) {
	e, ok := u.byID[id]
	if ok {
		delete(u.byID, id)
	}
	return e.v, ok
}

// endedBeforeSend remembers the outcomes of the last endedBeforeSendN
// sessions that ended before a Send adopted them (txParent.unsent).
type endedBeforeSend struct{ recent[Outcome] }

const endedBeforeSendN = 4096

func (u *endedBeforeSend) add(id string, o Outcome) { u.put(id, o, endedBeforeSendN) }

// forget drops id's record (an id ended again later gets a slot of its
// own).
func (u *endedBeforeSend) forget(id string) { u.take(id) }

// refusedBeforeSend remembers, for the last refusedBeforeSendN request
// ids, the last RequestData refused unresolved while no session here had
// the request (txParent.refusedEarly): diagnostic text only, for a Send
// that comes after. It opens no session, pins nothing and decides nothing
// about a request by itself; a flood of refused frames only pushes older
// entries out. At most refusedBeforeSendN × (request id + peer +
// messages.MaxErrorLen bytes of text).
type refusedBeforeSend struct{ recent[TxRefused] }

const refusedBeforeSendN = 256

func (u *refusedBeforeSend) add(id string, r TxRefused) { u.put(id, r, refusedBeforeSendN) }

// txParent supervises TxSessions and routes context-side frames to them.
// Its decisions are core.TxTable's; it keeps the sessions' PIDs and the
// handles Send gave out.
type txParent struct {
	env      *shellEnv
	topo     Topology
	self     messages.PeerID
	link     control.Link
	cfg      TxConfig
	table    txTable
	sessions sessionTable
	handles  map[string]*Handle
	// unsent: why sessions that a RequestData opened ended before a Send
	// adopted them (the wait for Send is bounded by TransferTimeout), for
	// a Send that comes after: the table refuses it as done, and the
	// caller learns what ended it.
	unsent endedBeforeSend
	// refusedEarly: the last RequestData refused unresolved for requests
	// no session had yet, for the deadline's error of a Send that comes
	// after (a session that waits gets a TxRefused at once).
	refusedEarly refusedBeforeSend

	// answering is the sender's incarnation of the frame being handled:
	// the parent's own replies are addressed to it.
	answering uint64
	// leases: this writer's leases on its generation peers (issue 17);
	// leaseArmed: a leaseTick is pending.
	leases     *core.PeerLeases
	leaseArmed bool
}

// refusedInstance refuses a Send naming generation instance gen for a
// request no session has, when a rank of gen asked for it before and was
// refused (refusedEarly), and the Hello the link holds for that rank now
// still serves another layout: every RequestData of it would be refused
// the same way, so the request could only wait out its deadline. The
// error wraps ErrMismatch (LayoutMismatch). Decided by the link's Hello,
// not by the remembered text; nothing is remembered or changed, so a Send
// after that rank came back with the right layout is taken.
func (p *txParent) refusedInstance(request, gen string) error {
	if gen == "" || p.sessions.draining || p.sessions.pids[request] != nil {
		return nil
	}
	r, ok := p.refusedEarly.get(request)
	if !ok || r.From.Instance != gen {
		return nil
	}
	hello, err := p.link.Hello(r.From)
	if err != nil {
		return nil
	}
	if err := LayoutMismatch(p.topo, hello); err != nil {
		return fmt.Errorf("send %s: generation instance %s cannot be served by this rank: its rank %s asked for the request and was refused: %w",
			request, gen, r.From, err)
	}
	return nil
}

// renewLease renews peer's lease at now and keeps a check armed for the
// earliest lapse.
func (p *txParent) renewLease(ctx actor.Context, peer messages.PeerID) {
	if p.leases.TTL() <= 0 {
		return
	}
	now := p.env.clock.Now()
	p.leases.Renew(peer, now)
	p.armLease(ctx, now)
}

func (p *txParent) armLease(ctx actor.Context, now time.Time) {
	next := p.leases.Next(now)
	if p.leaseArmed || next.IsZero() || p.sessions.draining {
		return
	}
	p.leaseArmed = true
	sys, self := ctx.ActorSystem(), ctx.Self()
	p.env.clock.AfterFunc(next.Sub(now), func() { sys.Root.Send(self, &leaseTick{}) })
}

// leaseLapsed fences this writer from peers whose lease lapsed: their
// streams fail, ops in flight go IN_DOUBT, endpoints close (TxPeerGone).
func (p *txParent) leaseLapsed(ctx actor.Context) {
	p.leaseArmed = false
	now := p.env.clock.Now()
	for _, peer := range p.leases.Expired(now) {
		p.env.stats.LeasesLapsed.Add(1)
		p.env.log.Warn().Str("peer", peer.String()).Dur("lease", p.leases.TTL()).Msg("writer lease lapsed: no more posts to the peer, its requests fail")
		for _, pid := range p.sessions.pids {
			ctx.Send(pid, TxPeerGone{Peer: peer, Why: "let its writer lease lapse"})
		}
	}
	p.armLease(ctx, now)
}

func (p *txParent) spawn(ctx actor.Context, id string) *actor.PID {
	cfg := p.cfg
	cfg.Request = id
	c := newTxCell(p.env, NewTxSession(cfg), p.env.meters.txSession())
	pid := ctx.Spawn(p.env.sessionProps(c.produce))
	p.sessions.pids[id] = pid
	return pid
}

func (p *txParent) Receive(ctx actor.Context) {
	p.answering = 0
	if f, ok := ctx.Message().(messages.Frame); ok {
		p.answering = core.FromIncarnation(f)
		p.renewLease(ctx, f.Sender()) // a frame of the peer: it is alive
	}
	switch m := ctx.Message().(type) {
	case parentCrash:
		panic("tx parent: crash injected")
	case *peerAlive:
		p.renewLease(ctx, m.peer)
	case *leaseTick:
		p.leaseLapsed(ctx)
	case *txOpenReq:
		if p.env.failed.Load() {
			// Send checked before asking; a worker may have stopped for
			// good since (the flag is set before TxWorkerDead goes out): a
			// session spawned now would not know that worker is dead.
			m.reply.answer(txOpenReply{err: p.env.failedErr(m.request)})
			return
		}
		if err := p.refusedInstance(m.request, m.generation); err != nil {
			m.reply.answer(txOpenReply{err: err})
			return
		}
		spawn, err := p.table.Open(m.request, m.generation)
		if err != nil {
			if errors.Is(err, ErrClosed) { // (the table's error is the bare sentinel)
				err = fmt.Errorf("%w: send %s: the engine is closing", ErrClosed, m.request)
			}
			if o, ok := p.unsent.get(m.request); ok && errors.Is(err, ErrBadRequest) {
				err = fmt.Errorf("request %s ended before Send (%s): the session its generation side's RequestData opened here ended: %w",
					m.request, o.Status, o.Err)
			}
			m.reply.answer(txOpenReply{err: err})
			return
		}
		p.unsent.forget(m.request) // taken: any later refusal is of this one
		pid := p.sessions.pids[m.request]
		if spawn {
			pid = p.spawn(ctx, m.request)
		}
		p.handles[m.request] = m.handle
		ctx.Send(pid, &txSetHandle{h: m.handle, start: m.start})
		if r, ok := p.refusedEarly.take(m.request); ok && spawn && (m.generation == "" || m.generation == r.From.Instance) {
			// Its generation side asked before Send and was refused:
			// the session names that for its deadline's error.
			ctx.Send(pid, r)
		}
		m.reply.answer(txOpenReply{pid: pid})
	case *messages.RequestData:
		if hoptrace.On {
			hoptrace.Mark("txparent.RequestData", m.RequestID)
		}
		p.onRequestData(ctx, m)
		p.env.credits.give(m)
	case *invalidRequestData:
		p.onUnread(ctx, m.rd, "invalid RequestData: "+m.err.Error())
		p.env.credits.give(m.rd)
	case *misaddressedRequestData:
		p.onMisaddressed(ctx, m.rd)
		p.env.credits.giveAnswer(m.rd.From)
	case *shedRequestData:
		p.onUnread(ctx, m.rd, fmt.Sprintf("context rank %s dropped the RequestData unread: %s had %d control frames waiting here (EngineConfig.FrameCredits): retry later",
			p.self, m.rd.From, p.env.credits.limit))
		p.env.credits.giveAnswer(m.rd.From)
	case *messages.Cancel:
		defer p.env.credits.give(m)
		deliver, notBound, hold := p.table.Cancel(m, p.env.clock.Now())
		if hold && p.table.Silenced(m.RequestID, m.From, m.FromIncarnation) {
			// Our stream to it ended without a terminal frame: writes to
			// it may still land, and a CancelAck would be a proof.
			p.silenced()
			if ev := p.env.warn(m.From.Instance, "silenced"); ev != nil {
				ev.Str("peer", m.From.String()).Str("request", m.RequestID).
					Msg("Cancel left unanswered: writes of this request to that peer were cut by a close that proved nothing about them; only this rank's exit proves them over")
			}
			return
		}
		if hold {
			// No tombstone can be kept for it yet (TxTable.Cancel): no
			// answer, so that its sender keeps the blocks and re-sends.
			p.env.stats.CancelsDeferred.Add(1)
			p.env.meters.reject(rejectTombsFull)
			if ev := p.env.warn(m.From.Instance, "tombs"); ev != nil {
				ev.Str("peer", m.From.String()).Str("request", m.RequestID).
					Msgf("Cancel left unanswered for now: every cancel tombstone of its instance is younger than %v; it is answered once one ages (its sender re-sends it)", core.CancelTombMinAge)
			}
			return
		}
		if notBound {
			// Not the request's instance: nothing of ours writes for it.
			p.env.stats.FramesRejected.Add(1)
			p.env.meters.reject(rejectNotBound)
		}
		if !deliver {
			// Nothing of ours touches that request, and the table saw to
			// it that nothing will (a tombstone refuses the sender's late
			// RequestData): we are quiescent.
			p.reply(ctx, m.RequestID, m.From, &messages.CancelAck{RequestID: m.RequestID, Epoch: m.Epoch, From: p.self})
			return
		}
		ctx.Send(p.sessions.pids[m.RequestID], TxPeerCancel{Peer: p.genIndex(m.From), From: m.From, Epoch: m.Epoch,
			Incarnation: m.FromIncarnation, Reason: m.Reason})
	case *sessionStopped:
		pid := p.sessions.pids[m.request]
		if pid == nil || !pid.Equal(m.session) {
			return // a second one (sessionStopped.session)
		}
		ctx.Poison(pid) // after whatever this parent already sent it
		delete(p.sessions.pids, m.request)
		// The session finishes its handle itself; if it stopped before a
		// Send adopted it (the handle then went to a dead actor), this
		// does (Handle.finish is once-only).
		if h := p.handles[m.request]; h != nil {
			// Done means every pin dropped: chunks the handle pinned that
			// the session will never take are released first (its own
			// Finish did, unless a Send adopted it after that).
			p.env.sweepPins(m.request, &h.pins)
			h.finish(m.outcome)
		} else if m.outcome.Err != nil {
			p.unsent.add(m.request, m.outcome)
		}
		delete(p.handles, m.request)
		p.table.Silence(m.request, m.silent)
		if len(m.silent) > 0 {
			p.env.writesCut.Store(true) // Engine.WritesOver
		}
		p.table.Stopped(m.request)
		p.sessions.maybeDrained()
	case *closeReq:
		p.sessions.draining = true
		p.sessions.closing = m.drained
		for _, id := range p.table.Close() {
			ctx.Send(p.sessions.pids[id], TxCancel{Reason: ErrClosed})
		}
		p.sessions.maybeDrained()
	case *listSessions:
		ctx.Respond(p.sessions.list("tx"))
	case *peerDown:
		for _, pid := range p.sessions.pids {
			ctx.Send(pid, TxPeerGone{Peer: m.peer, Why: m.why, Incarnation: m.inc})
		}
	case *workerDead:
		for _, pid := range p.sessions.pids {
			ctx.Send(pid, m.tx(pid))
		}
	}
}

// genIndex maps a generation peer to its rank index in its instance, from
// its Hello.
func (p *txParent) genIndex(from messages.PeerID) int {
	return int(from.Rank)
}

// reply answers a frame f (RequestData, Cancel) on the parent's own: from
// this incarnation, to the one the answered frame came from.
func (p *txParent) reply(ctx actor.Context, request string, to messages.PeerID, f messages.Frame) {
	core.Stamp(f, p.env.incarnation, p.answering)
	w := WorkerFor(request, to, len(p.env.workers))
	sendTo(ctx, p.env.frameWorker(w), &workerSend{SendFrame: SendFrame{Worker: w, To: to, Frame: f}})
}

// refuse answers a RequestData that touches no session: FAILED to its
// sender, counted, and forgotten (no session, no tombstone).
func (p *txParent) refuse(ctx actor.Context, rd *messages.RequestData, why rejectReason, err error) {
	if why == rejectStale {
		p.env.stale() // an earlier incarnation's, as the listener's (admit)
	} else {
		p.env.stats.FramesRejected.Add(1)
		p.env.meters.reject(why)
	}
	p.env.warn(rd.From.String(), "refused "+rejectNames[why]).Err(err).Str("request", rd.RequestID).Msg("RequestData refused")
	p.reply(ctx, rd.RequestID, rd.From, &messages.Result{RequestID: rd.RequestID, Epoch: rd.Epoch, From: p.self,
		Status: messages.StatusFailed, Error: messages.TruncateText(err.Error(), messages.MaxErrorLen)})
}

// closingText is the reason a closing context rank gives a RequestData
// for a request it has no session for: no Send made here took it, and
// none will (before, such a frame was told "already finished or
// cancelled", which named neither the closing nor the missing Send).
func closingText(self messages.PeerID, request string) string {
	return fmt.Sprintf("context rank %s is closing: no Send for request %s was made there, and none will be", self, request)
}

// invalidRequestData is a RequestData that failed validation (err) while
// naming its request and sender validly (messages.RequestData.Named): only
// those fields and its incarnations are read.
type invalidRequestData struct {
	rd  *messages.RequestData
	err error
}

// invalidResult is a Result that failed validation (err) while naming
// its request and sender validly (messages.Result.Named): only those
// fields and its incarnations are read.
type invalidResult struct {
	res *messages.Result
	err error
}

// misaddressedRequestData is a RequestData the listener dropped as
// addressed to an earlier incarnation of this rank (listener.misaddressed),
// as the fields that name it — request id, epoch, sender, incarnations —
// and its features.
type misaddressedRequestData struct{ rd *messages.RequestData }

// shedRequestData is a RequestData refused for its peer's spent frame
// credits (frameCredits), as the fields that name it: request id, epoch,
// sender and incarnations.
type shedRequestData struct{ rd *messages.RequestData }

// stale counts one stale frame: Counters.FramesStale and
// kvxfer_frames_rejected_total{reason="stale"} count the same frames, this
// and RxSession.StaleFrames (rxKind.stepped, rxMeter.stepped).
func (e *shellEnv) stale() {
	e.stats.FramesStale.Add(1)
	e.meters.reject(rejectStale)
}

// silenced counts a frame left unanswered for good (TxTable.Silence).
func (p *txParent) silenced() {
	p.env.stats.FramesSilenced.Add(1)
	p.env.meters.reject(rejectSilenced)
}

// onUnread decides a RequestData that was not read — one that failed
// validation (invalidRequestData) or was refused for its peer's spent
// credits (shedRequestData) — so that its request fails at once instead
// of at its deadline (TxTable.Unread): a request live here and bound to
// the sender's instance gets it as a RequestData that failed to resolve
// (its session changes nothing if it has that epoch from that peer, else
// it fails and answers the peer FAILED); every other is answered FAILED
// by the parent, saying why, and nothing is remembered. One from a peer
// the request is silenced for gets no answer at all (TxTable.Silence).
// Only the RequestData's naming fields are read.
func (p *txParent) onUnread(ctx actor.Context, rd *messages.RequestData, why string) {
	if p.table.Silenced(rd.RequestID, rd.From, rd.FromIncarnation) {
		p.silenced() // any answer would be a proof (TxTable.Silence)
		return
	}
	if p.table.Unread(rd) {
		ctx.Send(p.sessions.pids[rd.RequestID], &txPeerRequestMsg{TxPeerRequest: TxPeerRequest{Peer: p.genIndex(rd.From), From: rd.From,
			Epoch: rd.Epoch, Err: fmt.Errorf("%w: request %s: %s", ErrBadRequest, rd.RequestID, why), Incarnation: rd.FromIncarnation}})
		return
	}
	// Nothing of ours writes for that sender's epoch, and nothing will:
	// the answer is a proof. It is addressed to the frame's incarnation
	// and comes from this one, as every reply: a session of another
	// incarnation of the peer takes it as no proof.
	p.answering = core.FromIncarnation(rd)
	p.reply(ctx, rd.RequestID, rd.From, &messages.Result{RequestID: rd.RequestID, Epoch: rd.Epoch, From: p.self,
		Status: messages.StatusFailed, Error: messages.TruncateText(why, messages.MaxErrorLen)})
}

// onMisaddressed answers a RequestData this incarnation dropped unread,
// addressed to an earlier one (misaddressedRequestData), with a
// messages.Misaddressed to the incarnation that sent it: its session took
// the frame as delivered, and would otherwise wait for that earlier
// incarnation's answer, which never comes, until a proof of its exit or
// its deadline. The answer changes nothing here (no session, no
// tombstone: the request is not this incarnation's until a RequestData
// addressed to it comes) and proves nothing about any incarnation's
// writes; the generation side takes it only for its one copy of that
// RequestData (core.RxSession's onMisaddressed). It goes only to a sender
// that says messages.FeatureMisaddressed, in the RequestData or in its
// Hello the link holds now, of the frame's incarnation
// (core.MisaddressedAnswer): an older build rejects the frame as of an
// unknown type (counted, with a warning), so there the frame stays
// dropped unanswered, as before.
func (p *txParent) onMisaddressed(ctx actor.Context, rd *messages.RequestData) {
	hello, err := p.link.Hello(rd.From)
	if a := core.MisaddressedAnswer(rd, p.self, p.env.incarnation, hello, err); a != nil {
		p.answering = rd.FromIncarnation
		p.reply(ctx, rd.RequestID, rd.From, a)
	}
}

// onRequestData validates a RequestData against the sender's Hello and
// the request's generation instance before it may touch any state: one
// that fails creates no session and no tombstone, so a hostile or broken
// peer cannot poison a request that has not started. Only the request's
// own instance can fail it.
func (p *txParent) onRequestData(ctx actor.Context, rd *messages.RequestData) {
	switch v, bound := p.table.RequestData(rd); v {
	case core.RequestDataSilenced:
		p.silenced() // any answer would be a proof (TxTable.Silence)
		return
	case core.RequestDataStale:
		p.env.stale()
		p.reply(ctx, rd.RequestID, rd.From, &messages.Result{RequestID: rd.RequestID, Epoch: rd.Epoch, From: p.self,
			Status: messages.StatusFailed, Error: "request already finished on the context side, or cancelled by this generation instance before it arrived"})
		return
	case core.RequestDataClosing:
		p.env.stale()
		p.reply(ctx, rd.RequestID, rd.From, &messages.Result{RequestID: rd.RequestID, Epoch: rd.Epoch, From: p.self,
			Status: messages.StatusFailed, Error: closingText(p.self, rd.RequestID)})
		return
	case core.RequestDataNotBound:
		p.refuse(ctx, rd, rejectNotBound, fmt.Errorf("%w: request %s is for generation instance %s, not %s",
			ErrBadRequest, rd.RequestID, bound, rd.From.Instance))
		return
	case core.RequestDataShed:
		inst, limit := rd.From.Instance, p.table.OrphanLimit()
		p.refuse(ctx, rd, rejectOrphans, fmt.Errorf("%w: request %s (%d destination blocks): generation instance %s already has %d requests naming %d destination blocks waiting for this context rank's Send (the orphan limit, EngineConfig.MaxOrphans: %d requests, %d blocks)",
			ErrBadRequest, rd.RequestID, core.DestBlocks(rd), inst, p.table.Orphans(inst), p.table.OrphanBlocks(inst), limit, limit*core.OrphanBlocksEach))
		return
	}
	if p.env.failed.Load() && p.sessions.pids[rd.RequestID] == nil {
		// The engine failed (a sender worker stopped for good, or a
		// parent panicked): it takes no new work (Send refuses it too),
		// and a session opened now could route a stream to a dead
		// worker, whose ops nothing would post or settle.
		p.refuse(ctx, rd, rejectUnresolved, p.env.failedErr(rd.RequestID))
		return
	}
	hello, err := p.link.Hello(rd.From)
	if err == nil && hello.Incarnation != 0 && rd.FromIncarnation != 0 && hello.Incarnation != rd.FromIncarnation {
		// The Hello the link holds is another incarnation's (a RequestData
		// the old one sent before it went, arriving after its successor's
		// Hello): its destination blocks are not the new pool's, and no
		// session may be touched by it. It is refused, answered to the
		// incarnation it came from.
		p.refuse(ctx, rd, rejectStale, fmt.Errorf("%w: RequestData of %s incarnation %d, whose Hello here is incarnation %d's",
			core.ErrStaleIncarnation, rd.From, rd.FromIncarnation, hello.Incarnation))
		return
	}
	var route *Route
	var expected []int
	if err == nil {
		route, expected, err = ResolveRequest(p.topo, hello, rd)
	}
	refuse, spawn := p.table.Resolved(rd, err)
	if refuse {
		// Nobody has claimed the request: this frame does not get to.
		p.refuse(ctx, rd, rejectUnresolved, err)
		if pid := p.sessions.pids[rd.RequestID]; pid != nil && err != nil {
			// A session waits for it (Send, not bound to an instance):
			// it keeps why, for its deadline's error.
			ctx.Send(pid, TxRefused{From: rd.From, Why: messages.TruncateText(err.Error(), messages.MaxErrorLen)})
		} else if err != nil {
			// No session yet: kept (bounded) for a Send that comes after.
			p.refusedEarly.add(rd.RequestID, TxRefused{From: rd.From, Why: messages.TruncateText(err.Error(), messages.MaxErrorLen)})
		}
		return
	}
	if err != nil {
		// The request's own instance cannot be served: its session fails.
		p.env.stats.FramesRejected.Add(1)
		p.env.meters.reject(rejectUnresolved)
	}
	pid := p.sessions.pids[rd.RequestID]
	if spawn {
		pid = p.spawn(ctx, rd.RequestID)
	}
	ctx.Send(pid, &txPeerRequestMsg{TxPeerRequest: TxPeerRequest{Peer: p.genIndex(rd.From), From: rd.From, Epoch: rd.Epoch,
		PromptLen: int(rd.PromptLen), Route: route, Expected: expected, Err: err, Incarnation: rd.FromIncarnation}, hello: hello, rd: rd})
}

// rxParent supervises RxSessions, allocates destination blocks (queueing
// requests while the pool is full) and routes generation-side frames. Its
// writers, epochs and down set are core.RxTable's; it keeps the sessions'
// PIDs and the allocation queue.
type rxParent struct {
	env      *shellEnv
	topo     Topology
	self     messages.PeerID
	workers  int
	table    rxTable
	sessions sessionTable
	queue    allocQueue
	link     control.Link
	// handles are the started sessions' handles, for the error of a
	// Receive that reuses the id of one that ended but still drains.
	handles map[string]*Handle
	// waitErr is why the allocation queue's head waits (the pools' last
	// ErrOutOfBlocks for it: blocks in use, or the quarantine bound), for
	// the error of a queued request that times out.
	waitErr error
	// inDoubt: the requests whose sessions Close abandoned with their
	// destination blocks quarantined (sessionStopped.inDoubt), for Close's
	// error (listInDoubt). At most the sessions live at Close.
	inDoubt []string
	// shape is this rank's Layout.Shape, made by the first request that
	// needs it (the topology never changes): a request no longer makes
	// its layer lists again.
	shape *kvcache.Shape
}

func (p *rxParent) Receive(ctx actor.Context) {
	defer p.noteQueue()
	switch m := ctx.Message().(type) {
	case *peerAlive:
		// A writer declared down is heard again (its heartbeat): its
		// suspected requests send it their Cancel now, so that its answer
		// releases their blocks without waiting for the next re-send.
		if p.table.IsDown(m.peer) {
			p.heard(ctx, m.peer)
		}
	case *rxOpenReq:
		if hoptrace.On {
			hoptrace.Mark("rxparent.open", m.req.ID)
		}
		if p.sessions.draining {
			m.reply.answer(rxOpenReply{err: fmt.Errorf("%w: receive %s: the engine is closing", ErrClosed, m.req.ID)})
			return
		}
		if p.table.Started(m.req.ID) || p.queue.Queued(m.req.ID) {
			err := fmt.Errorf("%w: request %s already receiving", ErrBadRequest, m.req.ID)
			if h := p.handles[m.req.ID]; h != nil && h.Decided() != nil {
				d := h.Decided()
				// Ended, but a writer has not yet proven that it writes
				// no more into the blocks it was given: the id is the
				// session's until then.
				err = fmt.Errorf("%w: request %s ended (%s) and still waits for its writers' proof that they write no more into its blocks; retry under another id, or once its handle is released",
					ErrBadRequest, m.req.ID, d.Status)
			}
			m.reply.answer(rxOpenReply{err: err})
			return
		}
		counts, err := p.needed(m.req)
		if err == nil && m.req.Blocks != nil {
			err = p.checkOwned(m.req, counts)
		}
		if err != nil {
			m.reply.answer(rxOpenReply{err: err})
			return
		}
		m.reply.answer(rxOpenReply{})
		if m.req.Blocks != nil {
			// The framework allocated the blocks: nothing to wait for.
			p.start(ctx, m, m.req.Blocks)
			return
		}
		p.queue.Push(m.req.ID, counts, m)
		p.noteQueue() // before drainQueue's allocation attempt
		if !m.req.Deadline.IsZero() {
			sys, self, id := ctx.ActorSystem(), ctx.Self(), m.req.ID
			m.deadline = p.env.clock.AfterFunc(m.req.Deadline.Sub(p.env.clock.Now()), func() { sys.Root.Send(self, &rxQueueTimeout{request: id, q: m}) })
		}
		p.drainQueue(ctx)
	case parentCrash:
		panic("rx parent: crash injected")
	case *blocksFreed:
		p.drainQueue(ctx)
	case *rxQueueTimeout:
		if q, ok := p.queue.Get(m.request); ok && q == m.q {
			p.queue.Remove(m.request)
			// The error wraps why the queue waited (the pools'
			// ErrOutOfBlocks, or ErrQuarantineFull, which wraps it) as
			// well as ErrTimeout.
			err := fmt.Errorf("%w: request %s waited for destination blocks (%d other requests still queued): %w",
				ErrTimeout, q.req.ID, p.queue.Len(), kvcache.ErrOutOfBlocks)
			if p.waitErr != nil {
				err = fmt.Errorf("%w: request %s waited for destination blocks (%d other requests still queued; the queue's head waited: %w)",
					ErrTimeout, q.req.ID, p.queue.Len(), p.waitErr)
			}
			p.dropQueued(ctx, q, RxTimedOut, err)
			// It may have been the head: those behind it may fit now.
			p.drainQueue(ctx)
		}
		p.sessions.maybeDrained()
	case *messages.Result:
		if hoptrace.On {
			hoptrace.Mark("rxparent.Result", m.RequestID)
		}
		p.route(ctx, m)
		p.env.credits.give(m)
	case *messages.CancelAck:
		p.route(ctx, m)
		p.env.credits.give(m)
	case *messages.Misaddressed:
		// Its session decides (core.RxSession's onMisaddressed); one for
		// a request not started here (finished, or never) is counted
		// stale, one from a peer that is no writer of it rejected.
		p.route(ctx, m)
		p.env.credits.give(m)
	case *invalidResult:
		// Counted and logged by the listener; it shows nothing about its
		// sender, so the table only looks its writer up.
		if v, w := p.table.Lookup(m.res); v == core.RxRouteDeliver {
			ctx.Send(p.sessions.pids[m.res.RequestID], RxFrame{Writer: w, Frame: m.res, Invalid: m.err})
		}
		p.env.credits.give(m.res)
	case *sessionStopped:
		if pid := p.sessions.pids[m.request]; pid == nil || !pid.Equal(m.session) {
			return // a second one (sessionStopped.session)
		}
		if m.inDoubt {
			p.inDoubt = append(p.inDoubt, m.request)
		} else if h := p.handles[m.request]; h != nil {
			// No write can touch its blocks any more (every writer
			// quiescent, or it holds none): Released is said here, as the
			// context side's Done is, not by the session before this
			// message left it. A caller it wakes finds the session gone
			// (a Close with no time left drains: the C ABI's close after
			// the request's event), and a Close that drains finds it said.
			h.release()
			p.env.pools.settleOver() // the framework's blocks lent to it, if any (Pools.lend)
		}
		delete(p.sessions.pids, m.request)
		delete(p.handles, m.request)
		p.table.Stopped(m.request)
		p.sessions.maybeDrained()
		p.drainQueue(ctx)
	case *closeReq:
		p.sessions.draining = true
		p.sessions.closing = m.drained
		for _, q := range p.queue.Clear() {
			p.dropQueued(ctx, q, RxCancelled, ErrClosed)
		}
		p.heardAtClose(ctx)
		for _, pid := range p.sessions.pids {
			ctx.Send(pid, RxCancel{Reason: ErrClosed})
			// Close does not wait for proofs that may never come (a
			// writer partitioned or stalled for good): a session still
			// waiting for one stops, its blocks quarantined.
			ctx.Send(pid, RxAbandon{})
		}
		p.sessions.maybeDrained()
	case *rxCrashReq:
		if pid := p.sessions.pids[m.request]; pid != nil {
			ctx.Send(pid, &panicNow{})
		}
	case *rxCancelReq:
		if q, ok := p.queue.Get(m.request); ok && q.handle == m.handle {
			p.queue.Remove(m.request)
			p.dropQueued(ctx, q, RxCancelled, ErrCancelled)
			// It may have been the head: those behind it may fit now.
			p.drainQueue(ctx)
			return
		}
		if pid := p.sessions.pids[m.request]; pid != nil && p.handles[m.request] == m.handle {
			ctx.Send(pid, RxCancel{})
		}
	case *listSessions:
		ctx.Respond(p.sessions.list("rx"))
	case *listInDoubt:
		ctx.Respond(slices.Clone(p.inDoubt))
	case *peerDown:
		for _, r := range p.table.PeerDown(m.peer, m.inc) {
			// Missed heartbeats (or a record gone from etcd) are
			// suspicion, not proof (DESIGN.md §3): the request fails, its
			// blocks are quarantined.
			ctx.Send(p.sessions.pids[r.Request], RxSuspect{Writer: r.Writer, Err: fmt.Errorf("%w: %s %s", ErrPeerGone, m.peer, m.why),
				Incarnation: m.inc})
		}
	case *writerExited:
		refs := p.table.Exited(m.peer, m.inc)
		for _, r := range refs {
			ctx.Send(p.sessions.pids[r.Request], RxPeerGone{Writer: r.Writer, Err: fmt.Errorf("%w: %s: %s", ErrPeerGone, m.peer, m.how), Incarnation: m.inc})
		}
		ctx.Respond(requestsOf(refs))
	case *writerRequests:
		ctx.Respond(requestsOf(p.table.Addressed(m.peer, m.inc)))
	case *readdressed:
		if p.table.Readdress(m.request, m.writer, m.inc) && p.sessions.pids[m.request] != nil {
			// Proven exited before this request was addressed to it: the
			// proof applies to it too (no other will come).
			ctx.Send(p.sessions.pids[m.request], RxPeerGone{Writer: m.writer, Incarnation: m.inc,
				Err: fmt.Errorf("%w: writer incarnation %d has exited", ErrPeerGone, m.inc)})
		}
	case *workerDead:
		for _, pid := range p.sessions.pids {
			ctx.Send(pid, RxWorkerDead{Worker: m.worker})
		}
	}
}

// requestsOf counts the distinct requests of refs.
func requestsOf(refs []core.RxWriterRef) int {
	seen := make(map[string]bool, len(refs))
	for _, r := range refs {
		seen[r.Request] = true
	}
	return len(seen)
}

// finishQueued ends a request that has no session (yet): its handle gets
// the outcome at once, after the metrics (as a session's shell does); no
// RequestData left, so its blocks (if any) are released too.
func (p *rxParent) finishQueued(q *rxOpenReq, st RxState, err error) {
	q.leftQueue()
	p.env.meters.rxUnstarted(st, err, q.at, p.env.clock.Now())
	q.handle.finish(Outcome{Request: q.req.ID, Status: st.Status(), Err: err})
	q.handle.release()
	if q.req.Blocks != nil {
		p.env.pools.settleOver() // its lend is over (Pools.lend)
	}
}

// dropQueued ends a request taken out of the allocation queue (cancelled,
// timed out, or dropped by Close) and tells its writers, which may have
// Send under way for it: a Send there ends at once with ErrPeerCancelled,
// and a later Send is refused with it, instead of the prefill running to
// its deadline, as for a started request's Cancel. Nothing waits for an
// answer: no RequestData left, no write can come (a CancelAck is dropped
// as for any ended request).
func (p *rxParent) dropQueued(ctx actor.Context, q *rxOpenReq, st RxState, err error) {
	p.finishQueued(q, st, err)
	o := core.RxOpen{Request: q.req.ID, PromptLen: q.req.PromptLen, Context: q.req.Context, ContextParallel: q.req.ContextParallel}
	for _, peer := range p.table.Writers(o) {
		var to uint64
		if p.link != nil {
			if h, err := p.link.Hello(peer); err == nil {
				to = h.Incarnation
			}
		}
		f := &messages.Cancel{RequestID: q.req.ID, From: p.self, Reason: RxCancelled.String()}
		core.Stamp(f, p.env.incarnation, to)
		w := WorkerFor(q.req.ID, peer, len(p.env.workers))
		sendTo(ctx, p.env.frameWorker(w), &workerSend{SendFrame: SendFrame{Worker: w, To: peer, Frame: f}})
	}
}

// unstarted gives back the blocks of a request that failed before its
// session started (no RequestData left): kvxfer's own go back to the pool,
// the framework's are the framework's again once the handle says so.
func (p *rxParent) unstarted(q *rxOpenReq, blocks [][]kvcache.BlockID) {
	if q.req.Blocks == nil {
		_ = p.env.pools.Free(blocks)
	}
}

// checkOwned validates destination blocks the framework allocated: per
// layer group, exactly the needed count, each inside the pool, none twice.
func (p *rxParent) checkOwned(r RxRequest, counts []int) error {
	if len(r.Blocks) != len(counts) {
		return fmt.Errorf("%w: request %s: destination blocks for %d layer groups, the layout has %d",
			ErrBadRequest, r.ID, len(r.Blocks), len(counts))
	}
	for g, ids := range r.Blocks {
		if len(ids) != counts[g] {
			return fmt.Errorf("%w: request %s layer group %d: %d destination blocks, the request needs %d (prompt %d tokens, %d prefix-hit blocks)",
				ErrBadRequest, r.ID, g, len(ids), counts[g], r.PromptLen, hitOf(r, g))
		}
		seen := make(map[kvcache.BlockID]bool, len(ids))
		for _, id := range ids {
			if id < 0 || int(id) >= p.topo.Pools[g].Blocks {
				return fmt.Errorf("%w: request %s layer group %d: destination block %d outside the pool of %d blocks",
					ErrBadRequest, r.ID, g, id, p.topo.Pools[g].Blocks)
			}
			if seen[id] {
				return fmt.Errorf("%w: request %s layer group %d: destination block %d named twice", ErrBadRequest, r.ID, g, id)
			}
			seen[id] = true
		}
	}
	return nil
}

func hitOf(r RxRequest, g int) int {
	if g < len(r.PrefixHitBlocks) {
		return r.PrefixHitBlocks[g]
	}
	return 0
}

func (p *rxParent) route(ctx actor.Context, f messages.Frame) {
	// A frame takes its sender out of the down set (RxTable.Route): it is
	// heard again, and its suspected requests must hear it too, after the
	// frame. Left to Engine.PeerAlive or Close, they never would: both
	// tell only of a peer still in the down set.
	down := p.table.IsDown(f.Sender())
	switch v, w := p.table.Route(f); v {
	case core.RxRouteStale:
		p.env.stale()
	case core.RxRouteNotWriter:
		p.env.stats.FramesRejected.Add(1)
		p.env.meters.reject(rejectNotWriter)
		p.env.log.Warn().Str("request", f.Request()).Str("peer", f.Sender().String()).Msg("frame from a peer that is not a writer of the request")
	case core.RxRouteDeliver:
		ctx.Send(p.sessions.pids[f.Request()], RxFrame{Writer: w, Frame: f})
	}
	if down {
		p.tellHeard(ctx, f.Sender(), core.FromIncarnation(f))
	}
}

// needed computes the destination block counts per group for a request.
func (p *rxParent) needed(r RxRequest) ([]int, error) {
	if r.ID == "" || len(r.ID) > messages.MaxRequestIDLen {
		return nil, fmt.Errorf("%w: request id length %d", ErrBadRequest, len(r.ID))
	}
	if r.PromptLen < 1 {
		return nil, fmt.Errorf("%w: request %s prompt length %d", ErrBadRequest, r.ID, r.PromptLen)
	}
	l := p.topo.Layout
	if p.shape == nil {
		shape, err := l.Shape(p.topo.Parallel, p.topo.Rank)
		if err != nil {
			return nil, err
		}
		p.shape = &shape
	}
	shape := p.shape
	if len(r.PrefixHitBlocks) > len(l.Groups) {
		return nil, fmt.Errorf("%w: request %s: prefix hits for %d layer groups, the layout has %d",
			ErrBadRequest, r.ID, len(r.PrefixHitBlocks), len(l.Groups))
	}
	blocks := (r.PromptLen + l.TokensPerBlock - 1) / l.TokensPerBlock
	for g, hit := range r.PrefixHitBlocks {
		if hit < 0 || hit > blocks {
			return nil, fmt.Errorf("%w: request %s: prefix hit of layer group %d = %d blocks, want 0..%d (a prompt of %d tokens, %d per block)",
				ErrBadRequest, r.ID, g, hit, blocks, r.PromptLen, l.TokensPerBlock)
		}
	}
	counts := make([]int, len(l.Groups))
	for g, grp := range l.Groups {
		if len(shape.Layers[g]) == 0 {
			continue
		}
		first, end := kvcache.NeededRange(r.PromptLen, grp.Window, l.TokensPerBlock, hitOf(r, g))
		counts[g] = end - first
		if err := p.topo.Pools[g].CheckFits(counts[g]); err != nil {
			return nil, fmt.Errorf("request %s (%d tokens), layer group %d: %w", r.ID, r.PromptLen, g, err)
		}
	}
	return counts, nil
}

// noteQueue publishes the allocation queue's length for the pools' free
// hook (shellEnv.allocWaiting). It runs after every message (the queue's
// changes) and after a Push, before the allocation attempt that may leave
// the request queued: a free that misses the wake-up took the pools' lock
// before that attempt did, and the attempt sees its blocks.
func (p *rxParent) noteQueue() { p.env.allocWaiting.Store(int64(p.queue.Len())) }

// drainQueue starts queued requests, in order, while blocks are free (one
// that needs no block, every block a prefix hit, even behind a head that
// waits: core.AllocQueue.Drain); one that no free can make fit fails
// rather than block the queue.
func (p *rxParent) drainQueue(ctx actor.Context) {
	p.waitErr = nil
	p.queue.Drain(func(counts []int) ([][]kvcache.BlockID, error) {
		b, err := p.env.pools.Alloc(counts)
		if errors.Is(err, kvcache.ErrOutOfBlocks) {
			p.waitErr = err
		}
		return b, err
	},
		func(q *rxOpenReq, blocks [][]kvcache.BlockID) { p.start(ctx, q, blocks) },
		func(q *rxOpenReq, err error) {
			p.finishQueued(q, RxFailed, fmt.Errorf("request %s: %w", q.req.ID, err))
		})
}

// otherVersion fails q before it starts when err, the link's answer for
// its writer peer's Hello, says the writer speaks another protocol version
// (it wraps a messages.VersionError: a build that can read none of the
// request's frames, nor we its Result), naming both versions, instead of
// leaving it to its deadline or to the writer's silence (ErrPeerGone).
// Nothing has left, so nothing was written. It reports whether it did.
func (p *rxParent) otherVersion(q *rxOpenReq, blocks [][]kvcache.BlockID, peer messages.PeerID, err error) bool {
	var ve *messages.VersionError
	if !errors.As(err, &ve) {
		return false
	}
	p.unstarted(q, blocks)
	p.finishQueued(q, RxFailed, fmt.Errorf("%w: request %s: writer %s speaks control protocol version %d, this engine speaks %d: it cannot be asked",
		ErrMismatch, q.req.ID, peer, ve.Got, messages.Version))
	return true
}

// leftQueue stops q's queue deadline: it started, or it ended unstarted.
func (q *rxOpenReq) leftQueue() {
	if q.deadline != nil {
		q.deadline.Stop()
		q.deadline = nil
	}
}

// heardAtClose runs heard for every peer the table holds down, as the
// engine closes: a writer suspected only of missed heartbeats that the
// control plane hears again now (a partition healed, a stall over) may
// still answer the request's Cancel, and a closing engine waits for that
// answer, within Close's context, instead of leaving the blocks
// quarantined for the pool's lifetime. Its RxHeard goes before
// RxAbandon, in the same mailbox.
func (p *rxParent) heardAtClose(ctx actor.Context) {
	for _, peer := range p.table.DownPeers() {
		p.heard(ctx, peer)
	}
}

// heard takes peer, declared down, out of the down set when the control
// plane hears it again (its Hello is current), and tells the sessions it
// is a writer of (RxHeard, with the incarnation its Hello names): those
// that suspected it only of missed heartbeats send it their Cancel again
// at once and, closing, wait for its answer.
func (p *rxParent) heard(ctx actor.Context, peer messages.PeerID) {
	if p.link == nil {
		return
	}
	h, err := p.link.Hello(peer)
	if err != nil {
		return
	}
	p.table.Heard(peer)
	p.tellHeard(ctx, peer, h.Incarnation)
}

// tellHeard sends RxHeard, for incarnation inc of peer, to the sessions
// peer is a writer of: it has left the down set (heard, a request's start,
// a frame of it).
func (p *rxParent) tellHeard(ctx actor.Context, peer messages.PeerID, inc uint64) {
	for _, r := range p.table.WriterRefs(peer) {
		if pid := p.sessions.pids[r.Request]; pid != nil {
			ctx.Send(pid, RxHeard{Writer: r.Writer, Incarnation: inc})
		}
	}
}

func (p *rxParent) start(ctx actor.Context, q *rxOpenReq, blocks [][]kvcache.BlockID) {
	q.leftQueue()
	o := core.RxOpen{Request: q.req.ID, PromptLen: q.req.PromptLen, Context: q.req.Context, ContextParallel: q.req.ContextParallel,
		PrefixHitBlocks: q.req.PrefixHitBlocks, Deadline: q.req.Deadline}
	// A writer the control plane declared dead and does not hear again
	// fails the request before any RequestData leaves (RxTable.Start).
	// One it hears (its Hello is current) leaves the down set, and the
	// requests that suspected it hear it too (tellHeard).
	for _, peer := range p.table.DownWriters(o) {
		if p.link == nil {
			continue
		}
		h, err := p.link.Hello(peer)
		if err == nil {
			p.table.Heard(peer)
			p.tellHeard(ctx, peer, h.Incarnation)
		} else if p.otherVersion(q, blocks, peer, err) {
			return
		}
	}
	// Address the request to the writers' incarnations their latest
	// Hellos name (a writer may have restarted since the last request).
	for _, peer := range p.table.Writers(o) {
		if p.link == nil {
			break
		}
		h, err := p.link.Hello(peer)
		if err == nil {
			p.table.Learn(peer, h.Incarnation)
		} else if p.otherVersion(q, blocks, peer, err) {
			return
		}
	}
	// A writer whose incarnation is proven exited (Engine.WriterExited)
	// would never answer: fail the request before any RequestData leaves.
	if gone := p.table.ExitedWriters(o); len(gone) > 0 {
		p.unstarted(q, blocks)
		p.finishQueued(q, RxFailed, fmt.Errorf("%w: request %s: writer %s has exited (incarnation %d)",
			ErrPeerGone, q.req.ID, gone[0], p.table.Incarnation(gone[0])))
		return
	}
	// Runs of the pool's blocks revoked from an earlier writer: the
	// request's writers must write them where the view now shows. The
	// framework's blocks (ReceiveRequest.Blocks) are the pool's too, and
	// may have been revoked while kvxfer held them.
	remap, err := p.env.remapFor(blocks)
	if err != nil {
		p.unstarted(q, blocks)
		p.finishQueued(q, RxFailed, fmt.Errorf("request %s: %w", q.req.ID, err))
		return
	}
	epoch, writers, err := p.table.Start(o, blocks, p.env.clock.Now())
	if err != nil {
		p.unstarted(q, blocks)
		p.finishQueued(q, RxFailed, err)
		return
	}
	if len(remap) > 0 {
		// Only a writer that honours the remap may write moved blocks: an
		// older one would write into the revoked memory, and READY would
		// cover bytes it never wrote where the view shows them.
		for _, w := range writers {
			if p.link == nil {
				break
			}
			h, herr := p.link.Hello(w.Peer)
			if herr == nil && h.Has(messages.FeatureRemap) {
				continue
			}
			why := "does not say it honours remapped destination blocks (an older version): upgrade it, or turn revocation off on this rank (revoke_spare_bytes = -1)"
			if herr != nil {
				why = fmt.Sprintf("has not said Hello yet (%v), so it is not known to honour remapped destination blocks: retry once it has", herr)
			}
			p.table.Stopped(q.req.ID)
			p.unstarted(q, blocks)
			p.finishQueued(q, RxFailed, fmt.Errorf("%w: request %s: some of its destination blocks were revoked from a stale writer, and writer %s %s",
				ErrMismatch, q.req.ID, w.Peer, why))
			return
		}
	}
	for _, w := range writers {
		w.Request.Remap = remap
	}
	// CancelResend: a decided session asks writers that have not answered
	// again, so one lost Cancel or CancelAck cannot hold the blocks forever.
	c := newRxCell(p.env, NewRxSession(RxConfig{Request: q.req.ID, Epoch: epoch, Self: p.self,
		Deadline: q.req.Deadline, Writers: writers, Blocks: blocks, CancelResend: time.Second, CallerOwned: q.req.Blocks != nil,
		Incarnation: p.env.incarnation}), q.handle, p.env.meters.rxSession(q.at))
	p.sessions.pids[q.req.ID] = ctx.Spawn(p.env.sessionProps(c.produce))
	p.handles[q.req.ID] = q.handle
}

// listener validates every frame that arrives and routes it. It is not an
// actor: the control link's delivery goroutine runs its step (RouteFrame)
// and sends the frame straight to the parent, which saves a mailbox hop
// (a goroutine wake) per frame. The link delivers frames one at a time,
// in arrival order, so each parent still receives them in that order.
type listener struct {
	env  *shellEnv
	root *actor.RootContext
	tx   *actor.PID
	rx   *actor.PID
	tr   TableTracer // nil unless tracing tables
	// incs refuses frames of earlier incarnations (issue 17).
	incs *core.IncarnationTable
	// mu makes each route one step: a MemLink delivers from its senders'
	// goroutines, and the step's table tracer, incs and the order in which
	// frames reach the parents must agree (uncontended over zmq, whose
	// listener goroutine delivers alone).
	mu sync.Mutex
}

// admit refuses, counted, a frame addressed to an earlier incarnation of
// this rank or sent by an earlier incarnation of the peer: it is never
// acted on.
func (l *listener) admit(f messages.Frame) bool {
	err := l.incs.Admit(f)
	if err == nil {
		return true
	}
	l.env.stale()
	if ev := l.env.warn(f.Sender().String(), "stale incarnation"); ev != nil {
		ev.Err(err).Msg("control frame of an earlier incarnation dropped")
	}
	return false
}

// misaddressed sends the tx parent, which answers it (onMisaddressed),
// the fields that name f, a valid frame admit refused, when f is a
// RequestData addressed to an earlier incarnation of this rank
// (core.IncarnationTable.Misaddressed): its sender takes it as delivered
// and would never send it again. The copy takes an answer credit of its
// sender's (frameCredits), which the parent gives back; credited: the
// caller took it already (shed). It reports whether the copy went.
func (l *listener) misaddressed(f messages.Frame, credited bool) bool {
	rd, ok := l.incs.Misaddressed(f)
	if !ok || !credited && !l.env.credits.takeAnswer(rd.From) {
		return false
	}
	l.root.Send(l.tx, &misaddressedRequestData{rd: &messages.RequestData{RequestID: rd.RequestID, Epoch: rd.Epoch, From: rd.From,
		Incarnations: rd.Incarnations, Features: rd.Features}})
	return true
}

// shed takes a RequestData refused for its peer's spent credits through
// the same step and incarnation check as any frame and, passing them,
// sends the fields that name it to the tx parent, which decides what
// becomes of it (onUnread). It reports whether it went.
func (l *listener) shed(rd *messages.RequestData) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	dest, _ := routeFrame(l.tr, l.env.clock, rd)
	if dest != core.FrameToTx && dest != core.FrameInvalidToTx {
		return false
	}
	if !l.admit(rd) {
		return dest == core.FrameToTx && l.misaddressed(rd, true)
	}
	l.root.Send(l.tx, &shedRequestData{rd: &messages.RequestData{RequestID: rd.RequestID, Epoch: rd.Epoch, From: rd.From,
		Incarnations: rd.Incarnations}})
	return true
}

func (l *listener) route(f messages.Frame) {
	if hoptrace.On {
		hoptrace.Mark(fmt.Sprintf("listener.%T", f), f.Request())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	dest, err := routeFrame(l.tr, l.env.clock, f)
	if dest.Invalid() {
		l.env.stats.FramesRejected.Add(1)
		l.env.meters.reject(rejectInvalid)
		// Sampled per claimed sender, as every per-peer warning: the
		// frame failed validation, so what it names is clipped.
		from := messages.TruncateText(f.Sender().String(), 64)
		if ev := l.env.warn(from, "invalid frame"); ev != nil {
			ev.Err(err).Str("peer", from).Str("request", messages.TruncateText(f.Request(), messages.MaxRequestIDLen)).
				Msgf("control frame %T rejected", f)
		}
	}
	switch dest {
	case core.FrameToTx, core.FrameToRx, core.FrameInvalidToTx, core.FrameInvalidToRx:
		if !l.admit(f) {
			if dest == core.FrameToTx {
				l.misaddressed(f, false)
			}
			l.env.credits.give(f)
			return
		}
	default:
		l.env.credits.give(f)
		return
	}
	// Its parent gives the credit back.
	switch dest {
	case core.FrameToTx:
		l.root.Send(l.tx, f)
	case core.FrameToRx:
		l.root.Send(l.rx, f)
	case core.FrameInvalidToTx:
		// The tx parent tells its sender why at once (DESIGN.md §6), or
		// the request's session does (onUnread).
		l.root.Send(l.tx, &invalidRequestData{rd: f.(*messages.RequestData), err: err})
	case core.FrameInvalidToRx:
		// A writer's unreadable answer: the rx parent fails the session
		// it names (no proof).
		l.root.Send(l.rx, &invalidResult{res: f.(*messages.Result), err: err})
	}
}
