package zmq

import (
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

func TestLivenessDownOnceAgainOnlyAfterReturn(t *testing.T) {
	const timeout = 3 * time.Second
	t0 := time.Unix(1000, 0)
	l := newLiveness(timeout)
	p := pid("ctx", 0)
	var downs []messages.PeerID
	expire := func(now time.Time) { l.expire(now, func(p messages.PeerID) { downs = append(downs, p) }) }

	if back := l.hello(p, t0); back {
		t.Fatal("first hello reported a return")
	}
	expire(t0.Add(timeout - time.Nanosecond))
	if len(downs) != 0 {
		t.Fatalf("down before %v of silence: %v", timeout, downs)
	}
	l.seen(p, t0.Add(time.Second))
	expire(t0.Add(time.Second + timeout - time.Nanosecond))
	if len(downs) != 0 {
		t.Fatalf("a heartbeat did not push the deadline: %v", downs)
	}
	expire(t0.Add(time.Second + timeout))
	if len(downs) != 1 || downs[0] != p || !l.isDown(p) {
		t.Fatalf("downs = %v, isDown = %v; want one down for %s", downs, l.isDown(p), p)
	}
	expire(t0.Add(time.Hour))
	if len(downs) != 1 {
		t.Fatalf("down reported again without a return: %v", downs)
	}
	if back := l.seen(p, t0.Add(time.Hour)); !back {
		t.Fatal("a sign of life from a down peer did not report its return")
	}
	if l.isDown(p) {
		t.Fatal("peer still down after it was heard from")
	}
	expire(t0.Add(time.Hour + timeout))
	if len(downs) != 2 {
		t.Fatalf("downs = %v, want a second down after the return", downs)
	}
}

func TestLivenessIgnoresPeersWithoutHello(t *testing.T) {
	l := newLiveness(time.Second)
	t0 := time.Unix(0, 0)
	l.seen(pid("x", 1), t0)
	called := false
	l.expire(t0.Add(time.Hour), func(messages.PeerID) { called = true })
	if called {
		t.Fatal("a peer that never said Hello went down")
	}
}

func TestLivenessOffNeverExpires(t *testing.T) {
	l := newLiveness(0)
	t0 := time.Unix(0, 0)
	l.hello(pid("x", 1), t0)
	l.expire(t0.Add(24*time.Hour), func(messages.PeerID) { t.Fatal("expired with liveness off") })
}

// next is the time until the first alive peer's silence reaches the
// timeout, bounded by most and the timeout; down peers and peers that
// never said Hello do not count, and an overdue peer gives 0.
func TestLivenessNext(t *testing.T) {
	const timeout = 3 * time.Second
	t0 := time.Unix(1000, 0)
	l := newLiveness(timeout)
	a, b := messages.PeerID{Instance: "a"}, messages.PeerID{Instance: "b"}
	if got := l.next(t0, time.Minute); got != timeout {
		t.Fatalf("no peer: next = %v, want the timeout %v", got, timeout)
	}
	if got := l.next(t0, time.Second); got != time.Second {
		t.Fatalf("no peer: next = %v, want most (1s)", got)
	}
	l.hello(a, t0)
	l.hello(b, t0.Add(time.Second))
	if got := l.next(t0.Add(1500*time.Millisecond), time.Minute); got != 1500*time.Millisecond {
		t.Fatalf("a heard at t0, now t0+1.5s: next = %v, want 1.5s", got)
	}
	l.expire(t0.Add(timeout), func(messages.PeerID) {}) // a goes down
	if got := l.next(t0.Add(timeout), time.Minute); got != time.Second {
		t.Fatalf("a down, b heard at t0+1s, now t0+3s: next = %v, want 1s (b's)", got)
	}
	if got := l.next(t0.Add(10*time.Second), time.Minute); got != 0 {
		t.Fatalf("b overdue: next = %v, want 0", got)
	}
	if got := newLiveness(0).next(t0, time.Minute); got != time.Minute {
		t.Fatalf("liveness off: next = %v, want most", got)
	}
}

// forget stops tracking a peer (one the full directory forgot): it is no
// longer in the table, its later frames do not bring it back, and expiry
// never reports it again.
func TestLivenessForget(t *testing.T) {
	l := newLiveness(time.Second)
	t0 := time.Unix(0, 0)
	p := pid("x", 1)
	l.hello(p, t0)
	var downs int
	l.expire(t0.Add(time.Hour), func(messages.PeerID) { downs++ })
	if downs != 1 || !l.isDown(p) {
		t.Fatalf("%d downs, isDown %v: want the silent peer down once", downs, l.isDown(p))
	}
	l.forget(p)
	if len(l.peers) != 0 || l.isDown(p) {
		t.Fatalf("after forget: %d peers tracked, isDown %v", len(l.peers), l.isDown(p))
	}
	if l.seen(p, t0.Add(2*time.Hour)) {
		t.Fatal("a forgotten peer came back on a frame: it is tracked again")
	}
	l.expire(t0.Add(3*time.Hour), func(messages.PeerID) { downs++ })
	if downs != 1 {
		t.Fatalf("a forgotten peer was reported down again (%d downs)", downs)
	}
}
