package core

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// TxTable is the tx parent's state and decisions, without I/O: which of the
// context side's requests have a live session, which one Engine.Send
// adopted, which generation instance each live request is bound to, and
// the tombstones of recently finished requests and of requests a
// generation instance cancelled before any session here had them. The
// parent's shell (actors) spawns and poisons sessions, asks the control
// plane for the sender's Hello and sends replies; the simulator (test/sim)
// drives the same table. A frame that a decision refuses touches no state.
type TxTable struct {
	live    map[string]bool
	adopted map[string]bool
	// bound fixes each live request's generation instance: named by Send,
	// or else the instance of the first RequestData that resolved.
	bound map[string]string
	tombs tombstones // finished requests
	// ctombs are the cancel tombstones, a ring of their own per cancelling
	// instance (corder: the instances, oldest first, at most
	// maxCancelInstances), so that neither finished requests nor another
	// instance's Cancels — a flood of them for made-up ids — push one out.
	ctombs   map[string]*tombstones
	corder   []string
	draining bool
	// orphans counts, per generation instance, the live sessions its
	// RequestData opened that no Send adopted yet; limit bounds it (0:
	// none), so that a peer cannot make this rank hold sessions for
	// requests it never sends.
	orphans map[string]int
	limit   int
	// orphanBlocks counts, per instance, the destination block ids its
	// orphans' RequestData name (what an orphan's memory grows with: up to
	// messages.MaxBlocks each); blocksOf keeps each orphan's count. The
	// limit on it is limit × OrphanBlocksEach.
	orphanBlocks map[string]int
	blocksOf     map[string]int
	// orphansLive counts the orphans of every instance; orphansEnded the
	// orphans whose session stopped with no Send ever adopting them;
	// orphanIDs names the first MaxOrphanIDs orphans not adopted (live
	// or ended), in the order their RequestData opened them, and
	// orphanIDsV counts its changes (the shell publishes it on one).
	orphansLive  int
	orphansEnded int64
	orphanIDs    []string
	orphanIDsV   uint64
	// silenced holds, per request, the generation ranks whose streams
	// ended without a terminal frame (TxSession.SilentPeers), with the
	// incarnation each stream wrote to: writes to it may still land, so
	// no frame of this rank may ever tell it otherwise. Never forgotten (a
	// forgotten entry would let a Cancel be acknowledged): one entry per
	// such request for the engine's life, a few bytes where the
	// alternative was its source blocks.
	silenced map[string][]SilentPeer
}

// OrphanBlocksEach is what the orphan limit allows each orphan on average,
// in destination block ids: an instance's orphans together may name at
// most MaxOrphans × OrphanBlocksEach ids (with the default 4096, 64M ids,
// about a quarter of a GiB of ids), so that a count of orphans cannot
// stand for gigabytes. A 128k-token prompt in blocks of 16 tokens is 8192
// ids a layer group.
const OrphanBlocksEach = 16384

// SetOrphanLimit bounds, per generation instance, the sessions its
// RequestData may open before Send adopts them (n ≤ 0: no bound). Past
// it RequestData for a new request is shed (RequestDataShed).
func (t *TxTable) SetOrphanLimit(n int) { t.limit = max(n, 0) }

// OrphanLimit is the bound SetOrphanLimit set (0: none).
func (t *TxTable) OrphanLimit() int { return t.limit }

// Orphans is how many live sessions instance's RequestData opened that no
// Send adopted yet.
func (t *TxTable) Orphans(instance string) int { return t.orphans[instance] }

// OrphanBlocks is how many destination block ids the RequestData of
// instance's orphans name.
func (t *TxTable) OrphanBlocks(instance string) int { return t.orphanBlocks[instance] }

// OrphansLive is how many live sessions the RequestData of any generation
// instance opened that no Send adopted yet.
func (t *TxTable) OrphansLive() int { return t.orphansLive }

// OrphansEnded is how many sessions a RequestData opened have stopped
// with no Send ever adopting them (a generation instance asked for a
// request this side never sent), since the table's birth.
func (t *TxTable) OrphansEnded() int64 { return t.orphansEnded }

// MaxOrphanIDs bounds OrphanIDs.
const MaxOrphanIDs = 4

// OrphanIDs names the first MaxOrphanIDs orphans that no Send adopted,
// live or ended, in the order their RequestData opened them (the table's
// own slice: do not modify it), and its version, which changes whenever
// the list does. An orphan that Send adopts leaves the list; one whose
// session stops unadopted stays: its request was asked for and never
// sent.
func (t *TxTable) OrphanIDs() ([]string, uint64) { return t.orphanIDs, t.orphanIDsV }

// DestBlocks is how many destination block ids rd names.
func DestBlocks(rd *messages.RequestData) int {
	n := 0
	for _, g := range rd.Groups {
		n += len(g.Blocks)
	}
	return n
}

// NewTxTable returns an empty table that remembers the last n finished
// requests, and the last n requests each generation instance cancelled
// before any session here had them.
func NewTxTable(n int) *TxTable {
	return &TxTable{live: map[string]bool{}, adopted: map[string]bool{}, bound: map[string]string{},
		tombs: newTombstones(n), ctombs: map[string]*tombstones{}, orphans: map[string]int{}, orphanBlocks: map[string]int{}, blocksOf: map[string]int{},
		silenced: map[string][]SilentPeer{}}
}

// Open is Engine.Send for request, naming its generation instance or not
// (""). It refuses a request Send already adopted, one finished recently,
// one another instance's RequestData opened when Send names another, and
// every request once the engine is closing. It refuses with
// ErrPeerCancelled a request without a session that a generation instance
// cancelled here — the one Send names, or any when Send names none: that
// instance was told nothing of ours writes for it and freed its blocks,
// so the serving process may stop its prefill at once. A request silenced
// towards a generation rank (Silence) is refused for the engine's life,
// with an error naming the rank and saying why (silencedErr), before any
// other reason. spawn says the session must be started (no RequestData
// opened it first).
func (t *TxTable) Open(request, generation string) (spawn bool, err error) {
	if t.draining {
		return false, ErrClosed
	}
	if t.adopted[request] {
		return false, fmt.Errorf("%w: request %s already sent", ErrBadRequest, request)
	}
	if peers := t.silenced[request]; peers != nil {
		// Before any other reason: this one lasts the engine's life.
		return false, silencedErr(request, peers)
	}
	if !t.live[request] {
		by := generation
		if by == "" {
			by = t.canceller(request)
		} else if !t.cancelled(request, by) {
			by = ""
		}
		if by != "" {
			// Refused for good: any instance's later RequestData is
			// answered FAILED at once (stale), not left to open a session
			// that no Send adopts (it would wait for its deadline) — also
			// when the Cancel came from another instance than the request's.
			t.tombs.add(tomb{request: request})
			if why := t.cancelReason(request, by); why != "" {
				return false, fmt.Errorf("%w: request %s was cancelled by generation instance %s before Send (its reason: %q)",
					ErrPeerCancelled, request, by, why)
			}
			return false, fmt.Errorf("%w: request %s was cancelled by generation instance %s before Send",
				ErrPeerCancelled, request, by)
		}
	}
	if t.tombs.has(request) {
		return false, fmt.Errorf("%w: request %s already sent", ErrBadRequest, request)
	}
	if b := t.bound[request]; t.live[request] && generation != "" && b != "" && b != generation {
		// A RequestData from another instance opened the session first:
		// Send's word decides; that session is that instance's mistake.
		return false, fmt.Errorf("%w: request %s: generation instance %s already asked for it, Send names %s",
			ErrBadRequest, request, b, generation)
	}
	spawn = !t.live[request]
	if !spawn {
		t.unorphan(request, true) // a RequestData opened it: Send adopts it now
	}
	t.live[request] = true
	if generation != "" {
		t.bound[request] = generation
	}
	t.adopted[request] = true
	return spawn, nil
}

// unorphan takes a live, unadopted request off its instance's count:
// adopted by Send, or ended (its session stopped) without.
func (t *TxTable) unorphan(request string, adopted bool) {
	if !t.live[request] || t.adopted[request] {
		return
	}
	t.orphansLive--
	if !adopted {
		t.orphansEnded++
	} else if i := slices.Index(t.orphanIDs, request); i >= 0 {
		t.orphanIDs = slices.Delete(t.orphanIDs, i, i+1)
		t.orphanIDsV++
	}
	inst := t.bound[request]
	if t.orphanBlocks[inst] -= t.blocksOf[request]; t.orphanBlocks[inst] <= 0 {
		delete(t.orphanBlocks, inst)
	}
	delete(t.blocksOf, request)
	if t.orphans[inst]--; t.orphans[inst] <= 0 {
		delete(t.orphans, inst)
	}
}

// Unread decides a RequestData that was not read: one that failed
// validation while naming its request and sender (messages.InvalidFrame),
// or one refused for its sender's spent frame credits. toSession: the
// request is live here and bound to the sender's instance (by Send's
// Generation or an earlier RequestData), so its session takes it as a
// RequestData that failed to resolve — it changes nothing if the session
// already has that epoch from that peer (a stream of it may be writing),
// else nothing of it writes for the peer and it fails, answering FAILED.
// Otherwise the parent answers the sender FAILED and remembers nothing:
// no session here has a stream of that sender (none at all; or the
// request's, unbound, has none of anyone's yet; or it is bound to another
// instance), so the answer is a proof, and the session, if any, is not
// touched — nothing unvalidated fails a request that is not its sender's.
// This is what Resolved does with a RequestData that fails to resolve.
// One from a peer the request is silenced for (Silenced) must not be
// answered at all: its caller checks that first.
func (t *TxTable) Unread(rd *messages.RequestData) (toSession bool) {
	return t.live[rd.RequestID] && t.bound[rd.RequestID] == rd.From.Instance
}

// RequestDataVerdict is what becomes of a RequestData before it may touch
// any state.
type RequestDataVerdict uint8

// RequestData verdicts.
const (
	// RequestDataResolve: resolve it against its sender's Hello, then call
	// Resolved.
	RequestDataResolve RequestDataVerdict = iota + 1
	// RequestDataStale: the request finished here, or its sender's
	// instance cancelled it before any session here had it (TxTable.Cancel):
	// answer FAILED, remember nothing.
	RequestDataStale
	// RequestDataNotBound: the request is bound to another generation
	// instance: refuse it (FAILED to its sender), remember nothing.
	RequestDataNotBound
	// RequestDataShed: a new request while its instance already has as
	// many sessions waiting for Send as the orphan limit allows, or their
	// RequestData would name more destination blocks than it allows
	// (limit × OrphanBlocksEach): refuse
	// it (FAILED to its sender), remember nothing.
	RequestDataShed
	// RequestDataClosing: a request no session here has while the engine
	// is closing (Drain): no Send will take it; answer FAILED saying so,
	// remember nothing.
	RequestDataClosing
	// RequestDataSilenced: the request's stream to the sender ended
	// without a terminal frame (Silence): writes to it may still land,
	// and any answer would be a proof. Drop it unanswered.
	RequestDataSilenced
)

// RequestData classifies rd; with RequestDataNotBound, bound is the
// instance the request is bound to.
func (t *TxTable) RequestData(rd *messages.RequestData) (v RequestDataVerdict, bound string) {
	if t.Silenced(rd.RequestID, rd.From, rd.FromIncarnation) {
		return RequestDataSilenced, ""
	}
	if t.cancelled(rd.RequestID, rd.From.Instance) || !t.live[rd.RequestID] && t.tombs.has(rd.RequestID) {
		return RequestDataStale, ""
	}
	if !t.live[rd.RequestID] && t.draining {
		return RequestDataClosing, ""
	}
	if b := t.bound[rd.RequestID]; b != "" && b != rd.From.Instance {
		return RequestDataNotBound, b
	}
	if inst := rd.From.Instance; !t.live[rd.RequestID] && t.limit > 0 &&
		(t.orphans[inst] >= t.limit || t.orphanBlocks[inst]+DestBlocks(rd) > t.limit*OrphanBlocksEach) {
		return RequestDataShed, ""
	}
	return RequestDataResolve, ""
}

// Resolved takes a RequestData that RequestData said to resolve, with the
// resolution's error. refuse: it could not be resolved and no instance has
// claimed the request, so it may not (FAILED to its sender, nothing
// remembered). Otherwise it goes to the request's session — spawned first
// when spawn — which fails the request if err is set: the request's own
// instance could not be served.
func (t *TxTable) Resolved(rd *messages.RequestData, err error) (refuse, spawn bool) {
	if err != nil && t.bound[rd.RequestID] == "" {
		return true, false
	}
	spawn = !t.live[rd.RequestID]
	t.live[rd.RequestID] = true
	t.bound[rd.RequestID] = rd.From.Instance
	if spawn {
		t.orphans[rd.From.Instance]++ // no Send adopted it yet
		n := DestBlocks(rd)
		t.blocksOf[rd.RequestID] = n
		t.orphanBlocks[rd.From.Instance] += n
		t.orphansLive++
		if len(t.orphanIDs) < MaxOrphanIDs {
			t.orphanIDs = append(t.orphanIDs, rd.RequestID)
			t.orphanIDsV++
		}
	}
	return false, spawn
}

// Cancel classifies a peer's Cancel: deliver it to the request's session,
// or answer CancelAck at once (nothing of ours writes for it); notBound
// says the sender is not the request's instance (counted as a rejection).
//
// The CancelAck is a proof: on it the sender frees the request's
// destination blocks. Its RequestData may still be on its way — Cancel
// and RequestData can leave on two connections (a sender worker that
// restarted or died between them), and frames keep their order only
// within one — so a Cancel for a request without a session leaves a
// tombstone of (request, sender's instance): that instance's RequestData
// for it is stale from then on (RequestData), and Open refuses the
// request (ErrPeerCancelled). Only the sender's instance is refused: a
// Cancel proves nothing about another instance's blocks, and must not
// make a request refuse the instance it belongs to. A live request not
// bound yet (Send named no instance, no RequestData came) trusts the first
// instance to speak of it, as it would a RequestData: the Cancel goes to
// its session, which fails, so that no stream of it ever writes, and
// acknowledges.
//
// hold: the Cancel can be given no tombstone now (every slot of its
// instance's ring, or of the table's instances, holds one younger than
// CancelTombMinAge), so it must not be acknowledged yet: the generation
// side re-sends it every second (for the first 2×CancelTombMinAge, then
// backing off: RxConfig.CancelResend), and one of them is answered once a
// slot has aged. Forgetting a young tombstone instead would let a RequestData
// still on its way open a session that writes into freed blocks.
//
// A Cancel from a generation rank whose stream of the request ended
// without a terminal frame (Silence) is held for good: writes to it may
// still land, and the CancelAck would be a proof.
func (t *TxTable) Cancel(m *messages.Cancel, now time.Time) (deliver, notBound, hold bool) {
	if t.Silenced(m.RequestID, m.From, m.FromIncarnation) {
		return false, false, true
	}
	if !t.live[m.RequestID] {
		if m.From.Instance != "" && !t.tombs.has(m.RequestID) && !t.addCancel(m.RequestID, m.From.Instance, m.Reason, now) {
			return false, false, true
		}
		return false, false, false
	}
	if b := t.bound[m.RequestID]; b != "" && b != m.From.Instance {
		return false, true, false
	}
	if !t.adopted[m.RequestID] && m.From.Instance != "" {
		// A session that a RequestData opened and no Send adopted yet,
		// cancelled by its instance: a Send after it stopped is refused
		// with ErrPeerCancelled, as when the Cancel comes first (without
		// the tombstone it would say "already sent"). No slot free: it
		// says that.
		t.addCancel(m.RequestID, m.From.Instance, m.Reason, now)
	}
	return true, false, false
}

// CancelTombMinAge is how long a cancel tombstone is kept at least
// (TxTable.Cancel): far longer than a RequestData overtaken by its Cancel
// can take to arrive on the other connection (milliseconds), so that a
// burst of Cancels only delays acknowledgements instead of forgetting a
// tombstone such a RequestData still needs.
const CancelTombMinAge = 30 * time.Second

// SilentPeer is a generation rank a stream ended silent towards
// (TxSession.SilentPeers), with the incarnation of it the stream wrote
// to: its RequestData's (0: not known, a peer without incarnations).
type SilentPeer struct {
	messages.PeerID
	Incarnation uint64 `json:",omitempty"`
}

func (p SilentPeer) String() string {
	if p.Incarnation == 0 {
		return p.PeerID.String()
	}
	return fmt.Sprintf("%s (incarnation %d)", p.PeerID, p.Incarnation)
}

// covers reports whether a frame of peer's incarnation inc must go
// unanswered: it is p's rank, and that incarnation or an earlier one, or
// either is not known. A later incarnation never got a write of the
// stream: nothing of this request may still land in what it owns.
func (p SilentPeer) covers(peer messages.PeerID, inc uint64) bool {
	return p.PeerID == peer && (p.Incarnation == 0 || inc == 0 || inc <= p.Incarnation)
}

// Silence records, for good, that the request's streams to peers ended
// without a terminal frame (TxSession.SilentPeers, before Stopped): the
// Cancels of those incarnations (or earlier ones) of those ranks are never
// acknowledged (Cancel holds them), their RequestData never answered
// (RequestDataSilenced, Silenced), and the request is never opened again
// (Open).
func (t *TxTable) Silence(request string, peers []SilentPeer) {
	for _, p := range peers {
		if !slices.Contains(t.silenced[request], p) {
			t.silenced[request] = append(t.silenced[request], p)
		}
	}
}

// silencedErr is Open's refusal of a request silenced towards peers: the
// caller learns that the id is refused for good, and why, instead of a
// bare "already sent" (a framework retrying under the same id).
func silencedErr(request string, peers []SilentPeer) error {
	names := make([]string, len(peers))
	for i, p := range peers {
		names[i] = p.String()
	}
	return fmt.Errorf("%w: request %s already sent, and silenced towards %s: its writes there were cut by a close that proved nothing about them, so they may still land, and no frame of this engine may tell that rank otherwise; the id cannot be sent again on this engine (send it under another id)",
		ErrBadRequest, request, strings.Join(names, ", "))
}

// Silenced reports whether the request's stream to peer ended without a
// terminal frame (Silence), for a frame of incarnation inc of it (its
// FromIncarnation; 0: not known): no frame may answer it about the
// request. A later incarnation than the stream wrote to is answered as
// for any finished request. A RequestData that was not read (Unread) from
// a silenced peer is dropped unanswered too.
func (t *TxTable) Silenced(request string, peer messages.PeerID, inc uint64) bool {
	for _, p := range t.silenced[request] {
		if p.covers(peer, inc) {
			return true
		}
	}
	return false
}

// Stopped takes a session that released everything off the table and
// leaves its tombstone.
func (t *TxTable) Stopped(request string) {
	t.unorphan(request, false)
	delete(t.live, request)
	delete(t.adopted, request)
	delete(t.bound, request)
	t.tombs.add(tomb{request: request})
}

// Close starts the engine's close: every later Open and every RequestData
// for a request without a session is refused. It returns the live
// requests, sorted, for their sessions to be cancelled.
func (t *TxTable) Close() []string {
	t.draining = true
	return t.Live()
}

// Live returns the requests with a live session, sorted.
func (t *TxTable) Live() []string {
	out := make([]string, 0, len(t.live))
	for id := range t.live {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Draining reports whether Close was called.
func (t *TxTable) Draining() bool { return t.draining }

// tomb is one tombstone: a request that finished here (canceller ""), or
// one that generation instance canceller cancelled before any session
// here had it.
type tomb struct {
	request, canceller string
}

// tombstones remembers the last n tombstones so that a late frame for a
// request gets a definite answer instead of reopening it. Its ring grows
// as tombstones are added, up to n, then wraps; a tombstone already held
// is not added again (a Cancel re-sent until acknowledged takes one slot).
type tombstones struct {
	n    int
	ring []tomb
	at   int // next slot to overwrite once the ring is full
	set  map[tomb]bool
	// when is each slot's time (addAged only), last the newest.
	when []time.Time
	last time.Time
	// why is the reason a tombstone was given with (addAged: a Cancel's
	// Reason), where it was given one.
	why map[tomb]string
}

func newTombstones(n int) tombstones {
	return tombstones{n: max(n, 1), set: map[tomb]bool{}}
}

func (t *tombstones) add(tb tomb) {
	if t.set[tb] {
		return
	}
	if len(t.ring) < t.n {
		t.ring = append(t.ring, tb)
	} else {
		delete(t.set, t.ring[t.at])
		t.ring[t.at] = tb
		t.at = (t.at + 1) % t.n
	}
	t.set[tb] = true
}

// addAged adds tb at now, with the reason why (kept while tb is, the
// first one given), unless the ring is full and its oldest tombstone is
// younger than minAge; it reports whether tb is held.
func (t *tombstones) addAged(tb tomb, why string, now time.Time, minAge time.Duration) bool {
	if t.set[tb] {
		if why != "" && t.why[tb] == "" {
			t.setWhy(tb, why)
		}
		return true
	}
	if len(t.ring) < t.n {
		t.ring = append(t.ring, tb)
		t.when = append(t.when, now)
	} else {
		if now.Sub(t.when[t.at]) < minAge {
			return false
		}
		delete(t.set, t.ring[t.at])
		delete(t.why, t.ring[t.at])
		t.ring[t.at], t.when[t.at] = tb, now
		t.at = (t.at + 1) % t.n
	}
	t.set[tb] = true
	t.last = now
	if why != "" {
		t.setWhy(tb, why)
	}
	return true
}

func (t *tombstones) setWhy(tb tomb, why string) {
	if t.why == nil {
		t.why = map[tomb]string{}
	}
	t.why[tb] = why
}

// has reports whether request finished here recently.
func (t *tombstones) has(request string) bool { return t.set[tomb{request: request}] }

// maxCancelInstances bounds the instances whose cancel tombstones the
// table keeps: past it the instance that cancelled least recently is
// forgotten, once its newest is CancelTombMinAge old. Under CURVE an
// instance is a key's; only an insecure link lets a peer name many.
const maxCancelInstances = 64

// addCancel remembers that instance cancelled request before any session
// here had it, and the Cancel's reason (why: peer text, validated), in
// instance's own ring (as many slots as the finished ring), and reports
// whether it could: it forgets no tombstone younger than CancelTombMinAge
// to make room (nor an instance's ring whose newest is).
func (t *TxTable) addCancel(request, instance, why string, now time.Time) bool {
	r := t.ctombs[instance]
	if r == nil {
		if len(t.corder) >= maxCancelInstances {
			// The instance that cancelled least recently goes, not the
			// first known: that one may cancel every few seconds.
			stale := 0
			for i, inst := range t.corder {
				if t.ctombs[inst].last.Before(t.ctombs[t.corder[stale]].last) {
					stale = i
				}
			}
			if now.Sub(t.ctombs[t.corder[stale]].last) < CancelTombMinAge {
				return false
			}
			delete(t.ctombs, t.corder[stale])
			t.corder = slices.Delete(t.corder, stale, stale+1)
		}
		tr := newTombstones(t.tombs.n)
		r = &tr
		t.ctombs[instance] = r
		t.corder = append(t.corder, instance)
	}
	return r.addAged(tomb{request: request, canceller: instance}, why, now, CancelTombMinAge)
}

// cancelReason is the reason instance's Cancel of request gave, if it
// cancelled it before any session here had it ("": none given).
func (t *TxTable) cancelReason(request, instance string) string {
	if r := t.ctombs[instance]; r != nil {
		return r.why[tomb{request: request, canceller: instance}]
	}
	return ""
}

// cancelled reports whether instance cancelled request before any session
// here had it.
func (t *TxTable) cancelled(request, instance string) bool {
	r := t.ctombs[instance]
	return instance != "" && r != nil && r.set[tomb{request: request, canceller: instance}]
}

// canceller returns an instance that cancelled request before any session
// here had it (the longest known first), or "".
func (t *TxTable) canceller(request string) string {
	for _, inst := range t.corder {
		if t.cancelled(request, inst) {
			return inst
		}
	}
	return ""
}
