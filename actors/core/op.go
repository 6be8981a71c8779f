package core

import "fmt"

// OpState is the physical state of one Op (one batch of writes for one
// stream and one chunk). Legal transitions (DESIGN.md §3):
//
//	ADMITTED   → NOT_SUBMITTED | SUBMITTING
//	SUBMITTING → SUBMITTED | NOT_SUBMITTED | BACKEND_DONE | IN_DOUBT
//	SUBMITTED  → BACKEND_DONE | IN_DOUBT
//	IN_DOUBT   → RETIRED | SOURCES_RELEASED
//
// NOT_SUBMITTED, BACKEND_DONE and RETIRED are quiescent: the backend will
// neither read the op's source pages nor write its destination pages again.
// SOURCES_RELEASED is an op whose endpoint's close cut its writes without
// proof that they no longer land, but proved that the backend reads none
// of its source any more (rdma.ErrSourcesReleased): it is not quiescent —
// its writes may still land at the peer, so its stream sends the peer no
// terminal frame — but it no longer holds its source pages
// (SourceQuiescent). SUBMITTING may go straight to BACKEND_DONE when the
// worker's "posted" and "completed" reports arrive as one message.
type OpState uint8

// Op states.
const (
	OpAdmitted OpState = iota
	OpNotSubmitted
	OpSubmitting
	OpSubmitted
	OpBackendDone
	OpInDoubt
	OpRetired
	OpSourcesReleased
)

// NumOpStates is the number of OpState values (OpAdmitted..OpSourcesReleased).
const NumOpStates = len(opStateNames)

var opStateNames = [...]string{"ADMITTED", "NOT_SUBMITTED", "SUBMITTING", "SUBMITTED", "BACKEND_DONE", "IN_DOUBT", "RETIRED", "SOURCES_RELEASED"}

func (s OpState) String() string {
	if int(s) < len(opStateNames) {
		return opStateNames[s]
	}
	return fmt.Sprintf("OpState(%d)", uint8(s))
}

// Quiescent reports whether the backend is done with the op for good: it
// reads none of its source pages and writes none of its destination pages
// any more.
func (s OpState) Quiescent() bool {
	return s == OpNotSubmitted || s == OpBackendDone || s == OpRetired
}

// SourceQuiescent reports whether the backend reads none of the op's source
// pages any more: a quiescent op, or one in SOURCES_RELEASED. Every such
// state is final.
func (s OpState) SourceQuiescent() bool { return s.Quiescent() || s == OpSourcesReleased }

var legalOp = map[[2]OpState]bool{
	{OpAdmitted, OpNotSubmitted}:   true,
	{OpAdmitted, OpSubmitting}:     true,
	{OpSubmitting, OpSubmitted}:    true,
	{OpSubmitting, OpNotSubmitted}: true,
	{OpSubmitting, OpBackendDone}:  true,
	{OpSubmitting, OpInDoubt}:      true,
	{OpSubmitted, OpBackendDone}:   true,
	{OpSubmitted, OpInDoubt}:       true,
	{OpInDoubt, OpRetired}:         true,
	{OpInDoubt, OpSourcesReleased}: true,
}

// LegalOpTransition reports whether from → to is allowed.
func LegalOpTransition(from, to OpState) bool { return legalOp[[2]OpState{from, to}] }

// OpRef names one op globally within an engine: the session's request, the
// stream's peer index and the op's sequence number within the stream.
type OpRef struct {
	Request string
	Peer    int
	Seq     int
}

func (r OpRef) String() string { return fmt.Sprintf("%s/peer%d/op%d", r.Request, r.Peer, r.Seq) }
