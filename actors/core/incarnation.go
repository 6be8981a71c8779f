package core

import (
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/messages"
)

// ErrStaleIncarnation: a frame addressed to an earlier incarnation of this
// rank, or sent by an earlier incarnation of its peer than one already
// heard. It is dropped: a rank never acts on it (issue 17).
var ErrStaleIncarnation = errors.New("actors: frame of an earlier incarnation")

// IncarnationTable is the listener's memory of incarnations: this rank's
// own (new at each start) and the latest heard from each peer (its Hello,
// or any frame it sent). Incarnation 0 means not known (a peer that
// predates incarnations): it is never refused for that alone.
type IncarnationTable struct {
	self  uint64
	peers map[messages.PeerID]uint64
}

// NewIncarnationTable returns the table of a rank whose incarnation is
// self.
func NewIncarnationTable(self uint64) *IncarnationTable {
	return &IncarnationTable{self: self, peers: map[messages.PeerID]uint64{}}
}

// Self is this rank's incarnation.
func (t *IncarnationTable) Self() uint64 { return t.self }

// Of is the latest incarnation heard from peer (0: none).
func (t *IncarnationTable) Of(peer messages.PeerID) uint64 { return t.peers[peer] }

// Hello records a peer's Hello. It refuses (ErrStaleIncarnation) a Hello
// of an earlier incarnation than one already heard; newer reports that it
// names a later incarnation than the one known (the peer restarted: not,
// by itself, proof that the old one's writes are over — docs/membership.md).
func (t *IncarnationTable) Hello(h *messages.Hello) (newer bool, err error) {
	known := t.peers[h.From]
	switch {
	case h.Incarnation == 0:
		return false, nil
	case h.Incarnation < known:
		return false, fmt.Errorf("%w: Hello of %s incarnation %d, incarnation %d already heard", ErrStaleIncarnation, h.From, h.Incarnation, known)
	case h.Incarnation > known:
		t.peers[h.From] = h.Incarnation
		return known != 0, nil
	}
	return false, nil
}

// Admit decides whether this rank may act on f: not when f is addressed to
// another incarnation of this rank (an earlier one: this rank restarted
// since the sender learnt of it), nor when its sender's incarnation is
// earlier than one already heard from that peer — but for a terminal
// frame (Result, CancelAck): an earlier incarnation's answer to a request
// addressed to it is the very proof that request waits for (its writes
// are over), so it passes, teaching nothing, and the request's session
// decides (it takes only its writer's incarnation). A frame of a later
// incarnation than known teaches it. Frames without incarnations pass.
func (t *IncarnationTable) Admit(f messages.Frame) error {
	in, ok := f.(messages.Incarnated)
	if !ok {
		return nil
	}
	inc := in.Incarnation()
	if inc.ToIncarnation != 0 && t.self != 0 && inc.ToIncarnation != t.self {
		return fmt.Errorf("%w: %T for request %s from %s addressed to incarnation %d, this rank is incarnation %d",
			ErrStaleIncarnation, f, f.Request(), f.Sender(), inc.ToIncarnation, t.self)
	}
	if inc.FromIncarnation == 0 {
		return nil
	}
	from := f.Sender()
	if known := t.peers[from]; inc.FromIncarnation < known {
		switch f.(type) {
		case *messages.Result, *messages.CancelAck:
			return nil
		}
		return fmt.Errorf("%w: %T for request %s from %s incarnation %d, incarnation %d already heard",
			ErrStaleIncarnation, f, f.Request(), from, inc.FromIncarnation, known)
	}
	t.peers[from] = inc.FromIncarnation
	return nil
}

// Misaddressed reports whether f, which Admit refused, is a RequestData
// addressed to an earlier incarnation of this rank by a sender whose
// incarnation is not earlier than one already heard: this incarnation
// drops it unread, and may answer it with a messages.Misaddressed (the
// shell does when the sender's Hello says messages.FeatureMisaddressed),
// so that the sender addresses it anew instead of taking it as delivered.
// It changes nothing: a dropped frame teaches no incarnation. Only a
// RequestData is answered: it is the frame a generation rank sends once
// and takes as delivered once it leaves; a Cancel is re-sent on its own.
func (t *IncarnationTable) Misaddressed(f messages.Frame) (*messages.RequestData, bool) {
	rd, ok := f.(*messages.RequestData)
	if !ok || t.self == 0 || rd.ToIncarnation == 0 || rd.ToIncarnation >= t.self || rd.FromIncarnation == 0 ||
		rd.FromIncarnation < t.peers[rd.From] {
		return nil, false
	}
	return rd, true
}

// MisaddressedAnswer is this rank's answer to rd, a RequestData it dropped
// as addressed to an earlier incarnation of itself (Misaddressed), when
// rd's sender takes one: rd says messages.FeatureMisaddressed (its
// Features), or hello, the sender's Hello the control plane holds now
// (err: none known), is of rd's incarnation and says it. nil: no answer
// — a build before the feature rejects the frame as of an unknown type
// (counted, with a warning). self and selfInc are this rank's PeerID and
// incarnation.
func MisaddressedAnswer(rd *messages.RequestData, self messages.PeerID, selfInc uint64, hello *messages.Hello, err error) *messages.Misaddressed {
	takes := rd.Features&messages.FeatureMisaddressed != 0 ||
		err == nil && hello != nil && hello.From == rd.From && hello.Incarnation != 0 && hello.Incarnation == rd.FromIncarnation &&
			hello.Has(messages.FeatureMisaddressed)
	if !takes || rd.FromIncarnation == 0 || rd.ToIncarnation == 0 || rd.ToIncarnation >= selfInc {
		return nil
	}
	return &messages.Misaddressed{RequestID: rd.RequestID, Epoch: rd.Epoch, From: self, Addressed: rd.ToIncarnation,
		Incarnations: messages.Incarnations{FromIncarnation: selfInc, ToIncarnation: rd.FromIncarnation}}
}

// stamp sets the incarnations of a frame this rank sends.
func stamp(f messages.Frame, in messages.Incarnations) {
	switch m := f.(type) {
	case *messages.RequestData:
		m.Incarnations = in
	case *messages.Result:
		m.Incarnations = in
	case *messages.Cancel:
		m.Incarnations = in
	case *messages.CancelAck:
		m.Incarnations = in
	case *messages.Misaddressed:
		m.Incarnations = in
	}
}

// Stamp sets the incarnations of a frame a shell sends on its own (a
// parent's direct reply): from this rank's incarnation self, to the
// incarnation of the frame it answers (0: not known).
func Stamp(f messages.Frame, self, to uint64) {
	stamp(f, messages.Incarnations{FromIncarnation: self, ToIncarnation: to})
}

// FromIncarnation is the sender's incarnation a frame carries (0: none).
func FromIncarnation(f messages.Frame) uint64 {
	if in, ok := f.(messages.Incarnated); ok {
		return in.Incarnation().FromIncarnation
	}
	return 0
}
