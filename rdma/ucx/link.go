//go:build cgo && linux && !kvxfer_noucx

package ucx

import (
	"crypto/ecdh"
	"fmt"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/rdma"
)

// linkState is where an agent stands with one peer agent.
//
//	connecting → up → left (the peer said bye)
//	     └───────┴──→ failed (its endpoint failed, or no answer to hello)
type linkState uint8

const (
	linkConnecting linkState = iota
	linkUp
	linkLeft
	linkFailed
)

func (s linkState) String() string {
	switch s {
	case linkConnecting:
		return "connecting"
	case linkUp:
		return "up"
	case linkLeft:
		return "left"
	case linkFailed:
		return "failed"
	}
	return fmt.Sprintf("linkState(%d)", uint8(s))
}

// link is an agent's association with one peer agent: a control endpoint
// each way, what this agent knows of the peer's registrations, and how many
// of this agent's batches are in flight into each of them. Endpoints to
// the peer share it.
type link struct {
	peer agentID
	addr address // the peer's; worker bytes owned
	name string
	key  [32]byte // seals the control messages both ways (linkkey.go)
	// mds: what the peer's worker address says of its memory domains, for
	// the checks of its packed rkeys (rkey.go); nil if it did not
	// validate (its keys are then refused). Read-only.
	mds *peerMDs

	mu      sync.Mutex
	state   linkState
	err     error           // why failed or left
	ident   string          // whom the peer serves (its hello's identity)
	next    uint64          // the peer's registrations from this id on postdate the hello
	live    map[uint64]bool // the peer's registrations below next that are live
	revoked map[uint64]bool
	busy    map[uint64]int // batches in flight into each registration

	// Progress goroutine only.
	// unanswered: the link failed because the peer never answered its
	// hello; a later Connect tries again on a new link.
	unanswered bool
	u          *uep              // control endpoint to the peer
	eps        map[*uep]struct{} // data endpoints to the peer
	waiters    []*call           // Connects waiting for the handshake
	deadline   time.Time         // of the handshake
	byeReq     uint64            // our bye, until acknowledged
	byeBy      time.Time         // deadline of the acknowledgement
	ackTo      uint64            // the peer's bye, acknowledged once eps is empty
	ackDue     bool
	// silent: a revoke or restore to the peer went unanswered for the
	// revoke timeout, and nothing came from it since (why, for the
	// errors). Later deregistrations do not wait for it again: a frozen
	// peer cost every registration two timeouts, a minute to close a pool
	// of three.
	silent string
	// unproven: the link failed (failLink) without proof that the peer's
	// writes into this agent's memory are over (why, for the errors): an
	// unanswered hello is a timeout, and an error UCX reports on the
	// control endpoint concerns that endpoint alone, no proof either
	// (docs/membership.md §4). Deregistrations are then refused busy and
	// Close keeps the memory (ErrCloseUnproven), as for a peer that did
	// not acknowledge the bye.
	unproven string
	// exited: the peer's process exited, as proven from outside UCX
	// (Agent.PeerExited; how, for the errors). Proof for the memory this
	// agent allocated (Alloc), which the peer wrote into with copies of
	// its own threads; none for memory registered with ucp_mem_map, where
	// what the peer queued is applied by this worker (unprovenFor).
	exited string
	// drained: the peer's node stated, after its engine read its last
	// frame, that every write it started is over (a drained goodbye;
	// Agent.PeerDrained; how, for the logs). Proof for all of this
	// agent's memory, as the peer's bye is: whatever failure of the link
	// came before or comes after leaves nothing unproven (unprovenFor),
	// and an acknowledgement of this agent's bye is not needed.
	drained string
	// byeAcked: the peer acknowledged this agent's bye (it closed its
	// endpoints to this agent first): an error on the control endpoint
	// after that leaves nothing unproven.
	byeAcked bool
	// cut: a data endpoint of this agent to the peer closed with writes
	// cut on the wire without proof that they no longer land (uep.unproven:
	// the close timeout, failLink, dataFailed; its reason, for the
	// errors). They may still be applied by the peer's worker after
	// anything this agent sends later on the control endpoint, so this
	// agent owes the peer a proof it cannot give: it says no bye to the
	// peer and acknowledges none of its byes (stepShutdown, stepLinks),
	// which the peer would take as proof that this agent's writes into
	// its memory are over.
	cut string
}

// unprovenFor says why the peer's writes into r may not be over since
// its link failed ("" when they are over, or the link did not fail
// unproven). The peer's exit (exited) clears it for memory this agent
// allocated; its drained goodbye (drained) clears it for all memory.
// Progress goroutine only.
func (l *link) unprovenFor(r *registration) string {
	if r.source || l.drained != "" {
		return "" // no peer was told how to write into it, or its writes are over
	}
	if l.exited != "" && r.alloc != nil {
		return ""
	}
	return l.unproven
}

func newLink(pa address, name string) *link {
	mds, _ := peerMDsOf(pa.worker)
	return &link{
		peer:    pa.id,
		addr:    address{id: pa.id, pub: pa.pub, spub: pa.spub, worker: append([]byte(nil), pa.worker...)},
		name:    name,
		mds:     mds,
		live:    make(map[uint64]bool),
		revoked: make(map[uint64]bool),
		busy:    make(map[uint64]int),
		eps:     make(map[*uep]struct{}),
	}
}

// learn takes the peer's hello or welcome; the link is up.
func (l *link) learn(m *message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != linkConnecting {
		return
	}
	l.ident = string(m.ident)
	l.next = m.nextReg
	for _, id := range m.live {
		l.live[id] = true
	}
	l.state = linkUp
}

// setState moves the link to left or failed (the first terminal state
// wins) and reports whether it changed.
func (l *link) setState(s linkState, err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == linkLeft || l.state == linkFailed {
		return false
	}
	l.state, l.err = s, err
	return true
}

// failure is the link's error once it failed (the peer unreachable), else
// nil; a link the peer left cleanly (Bye) is no failure.
func (l *link) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != linkFailed {
		return nil
	}
	return fmt.Errorf("%w: %v", rdma.ErrPeerGone, l.err)
}

func (l *link) getState() linkState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// acquire counts a batch into registration reg of the peer, or says why it
// cannot be posted.
func (l *link) acquire(reg uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.state {
	case linkLeft, linkFailed:
		return fmt.Errorf("%w: %v", rdma.ErrPeerGone, l.err)
	}
	if l.revoked[reg] || (reg < l.next && !l.live[reg]) {
		return fmt.Errorf("%w: registration %d of agent %s was revoked (stale key)", rdma.ErrBadKey, reg, l.peer)
	}
	l.busy[reg]++
	return nil
}

// revoke marks reg revoked unless a batch is in flight into it.
func (l *link) revoke(reg uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.busy[reg] > 0 {
		return false
	}
	l.revoked[reg] = true
	delete(l.live, reg)
	return true
}

func (l *link) restore(reg uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.revoked, reg)
	l.live[reg] = true
}

// release uncounts a batch into registration reg of the peer.
func (l *link) release(reg uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.busy[reg]--; l.busy[reg] <= 0 {
		delete(l.busy, reg)
	}
}

// keyOr is the link's key, or for no link (l nil) the key a link to the
// agent with public key pub would have; nil when pub is not a usable key.
// (A link's peer has the public key its id is derived from, so one id
// names one key.)
func (l *link) keyOr(priv *ecdh.PrivateKey, pub [pubLen]byte) *[32]byte {
	if l != nil {
		return &l.key
	}
	k, err := linkKey(priv, pub)
	if err != nil {
		return nil
	}
	return &k
}

// identity is whom the peer's agent serves, as its hello said ("" before
// the link is up, or when it was given none).
func (l *link) identity() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ident
}
