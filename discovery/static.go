package discovery

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/messages"
)

// Static is the registry of a fixed list of peers (flags or a config
// file): no server, no liveness of its own. Register emits one Up per
// listed peer other than this rank; no Down ever comes from it (peer
// liveness stays with the control plane's heartbeats). It is the embedded
// default.
//
// A listed peer names at least its instance, rank and control endpoint;
// what its Hello carries (incarnation, backend, agent address, layout,
// parallelism) may be left out and is then learned from the Hello. The
// list may name this rank too (every rank can share one file): the entry
// must then agree with the registered record's control endpoint and key.
type Static struct {
	list []Record
	q    *eventQueue

	mu         sync.Mutex
	self       *Record
	closed     bool
	closeOnce  sync.Once
	registered bool
}

var _ Registry = (*Static)(nil)

// NewStatic checks the list (every entry valid, no rank listed twice).
func NewStatic(peers []Record, opts ...Option) (*Static, error) {
	o := buildOptions(opts)
	seen := map[messages.PeerID]bool{}
	list := make([]Record, 0, len(peers))
	for i, p := range peers {
		if err := p.validateStatic(); err != nil {
			return nil, fmt.Errorf("static peer %d: %w", i, err)
		}
		if seen[p.Peer()] {
			return nil, fmt.Errorf("%w: static peer %d: %s is listed twice", ErrInvalidRecord, i, p.Peer())
		}
		seen[p.Peer()] = true
		list = append(list, p)
	}
	return &Static{list: list, q: newEventQueue(o.queue, nil)}, nil
}

// Register records this rank and emits Up for every other listed peer.
func (s *Static) Register(_ context.Context, r Record) error {
	if err := r.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.registered {
		return fmt.Errorf("%w: %s", ErrRegistered, s.self)
	}
	var ups []Event
	for _, p := range s.list {
		if p.Peer() != r.Peer() {
			ups = append(ups, Event{Kind: EventUp, Record: p})
			continue
		}
		if p.ControlEndpoint != r.ControlEndpoint {
			return fmt.Errorf("%w: %s: the static list names control endpoint %s, the rank registers %s",
				ErrInvalidRecord, r.Peer(), p.ControlEndpoint, r.ControlEndpoint)
		}
		if p.CurvePublicKey != "" && p.CurvePublicKey != r.CurvePublicKey {
			return fmt.Errorf("%w: %s: the static list names another CURVE public key than the rank registers", ErrInvalidRecord, r.Peer())
		}
	}
	s.self, s.registered = &r, true
	s.q.push(ups...)
	return nil
}

// Events implements Registry.
func (s *Static) Events() <-chan Event { return s.q.out }

// Peers lists the static peers other than this rank (all of them before
// Register).
func (s *Static) Peers() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Record
	for _, p := range s.list {
		if s.self == nil || p.Peer() != s.self.Peer() {
			out = append(out, p)
		}
	}
	return out
}

// Err is the reason Events closed before Close (nil otherwise).
func (s *Static) Err() error {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	if s.q.err == errEnded {
		return nil
	}
	return s.q.err
}

// Close implements Registry; no Down is emitted (there is no one to tell).
func (s *Static) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.q.close()
	})
	return nil
}
