package zmq

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// goodbyeLog records OnPeerGoodbye and OnPeerDown calls, and each
// goodbye's reason.
type goodbyeLog struct {
	mu      sync.Mutex
	byes    []goneInc
	reasons []string
	downs   []messages.PeerID
}

func (g *goodbyeLog) goodbye(p messages.PeerID, inc uint64, reason string) {
	g.mu.Lock()
	g.byes = append(g.byes, goneInc{p, inc})
	g.reasons = append(g.reasons, reason)
	g.mu.Unlock()
}

func (g *goodbyeLog) down(p messages.PeerID) {
	g.mu.Lock()
	g.downs = append(g.downs, p)
	g.mu.Unlock()
}

func (g *goodbyeLog) counts() (byes, downs int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.byes), len(g.downs)
}

// A link that closes says goodbye to the peers it is connected to, and
// a peer takes it down at once, for the incarnation its Hello named:
// OnPeerGoodbye (not OnPeerDown) is called with that incarnation, and
// Hello says it closed (ErrPeerClosed). The heartbeat timeout (100000 intervals) is far
// past the test's wait: only the goodbye can explain the Down. (Checked
// to fail: without the goodbye, no OnPeerGoodbye within the wait.)
func TestCloseSaysGoodbye(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(mode(secure), func(t *testing.T) {
			ctxID, genID := pid("ctx", 0), pid("gen", 0)
			base := Config{Insecure: !secure, HeartbeatInterval: 20 * time.Millisecond, HeartbeatMisses: 100000}
			ca, cb := base, base
			if secure {
				ka, kb := newKeys(t), newKeys(t)
				ca.Curve = Curve{Secret: ka.secret, AllowedPeers: []string{kb.public}, PeerServerKeys: map[messages.PeerID]string{genID: kb.public}}
				cb.Curve = Curve{Secret: kb.secret, AllowedPeers: []string{ka.public}, PeerServerKeys: map[messages.PeerID]string{ctxID: ka.public}}
			}
			log := &goodbyeLog{}
			cb.OnPeerGoodbye, cb.OnPeerDown = log.goodbye, log.down
			b := listenAs(t, incHello(genID, 3), cb).link
			ca.Peers = map[messages.PeerID]string{genID: b.Endpoint()}
			a := listenAs(t, incHello(ctxID, 7), ca).link
			if err := b.AddPeer(ctxID, a.Endpoint()); err != nil {
				t.Fatal(err)
			}
			waitFor(t, patience, "Hellos both ways and ctx's connection to gen up", func() bool {
				_, errA := a.Hello(genID)
				_, errB := b.Hello(ctxID)
				st, err := a.PeerState(genID)
				return errA == nil && errB == nil && err == nil && st.Conn == ConnUp
			})
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, patience, "gen's OnPeerGoodbye for ctx/0", func() bool { n, _ := log.counts(); return n > 0 })
			log.mu.Lock()
			byes, downs := append([]goneInc(nil), log.byes...), len(log.downs)
			log.mu.Unlock()
			if len(byes) != 1 || byes[0] != (goneInc{ctxID, 7}) || downs != 0 {
				t.Fatalf("goodbyes %v, OnPeerDown %d times; want one goodbye of ctx/0's incarnation 7 and no OnPeerDown", byes, downs)
			}
			_, err := b.Hello(ctxID)
			if !errors.Is(err, control.ErrPeerGone) || !errors.Is(err, ErrPeerClosed) || !strings.Contains(err.Error(), "ctx/0 closed (it said goodbye)") {
				t.Fatalf("Hello of a peer that said goodbye: %v; want ErrPeerGone saying it closed", err)
			}
			for r, n := range b.Stats().Rejected {
				if n != 0 {
					t.Errorf("%d frames rejected (%s)", n, r)
				}
			}
		})
	}
}

// Without OnPeerGoodbye, a goodbye calls OnPeerDown, once.
func TestGoodbyeWithoutOnPeerGoodbyeCallsOnPeerDown(t *testing.T) {
	f := newDepartedFixture(t)
	downs := 0
	f.s.l.cfg.OnPeerDown = func(p messages.PeerID) {
		if p == f.peer {
			downs++
		}
	}
	f.goodbye("c1", 1, f.old.public)
	f.goodbye("c1", 1, f.old.public)
	if downs != 1 {
		t.Fatalf("OnPeerDown called %d times for two goodbyes, want 1", downs)
	}
}

// goodbye hands the listener a goodbye of gen/0 naming incarnation inc on
// connection conn authenticated with key.
func (f *departedFixture) goodbye(conn string, inc uint64, key string) {
	f.t.Helper()
	f.s.handle(conn, mustEncode(f.t, &messages.Heartbeat{From: f.peer, Seq: 1, FromIncarnation: inc, Leaving: true}), key, 1)
	f.s.goodbyes() // the ROUTER found empty
}

// A goodbye is taken only from the connection's bound sender, for the
// incarnation its Hello named, when that is the incarnation the directory
// holds for it: one that names another sender, another incarnation than
// its connection's, comes on a connection without Hello, or on an
// earlier incarnation's connection is rejected (counted), changes nothing
// and makes no state; one from an incarnation that left the cluster is
// ignored. The genuine one takes the peer down once; after it the incarnation's
// heartbeats are no sign of life, its Result is still delivered, and a
// new incarnation's Hello brings the name back. (Checked to fail: with
// the goodbye taken from any bound connection, the earlier incarnation's
// took incarnation 2 down.)
func TestForgedGoodbyesAreIgnored(t *testing.T) {
	f := newDepartedFixture(t)
	log := &goodbyeLog{}
	f.s.l.cfg.OnPeerGoodbye, f.s.l.cfg.OnPeerDown = log.goodbye, log.down
	alive := 0
	f.s.l.cfg.OnPeerAlive = func(messages.PeerID) { alive++ }
	var got []messages.Frame
	f.s.deliver = func(fr messages.Frame) { got = append(got, fr) }
	other := pid("gen", 1)
	untouched := func(what string) {
		t.Helper()
		if byes, downs := log.counts(); byes+downs != 0 {
			t.Fatalf("%s: %d goodbyes and %d downs told", what, byes, downs)
		}
		if _, err := f.s.l.Hello(f.peer); err != nil {
			t.Fatalf("%s: gen/0 is down: %v", what, err)
		}
		f.s.l.mu.Lock()
		_, made := f.s.l.peers[other]
		f.s.l.mu.Unlock()
		if made || f.s.live.tracks(other) {
			t.Fatalf("%s: state made for %s", what, other)
		}
	}
	rejected := func(r RejectReason, before int64, what string) {
		t.Helper()
		if n := f.rejected(r) - before; n != 1 {
			t.Fatalf("%s: %d rejected (%s), want 1 (%+v)", what, n, r, f.s.l.Stats().Rejected)
		}
	}
	bye := func(from messages.PeerID, inc uint64) []byte {
		return mustEncode(t, &messages.Heartbeat{From: from, Seq: 1, FromIncarnation: inc, Leaving: true})
	}

	// Another sender's, on gen/0's connection: its key may not speak for it.
	before := f.rejected(RejectIdentity)
	f.s.handle("c1", bye(other, 1), f.old.public, 1)
	f.s.goodbyes()
	rejected(RejectIdentity, before, "goodbye of gen/1 with gen/0's key")
	untouched("goodbye of gen/1 with gen/0's key")

	// Another incarnation's, on incarnation 1's connection.
	before = f.rejected(RejectSender)
	f.goodbye("c1", 2, f.old.public)
	rejected(RejectSender, before, "goodbye of incarnation 2 on incarnation 1's connection")
	untouched("goodbye of incarnation 2 on incarnation 1's connection")

	// On a connection that said no Hello.
	before = f.rejected(RejectNoHello)
	f.goodbye("c9", 1, f.old.public)
	rejected(RejectNoHello, before, "goodbye before Hello")
	untouched("goodbye before Hello")

	// gen/0 restarts (incarnation 2, same key); incarnation 1's goodbye,
	// on its own connection, is not incarnation 2's.
	f.clock.advance(time.Second)
	f.hello("c2", 2, f.old.public)
	if inc := f.current(); inc != 2 {
		t.Fatalf("gen/0's Hello: incarnation %d, want 2", inc)
	}
	for _, inc := range []uint64{1, 0} {
		before = f.rejected(RejectGoodbye)
		f.goodbye("c1", inc, f.old.public)
		rejected(RejectGoodbye, before, "the earlier incarnation's goodbye")
		untouched("the earlier incarnation's goodbye")
	}

	// The genuine goodbye: down once, for incarnation 2.
	f.goodbye("c2", 2, f.old.public)
	f.goodbye("c2", 0, f.old.public) // a repeat: nothing more
	log.mu.Lock()
	byes, downs := append([]goneInc(nil), log.byes...), len(log.downs)
	log.mu.Unlock()
	if len(byes) != 1 || byes[0] != (goneInc{f.peer, 2}) || downs != 0 {
		t.Fatalf("goodbyes %v, OnPeerDown %d times; want one goodbye of gen/0's incarnation 2", byes, downs)
	}
	if _, err := f.s.l.Hello(f.peer); !errors.Is(err, control.ErrPeerGone) || !strings.Contains(err.Error(), "closed (it said goodbye)") {
		t.Fatalf("Hello after the goodbye: %v; want ErrPeerGone saying it closed", err)
	}
	// Its heartbeats are no life; its last Result is delivered, and no
	// life either; its silence calls no second Down.
	alive = 0
	f.beat("c2", 2, f.old.public)
	f.s.handle("c2", mustEncode(t, result(f.peer, 1)), f.old.public, 1)
	f.clock.advance(time.Hour)
	f.s.live.expire(f.clock.now(), f.s.down)
	if _, err := f.s.l.Hello(f.peer); err == nil || alive != 0 || len(got) != 1 {
		t.Fatalf("after the goodbye: Hello %v, OnPeerAlive %d times, %d frames delivered; want down, 0, 1", err, alive, len(got))
	}
	if byes, downs := log.counts(); byes != 1 || downs != 0 {
		t.Fatalf("after the goodbye: %d goodbyes, %d downs; want 1, 0", byes, downs)
	}

	// A new incarnation's Hello brings the name back.
	f.hello("c3", 3, f.old.public)
	f.beat("c3", 1, f.old.public)
	if inc := f.current(); inc != 3 {
		t.Fatalf("after incarnation 3's Hello: incarnation %d is up, want 3", inc)
	}

	// An incarnation that left the cluster (RemovePeer: etcd's Down of a
	// node that closed, its lease revoked before its link said goodbye)
	// says goodbye: its own, and no news; nothing is told or counted.
	f.s.l.RemovePeer(f.peer)
	rej := f.s.l.Stats().Rejected
	f.goodbye("c3", 3, f.old.public)
	if byes, downs := log.counts(); byes != 1 || downs != 0 {
		t.Fatalf("after the departed incarnation's goodbye: %d goodbyes, %d downs; want 1, 0", byes, downs)
	}
	for r, n := range f.s.l.Stats().Rejected {
		if n != rej[r] {
			t.Fatalf("the departed incarnation's goodbye counted as rejected (%s)", r)
		}
	}
}

// On an insecure link a connection may claim any sender in its Hello, but
// a goodbye naming another sender than its Hello's is rejected (sender)
// and makes no state for the sender it names; a goodbye on a connection
// whose Hello named no incarnation is rejected (goodbye).
func TestGoodbyeOfAnotherSenderIsRejected(t *testing.T) {
	clock := &fakeClock{}
	clock.advance(time.Hour)
	s := bareListener(t, clock)
	log := &goodbyeLog{}
	s.l.cfg.OnPeerGoodbye, s.l.cfg.OnPeerDown = log.goodbye, log.down
	gen, other := pid("gen", 0), pid("gen", 1)
	s.handle("c1", mustEncode(t, incHello(gen, 1)), "", 1)
	s.handle("c1", mustEncode(t, &messages.Heartbeat{From: other, Seq: 1, Leaving: true}), "", 1)
	s.goodbyes()
	if n := s.l.Stats().Rejected[RejectSender]; n != 1 {
		t.Fatalf("%d goodbyes of another sender rejected (sender), want 1", n)
	}
	s.l.mu.Lock()
	_, made := s.l.peers[other]
	s.l.mu.Unlock()
	if byes, downs := log.counts(); byes+downs != 0 || made || s.live.tracks(other) {
		t.Fatalf("goodbye of gen/1 on gen/0's connection: %d goodbyes, %d downs, entry made %v, tracked %v",
			byes, downs, made, s.live.tracks(other))
	}
	if _, err := s.l.Hello(gen); err != nil {
		t.Fatalf("gen/0 down after another sender's goodbye on its connection: %v", err)
	}
	// A peer whose Hello names no incarnation: its goodbye could be a
	// previous process's of the same name, and is not taken.
	old := pid("ctx", 1)
	s.handle("c2", mustEncode(t, helloOf(old, "0")), "", 1)
	s.handle("c2", mustEncode(t, &messages.Heartbeat{From: old, Seq: 1, Leaving: true}), "", 1)
	s.goodbyes()
	if n := s.l.Stats().Rejected[RejectGoodbye]; n != 1 {
		t.Fatalf("%d goodbyes on a connection without incarnation rejected (goodbye), want 1", n)
	}
	if _, err := s.l.Hello(old); err != nil {
		t.Fatalf("ctx/1 (no incarnation) down after its goodbye: %v", err)
	}
}

// Close does not wait for a goodbye that cannot leave (its peer is gone):
// the heartbeat socket lingers goodbyeLinger, not for ever. (Checked to
// fail: with linger -1, Close does not return.)
func TestCloseDoesNotWaitForAGonePeer(t *testing.T) {
	l := listenAs(t, incHello(pid("ctx", 0), 1), Config{Insecure: true, HeartbeatInterval: -1}).link
	// A DEALER to an endpoint where nothing listens queues what it is
	// given (no ZMQ_IMMEDIATE), as a heartbeat socket to a peer that went
	// away does, for the goodbye to wait in.
	sock, err := l.newDealer(pid("gen", 0), "tcp://127.0.0.1:1", "", 4, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	l.byes = &goodbyes{hb: messages.Heartbeat{From: pid("ctx", 0), Seq: 1, FromIncarnation: 1, Leaving: true}, socks: []*zmq4.Socket{sock}}
	l.mu.Unlock()
	done := make(chan struct{})
	go func() {
		l.Close()
		close(done)
	}()
	waitFor(t, patience, "Close with a goodbye to a peer that is gone", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
}

// leave takes a tracked alive peer down once, for one incarnation, whose
// frames are then no sign of life (leftAs), even after the peer's next
// Hello (a new incarnation's);
// an untracked peer is not made, a down one is not told again, and a
// goodbye'd peer's silence is no second Down.
func TestLivenessLeave(t *testing.T) {
	const timeout = 3 * time.Second
	t0 := time.Unix(1000, 0)
	l := newLiveness(timeout)
	p, q := pid("ctx", 0), pid("ctx", 1)
	if l.leave(q, 1) || l.tracks(q) {
		t.Fatal("leave of an untracked peer took effect or tracked it")
	}
	l.hello(p, t0)
	if !l.leave(p, 7) || !l.isDown(p) || !l.leftAs(p, 7) || l.leftAs(p, 8) {
		t.Fatalf("leave(7): down %v, leftAs(7) %v, leftAs(8) %v; want down, left as 7 only", l.isDown(p), l.leftAs(p, 7), l.leftAs(p, 8))
	}
	if l.leave(p, 7) {
		t.Fatal("a second leave reported a transition")
	}
	downs := 0
	l.expire(t0.Add(time.Hour), func(messages.PeerID) { downs++ })
	if downs != 0 {
		t.Fatalf("a peer that left went down again by silence (%d)", downs)
	}
	// A new incarnation's Hello (the listener keeps incarnation 7's late
	// Hello from liveness) brings p back; 7 stays gone.
	if back := l.hello(p, t0.Add(time.Hour)); !back || !l.leftAs(p, 7) || l.isDown(p) {
		t.Fatalf("after a Hello: back %v, leftAs(7) %v, down %v; want back, 7 left, alive", back, l.leftAs(p, 7), l.isDown(p))
	}
	// A goodbye of a peer down by silence tells nothing, but its
	// incarnation is gone too.
	l.expire(t0.Add(3*time.Hour), func(messages.PeerID) { downs++ })
	if l.leave(p, 8) || !l.leftAs(p, 8) || !l.leftAs(p, 7) || l.leftAs(p, 0) {
		t.Fatalf("goodbye of 8, down by silence: leftAs(8) %v, leftAs(7) %v, leftAs(0) %v; want 8 and 7 left, not 0",
			l.leftAs(p, 8), l.leftAs(p, 7), l.leftAs(p, 0))
	}
}

// A goodbye comes on the sender's heartbeat connection and its last
// frames on others, which the ROUTER fair-queues: a goodbye read before a
// Result the peer sent ahead of it, on another connection, is acted on
// only once the ROUTER is drained, so that the Result is handled (and
// delivered) while the peer is up, and the request it ends is not failed
// by the goodbye first. (Checked to fail: with the goodbye acted on as
// it is read, the Result came after the peer's Down.)
func TestGoodbyeWaitsForTheFramesReadWithIt(t *testing.T) {
	f := newDepartedFixture(t)
	var events []string
	f.s.l.cfg.OnPeerGoodbye = func(messages.PeerID, uint64, string) { events = append(events, "goodbye") }
	f.s.deliver = func(fr messages.Frame) {
		if _, err := f.s.l.Hello(f.peer); err != nil {
			events = append(events, "frame after down")
			return
		}
		events = append(events, "frame")
	}
	f.hello("beat", 1, f.old.public) // incarnation 1's heartbeat connection
	// One read of the ROUTER: the goodbye, then the Result sent before it.
	f.s.handle("beat", mustEncode(t, &messages.Heartbeat{From: f.peer, Seq: 9, FromIncarnation: 1, Leaving: true}), f.old.public, 1)
	f.s.handle("c1", mustEncode(t, result(f.peer, 1)), f.old.public, 1)
	f.s.goodbyes() // the ROUTER found empty
	if want := []string{"frame", "goodbye"}; !slices.Equal(events, want) {
		t.Fatalf("events %v, want %v: the Result read with the goodbye handled while the peer is up", events, want)
	}
}

// An incarnation that said goodbye stays gone: a Hello of it that comes
// late (a Conn whose Hello left its backlog after the goodbye, on another
// connection the ROUTER fair-queues), on a new connection or on one it
// said Hello on before, does not make the name live again, nor do the
// heartbeats on it; its Result there is still delivered (a proof). This
// holds also once the peer was down by silence when the goodbye came,
// and after a new incarnation's Hello, which is welcome and which the
// old one's late Hello does not replace. (Checked to fail: the late Hello
// revived incarnation 1, OnPeerAlive was called and its silence called a
// second Down.)
func TestLateHelloAfterGoodbyeDoesNotRevive(t *testing.T) {
	f := newDepartedFixture(t)
	log := &goodbyeLog{}
	f.s.l.cfg.OnPeerGoodbye, f.s.l.cfg.OnPeerDown = log.goodbye, log.down
	alive, hellos := 0, 0
	f.s.l.cfg.OnPeerAlive = func(messages.PeerID) { alive++ }
	f.s.l.cfg.OnHello = func(*messages.Hello) { hellos++ }
	var got []messages.Frame
	f.s.deliver = func(fr messages.Frame) { got = append(got, fr) }
	gone := func(what string) {
		t.Helper()
		if _, err := f.s.l.Hello(f.peer); !errors.Is(err, ErrPeerClosed) {
			t.Fatalf("%s: Hello of gen/0 %v; want ErrPeerClosed", what, err)
		}
		if alive != 0 || hellos != 0 {
			t.Fatalf("%s: OnPeerAlive %d times, OnHello %d times; want none", what, alive, hellos)
		}
	}

	f.goodbye("c1", 1, f.old.public)
	if byes, _ := log.counts(); byes != 1 {
		t.Fatalf("%d goodbyes told, want 1", byes)
	}
	alive = 0
	f.clock.advance(time.Second)
	f.hello("c2", 1, f.old.public) // late, on a new connection
	gone("a late Hello on a new connection")
	f.hello("c1", 1, f.old.public) // late, on its connection
	gone("a late Hello on its own connection")
	f.beat("c2", 1, f.old.public)
	f.s.handle("c2", mustEncode(t, result(f.peer, 1)), f.old.public, 1)
	gone("a heartbeat after the late Hello")
	if len(got) != 1 {
		t.Fatalf("%d frames delivered on the late Hello's connection, want its Result", len(got))
	}
	f.clock.advance(time.Hour)
	f.s.live.expire(f.clock.now(), f.s.down)
	if byes, downs := log.counts(); byes != 1 || downs != 0 {
		t.Fatalf("after the late Hello's silence: %d goodbyes, %d downs; want 1, 0", byes, downs)
	}

	// A new incarnation is welcome; the old one's late Hello does not
	// take the name back from it.
	f.hello("c3", 2, f.old.public)
	if inc := f.current(); inc != 2 || hellos != 1 {
		t.Fatalf("incarnation 2's Hello: incarnation %d is up (OnHello %d times), want 2 (once)", f.current(), hellos)
	}
	f.hello("c4", 1, f.old.public)
	if inc := f.current(); inc != 2 || hellos != 1 {
		t.Fatalf("incarnation 1's late Hello after 2's: incarnation %d is up (OnHello %d times), want 2 (once)", inc, hellos)
	}

	// Down by silence when its goodbye comes: the goodbye tells nothing
	// more, and a late Hello of it does not revive it either.
	f.clock.advance(time.Hour)
	f.s.live.expire(f.clock.now(), f.s.down)
	if _, downs := log.counts(); downs != 1 {
		t.Fatalf("incarnation 2 silent: %d downs, want 1", downs)
	}
	f.goodbye("c3", 2, f.old.public)
	f.hello("c5", 2, f.old.public)
	if _, err := f.s.l.Hello(f.peer); err == nil {
		t.Fatal("incarnation 2, down by silence, said goodbye; its late Hello revived it")
	}
	if byes, downs := log.counts(); byes != 1 || downs != 1 {
		t.Fatalf("after incarnation 2's goodbye and late Hello: %d goodbyes, %d downs; want 1, 1", byes, downs)
	}
}
