package discovery

import (
	"errors"
	"testing"
	"time"
)

func staticPeer(instance string, rank int32, endpoint string) Record {
	return Record{Instance: instance, Rank: rank, ControlEndpoint: endpoint}
}

// TestStaticRegistry: the listed peers other than this rank come Up at
// Register, nothing else ever comes, and Close closes Events.
func TestStaticRegistry(t *testing.T) {
	list := []Record{
		staticPeer("ctx", 0, "tcp://10.0.0.1:5000"),
		staticPeer("ctx", 1, "tcp://10.0.0.1:5001"),
		staticPeer("gen", 0, "ipc://gen0"),
	}
	s, err := NewStatic(list)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if p := s.Peers(); len(p) != 3 {
		t.Errorf("peers before Register %v, want the whole list", p)
	}
	self := testRecord("gen", 0, NewIncarnation())
	self.ControlEndpoint = "ipc://gen0"
	if err := s.Register(ctxFor(t, time.Second), self); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, s, 5*time.Second, "ctx/0 up", func(e Event) bool { return e.Kind == EventUp && e.Record.Peer() == list[0].Peer() })
	waitEvent(t, s, 5*time.Second, "ctx/1 up", func(e Event) bool { return e.Kind == EventUp && e.Record.Peer() == list[1].Peer() })
	if p := s.Peers(); len(p) != 2 {
		t.Errorf("peers %v, want the two ctx ranks", p)
	}
	if err := s.Register(ctxFor(t, time.Second), self); !errors.Is(err, ErrRegistered) {
		t.Errorf("second Register: %v", err)
	}
	select {
	case ev := <-s.Events():
		t.Errorf("unexpected %v", ev)
	default:
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-s.Events(); ok {
		t.Error("events open after Close")
	}
	if err := s.Register(ctxFor(t, time.Second), self); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close: %v", err)
	}
	if s.Err() != nil {
		t.Errorf("Err after a plain Close: %v", s.Err())
	}
}

func TestStaticRefuses(t *testing.T) {
	if _, err := NewStatic([]Record{staticPeer("ctx", 0, "tcp://a:1"), staticPeer("ctx", 0, "tcp://b:1")}); !errors.Is(err, ErrInvalidRecord) {
		t.Errorf("rank listed twice: %v", err)
	}
	if _, err := NewStatic([]Record{staticPeer("ctx", 0, "a:1")}); !errors.Is(err, ErrInvalidRecord) {
		t.Errorf("endpoint without scheme: %v", err)
	}
	withKey := staticPeer("ctx", 0, "tcp://a:1")
	withKey.CurvePublicKey = "short"
	if _, err := NewStatic([]Record{withKey}); !errors.Is(err, ErrInvalidRecord) {
		t.Errorf("bad CURVE key: %v", err)
	}
	s, err := NewStatic([]Record{staticPeer("ctx", 0, "tcp://a:1")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	self := testRecord("ctx", 0, 1)
	if err := s.Register(ctxFor(t, time.Second), self); !errors.Is(err, ErrInvalidRecord) {
		t.Errorf("self listed at another endpoint: %v", err)
	}
	bad := self
	bad.Incarnation = 0
	if err := s.Register(ctxFor(t, time.Second), bad); !errors.Is(err, ErrInvalidRecord) {
		t.Errorf("register without incarnation: %v", err)
	}
}
