package zmq

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/messages"
)

// boundFixture is a bare listener (insecure, or CURVE when keyed) with
// maxConns and maxConnsPerIdentity lowered, whose warnings a test reads.
type boundFixture struct {
	t     *testing.T
	s     *listener
	clock *fakeClock
	in    *inbox
	logs  *syncBuffer
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newBoundFixture(t *testing.T, secure bool, conns, perIdentity int) *boundFixture {
	oldConns, oldPer := maxConns, maxConnsPerIdentity
	maxConns, maxConnsPerIdentity = conns, perIdentity
	t.Cleanup(func() { maxConns, maxConnsPerIdentity = oldConns, oldPer })
	clock := &fakeClock{}
	clock.advance(time.Hour)
	f := &boundFixture{t: t, clock: clock, in: &inbox{}, logs: &syncBuffer{}}
	if secure {
		f.s = secureBareListener(t, clock)
	} else {
		f.s = bareListener(t, clock)
	}
	f.s.deliver = f.in.deliver
	f.s.l.log = zerolog.New(f.logs).Level(zerolog.WarnLevel)
	return f
}

// hello hands the listener inc's Hello as id on connection conn with key
// and reports whether it was taken (no rejection counted).
func (f *boundFixture) hello(conn string, id messages.PeerID, inc uint64, key string) bool {
	f.t.Helper()
	before := f.s.l.Rejected()
	f.s.handle(conn, mustEncode(f.t, incHello(id, inc)), key, 1)
	return f.s.l.Rejected() == before
}

func (f *boundFixture) mustHello(conn string, id messages.PeerID, inc uint64, key string) {
	f.t.Helper()
	if !f.hello(conn, id, inc, key) {
		f.t.Fatalf("Hello of %s (incarnation %d) on connection %s rejected (%+v)", id, inc, conn, f.s.l.Stats().Rejected)
	}
}

// bound checks that exactly the connections want are bound, each to its
// PeerID.
func (f *boundFixture) bound(want map[string]messages.PeerID) {
	f.t.Helper()
	for conn, p := range want {
		if b := f.s.conns[conn]; b == nil || b.peer != p {
			f.t.Fatalf("connection %s: binding %+v, want bound to %s", conn, b, p)
		}
	}
	if len(f.s.conns) != len(want) {
		f.t.Fatalf("%d connections bound, want %d (%v)", len(f.s.conns), len(want), want)
	}
	n := 0
	for _, of := range f.s.owned {
		n += len(of)
	}
	if n != len(f.s.conns) {
		f.t.Fatalf("%d bindings by identity, %d in all", n, len(f.s.conns))
	}
}

// One peer saying Hello on many connections holds at most
// maxConnsPerIdentity of the listener's bindings: its Hello past that is
// rejected (full) with a warning naming it and the bound, its bound
// connections still deliver, and another peer's new connections are
// still bound. Before, the only bound was the table's (maxConns): the
// first peer took every binding and the second's Hello was refused.
// (Checked to fail without the per-identity bound: gen/1's third Hello
// was taken and dec/0's second refused, full.)
func TestOnePeerCannotTakeEveryBinding(t *testing.T) {
	f := newBoundFixture(t, false, 4, 2)
	gen, dec := pid("gen", 1), pid("dec", 0)
	f.mustHello("a1", gen, 1, "")
	f.mustHello("a2", gen, 1, "")
	full := f.s.l.Stats().Rejected[RejectFull]
	if f.hello("a3", gen, 1, "") {
		t.Fatalf("gen/1's third connection bound past maxConnsPerIdentity %d", maxConnsPerIdentity)
	}
	if n := f.s.l.Stats().Rejected[RejectFull]; n != full+1 {
		t.Fatalf("full rejections %d, want %d", n, full+1)
	}
	if logs := f.logs.String(); !strings.Contains(logs, "peer gen/1 (insecure) already holds 2 connections, at most 2 per identity") {
		t.Fatalf("the refusal does not name the identity and the bound:\n%s", logs)
	}
	// The other peer still binds, up to the table's bound.
	f.mustHello("b1", dec, 1, "")
	f.mustHello("b2", dec, 1, "")
	f.bound(map[string]messages.PeerID{"a1": gen, "a2": gen, "b1": dec, "b2": dec})
	// gen/1's bound connections are undisturbed: a Hello again on one is
	// taken, its frames are delivered; the refused one is not bound.
	f.mustHello("a1", gen, 1, "")
	f.s.handle("a2", mustEncode(t, result(gen, 1)), "", 1)
	f.s.handle("b1", mustEncode(t, result(dec, 2)), "", 1)
	if len(f.in.from(gen)) != 1 || len(f.in.from(dec)) != 1 {
		t.Fatalf("delivered %d frames of gen/1 and %d of dec/0, want 1 each", len(f.in.from(gen)), len(f.in.from(dec)))
	}
	// A frame on the refused connection tries its Hello's binding again
	// (revive): still no room, it is held (hold), neither delivered nor
	// rejected, within the hold's bounds (TestHeldFramesAreBounded).
	full = f.s.l.Stats().Rejected[RejectFull]
	f.s.handle("a3", mustEncode(t, result(gen, 3)), "", 1)
	if f.s.l.Stats().Rejected[RejectFull] != full || len(f.in.from(gen)) != 1 || len(f.s.ghosts["a3"].held) != 1 {
		t.Fatal("a frame on the refused connection, still without room, was not held")
	}
	if _, err := f.s.l.Hello(dec); err != nil {
		t.Fatalf("dec/0: %v", err)
	}
	f.bound(map[string]messages.PeerID{"a1": gen, "a2": gen, "b1": dec, "b2": dec})
}

// With CURVE the bound is per key, whichever names the key speaks for: a
// key bound to every rank of an instance cannot spread over its ranks to
// take the table. (Checked to fail without the per-identity bound: the
// key's third connection, as gen/2, was bound, and key B's second Hello
// refused.)
func TestOneCurveKeyCannotTakeEveryBinding(t *testing.T) {
	f := newBoundFixture(t, true, 4, 2)
	a, b := newKeys(t), newKeys(t)
	for _, id := range []Identity{{PublicKey: a.public, Instance: "gen"}, {PublicKey: b.public, Instance: "dec"}} {
		if err := f.s.l.AddIdentity(id); err != nil {
			t.Fatal(err)
		}
	}
	f.mustHello("a1", pid("gen", 0), 1, a.public)
	f.mustHello("a2", pid("gen", 1), 2, a.public)
	if f.hello("a3", pid("gen", 2), 3, a.public) {
		t.Fatalf("key A's third connection (as gen/2) bound past maxConnsPerIdentity %d", maxConnsPerIdentity)
	}
	if logs := f.logs.String(); !strings.Contains(logs, "CURVE key "+a.public+" already holds 2 connections, at most 2 per identity") {
		t.Fatalf("the refusal does not name the key and the bound:\n%s", logs)
	}
	if _, err := f.s.l.Hello(pid("gen", 2)); err == nil {
		t.Fatal("the refused Hello of gen/2 is in the directory")
	}
	f.mustHello("b1", pid("dec", 0), 4, b.public)
	f.mustHello("b2", pid("dec", 1), 5, b.public)
	f.bound(map[string]messages.PeerID{"a1": pid("gen", 0), "a2": pid("gen", 1), "b1": pid("dec", 0), "b2": pid("dec", 1)})
}

// An identity at its bound makes room from its own bindings that the
// table would forget when full (here its superseded incarnation's), and
// never from another identity's, though the other's are forgettable (its
// peer is down): with none of its own to forget its Hello is rejected.
// (Checked to fail without the per-identity bound: gen/1's superseded
// binding stayed, and its last Hello took the room of dec/0's binding.)
func TestIdentityAtItsBoundForgetsOnlyItsOwn(t *testing.T) {
	f := newBoundFixture(t, false, 4, 2)
	gen, dec := pid("gen", 1), pid("dec", 0)
	f.mustHello("b1", dec, 1, "")
	f.clock.advance(time.Hour) // dec/0 falls silent: down
	f.s.live.expire(f.clock.now(), f.s.down)
	if !f.s.live.isDown(dec) {
		t.Fatal("dec/0 is not down after an hour of silence")
	}
	f.mustHello("a1", gen, 1, "")
	f.mustHello("a2", gen, 2, "") // restarted: a1 is superseded
	f.mustHello("a3", gen, 2, "") // at its bound: a1 makes room
	f.bound(map[string]messages.PeerID{"b1": dec, "a2": gen, "a3": gen})
	if f.hello("a4", gen, 2, "") {
		t.Fatal("gen/1's connection bound past its bound by forgetting down dec/0's binding")
	}
	f.bound(map[string]messages.PeerID{"b1": dec, "a2": gen, "a3": gen})
	// dec/0's binding still delivers.
	f.s.handle("b1", mustEncode(t, result(dec, 1)), "", 1)
	if len(f.in.from(dec)) != 1 {
		t.Fatal("dec/0's frame on its bound connection not delivered")
	}
}

// A live peer that closes connections and dials new ones (a worker
// restart, a redial of this node taken for down) gets its new
// connections bound at its bound (or the table's): the ROUTER never tells
// the listener that a connection closed, so the closed connections'
// bindings, of a live, current incarnation that forgetDownConns never
// frees, stayed, and once they filled the bound every new connection's
// Hello was refused (full). The listener now probes the bindings at the
// bound and forgets those whose connection is gone; the live one still
// delivers. (Checked to fail without probeDead: every new connection's
// Hello was refused until the deadline.)
func TestClosedConnectionsLeaveRoom(t *testing.T) {
	for _, tc := range []struct {
		name               string
		conns, perIdentity int
	}{
		{"identity", 1000, 3},
		{"table", 3, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oldConns, oldPer := maxConns, maxConnsPerIdentity
			maxConns, maxConnsPerIdentity = tc.conns, tc.perIdentity
			t.Cleanup(func() { maxConns, maxConnsPerIdentity = oldConns, oldPer })
			a := listen(t, pid("ctx", 0), Config{Insecure: true})
			b := listen(t, pid("gen", 0), Config{Insecure: true})
			introduce(t, b, a)
			req := 0
			// send sends a Result on c and reports whether a delivered it
			// (false: a rejected it, its connection not bound). c's
			// messages that a has not handled yet are frames of them,
			// the Result last (on a new connection its Hello comes
			// first: 2), and rejected is a's count of rejections before
			// the first of them was sent. The Result is not delivered
			// once a has rejected them all, whatever the reason: a Hello
			// refused at the bound (full), then its Result, which tries
			// the refused Hello's binding again (revive) and, still
			// without room, is rejected (full).
			send := func(c interface{ Send(messages.Frame) error }, rejected, frames int64) bool {
				t.Helper()
				req++
				id := fmt.Sprintf("req-%d", req)
				if err := c.Send(result(b.id, req)); err != nil {
					t.Fatal(err)
				}
				delivered := false
				waitFor(t, patience, "the Result's delivery or rejection", func() bool {
					for _, f := range a.in.from(b.id) {
						if f.Request() == id {
							delivered = true
							return true
						}
					}
					return a.link.Rejected() >= rejected+frames
				})
				return delivered
			}
			var conns []interface {
				Send(messages.Frame) error
				Close() error
			}
			for range 3 {
				rejected := a.link.Rejected()
				c, err := b.link.Dial(a.id)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				if !send(c, rejected, 2) {
					t.Fatalf("connection %d of 3 refused", len(conns)+1)
				}
				conns = append(conns, c)
			}
			// Two close; gen/0 stays alive and current.
			conns[0].Close()
			conns[1].Close()
			// Its next connection is bound once the ROUTER has seen the
			// two close and a probe has run since (at most one a second
			// per binding, probeEvery): a Hello before that is refused
			// (full), and the Result after it is held until then
			// (hold); were it rejected, the connection would be closed
			// and another dialled.
			tries := 0
			deadline := time.Now().Add(patience)
			for {
				tries++
				rejected := a.link.Rejected()
				c, err := b.link.Dial(a.id)
				if err != nil {
					t.Fatal(err)
				}
				if send(c, rejected, 2) {
					t.Cleanup(func() { c.Close() })
					break
				}
				c.Close()
				if time.Now().After(deadline) {
					t.Fatalf("no new connection of gen/0 bound in %d tries: the closed connections' bindings stay (%+v)",
						tries, a.link.Stats().Rejected)
				}
			}
			if !send(conns[2], a.link.Rejected(), 1) {
				t.Fatal("the live connection's binding was forgotten")
			}
		})
	}
}

// probeRouter gives f's bare listener a ROUTER of its own
// (ZMQ_ROUTER_MANDATORY, as Listen makes it) to which no connection is
// made: every probe (probeDead) finds the connection it sends to gone
// (EHOSTUNREACH), as it finds a live connection whose transport is being
// re-established (a TCP reconnect keeps its routing id, but the ROUTER
// holds none for it between the two).
func (f *boundFixture) probeRouter() {
	f.t.Helper()
	r, err := f.s.l.zctx.NewSocket(zmq4.ROUTER)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { closeSocket(r) }) // before the link's Close ends the context
	if err := r.SetRouterMandatory(1); err != nil {
		f.t.Fatal(err)
	}
	if err := r.Bind("inproc://probe-router-" + f.t.Name()); err != nil {
		f.t.Fatal(err)
	}
	f.s.router = r
}

// A live connection whose transport reconnects at the very moment a
// probe runs at a bound (the ROUTER holds no connection for its routing
// id just then) keeps its binding: when its frames come again, on the
// same routing id with the same key and sender, the listener binds it
// again (room permitting) and delivers them, instead of refusing them
// (no_hello) until a Hello that the Conn repeats only when the peer's
// incarnation changes. A frame on the routing id with another key or
// sender is not taken for it. (Checked to fail: without the memory of
// connections a probe forgot, c1's Result was rejected, no_hello.)
func TestProbedReconnectingConnectionKeepsItsBinding(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(mode(secure), func(t *testing.T) {
			f := newBoundFixture(t, secure, 1000, 2)
			f.probeRouter()
			gen, dec := pid("gen", 0), pid("dec", 0)
			key, other := "", ""
			if secure {
				ka, kb := newKeys(t), newKeys(t)
				key, other = ka.public, kb.public
				for _, id := range []Identity{{PublicKey: key, Instance: "gen"}, {PublicKey: other, Instance: "dec"}} {
					if err := f.s.l.AddIdentity(id); err != nil {
						t.Fatal(err)
					}
				}
			}
			f.mustHello("c1", gen, 1, key)
			f.mustHello("c2", gen, 1, key)
			// gen/0 at its bound: a third connection's Hello probes c1 and
			// c2, which the ROUTER does not hold just now.
			f.mustHello("c3", gen, 1, key)
			f.bound(map[string]messages.PeerID{"c3": gen})
			noHello := f.s.l.Stats().Rejected[RejectNoHello]
			// c1 reconnected: its Result comes on its routing id.
			f.s.handle("c1", mustEncode(t, result(gen, 1)), key, 1)
			if got := f.in.from(gen); len(got) != 1 || f.s.l.Stats().Rejected[RejectNoHello] != noHello {
				t.Fatalf("c1's Result after it reconnected: %d delivered, %d rejected (no_hello); want it delivered",
					len(got), f.s.l.Stats().Rejected[RejectNoHello]-noHello)
			}
			f.bound(map[string]messages.PeerID{"c1": gen, "c3": gen})
			// Another sender (with its own key) on c2's routing id is not
			// c2: no Hello on it.
			f.s.handle("c2", mustEncode(t, result(dec, 2)), other, 1)
			if n := f.s.l.Stats().Rejected[RejectNoHello] - noHello; n != 1 || len(f.in.from(dec)) != 0 {
				t.Fatalf("dec/0's frame on c2's routing id: %d rejected (no_hello), %d delivered; want 1, 0", n, len(f.in.from(dec)))
			}
		})
	}
}

// The bindings probeDead forgot are remembered at most maxGhosts: past
// it, the old ones go first, else any one.
func TestForgottenBindingsAreBounded(t *testing.T) {
	old := maxGhosts
	maxGhosts = 2
	t.Cleanup(func() { maxGhosts = old })
	s := &listener{}
	t0 := time.Unix(1000, 0)
	b := &binding{peer: pid("gen", 0)}
	s.ghost("g1", b, t0, false)
	s.ghost("g2", b, t0.Add(ghostKeep/2), false)
	s.ghost("g3", b, t0.Add(ghostKeep), false) // g1 is old: it goes
	if _, ok := s.ghosts["g1"]; ok || len(s.ghosts) != 2 {
		t.Fatalf("ghosts %v: want g2 and g3", s.ghosts)
	}
	s.ghost("g4", b, t0.Add(ghostKeep), true) // none old: any one goes
	if _, ok := s.ghosts["g4"]; !ok || len(s.ghosts) != 2 {
		t.Fatalf("ghosts %v: want g4 and one other", s.ghosts)
	}
}

// A connection whose Hello was refused at its identity's bound because
// a closed connection still counted as there (probeDead probes a binding
// at most once a second) is bound at a frame of it that comes once a
// probe may find room, instead of being refused (no_hello) for good: a
// Conn does not say Hello again. Only for the incarnation the directory
// holds: a refused Hello of another is not taken from a later frame.
// (Checked to fail: without the memory of refused Hellos, c3's Result
// was rejected, no_hello.)
func TestHelloRefusedAtABoundIsTakenLater(t *testing.T) {
	f := newBoundFixture(t, false, 1000, 2)
	f.probeRouter()
	gen := pid("gen", 0)
	f.mustHello("c1", gen, 1, "")
	f.mustHello("c2", gen, 1, "")
	// A probe just found c1 and c2 there; c1 then closed.
	probed := time.Now()
	f.s.conns["c1"].probedAt, f.s.conns["c2"].probedAt = probed, probed
	if f.hello("c3", gen, 1, "") {
		t.Fatal("c3's Hello taken within a second of the probe: the test does not show the window")
	}
	noHello := f.s.l.Stats().Rejected[RejectNoHello]
	// A second later (the probe times made older), c3's Result comes.
	f.s.conns["c1"].probedAt, f.s.conns["c2"].probedAt = probed.Add(-2*probeEvery), probed.Add(-2*probeEvery)
	f.s.handle("c3", mustEncode(t, result(gen, 1)), "", 1)
	if got := f.in.from(gen); len(got) != 1 || f.s.l.Stats().Rejected[RejectNoHello] != noHello {
		t.Fatalf("c3's Result once a probe may find room: %d delivered, %d rejected (no_hello); want it delivered",
			len(got), f.s.l.Stats().Rejected[RejectNoHello]-noHello)
	}
	if b := f.s.conns["c3"]; b == nil || b.peer != gen || b.inc != 1 {
		t.Fatalf("c3 bound as %+v, want gen/0's incarnation 1", b)
	}

	// A Hello of incarnation 2 refused at the bound (c3 and c5, whose
	// probes are fresh) is not taken from a later frame while the
	// directory holds incarnation 1: the frame is held (its sender took
	// it as sent), and rejected (no_hello) once held for ghostKeep
	// without the directory holding incarnation 2.
	f.mustHello("c5", gen, 1, "")
	for _, b := range f.s.conns {
		b.probedAt = time.Now()
	}
	if f.hello("c4", gen, 2, "") {
		t.Fatal("c4's Hello taken past the bound")
	}
	for _, b := range f.s.conns {
		b.probedAt = b.probedAt.Add(-2 * probeEvery)
	}
	f.s.handle("c4", mustEncode(t, result(gen, 2)), "", 1)
	if n := f.s.l.Stats().Rejected[RejectNoHello] - noHello; n != 0 || len(f.in.from(gen)) != 1 || len(f.s.ghosts["c4"].held) != 1 {
		t.Fatalf("incarnation 2's frame on c4: %d rejected (no_hello), %d of gen/0 delivered, %d held; want 0, 1, 1",
			n, len(f.in.from(gen)), len(f.s.ghosts["c4"].held))
	}
	f.s.retryHeld()
	if n := f.s.l.Stats().Rejected[RejectNoHello] - noHello; n != 0 || len(f.in.from(gen)) != 1 {
		t.Fatalf("incarnation 2's frame on c4, retried: %d rejected (no_hello), %d of gen/0 delivered; want 0, 1", n, len(f.in.from(gen)))
	}
	g := f.s.ghosts["c4"]
	g.heldAt = g.heldAt.Add(-2 * ghostKeep)
	f.s.ghosts["c4"] = g
	f.s.retryHeld()
	if n := f.s.l.Stats().Rejected[RejectNoHello] - noHello; n != 1 || len(f.in.from(gen)) != 1 || f.s.heldBytes != 0 {
		t.Fatalf("incarnation 2's frame on c4, held for ghostKeep: %d rejected (no_hello), %d of gen/0 delivered, %d bytes held; want 1, 1, 0",
			n, len(f.in.from(gen)), f.s.heldBytes)
	}
}
