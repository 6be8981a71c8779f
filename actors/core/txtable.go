package core

import (
	"fmt"
	"slices"

	"github.com/kvxfer/kvxfer/messages"
)

// TxTable is the tx parent's state and decisions, without I/O: which of the
// context side's requests have a live session, which one Engine.Send
// adopted, which generation instance each live request is bound to, and
// the tombstones of recently finished requests. The parent's shell
// (actors) spawns and poisons sessions, asks the control plane for the
// sender's Hello and sends replies; the simulator (test/sim) drives the
// same table. A frame that a decision refuses touches no state.
type TxTable struct {
	live    map[string]bool
	adopted map[string]bool
	// bound fixes each live request's generation instance: named by Send,
	// or else the instance of the first RequestData that resolved.
	bound    map[string]string
	tombs    tombstones
	draining bool
	// orphans counts, per generation instance, the live sessions its
	// RequestData opened that no Send adopted yet; limit bounds it (0:
	// none), so that a peer cannot make this rank hold sessions for
	// requests it never sends.
	orphans map[string]int
	limit   int
}

// SetOrphanLimit bounds, per generation instance, the sessions its
// RequestData may open before Send adopts them (n ≤ 0: no bound). Past
// it RequestData for a new request is shed (RequestDataShed).
func (t *TxTable) SetOrphanLimit(n int) { t.limit = max(n, 0) }

// OrphanLimit is the bound SetOrphanLimit set (0: none).
func (t *TxTable) OrphanLimit() int { return t.limit }

// Orphans is how many live sessions instance's RequestData opened that no
// Send adopted yet.
func (t *TxTable) Orphans(instance string) int { return t.orphans[instance] }

// NewTxTable returns an empty table that remembers the last tombstones
// finished requests.
func NewTxTable(tombstones int) *TxTable {
	return &TxTable{live: map[string]bool{}, adopted: map[string]bool{}, bound: map[string]string{},
		tombs: newTombstones(tombstones), orphans: map[string]int{}}
}

// Open is Engine.Send for request, naming its generation instance or not
// (""). It refuses a request Send already adopted, one finished recently,
// one another instance's RequestData opened when Send names another, and
// every request once the engine is closing. spawn says the session must be
// started (no RequestData opened it first).
func (t *TxTable) Open(request, generation string) (spawn bool, err error) {
	if t.draining {
		return false, ErrClosed
	}
	if t.adopted[request] || t.tombs.has(request) {
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
		t.unorphan(request) // a RequestData opened it: Send adopts it now
	}
	t.live[request] = true
	if generation != "" {
		t.bound[request] = generation
	}
	t.adopted[request] = true
	return spawn, nil
}

// unorphan takes a live, unadopted request off its instance's count.
func (t *TxTable) unorphan(request string) {
	if !t.live[request] || t.adopted[request] {
		return
	}
	inst := t.bound[request]
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
	// RequestDataStale: the request finished here (or the engine is
	// closing): answer FAILED, remember nothing.
	RequestDataStale
	// RequestDataNotBound: the request is bound to another generation
	// instance: refuse it (FAILED to its sender), remember nothing.
	RequestDataNotBound
	// RequestDataShed: a new request while its instance already has as
	// many sessions waiting for Send as the orphan limit allows: refuse
	// it (FAILED to its sender), remember nothing.
	RequestDataShed
)

// RequestData classifies rd; with RequestDataNotBound, bound is the
// instance the request is bound to.
func (t *TxTable) RequestData(rd *messages.RequestData) (v RequestDataVerdict, bound string) {
	if !t.live[rd.RequestID] && (t.tombs.has(rd.RequestID) || t.draining) {
		return RequestDataStale, ""
	}
	if b := t.bound[rd.RequestID]; b != "" && b != rd.From.Instance {
		return RequestDataNotBound, b
	}
	if !t.live[rd.RequestID] && t.limit > 0 && t.orphans[rd.From.Instance] >= t.limit {
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
	}
	return false, spawn
}

// Cancel classifies a peer's Cancel: deliver it to the request's session,
// or answer CancelAck at once (nothing of ours writes for it); notBound
// says the sender is not the request's instance (counted as a rejection).
func (t *TxTable) Cancel(m *messages.Cancel) (deliver, notBound bool) {
	if !t.live[m.RequestID] {
		return false, false
	}
	if t.bound[m.RequestID] != m.From.Instance {
		return false, true
	}
	return true, false
}

// Stopped takes a session that released everything off the table and
// leaves its tombstone.
func (t *TxTable) Stopped(request string) {
	t.unorphan(request)
	delete(t.live, request)
	delete(t.adopted, request)
	delete(t.bound, request)
	t.tombs.add(request)
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

// tombstones remembers the last n finished requests so that a late frame
// for one gets a definite answer instead of reopening it. Its ring grows
// as requests finish, up to n, then wraps.
type tombstones struct {
	n    int
	ring []string
	at   int // next slot to overwrite once the ring is full
	set  map[string]bool
}

func newTombstones(n int) tombstones {
	return tombstones{n: max(n, 1), set: map[string]bool{}}
}

func (t *tombstones) add(id string) {
	if len(t.ring) < t.n {
		t.ring = append(t.ring, id)
		t.set[id] = true
		return
	}
	delete(t.set, t.ring[t.at])
	t.ring[t.at] = id
	t.set[id] = true
	t.at = (t.at + 1) % t.n
}

func (t *tombstones) has(id string) bool { return t.set[id] }
