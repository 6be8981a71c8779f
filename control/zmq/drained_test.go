package zmq

import (
	"slices"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// drainedLog records OnPeerGoodbye and OnPeerDrained calls, in order.
type drainedLog struct {
	goodbyeLog
	events []string
	drains []goneInc
}

func (g *drainedLog) watch(c *Config) {
	c.OnPeerGoodbye = func(p messages.PeerID, inc uint64, reason string) {
		g.goodbye(p, inc, reason)
		g.mu.Lock()
		g.events = append(g.events, "goodbye")
		g.mu.Unlock()
	}
	c.OnPeerDown = g.down
	c.OnPeerDrained = func(p messages.PeerID, inc uint64) {
		g.mu.Lock()
		g.drains = append(g.drains, goneInc{p, inc})
		g.events = append(g.events, "drained")
		g.mu.Unlock()
	}
}

// reset forgets the proofs and the order told so far.
func (g *drainedLog) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.drains, g.events = nil, nil
}

func (g *drainedLog) drained() []goneInc {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.drains)
}

// A link whose owner said its writes are over (MarkDrained) says so in
// its goodbye, and the peer tells OnPeerDrained for the incarnation its
// Hello named, after OnPeerGoodbye; a link that was not told says a
// plain goodbye, and the peer tells no OnPeerDrained. (Checked to fail:
// without the drained goodbye, no OnPeerDrained came.)
func TestCloseSaysDrainedGoodbyeOnlyWhenMarked(t *testing.T) {
	for _, drained := range []bool{true, false} {
		name := "not marked"
		if drained {
			name = "marked"
		}
		t.Run(name, func(t *testing.T) {
			ctxID, genID := pid("ctx", 0), pid("gen", 0)
			base := Config{Insecure: true, HeartbeatInterval: 20 * time.Millisecond, HeartbeatMisses: 100000}
			ca, cb := base, base
			log := &drainedLog{}
			log.watch(&cb)
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
			if drained {
				a.MarkDrained()
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, patience, "gen's OnPeerGoodbye for ctx/0", func() bool { n, _ := log.counts(); return n > 0 })
			// The listener calls OnPeerDrained right after OnPeerGoodbye,
			// for the same goodbye: once it stopped, every call is in.
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			got := log.drained()
			switch {
			case drained && (!slices.Equal(got, []goneInc{{ctxID, 7}}) || !slices.Equal(log.events, []string{"goodbye", "drained"})):
				t.Fatalf("OnPeerDrained %v (events %v); want ctx/0's incarnation 7, once, after its goodbye", got, log.events)
			case !drained && len(got) != 0:
				t.Fatalf("OnPeerDrained %v for a goodbye whose link was not marked drained; want none", got)
			}
		})
	}
}

// drainedGoodbye hands the listener a drained goodbye of gen/0 naming
// incarnation inc on connection conn authenticated with key.
func (f *departedFixture) drainedGoodbye(conn string, inc uint64, key string) {
	f.t.Helper()
	f.s.handle(conn, mustEncode(f.t, &messages.Heartbeat{From: f.peer, Seq: 1, FromIncarnation: inc, Leaving: true, Drained: true}), key, 1)
	f.s.goodbyes() // the ROUTER found empty
}

// A drained goodbye proves only as its connection's own: one naming
// another sender, another incarnation than its connection's, on a
// connection without Hello, or on an earlier incarnation's connection is
// rejected as any goodbye is and tells no OnPeerDrained. The genuine one
// tells it, for the connection's incarnation, after OnPeerGoodbye; one
// that is no news as a goodbye — a repeat, an incarnation down by
// silence, one that left the cluster — still tells it (its proof is
// news), without a second Down. A plain goodbye never tells it.
// (Checked to fail: with every taken goodbye taken as drained, the plain
// one told OnPeerDrained.)
func TestForgedDrainedGoodbyesProveNothing(t *testing.T) {
	f := newDepartedFixture(t)
	log := &drainedLog{}
	log.watch(&f.s.l.cfg)
	none := func(what string) {
		t.Helper()
		if d := log.drained(); len(d) != 0 {
			t.Fatalf("%s: OnPeerDrained %v; want none", what, d)
		}
		if byes, downs := log.counts(); byes+downs != 0 {
			t.Fatalf("%s: %d goodbyes and %d downs told", what, byes, downs)
		}
	}
	other := pid("gen", 1)
	before := f.rejected(RejectIdentity)
	f.s.handle("c1", mustEncode(t, &messages.Heartbeat{From: other, Seq: 1, FromIncarnation: 1, Leaving: true, Drained: true}), f.old.public, 1)
	f.s.goodbyes()
	if f.rejected(RejectIdentity) != before+1 {
		t.Fatal("a drained goodbye of gen/1 with gen/0's key was not rejected (identity)")
	}
	none("a drained goodbye of gen/1 with gen/0's key")
	before = f.rejected(RejectSender)
	f.drainedGoodbye("c1", 2, f.old.public)
	if f.rejected(RejectSender) != before+1 {
		t.Fatal("a drained goodbye of incarnation 2 on incarnation 1's connection was not rejected (sender)")
	}
	none("a drained goodbye of incarnation 2 on incarnation 1's connection")
	before = f.rejected(RejectNoHello)
	f.drainedGoodbye("c9", 1, f.old.public)
	if f.rejected(RejectNoHello) != before+1 {
		t.Fatal("a drained goodbye before Hello was not rejected (no_hello)")
	}
	none("a drained goodbye before Hello")

	// gen/0 restarts (incarnation 2); incarnation 1's drained goodbye, on
	// its own connection, is rejected as a goodbye (the directory holds
	// incarnation 2, which it must not take down) but is incarnation 1's
	// own word about its writes: proof for incarnation 1 alone.
	f.clock.advance(time.Second)
	f.hello("c2", 2, f.old.public)
	before = f.rejected(RejectGoodbye)
	f.drainedGoodbye("c1", 1, f.old.public)
	if f.rejected(RejectGoodbye) != before+1 {
		t.Fatal("the earlier incarnation's drained goodbye was not rejected (goodbye)")
	}
	if byes, downs := log.counts(); byes+downs != 0 || !slices.Equal(log.drained(), []goneInc{{f.peer, 1}}) {
		t.Fatalf("the earlier incarnation's drained goodbye: %d goodbyes, %d downs, OnPeerDrained %v; want none, none, incarnation 1",
			byes, downs, log.drained())
	}
	if _, err := f.s.l.Hello(f.peer); err != nil {
		t.Fatalf("incarnation 2 after incarnation 1's drained goodbye: %v", err)
	}
	log.reset()

	// A plain goodbye takes incarnation 2 down and proves nothing; its
	// drained goodbye after it (no news as a goodbye) proves.
	f.goodbye("c2", 2, f.old.public)
	if byes, _ := log.counts(); byes != 1 || len(log.drained()) != 0 {
		t.Fatalf("a plain goodbye: %d goodbyes, OnPeerDrained %v; want 1 goodbye, no OnPeerDrained", byes, log.drained())
	}
	f.drainedGoodbye("c2", 2, f.old.public)
	if byes, downs := log.counts(); byes != 1 || downs != 0 || !slices.Equal(log.drained(), []goneInc{{f.peer, 2}}) {
		t.Fatalf("incarnation 2's drained goodbye after its plain one: %d goodbyes, %d downs, OnPeerDrained %v; want 1, 0, incarnation 2 once",
			byes, downs, log.drained())
	}

	// Incarnation 3: a drained goodbye takes it down, then proves.
	f.hello("c3", 3, f.old.public)
	f.drainedGoodbye("c3", 3, f.old.public)
	log.mu.Lock()
	events := slices.Clone(log.events)
	log.mu.Unlock()
	if want := []string{"goodbye", "drained", "goodbye", "drained"}; !slices.Equal(events, want) {
		t.Fatalf("events %v, want %v: incarnation 3's drained goodbye tells its Down, then its proof", events, want)
	}
	if d := log.drained(); !slices.Equal(d, []goneInc{{f.peer, 2}, {f.peer, 3}}) {
		t.Fatalf("OnPeerDrained %v, want incarnations 2 and 3", d)
	}

	// Incarnation 4 leaves the cluster first (etcd's Down: its lease
	// revoke comes before its goodbye): its drained goodbye is no news
	// as a goodbye, but proves.
	f.hello("c4", 4, f.old.public)
	f.s.l.RemovePeer(f.peer)
	f.drainedGoodbye("c4", 4, f.old.public)
	if byes, _ := log.counts(); byes != 2 {
		t.Fatalf("the departed incarnation's drained goodbye told a goodbye (%d)", byes)
	}
	if d := log.drained(); !slices.Equal(d, []goneInc{{f.peer, 2}, {f.peer, 3}, {f.peer, 4}}) {
		t.Fatalf("OnPeerDrained %v, want incarnations 2, 3 and 4", d)
	}
}
