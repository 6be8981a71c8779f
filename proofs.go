package kvxfer

import (
	"fmt"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/metrics"
)

// ProofKind is what proved that every write of one incarnation of a
// writer is over (DESIGN.md §3): the proofs Engine.WriterProven takes, one
// label value of kvxfer_write_proofs_total each. How the proof was found,
// in words, goes to the requests' errors and the logs; its kind is what
// Stats.WriteProofs and the metrics count by.
type ProofKind uint8

const (
	// ProofExited: the writer's death as its backend defines it, as the
	// caller's own detector found it (Engine.WriterExited).
	ProofExited ProofKind = iota
	// ProofPidfdExit: the writer's process exited, seen by a pidfd opened
	// at its Hello, the process seen mapping this rank's pool (package
	// node).
	ProofPidfdExit
	// ProofDrainedGoodbye: the writer closed after its engine read its
	// last frame and drained every write it started, and said so in its
	// goodbye (Engine.WritesOver; package node).
	ProofDrainedGoodbye

	// NumProofKinds is how many proof kinds there are: the length of
	// Stats.WriteProofs.
	NumProofKinds = int(iota)
)

// proofNames are the kinds' label values (kvxfer_write_proofs_total).
var proofNames = [NumProofKinds]string{
	ProofExited:         "exited",
	ProofPidfdExit:      "pidfd_exit",
	ProofDrainedGoodbye: "drained_goodbye",
}

// String is k's label value in the metrics ("exited", "pidfd_exit",
// "drained_goodbye"), or "ProofKind(n)" for a value that is none.
func (k ProofKind) String() string {
	if int(k) < NumProofKinds {
		return proofNames[k]
	}
	return fmt.Sprintf("ProofKind(%d)", uint8(k))
}

// ProofCount is what the proofs of one kind did (Stats.WriteProofs).
type ProofCount struct {
	// Proofs: proofs of this kind the engine took (it answered), whether
	// or not any request of the writer was live or quarantined here.
	Proofs int64
	// Requests: the requests they concerned, summed over the proofs:
	// each addressed to the proven incarnation and live, draining or
	// quarantined here, now failed with its blocks released once every
	// writer of it is quiescent (a request with another writer still
	// unproven keeps its blocks in quarantine until that one's proof).
	Requests int64
}

// proofCounters back Stats.WriteProofs and kvxfer_write_proofs_total.
type proofCounters struct {
	proofs, requests [NumProofKinds]atomic.Int64
}

// count adds one proof of kind k that concerned reqs requests.
func (c *proofCounters) count(k ProofKind, reqs int) {
	c.proofs[k].Add(1)
	c.requests[k].Add(int64(reqs))
}

// snapshot is the counters as Stats.WriteProofs.
func (c *proofCounters) snapshot() (s [NumProofKinds]ProofCount) {
	for k := range s {
		s[k] = ProofCount{Proofs: c.proofs[k].Load(), Requests: c.requests[k].Load()}
	}
	return s
}

// register publishes c in set: kvxfer_write_proofs_total and
// kvxfer_write_proof_requests_total, by kind, read at each scrape.
func (c *proofCounters) register(set *metrics.Set) error {
	kinds := proofNames[:]
	if err := set.CounterFuncs("write_proofs_total",
		"Proofs that every write of one writer incarnation is over (they release its requests' quarantined blocks), by kind.",
		"kind", kinds, func(i int) float64 { return float64(c.proofs[i].Load()) }); err != nil {
		return fmt.Errorf("metrics: write_proofs_total: %w", err)
	}
	if err := set.CounterFuncs("write_proof_requests_total",
		"Requests such proofs concerned (live, draining or quarantined, addressed to the proven incarnation), by kind.",
		"kind", kinds, func(i int) float64 { return float64(c.requests[i].Load()) }); err != nil {
		return fmt.Errorf("metrics: write_proof_requests_total: %w", err)
	}
	return nil
}

// WriterProven is WriterExited for a proof of kind kind: incarnation inc
// of writer peer can write no more, as kind proves (how says it in words,
// for the requests' errors). The requests addressed to that incarnation
// fail and their destination blocks leave quarantine. It returns how many
// requests the proof concerned; the proof counts in Stats.WriteProofs
// (kvxfer_write_proofs_total) only when the engine took it. A kind that is
// none of the ProofKind constants is refused (ErrBadRequest), and nothing
// is released.
func (e *Engine) WriterProven(peer messages.PeerID, inc uint64, kind ProofKind, how string) (int, error) {
	return e.writerProven("WriterProven", peer, inc, kind, how)
}

// writerProven is WriterProven, method naming the call in its errors.
func (e *Engine) writerProven(method string, peer messages.PeerID, inc uint64, kind ProofKind, how string) (int, error) {
	if int(kind) >= NumProofKinds {
		return 0, fmt.Errorf("%w: %s(%s, incarnation %d): proof kind %d is none of kvxfer's (0 to %d): nothing released",
			ErrBadRequest, method, messages.TruncateText(peer.String(), 2*messages.MaxInstanceLen), inc, uint8(kind), NumProofKinds-1)
	}
	if !e.started() {
		return 0, errNotStarted(method)
	}
	n, err := e.inner.WriterExited(peer, inc, how)
	if err != nil {
		return n, writerQueryErr(method, peer, inc, err)
	}
	e.proofs.count(kind, n)
	return n, nil
}
