package zmq

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// secureBareListener is bareListener in CURVE mode: a test hands handle
// each message with the CURVE key its connection authenticated with.
func secureBareListener(t *testing.T, clock *fakeClock) *listener {
	t.Helper()
	l, err := New(Config{Curve: Curve{Secret: newKeys(t).secret}, Bind: "tcp://127.0.0.1:0", HeartbeatInterval: time.Second,
		HeartbeatMisses: 3, Clock: clock.now, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	self := pid("ctx", 0)
	l.mu.Lock()
	l.self = helloOf(self, "self")
	l.mu.Unlock()
	return &listener{l: l, self: self, secure: true, deliver: func(messages.Frame) {}, conns: map[string]*binding{},
		live: newLiveness(l.liveTimeout())}
}

// incHello is id's Hello as incarnation inc (process 1000+inc).
func incHello(id messages.PeerID, inc uint64) *messages.Hello {
	h := helloOf(id, fmt.Sprint(inc))
	h.Incarnation, h.Process = inc, messages.ProcessID{Pid: uint32(1000 + inc), StartTime: inc, Host: "test-host"}
	return h
}

// departedFixture is a CURVE listener's state with peer gen/0 known from
// etcd (server key old, an endpoint) and its incarnation 1 said Hello on
// connection c1 with that key.
type departedFixture struct {
	t     *testing.T
	s     *listener
	clock *fakeClock
	peer  messages.PeerID
	old   keypair
	// endpointFirst: add adds the endpoint before the server key.
	endpointFirst bool
}

func newDepartedFixture(t *testing.T) *departedFixture {
	clock := &fakeClock{}
	clock.advance(time.Hour)
	f := &departedFixture{t: t, s: secureBareListener(t, clock), clock: clock, peer: pid("gen", 0), old: newKeys(t)}
	f.add(f.old.public)
	f.hello("c1", 1, f.old.public)
	if inc := f.current(); inc != 1 {
		f.t.Fatalf("gen/0's Hello at the link: incarnation %d, want 1", inc)
	}
	return f
}

// add is what a node does for an etcd Up: the key, then the endpoint
// (the other way round when endpointFirst).
func (f *departedFixture) add(key string) {
	f.t.Helper()
	if f.endpointFirst {
		f.addEndpoint()
	}
	if err := f.s.l.SetPeerServerKey(f.peer, key); err != nil {
		f.t.Fatal(err)
	}
	if !f.endpointFirst {
		f.addEndpoint()
	}
}

func (f *departedFixture) addEndpoint() {
	f.t.Helper()
	if err := f.s.l.AddPeer(f.peer, "tcp://127.0.0.1:1"); err != nil {
		f.t.Fatal(err)
	}
}

// hello hands the listener incarnation inc's Hello on connection conn
// authenticated with key.
func (f *departedFixture) hello(conn string, inc uint64, key string) {
	f.t.Helper()
	f.s.handle(conn, mustEncode(f.t, incHello(f.peer, inc)), key, 1)
}

// current is the incarnation of the Hello the directory holds for gen/0
// (0: none).
func (f *departedFixture) current() uint64 {
	h, err := f.s.l.Hello(f.peer)
	if err != nil {
		return 0
	}
	return h.Incarnation
}

func (f *departedFixture) rejected(r RejectReason) int64 { return f.s.l.Stats().Rejected[r] }

// beat hands the listener a Heartbeat of gen/0 on connection conn
// authenticated with key.
func (f *departedFixture) beat(conn string, seq uint64, key string) {
	f.t.Helper()
	f.s.handle(conn, mustEncode(f.t, &messages.Heartbeat{From: f.peer, Seq: seq}), key, 1)
}

// A removed incarnation's heartbeats, on the connection it said Hello on
// before its removal and on one it dials after, are no sign of life of
// the name: they do not tell OnPeerAlive (a node renews the writer's
// lease on gen/0 with it), do not keep the name from going down, do not
// bring the new incarnation's entry back once it went down, and are not
// taken for a twin of the new incarnation. Its last Result is still
// delivered. Before, every frame on a bound connection counted as life
// of its name, whichever incarnation said Hello on it.
func TestDepartedIncarnationsBeatsAreNoSignOfLife(t *testing.T) {
	f := newDepartedFixture(t)
	interval := f.s.l.cfg.HeartbeatInterval
	alive := 0
	f.s.l.cfg.OnPeerAlive = func(p messages.PeerID) {
		if p == f.peer {
			alive++
		}
	}
	downs := 0
	f.s.l.cfg.OnPeerDown = func(p messages.PeerID) {
		if p == f.peer {
			downs++
		}
	}
	var got []messages.Frame
	f.s.deliver = func(fr messages.Frame) { got = append(got, fr) }
	f.s.l.RemovePeer(f.peer)
	f.hello("c2", 1, f.old.public) // a connection it dials after its removal
	seq := uint64(0)
	departedBeats := func() {
		t.Helper()
		for _, c := range []string{"c1", "c2"} {
			seq++
			f.beat(c, seq, f.old.public)
		}
	}

	// Removed, with no new incarnation yet: its beats renew nothing, and
	// the name's silence runs out.
	for range 4 {
		f.clock.advance(interval)
		departedBeats()
		f.s.live.expire(f.clock.now(), f.s.down)
	}
	if alive != 0 {
		t.Fatalf("the departed incarnation's heartbeats told OnPeerAlive %d times", alive)
	}
	if downs != 1 {
		t.Fatalf("gen/0 went down %d times while only its departed incarnation beat, want 1", downs)
	}

	// The new incarnation, with a new key, says Hello, then falls silent.
	next := newKeys(t)
	f.add(next.public)
	f.clock.advance(interval)
	f.hello("c3", 2, next.public)
	if inc := f.current(); inc != 2 {
		t.Fatalf("gen/0's Hello: incarnation %d, want 2 (%+v)", inc, f.s.l.Stats().Rejected)
	}
	alive = 0
	for range 4 {
		f.clock.advance(interval)
		departedBeats()
		f.s.live.expire(f.clock.now(), f.s.down)
	}
	if downs != 2 {
		t.Fatalf("gen/0 went down %d times, want 2: the departed incarnation's beats kept its new incarnation alive", downs)
	}
	if alive != 0 {
		t.Fatalf("the departed incarnation's heartbeats told OnPeerAlive %d times after the new incarnation's Hello", alive)
	}
	if _, err := f.s.l.Hello(f.peer); err == nil {
		t.Fatal("gen/0's silent new incarnation is up: the departed incarnation's beats cleared its down")
	}
	if twin := f.s.twins[f.peer]; twin != 0 {
		t.Fatalf("the departed incarnation's beats were taken for a twin of the new one (pair %x)", twin)
	}

	// Its last Result is still delivered, and counts for no life either.
	f.s.handle("c1", mustEncode(t, result(f.peer, 1)), f.old.public, 1)
	if len(got) != 1 {
		t.Fatalf("%d of the departed incarnation's 1 last Result delivered (%+v)", len(got), f.s.l.Stats().Rejected)
	}
	if _, err := f.s.l.Hello(f.peer); err == nil || alive != 0 {
		t.Fatalf("the departed incarnation's Result counted as life of gen/0 (Hello: %v, OnPeerAlive %d times)", err, alive)
	}

	// The new incarnation's own beat is life.
	f.s.handle("c3", mustEncode(t, &messages.Heartbeat{From: f.peer, Seq: 1}), next.public, 1)
	if inc := f.current(); inc != 2 || alive != 1 {
		t.Fatalf("after the new incarnation's beat: Hello of incarnation %d, OnPeerAlive %d times; want 2, 1", inc, alive)
	}
}

// A re-add that lets the departed incarnation back (AddPeer with the key
// it spoke with) makes its beats life of the name again, until a newer
// incarnation says Hello.
func TestReaddedIncarnationsBeatsAreLife(t *testing.T) {
	f := newDepartedFixture(t)
	interval := f.s.l.cfg.HeartbeatInterval
	alive := 0
	f.s.l.cfg.OnPeerAlive = func(messages.PeerID) { alive++ }
	f.s.l.RemovePeer(f.peer)
	f.clock.advance(interval)
	f.beat("c1", 1, f.old.public)
	if alive != 0 {
		t.Fatalf("the departed incarnation's beat told OnPeerAlive %d times", alive)
	}
	f.add(f.old.public)
	f.beat("c1", 2, f.old.public)
	if alive != 1 {
		t.Fatalf("the re-added incarnation's beat told OnPeerAlive %d times, want 1", alive)
	}
	// A newer incarnation's Hello (a restart under the same key) departs
	// it again (helloAcceptedLocked): its beats are no life once more.
	f.clock.advance(interval)
	f.hello("c3", 2, f.old.public)
	alive = 0
	f.clock.advance(interval)
	f.beat("c1", 3, f.old.public)
	if alive != 0 {
		t.Fatalf("after incarnation 2's Hello, the departed incarnation 1's beat told OnPeerAlive %d times", alive)
	}
}

// After RemovePeer (etcd said gen/0 left), the departed incarnation, still
// running, repeats its Hello on its connection and says it on a new one:
// neither puts it back in the directory nor binds the name to its key
// again. Before, the listener made the entry afresh from the old Hello
// and bound gen/0 to the old key: a node took it for its new
// incarnation's Hello, and the new incarnation's key was refused as
// taken. The departed process's last frames are still delivered.
func TestRemovedIncarnationDoesNotTakeTheNameBack(t *testing.T) {
	f := newDepartedFixture(t)
	var got []messages.Frame
	f.s.deliver = func(fr messages.Frame) { got = append(got, fr) }
	f.s.l.RemovePeer(f.peer)
	f.hello("c1", 1, f.old.public) // its periodic Hello
	f.hello("c2", 1, f.old.public) // a connection it dials now
	f.s.l.mu.Lock()
	info := f.s.l.peers[f.peer]
	f.s.l.mu.Unlock()
	if info != nil {
		t.Fatalf("the departed incarnation's Hello put gen/0 back in the directory (Hello of incarnation %d, bound to key %q)",
			f.current(), info.key)
	}
	if n := f.rejected(RejectDeparted); n != 2 {
		t.Fatalf("%d Hellos refused as departed, want 2 (%+v)", n, f.s.l.Stats().Rejected)
	}
	// Its last frames, on the connection bound before the removal and on
	// the one bound after, still reach the engine.
	f.s.handle("c1", mustEncode(t, result(f.peer, 1)), f.old.public, 1)
	f.s.handle("c2", mustEncode(t, result(f.peer, 2)), f.old.public, 1)
	if len(got) != 2 {
		t.Fatalf("%d of the departed incarnation's 2 last Results delivered (%+v)", len(got), f.s.l.Stats().Rejected)
	}
}

// A new incarnation of gen/0 with a new key is accepted while the
// departed one, with the old key, goes on saying Hello, before and after
// the new one's; the departed one never has the name again. Before, the
// old Hello bound the name to the old key, and the new key's Hello was
// refused as taken ("alive and bound to key …") for as long as the old
// process lived.
//
// The order in which the name is added again does not matter: an AddPeer
// before the new key lets the departed incarnation back no more than one
// after it.
func TestNewIncarnationWithNewKeyWhileTheDepartedOneBeats(t *testing.T) {
	for _, endpointFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("endpoint-first-%v", endpointFirst), func(t *testing.T) {
			f := newDepartedFixture(t)
			f.endpointFirst = endpointFirst
			newIncarnationWithNewKey(t, f)
		})
	}
}

func newIncarnationWithNewKey(t *testing.T, f *departedFixture) {
	f.s.l.RemovePeer(f.peer)
	f.hello("c1", 1, f.old.public)
	next := newKeys(t)
	f.add(next.public) // etcd's Up of incarnation 2
	f.hello("c1", 1, f.old.public)
	if inc := f.current(); inc != 0 {
		t.Fatalf("after the new incarnation's Up, the departed one's Hello is gen/0's (incarnation %d)", inc)
	}
	f.hello("c3", 2, next.public)
	if inc := f.current(); inc != 2 {
		t.Fatalf("gen/0's Hello: incarnation %d, want the new one, 2 (%+v)", inc, f.s.l.Stats().Rejected)
	}
	f.hello("c1", 1, f.old.public)
	f.hello("c4", 1, f.old.public)
	f.hello("c3", 2, next.public)
	if inc := f.current(); inc != 2 {
		t.Fatalf("gen/0's Hello: incarnation %d, want 2", inc)
	}
	if n := f.rejected(RejectTaken); n != 0 {
		t.Fatalf("%d Hellos refused as taken", n)
	}
	if n := f.rejected(RejectDeparted); n != 4 {
		t.Fatalf("%d of the departed incarnation's 4 Hellos refused as departed (%+v)", n, f.s.l.Stats().Rejected)
	}
}

// An explicit re-add of the name (AddPeer, SetPeerServerKey with the key
// the departed incarnation spoke with) lets that incarnation back: the
// link is not told which incarnation an add is for, and a registry may
// bring one back (a caller's own registry, a record applied late).
func TestReaddedIncarnationSaysHelloAgain(t *testing.T) {
	f := newDepartedFixture(t)
	f.s.l.RemovePeer(f.peer)
	f.hello("c1", 1, f.old.public)
	if inc := f.current(); inc != 0 {
		t.Fatalf("the removed incarnation's Hello is gen/0's (incarnation %d)", inc)
	}
	f.add(f.old.public)
	f.hello("c1", 1, f.old.public)
	if inc := f.current(); inc != 1 {
		t.Fatalf("after the re-add, gen/0's Hello: incarnation %d, want 1 (%+v)", inc, f.s.l.Stats().Rejected)
	}
	// AddPeer alone (insecure callers have no key to set) re-adds too.
	f.s.l.RemovePeer(f.peer)
	f.hello("c1", 1, f.old.public)
	if inc := f.current(); inc != 0 {
		t.Fatalf("the removed incarnation's Hello is gen/0's (incarnation %d)", inc)
	}
	if err := f.s.l.AddPeer(f.peer, "tcp://127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	f.hello("c1", 1, f.old.public)
	if inc := f.current(); inc != 1 {
		t.Fatalf("after AddPeer, gen/0's Hello: incarnation %d, want 1 (%+v)", inc, f.s.l.Stats().Rejected)
	}
}

// A restart under the same key (the key_file of a rank is its own for
// good): the re-add for the new incarnation cannot be told from one for
// the departed incarnation, which may say Hello again — until the newer
// incarnation's Hello comes; from then on the departed one does not take
// the name back. Before, the two Hellos replaced each other in the
// directory for as long as the old process lived.
func TestSameKeyRestartKeepsTheDepartedIncarnationOut(t *testing.T) {
	f := newDepartedFixture(t)
	f.s.l.RemovePeer(f.peer)
	f.add(f.old.public)
	f.hello("c1", 1, f.old.public)
	f.hello("c3", 2, f.old.public)
	f.hello("c1", 1, f.old.public)
	f.hello("c4", 1, f.old.public)
	if inc := f.current(); inc != 2 {
		t.Fatalf("gen/0's Hello: incarnation %d, want the new one, 2 (%+v)", inc, f.s.l.Stats().Rejected)
	}
	if n := f.rejected(RejectDeparted); n != 2 {
		t.Fatalf("%d of the departed incarnation's 2 Hellos after the new one's refused", n)
	}
	// The new incarnation leaves in turn: both are departed now.
	f.s.l.RemovePeer(f.peer)
	f.hello("c1", 1, f.old.public)
	f.hello("c3", 2, f.old.public)
	if inc := f.current(); inc != 0 {
		t.Fatalf("a departed incarnation's Hello is gen/0's (incarnation %d)", inc)
	}
}

// The departed incarnations a link remembers are bounded: maxPeers in
// all (the removal longest ago forgotten first) and maxGoneIncarnations
// per name. A forgotten one's Hello is taken again, as before the
// removals were remembered.
func TestDepartedIncarnationsBounded(t *testing.T) {
	old := maxPeers
	maxPeers = 3
	t.Cleanup(func() { maxPeers = old })
	clock := &fakeClock{}
	clock.advance(time.Hour)
	s := bareListener(t, clock)
	say := func(p messages.PeerID, inc uint64) {
		t.Helper()
		s.handle(fmt.Sprintf("%s-%d", p, inc), mustEncode(t, incHello(p, inc)), "", 1)
	}
	// Five names, each removed: the first two are forgotten.
	for i := range 5 {
		p := pid(fmt.Sprintf("gen%d", i), 0)
		say(p, 1)
		if _, err := s.l.Hello(p); err != nil {
			t.Fatalf("%s's Hello: %v (%+v)", p, err, s.l.Stats().Rejected)
		}
		s.l.RemovePeer(p)
	}
	if s.l.goneN != maxPeers {
		t.Fatalf("%d departed incarnations remembered, want maxPeers (%d)", s.l.goneN, maxPeers)
	}
	for i := range 5 {
		p := pid(fmt.Sprintf("gen%d", i), 0)
		say(p, 1)
		_, err := s.l.Hello(p)
		if forgotten := i < 2; forgotten != (err == nil) {
			t.Fatalf("%s (removal %d of 5): Hello after its removal taken: %v, want %v", p, i+1, err == nil, forgotten)
		}
	}
	// One name removed again and again: its latest maxGoneIncarnations.
	maxPeers = 100
	p := pid("ctx", 7)
	for inc := uint64(1); inc <= 2*maxGoneIncarnations; inc++ {
		say(p, inc)
		s.l.RemovePeer(p)
	}
	s.l.mu.Lock()
	n := len(s.l.gone[p])
	s.l.mu.Unlock()
	if n != maxGoneIncarnations {
		t.Fatalf("%d departed incarnations of %s remembered, want %d", n, p, maxGoneIncarnations)
	}
	say(p, 2*maxGoneIncarnations)
	if _, err := s.l.Hello(p); err == nil {
		t.Fatal("the latest departed incarnation's Hello taken")
	}
	say(p, 1)
	if _, err := s.l.Hello(p); err != nil {
		t.Fatalf("the oldest departed incarnation, past the bound, not taken: %v", err)
	}
}

// listenAs is listen with Hello h of the caller's (an incarnation).
func listenAs(t *testing.T, h *messages.Hello, cfg Config) *node {
	t.Helper()
	cfg.Bind = "tcp://127.0.0.1:0"
	cfg.Logger = testLogger(t)
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	in := &inbox{}
	if _, err := l.Listen(h, in.deliver); err != nil {
		l.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &node{id: h.From, link: l, in: in}
}

// End to end, with processes that beat: gen/0's incarnation 1 is removed
// (etcd: it left) and lives on, repeating its Hello every two beats; its
// Hellos do not bring it back, its heartbeats tell OnPeerAlive nothing,
// and incarnation 2, with another key, is accepted beside it and keeps
// the name.
func TestDepartedIncarnationBeatsOnWithoutTheName(t *testing.T) {
	const beat = 10 * time.Millisecond
	ka, kb, kb2 := newKeys(t), newKeys(t), newKeys(t)
	var alive atomic.Int64 // OnPeerAlive calls for gen/0
	a := listen(t, pid("ctx", 0), Config{Curve: Curve{Secret: ka.secret}, HeartbeatInterval: 2 * beat, HeartbeatMisses: 1000,
		OnPeerAlive: func(p messages.PeerID) {
			if p == pid("gen", 0) {
				alive.Add(1)
			}
		}})
	start := func(inc uint64, k keypair) *node {
		n := listenAs(t, incHello(pid("gen", 0), inc), Config{Curve: Curve{Secret: k.secret}, HeartbeatInterval: beat, HeartbeatMisses: 2})
		if err := n.link.AllowKey(ka.public); err != nil {
			t.Fatal(err)
		}
		if err := a.link.AllowKey(k.public); err != nil {
			t.Fatal(err)
		}
		introduce(t, a, n)
		introduce(t, n, a)
		return n
	}
	b := start(1, kb)
	incAtA := func() uint64 {
		h, err := a.link.Hello(b.id)
		if err != nil {
			return 0
		}
		return h.Incarnation
	}
	departed := func() int64 { return a.link.Stats().Rejected[RejectDeparted] }
	waitFor(t, patience, "incarnation 1's Hello at a", func() bool { return incAtA() == 1 })

	a.link.RemovePeer(b.id)
	waitFor(t, patience, "incarnation 1's Hellos after its removal", func() bool { return departed() >= 2 || incAtA() != 0 })
	if inc := incAtA(); inc != 0 {
		t.Fatalf("after RemovePeer, the departed incarnation's Hello put gen/0 back (incarnation %d)", inc)
	}
	// The listener handles a connection's frames in order: every beat
	// from here on came after a Hello it refused as departed.
	told := alive.Load()
	seen := departed()
	waitFor(t, patience, "more of incarnation 1's Hellos", func() bool { return departed() >= seen+2 })
	if n := alive.Load() - told; n != 0 {
		t.Fatalf("the departed incarnation's heartbeats told OnPeerAlive for gen/0 %d times", n)
	}

	start(2, kb2)
	waitFor(t, patience, "incarnation 2's Hello at a", func() bool { return incAtA() == 2 })
	seen = departed()
	taken := func() int64 { return a.link.Stats().Rejected[RejectTaken] }
	waitFor(t, patience, "incarnation 1's Hellos after incarnation 2's", func() bool {
		return departed() >= seen+2 || incAtA() != 2 || taken() != 0
	})
	if inc := incAtA(); inc != 2 {
		t.Fatalf("gen/0's Hello at a: incarnation %d, want 2", inc)
	}
	if n := taken(); n != 0 {
		t.Fatalf("%d Hellos refused as taken", n)
	}
}

// A removed incarnation that still beats (draining in its Close) keeps
// its connections' bindings when the listener needs room: its last
// Result on a connection bound before its removal is a proof the
// generation side waits for. Since its beats stopped counting as life of
// the name, the name goes down by silence one timeout after the removal,
// and forgetDownConns dropped the bindings of every down name, so the
// departed process's Result on such a connection was refused (no Hello
// on it) once another peer's connections filled maxConns. Once it falls
// silent too, its bindings make room as before.
func TestDepartedBeatingIncarnationKeepsItsBindings(t *testing.T) {
	oldConns := maxConns
	maxConns = 3
	t.Cleanup(func() { maxConns = oldConns })
	f := newDepartedFixture(t)
	interval := f.s.l.cfg.HeartbeatInterval
	var got []messages.Frame
	f.s.deliver = func(fr messages.Frame) { got = append(got, fr) }
	f.s.l.RemovePeer(f.peer)
	for seq := range uint64(6) {
		f.clock.advance(interval)
		f.beat("c1", seq+1, f.old.public)
		f.s.live.expire(f.clock.now(), f.s.down)
	}
	// Down by silence, and so forgotten by liveness (a name RemovePeer
	// forgot): either way, forgetDownConns may drop its bindings.
	if f.s.live.tracks(f.peer) && !f.s.live.isDown(f.peer) {
		t.Fatal("the removed name is not down by silence: the test no longer tests what it says")
	}
	// Another peer, with a key of its own, fills the table.
	other := newKeys(t)
	if err := f.s.l.SetPeerServerKey(pid("gen", 1), other.public); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"d1", "d2", "d3"} {
		f.s.handle(c, mustEncode(t, incHello(pid("gen", 1), 7)), other.public, 1)
	}
	if f.s.conns["c1"] == nil {
		t.Fatal("the beating departed incarnation's binding was dropped to make room")
	}
	f.s.handle("c1", mustEncode(t, result(f.peer, 1)), f.old.public, 1)
	if len(got) != 1 {
		t.Fatalf("%d of the departed incarnation's 1 last Result delivered (%+v)", len(got), f.s.l.Stats().Rejected)
	}
	// Silent for a timeout, it makes room.
	f.clock.advance(4 * interval)
	f.s.handle("d4", mustEncode(t, incHello(pid("gen", 1), 7)), other.public, 1)
	if f.s.conns["c1"] != nil || f.s.conns["d4"] == nil {
		t.Fatalf("the silent departed incarnation's binding kept the room (c1 %v, d4 %v)", f.s.conns["c1"] != nil, f.s.conns["d4"] != nil)
	}
}

// A removal of an incarnation older than the one whose Hello the link
// holds (a restart whose Hello came before the old incarnation's etcd
// Down) leaves the newer one: its entry, Hello and key stay, and its
// beats are life of the name; only the older incarnation is departed, its
// Hello refused. Before, RemovePeer marked the incarnation the link held
// — the new, live one — as departed: its Hellos refused and its beats
// dropped until a re-add.
func TestRemovalOfAnOlderIncarnationKeepsTheNewer(t *testing.T) {
	f := newDepartedFixture(t)
	var alive atomic.Int32
	f.s.l.cfg.OnPeerAlive = func(p messages.PeerID) {
		if p == f.peer {
			alive.Add(1)
		}
	}
	f.hello("c2", 2, f.old.public) // the restart, same key, before the Down of 1
	if inc := f.current(); inc != 2 {
		t.Fatalf("gen/0's Hello at the link: incarnation %d, want 2", inc)
	}
	f.s.l.RemovePeerIncarnation(f.peer, 1)
	if inc := f.current(); inc != 2 {
		t.Fatalf("after the removal of incarnation 1, the link holds gen/0's incarnation %d, want 2 (kept)", inc)
	}
	before := f.rejected(RejectDeparted)
	f.hello("c1", 1, f.old.public) // the old process, draining, repeats its Hello
	if f.rejected(RejectDeparted) != before+1 || f.current() != 2 {
		t.Fatalf("incarnation 1's Hello after its removal: departed rejects %d→%d, link holds %d; want it refused, 2 kept",
			before, f.rejected(RejectDeparted), f.current())
	}
	n := alive.Load()
	f.clock.advance(time.Second)
	f.beat("c2", 1, f.old.public)
	if alive.Load() != n+1 {
		t.Fatalf("incarnation 2's beat after incarnation 1's removal told OnPeerAlive %d times, want once", alive.Load()-n)
	}
}

// An etcd Down of an incarnation whose Hello the link does not hold yet
// (its Up was heard, its Hello not: a process out of etcd without knowing
// it, or one whose Hello was still on its way) departs that incarnation:
// its Hello, when it comes, is refused and puts nothing back. Before,
// RemovePeerIncarnation departed only the incarnation whose Hello it held
// (an older one, or none), and the removed incarnation's later Hello took
// the name back: the link said it alive, and its beats kept it so, though
// the node had failed its requests as out of the cluster.
func TestRemovalOfAnIncarnationNotHeardYetRefusesItsHello(t *testing.T) {
	f := newDepartedFixture(t) // incarnation 1 said Hello
	f.add(f.old.public)        // incarnation 2's Up (same key)
	f.s.l.RemovePeerIncarnation(f.peer, 2)
	before := f.rejected(RejectDeparted)
	f.hello("c2", 2, f.old.public)
	if f.rejected(RejectDeparted) != before+1 || f.current() != 0 {
		t.Fatalf("removed incarnation 2's Hello: departed rejects %d→%d, link holds incarnation %d; want it refused, none held",
			before, f.rejected(RejectDeparted), f.current())
	}
	f.hello("c1", 1, f.old.public)
	if f.current() != 0 {
		t.Fatalf("incarnation 1's Hello after the removal: link holds incarnation %d, want none", f.current())
	}

	// A name whose Hello never came at all.
	other := pid("gen", 1)
	if err := f.s.l.SetPeerServerKey(other, f.old.public); err != nil {
		t.Fatal(err)
	}
	if err := f.s.l.AddPeer(other, "tcp://127.0.0.1:2"); err != nil {
		t.Fatal(err)
	}
	f.s.l.RemovePeerIncarnation(other, 5)
	before = f.rejected(RejectDeparted)
	f.s.handle("c3", mustEncode(t, incHello(other, 5)), f.old.public, 1)
	if _, err := f.s.l.Hello(other); err == nil || f.rejected(RejectDeparted) != before+1 {
		t.Fatalf("removed incarnation 5 of gen/1, never heard: its Hello taken (Hello error %v, departed rejects %d→%d)",
			err, before, f.rejected(RejectDeparted))
	}
	// A new incarnation is a peer as before.
	f.s.handle("c4", mustEncode(t, incHello(other, 6)), f.old.public, 1)
	if _, err := f.s.l.Hello(other); err != nil {
		t.Fatalf("gen/1's incarnation 6 after 5's removal: %v", err)
	}
}
