package actors

import (
	"errors"
	"fmt"
	"github.com/kvxfer/kvxfer/actors/core"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/metrics"
)

// This file is the shells' side of package metrics: an engine's metric
// children, resolved once when the engine starts (every label value but a
// heartbeat's peer is known then), and per-session meters that watch a
// session from its shell after each step. Steps know nothing of metrics.
// With EngineConfig.Metrics nil every meter is nil and the shells skip
// them with one nil check per message.

// failReason is a failure's label: the short name of the first sentinel
// error the outcome wraps, in this order.
type failReason uint8

const (
	reasonClosed failReason = iota
	reasonCancelled
	reasonPeerCancelled
	reasonTimeout
	reasonUnsent
	reasonPeerGone
	reasonWorkerCrashed
	reasonSessionCrashed
	reasonFence
	reasonPeerFailed
	reasonBadChunk
	reasonBadRequest
	reasonMismatch
	reasonOther
	numReasons
)

var failReasons = [numReasons]struct {
	name string
	err  error
}{
	{"closed", ErrClosed},
	{"cancelled", ErrCancelled},
	{"peer_cancelled", ErrPeerCancelled},
	{"timeout", ErrTimeout},
	{"unsent", ErrFrameUnsent},
	{"peer_gone", ErrPeerGone},
	{"worker_crashed", ErrWorkerCrashed},
	{"session_crashed", ErrSessionCrashed},
	{"fence", ErrFence},
	{"peer_failed", ErrPeerFailed},
	{"bad_chunk", ErrBadChunk},
	{"bad_request", ErrBadRequest},
	{"mismatch", ErrMismatch},
	{"other", nil},
}

func reasonOf(err error) failReason {
	for r := range reasonOther {
		if errors.Is(err, failReasons[r].err) {
			return r
		}
	}
	return reasonOther
}

// rejectReason is a rejected frame's label.
type rejectReason uint8

const (
	rejectInvalid    rejectReason = iota // failed validation at the listener
	rejectNotWriter                      // from a peer that is not a writer of the request
	rejectStale                          // too late to act on: Counters.FramesStale's frames (shellEnv.stale)
	rejectUnresolved                     // a RequestData that could not be resolved into a route
	rejectNotBound                       // from another generation instance than the request's
	rejectOrphans                        // a new request past its instance's orphan limit
	rejectShed                           // a RequestData or Cancel dropped: its peer's frame credits were spent
	rejectTombsFull                      // a Cancel left unanswered until a cancel tombstone ages (TxTable.Cancel)
	rejectSilenced                       // a Cancel or RequestData left unanswered for good (TxTable.Silence)
	numRejects
)

var rejectNames = [numRejects]string{"invalid", "not_writer", "stale", "unresolved", "not_bound", "orphan_limit", "shed",
	"tombstones_full", "silenced"}

// meters are an engine's resolved metric children. Every method is safe
// on a nil *meters (metrics off) and on any goroutine.
type meters struct {
	set              *metrics.Set
	bytesTx, bytesRx prometheus.Counter
	txDur            [core.NumTxStates]prometheus.Observer
	rxDur            [core.NumRxStates]prometheus.Observer
	chunkWrite       prometheus.Observer
	ops              [core.NumOpStates]prometheus.Gauge
	inDoubt          prometheus.Gauge
	txSessions       [core.NumTxStates]prometheus.Gauge
	rxSessions       [core.NumRxStates]prometheus.Gauge
	txFail, rxFail   [numReasons]prometheus.Counter
	rejected         [numRejects]prometheus.Counter
}

// newMeters resolves set's children and registers the engine's counters
// and its pools, both read at scrape time. groups names the pools' layer
// groups.
func newMeters(set *metrics.Set, stats *Counters, pools *Pools, groups []string, waiting *atomic.Int64, orphans *orphanStats) (*meters, error) {
	m := &meters{set: set,
		bytesTx:    set.BytesTransferred.WithLabelValues(metrics.SideTx),
		bytesRx:    set.BytesTransferred.WithLabelValues(metrics.SideRx),
		chunkWrite: set.ChunkWriteLatency,
		inDoubt:    set.OpsInDoubt,
	}
	for i := range core.NumTxStates {
		n := TxState(i).String()
		m.txDur[i] = set.TransferDuration.WithLabelValues(metrics.SideTx, n)
		m.txSessions[i] = set.Sessions.WithLabelValues(metrics.SideTx, n)
	}
	for i := range core.NumRxStates {
		n := RxState(i).String()
		m.rxDur[i] = set.TransferDuration.WithLabelValues(metrics.SideRx, n)
		m.rxSessions[i] = set.Sessions.WithLabelValues(metrics.SideRx, n)
	}
	for i := range core.NumOpStates {
		m.ops[i] = set.Ops.WithLabelValues(OpState(i).String())
	}
	for r, fr := range failReasons {
		m.txFail[r] = set.Failures.WithLabelValues(metrics.SideTx, fr.name)
		m.rxFail[r] = set.Failures.WithLabelValues(metrics.SideRx, fr.name)
	}
	for r, n := range rejectNames {
		m.rejected[r] = set.FramesRejected.WithLabelValues(n)
	}
	for _, c := range []struct {
		name, help string
		v          interface{ Load() int64 }
	}{
		{"worker_restarts_total", "Sender workers restarted after a panic.", &stats.WorkerRestarts},
		{"ops_posted_total", "Ops posted to the data-plane backend.", &stats.OpsPosted},
		{"frames_unsent_total", "Control frames not sent: a worker's dial or send failed, a connection closed with terminal frames it had accepted still unsent, or a RequestData waited for its writer's Hello.", &stats.FramesUnsent},
		{"session_panics_total", "Sessions restarted after a panic.", &stats.SessionPanics},
		{"pin_errors_total", "Pin or unpin calls the pools refused.", &stats.PinErrors},
		{"writer_leases_lapsed_total", "Writer leases that lapsed: the writer stopped posting to that peer and failed its requests with it.", &stats.LeasesLapsed},
		{"revoked_blocks_total", "Destination blocks revoked (reused at once, their old memory held until proof) instead of quarantined.", &stats.BlocksRevoked},
		{"dest_block_errors_total", "Quarantines, releases and frees of a finished request's destination blocks that the pools refused, and releases of revoked memory that failed: the blocks stay held as they were (quarantined or in use), never freed.", &stats.DestBlockErrors},
		{"session_panics_past_budget_total", "Session panics after the session's restart budget was spent: each resumed its session to drain, with the message it panicked on dropped (its request had failed already). A bug: report it with the engine's error log.", &stats.SessionPanicsPastBudget},
		{"parent_panics_total", "Panics of the engine's top-level actors (tx and rx parents, senders) or of its listener routing a control frame: each failed the engine, which refuses new requests while live ones drain. A bug: report it with the engine's error log, then restart the engine.", &stats.ParentPanics},
		{"stream_violations_total", "Peer-stream actors that disagreed with their session's step (a terminal frame while ops were unsettled, an effect after the terminal frame); the stream held its terminal frame. A bug: report it with the engine's error log.", &stats.StreamViolations},
		{"closes_unproven_total", "Data-plane endpoint closes that could not prove the writes on them over (a peer alive but not progressing, or lost with writes on the wire): their ops stay in doubt and their requests send no terminal frame; they keep their source pages unless the backend proved it reads none of them. Rising: check the data-plane links and peers the engine logs.", &stats.ClosesUnproven},
	} {
		v := c.v
		if err := set.CounterFunc(c.name, c.help, func() float64 { return float64(v.Load()) }); err != nil {
			return nil, fmt.Errorf("metrics: %s: %w", c.name, err)
		}
	}
	err := set.Pools(func() []metrics.PoolBlocks {
		st := pools.Stats()
		out := make([]metrics.PoolBlocks, len(st))
		for g, s := range st {
			name := strconv.Itoa(g)
			if g < len(groups) && groups[g] != "" {
				name = groups[g]
			}
			out[g] = metrics.PoolBlocks{Group: name, Free: s.Free, Allocated: s.Used - s.Pinned, Pinned: s.Pinned, Quarantined: s.Quarantined}
		}
		return out
	})
	if err != nil {
		return nil, fmt.Errorf("metrics: pools: %w", err)
	}
	if err := set.Quarantine(func() float64 { return float64(pools.QuarantinedBytes()) },
		func() float64 { return float64(pools.QuarantineLimit()) }); err != nil {
		return nil, fmt.Errorf("metrics: quarantine: %w", err)
	}
	if err := set.GaugeFunc("requests_waiting_for_blocks", "Receive requests waiting for destination blocks (the pools had too few free when they came); sampled at scrape.",
		func() float64 { return float64(waiting.Load()) }); err != nil {
		return nil, fmt.Errorf("metrics: requests_waiting_for_blocks: %w", err)
	}
	if err := set.GaugeFunc("revoked_held_blocks", "Revoked destination blocks whose old memory, the only memory a stale writer can reach, waits for its proof or stays with a Revoker that failed to release it; sampled at scrape.",
		func() float64 { return float64(stats.RevokedHeld.Load()) }); err != nil {
		return nil, fmt.Errorf("metrics: revoked_held_blocks: %w", err)
	}
	if err := set.GaugeFunc("caller_blocks_awaiting_proof", "The framework's own destination blocks (ReceiveRequest.Blocks) whose request failed while a writer gave no proof that its writes are over: not Released yet; sampled at scrape.",
		func() float64 { return float64(stats.CallerAwaitingProof.Load()) }); err != nil {
		return nil, fmt.Errorf("metrics: caller_blocks_awaiting_proof: %w", err)
	}
	if err := set.GaugeFunc("orphan_requests", "Requests a generation instance's RequestData asked this context engine for that no Send adopted yet; sampled at scrape.",
		func() float64 { return float64(orphans.live.Load()) }); err != nil {
		return nil, fmt.Errorf("metrics: orphan_requests: %w", err)
	}
	if err := set.CounterFunc("orphan_requests_ended_total", "Requests a generation instance asked this context engine for that ended with no Send ever adopting them.",
		func() float64 { return float64(orphans.ended.Load()) }); err != nil {
		return nil, fmt.Errorf("metrics: orphan_requests_ended_total: %w", err)
	}
	return m, nil
}

func (m *meters) reject(r rejectReason) {
	if m != nil {
		m.rejected[r].Inc()
	}
}

// peerDown counts a peer the control plane declared down.
func (m *meters) peerDown(peer messages.PeerID) {
	if m != nil {
		m.set.PeerDown(peer.String())
	}
}

// rxUnstarted records a request that ended before its session started
// (queued for blocks, cancelled, closed, or refused).
func (m *meters) rxUnstarted(st RxState, err error, since, now time.Time) {
	if m == nil || int(st) >= len(m.rxDur) {
		return
	}
	m.rxDur[st].Observe(now.Sub(since).Seconds())
	if st != RxReady {
		m.rxFail[reasonOf(err)].Inc()
	}
}

// txSession returns a meter for a new tx session (nil when metrics are
// off).
func (m *meters) txSession() *txMeter {
	if m == nil {
		return nil
	}
	return &txMeter{m: m}
}

// rxSession returns a meter for a new rx session whose Receive arrived at
// since (nil when metrics are off).
func (m *meters) rxSession(since time.Time) *rxMeter {
	if m == nil {
		return nil
	}
	return &rxMeter{m: m, since: since}
}

// txMeter watches one TxSession from its shell. It mirrors the state of
// every op that may still change and, after each step, compares only
// those: ops before a stream's first non-quiescent one are final, and
// while the session is undecided ops the stream has not submitted yet are
// ADMITTED. A step therefore costs O(streams + ops in flight), and nothing
// allocates but the amortised growth of the per-chunk and per-op slices.
type txMeter struct {
	m       *meters
	open    bool // counted in the gauges
	state   TxState
	since   time.Time   // Send (TxStart), else the session's birth
	chunkAt []time.Time // when each chunk was handed over
	streams []streamMeter
	counts  [core.NumOpStates]float64 // this session's share of the ops gauges
}

type streamMeter struct {
	st     core.StreamView // a session never replaces a stream
	lo     int             // ops [0, lo) are source-quiescent: final
	states []OpState       // the op states last seen
	bytes  uint64
}

// born counts a new session; it runs once, when the actor starts.
func (t *txMeter) born(s *TxSession, now time.Time) {
	t.open, t.state, t.since = true, s.State(), now
	t.m.txSessions[t.state].Inc()
}

// stepped updates the metrics after s stepped on msg at now.
func (t *txMeter) stepped(s *TxSession, msg any, now time.Time) {
	if !t.open {
		return
	}
	switch m := msg.(type) {
	case TxStart:
		t.since = now
	case TxCompleted:
		if m.Err == nil && !m.Refused {
			t.landed(s, m.Op, now)
		}
	}
	for len(t.chunkAt) < s.Chunks() {
		t.chunkAt = append(t.chunkAt, now)
	}
	t.sync(s)
	if st := s.State(); st != t.state {
		t.m.txSessions[t.state].Dec()
		t.m.txSessions[st].Inc()
		t.state = st
		if st == TxFailed || st == TxCancelled {
			t.m.txFail[reasonOf(s.Err())].Inc()
		}
	}
	if s.Stopped() {
		// Finish went out with Stop: the handle's Done fires now.
		t.m.txDur[t.state].Observe(now.Sub(t.since).Seconds())
		t.close()
	}
}

// landed observes the chunk-to-write latency of op r, which the step just
// took from SUBMITTING to BACKEND_DONE (the mirror is not yet synced).
func (t *txMeter) landed(s *TxSession, r OpRef, now time.Time) {
	if r.Request != s.Config().Request || r.Seq < 0 {
		return
	}
	for i := range t.streams {
		sm := &t.streams[i]
		if sm.st.Peer() != r.Peer {
			continue
		}
		if r.Seq >= sm.st.Ops() {
			return
		}
		if st, _ := sm.st.Op(r.Seq); st != OpBackendDone {
			return
		}
		if r.Seq >= len(sm.states) || (sm.states[r.Seq] != OpSubmitting && sm.states[r.Seq] != OpSubmitted) {
			return // already done before this step: a duplicate
		}
		if _, c := sm.st.Op(r.Seq); c < len(t.chunkAt) {
			t.m.chunkWrite.Observe(now.Sub(t.chunkAt[c]).Seconds())
		}
		return
	}
}

// sync brings the ops gauges and the bytes counter up to s.
func (t *txMeter) sync(s *TxSession) {
	undecided := !s.State().Terminal()
	var d [core.NumOpStates]int32 // this step's moves, applied once per state
	for len(t.streams) < s.Streams() {
		t.streams = append(t.streams, streamMeter{st: s.Stream(len(t.streams))})
	}
	for i := range t.streams {
		sm := &t.streams[i]
		st := sm.st
		if b := st.Bytes(); b != sm.bytes {
			t.m.bytesTx.Add(float64(b - sm.bytes))
			sm.bytes = b
		}
		ops := st.Ops()
		for len(sm.states) < ops {
			sm.states = append(sm.states, OpAdmitted)
			d[OpAdmitted]++
		}
		hi := ops
		if next := st.Next(); undecided && next < hi {
			hi = next // the rest are ADMITTED, waiting for their turn
		}
		for j := sm.lo; j < hi; j++ {
			if now, _ := st.Op(j); now != sm.states[j] {
				d[sm.states[j]]--
				d[now]++
				sm.states[j] = now
			}
		}
		for sm.lo < len(sm.states) && sm.states[sm.lo].SourceQuiescent() { // final states
			sm.lo++
		}
	}
	for st, n := range d {
		if n != 0 {
			t.add(OpState(st), float64(n))
		}
	}
}

func (t *txMeter) add(st OpState, d float64) {
	t.counts[st] += d
	t.m.ops[st].Add(d)
}

// inDoubtShare is one tx session's share of the engine's ops in doubt, as
// last published: the session's shell publishes TxSession.InDoubt after
// each step (0 once the session stopped), to Counters.OpsInDoubt, which
// Stats reads whether metrics are on or not, and to the
// kvxfer_ops_in_doubt gauge, by the same amounts: both are one count.
type inDoubtShare int64

// publish makes n the session's share, on the counter and (m not nil) the
// gauge.
func (p *inDoubtShare) publish(n int, stats *Counters, m *meters) {
	d := int64(n) - int64(*p)
	if d == 0 {
		return
	}
	*p = inDoubtShare(n)
	stats.OpsInDoubt.Add(d)
	if m != nil {
		m.inDoubt.Add(float64(d))
	}
}

// close takes the session out of the gauges; it runs when the session
// released everything, or when its actor stops without having done so.
func (t *txMeter) close() {
	if !t.open {
		return
	}
	t.open = false
	t.m.txSessions[t.state].Dec()
	for st, n := range t.counts {
		if n != 0 {
			t.add(OpState(st), -n)
		}
	}
}

// rxMeter watches one RxSession from its shell.
type rxMeter struct {
	m       *meters
	open    bool
	decided bool
	state   RxState
	since   time.Time // Receive
	bytes   uint64
	stale   int
}

func (r *rxMeter) born(s *RxSession, now time.Time) {
	r.open, r.state = true, s.State()
	if r.since.IsZero() {
		r.since = now
	}
	r.m.rxSessions[r.state].Inc()
}

func (r *rxMeter) stepped(s *RxSession, now time.Time) {
	if s.StaleFrames != r.stale {
		// Duplicate, stale-epoch or late frames: the session ignored them
		// (Counters.FramesStale too: rxKind.stepped).
		r.m.rejected[rejectStale].Add(float64(s.StaleFrames - r.stale))
		r.stale = s.StaleFrames
	}
	if !r.open {
		return
	}
	if b := s.Bytes(); b != r.bytes {
		r.m.bytesRx.Add(float64(b - r.bytes))
		r.bytes = b
	}
	if st := s.State(); st != r.state {
		r.m.rxSessions[r.state].Dec()
		r.m.rxSessions[st].Inc()
		r.state = st
		if st.Terminal() && !r.decided {
			// Finish went out: the handle's Done fires now.
			r.decided = true
			r.m.rxDur[st].Observe(now.Sub(r.since).Seconds())
			if st != RxReady {
				r.m.rxFail[reasonOf(s.Err())].Inc()
			}
		}
	}
	if s.Stopped() {
		r.close()
	}
}

func (r *rxMeter) close() {
	if r.open {
		r.open = false
		r.m.rxSessions[r.state].Dec()
	}
}
