package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// ErrMembershipLost: this node's own etcd record is gone (its lease
// expired or could not be renewed, its key was deleted or taken over).
// Every peer has taken its incarnation out of the cluster; the node failed
// its requests and must be closed (a new Open registers a new
// incarnation).
var ErrMembershipLost = errors.New("node: membership lost")

// found is a peer rank etcd reported up, and what the node knows of it.
type found struct {
	rec discovery.Record
	// at is when the node found this record (wall clock).
	at time.Time
	// hello: the Hello of this incarnation's link arrived and was checked.
	hello bool
	// linked: this node's own connection to the peer completed its
	// handshake (PeerState up) since it was found; until then a refused
	// handshake is redialed, whether or not the peer's Hello came.
	linked bool
	// redialed is when the node last redialed the peer after a refused
	// handshake.
	redialed time.Time
	// otherHello is the incarnation of the last Hello of another
	// incarnation than rec's that tend logged (0: none).
	otherHello uint64
}

// otherIncarnationError: the Hello the link holds of a peer is of an
// incarnation whose etcd record left, while etcd holds another record of
// the peer now: a departed incarnation's Hello (its process lives on and
// repeats it). A node registers the incarnation its engine says Hello
// with, so the two tie.
type otherIncarnationError struct {
	Peer messages.PeerID
	// Hello is the Hello's incarnation, Record the record's.
	Hello, Record uint64
}

func (e *otherIncarnationError) Error() string {
	return fmt.Sprintf("the Hello of %s is of incarnation %d, whose etcd record left; etcd holds incarnation %d "+
		"(a departed incarnation's Hello, whose process still talks)", e.Peer, e.Hello, e.Record)
}

// maxPastIncs bounds the departed incarnations remembered per peer.
const maxPastIncs = 8

// maxDepartedPeers bounds the peers whose departures (departed, pastIncs)
// the node remembers: those that left etcd last. A var for tests.
var maxDepartedPeers = 4096

// notePastLocked remembers that incarnation inc of peer id left etcd. Of
// the peers that left, only the maxDepartedPeers that left last are
// remembered (pastIncs and departed): the oldest departure is forgotten
// first. Callers hold n.mu.
func (n *Node) notePastLocked(id messages.PeerID, inc uint64) {
	if i := slices.Index(n.pastOrder, id); i >= 0 {
		n.pastOrder = slices.Delete(n.pastOrder, i, i+1)
	}
	n.pastOrder = append(n.pastOrder, id)
	for len(n.pastOrder) > maxDepartedPeers {
		oldest := n.pastOrder[0]
		n.pastOrder = slices.Delete(n.pastOrder, 0, 1)
		delete(n.pastIncs, oldest)
		delete(n.departed, oldest)
		if _, back := n.found[oldest]; !back {
			// Its agent address goes with it (a Hello of its next
			// incarnation notes it again): agents stays bounded by the
			// peers found and the departed ones remembered.
			delete(n.agents, oldest)
			// Its watch goes too, once no exit of its processes can
			// come any more (a peer of another host, or one whose
			// process exited): one whose process lives may still be
			// proof, and its process still disputed.
			if w := n.watched[oldest]; w != nil && len(w.pending()) == 0 {
				delete(n.watched, oldest)
			} else if w != nil {
				w.forgotten = true // it goes at the last exit (writerExited)
			}
		}
	}
	past := n.pastIncs[id]
	if slices.Contains(past, inc) {
		return
	}
	if len(past) >= maxPastIncs {
		past = slices.Delete(past, 0, 1)
	}
	n.pastIncs[id] = append(past, inc)
}

// otherIncarnation is the error for Hello h of peer id when it is of an
// incarnation of id whose record left etcd, other than rec, the record
// etcd holds of id now; nil otherwise. Only a departed record's
// incarnation is decidable: a node of an earlier version registered
// another incarnation than its Hello's, which ties to no record at all
// and is taken as before (the record's).
func (n *Node) otherIncarnation(id messages.PeerID, h *messages.Hello, rec discovery.Record) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.otherIncarnationLocked(id, h, rec)
}

func (n *Node) otherIncarnationLocked(id messages.PeerID, h *messages.Hello, rec discovery.Record) error {
	if h.Incarnation == 0 || h.Incarnation == rec.Incarnation || !slices.Contains(n.pastIncs[id], h.Incarnation) {
		return nil
	}
	return &otherIncarnationError{Peer: id, Hello: h.Incarnation, Record: rec.Incarnation}
}

// hello is the link's Hello of peer id, unless etcd holds a record of id
// of another incarnation (then an *otherIncarnationError).
func (n *Node) hello(id messages.PeerID) (*messages.Hello, error) {
	h, err := n.link.Hello(id)
	if err != nil {
		return nil, err
	}
	if rec, ok := n.member(id); ok {
		if err := n.otherIncarnation(id, h, rec); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// register opens the etcd registry, registers this node's record and
// then starts the membership goroutine. The link listens already, so the
// record carries the real endpoint. On error the registry is closed.
func (n *Node) register(ctx context.Context) error {
	opts, err := n.cfg.EtcdOptions()
	if err != nil {
		return err
	}
	ttl := discovery.DefaultTTL
	if n.cfg.DiscoveryTTL > 0 {
		ttl = time.Duration(n.cfg.DiscoveryTTL)
		opts = append(opts, discovery.WithTTL(ttl))
	}
	opts = append(opts, discovery.WithOnHeld(func(held discovery.Record) {
		at := held.ControlEndpoint
		if at == "" { // a record this build cannot read: its holder's incarnation key names it
			at = "an endpoint this kvxfer cannot read (a later kvxfer's record)"
		}
		n.log.Warn().Str("cluster", n.cfg.Cluster).Uint64("holder", held.Incarnation).Str("holder_endpoint", held.ControlEndpoint).
			Msgf("%s is held in etcd cluster %s by incarnation %d at %s, whose lease is live: waiting for it to go. "+
				"Another process runs as %s (same instance and rank?), or this rank's previous run has not been gone for its lease TTL (%v) yet",
				held.Peer(), n.cfg.Cluster, held.Incarnation, at, held.Peer(), ttl)
	}))
	reg, err := discovery.Open(ctx, n.cfg.Discovery, n.cfg.Cluster, nil, opts...)
	if err != nil {
		return fmt.Errorf("node: discovery = %q: %w", n.cfg.Discovery, err)
	}
	n.reg = reg
	// The record's incarnation is the engine's (its Hello's): a peer ties
	// a Hello to the record of the same incarnation, and knows one of
	// another incarnation for a departed incarnation's.
	h := n.eng.Hello()
	rec := discovery.Record{Instance: h.From.Instance, Rank: h.From.Rank, Incarnation: h.Incarnation,
		ControlEndpoint: n.link.Endpoint(), CurvePublicKey: n.link.PublicKey(), Backend: h.Backend,
		AgentAddr: h.AgentAddr, LayoutHash: h.LayoutHash, Parallel: h.Parallel, TP: h.TP, PP: h.PP}
	if err := reg.Register(ctx, rec); err != nil {
		return fmt.Errorf("node: registering %s in etcd cluster %s: %w", rec, n.cfg.Cluster, err)
	}
	n.mu.Lock()
	n.self = rec
	n.mu.Unlock()
	// Only now are the peers wired (peerUp: the link dials them and says
	// Hello): a process whose Register waits — its rank's key held by a
	// live lease — may be a second process of a rank that runs (the same
	// config started twice), and its Hello, then its goodbye as its Open
	// fails, would take the live rank's place at every peer (its requests
	// failed, its frames refused as an earlier incarnation's). The events
	// wait in the registry's queue meanwhile.
	n.injected, n.membershipDone = make(chan injectedEvent), make(chan struct{})
	n.watch.Add(1)
	go n.membership()
	n.log.Info().Str("cluster", n.cfg.Cluster).Uint64("incarnation", rec.Incarnation).Str("endpoint", rec.ControlEndpoint).
		Msgf("registered %s in etcd cluster %s", rec, n.cfg.Cluster)
	return nil
}

// membership is the node's membership goroutine: it acts on the
// registry's events and, every tick, checks the Hellos of peers etcd
// found (and redials one whose handshake this node's key lost a race
// for). It ends when the registry's events close.
//
// The tick runs only while a peer is left to tend: an idle node whose
// peers all said Hello over connections that are up does not wake for it.
func (n *Node) membership() {
	defer n.watch.Done()
	defer close(n.membershipDone)
	t := time.NewTicker(tendEvery)
	defer t.Stop()
	evs := n.reg.Events()
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				if err := n.reg.Err(); err != nil && !n.closing.Load() {
					n.fail(fmt.Errorf("%w: registry stopped: %w", ErrMembershipLost, err))
				}
				return
			}
			n.apply(ev)
			if n.cfg.OnMembership != nil {
				n.cfg.OnMembership(ev)
			}
			t.Reset(tendEvery)
		case in := <-n.injected:
			n.apply(in.ev)
			t.Reset(tendEvery)
			close(in.done)
		case <-t.C:
			if !n.tend() {
				t.Stop() // until the next event
			}
		}
	}
}

// peerUpHook, when set (tests), runs first in peerUp, given the node's
// instance and the record found: a test delays a node's wiring of its
// peers to widen the race between a restarted peer's Listen and its
// admitting this node's key.
var peerUpHook atomic.Pointer[func(self string, rec discovery.Record)]

// waitReachedHook, when set (tests), runs each time WaitPeers finds a
// peer reached (its connection up).
var waitReachedHook atomic.Pointer[func(id messages.PeerID)]

// peerStateHook, when set (tests), is what WaitPeers (and its waits)
// take for the link's PeerState of a peer, given the link's answer.
var peerStateHook atomic.Pointer[func(id messages.PeerID, st zmq.PeerState, err error) (zmq.PeerState, error)]

// awaitHook, when set (tests), runs as WaitPeers begins awaitOurHello
// ("hello") or awaitOurRefusals ("refusals") for peer id.
var awaitHook atomic.Pointer[func(what string, id messages.PeerID)]

// tendEvery is how often the membership goroutine tends the peers etcd
// found while one is left to tend.
const tendEvery = 20 * time.Millisecond

// injectedEvent is a test's registry event (Apply) for the membership
// goroutine; done is closed once it was applied.
type injectedEvent struct {
	ev   discovery.Event
	done chan struct{}
}

// apply acts on one registry event.
func (n *Node) apply(ev discovery.Event) {
	switch ev.Kind {
	case discovery.EventUp:
		n.peerUp(ev.Record)
	case discovery.EventDown:
		id := messages.PeerID{Instance: ev.Instance, Rank: ev.Rank}
		n.mu.Lock()
		f, ok := n.found[id]
		var foundInc uint64
		if ok {
			foundInc = f.rec.Incarnation
		}
		gone := ok && foundInc == ev.Incarnation
		if gone {
			delete(n.found, id)
			n.departed[id] = departure{at: time.Now(), reason: ev.Reason}
			n.notePastLocked(id, ev.Incarnation)
		}
		n.mu.Unlock()
		if !ok {
			return // a record this node refused
		}
		if !gone {
			// Another incarnation than the one found (the registry sends
			// a rank's Down before its successor's Up, so this is not
			// expected): the one found is up, and its requests are not
			// this Down's to fail.
			n.log.Debug().Str("peer", id.String()).Uint64("incarnation", ev.Incarnation).Uint64("found", foundInc).Str("reason", ev.Reason).
				Msgf("Down of incarnation %d of %s ignored: etcd holds incarnation %d of it", ev.Incarnation, id, foundInc)
			return
		}
		if n.link != nil {
			// The link forgets it: no more heartbeats or redials to it
			// (a socket and a monitor each), and its name is free for
			// a new incarnation with another key. Its connections' last
			// frames are still accepted. A superseding incarnation's Up
			// comes after this Down and adds it afresh; one whose Hello
			// came first stays (RemovePeerIncarnation).
			n.link.RemovePeerIncarnation(id, ev.Incarnation)
		}
		// That incarnation's requests fail, not those of a later one
		// whose Hello came first (a quick restart at the same endpoint,
		// before the old lease expired).
		n.eng.PeerIncarnationDown(id, ev.Incarnation, fmt.Sprintf("is out of etcd cluster %s (%s)", n.cfg.Cluster, ev.Reason))
		lvl := n.log.Warn()
		if ev.Reason == discovery.ReasonLeft {
			lvl = n.log.Info() // a peer that closed: the end of every run, no fault
		}
		lvl.Str("peer", id.String()).Uint64("incarnation", ev.Incarnation).Str("reason", ev.Reason).
			Msgf("peer %s is out of etcd cluster %s (%s): its requests fail", id, n.cfg.Cluster, ev.Reason)
		if succeeded(n.link, id, ev.Incarnation) {
			// A restart said Hello first: the peer is up, as a
			// predecessor's exit (exit.go) tells the application.
			return
		}
		if ev.Reason == discovery.ReasonLeft && n.cfg.OnPeerGoodbye != nil {
			// Its Close withdrew its record first: the goodbye its link
			// says next is no news to the link, unless it names a
			// reason (zmq.Config.OnPeerGoodbye).
			n.cfg.OnPeerGoodbye(id.Instance, int(id.Rank), "")
		}
		if n.cfg.OnPeerDown != nil {
			n.cfg.OnPeerDown(id.Instance, int(id.Rank))
		}
	case discovery.EventRejected:
		n.log.Warn().Str("key", ev.Key).Err(ev.Err).Msgf("etcd value at %s refused: %v", ev.Key, ev.Err)
	case discovery.EventLost:
		if n.closing.Load() {
			return // Close withdrew the record
		}
		why := ev.Reason
		if why == discovery.ReasonKeepaliveStopped {
			ttl := discovery.DefaultTTL
			if n.cfg.DiscoveryTTL > 0 {
				ttl = time.Duration(n.cfg.DiscoveryTTL)
			}
			why += fmt.Sprintf(": this rank could not renew its lease at %s (etcd stopped or unreachable for a TTL, %v, or the lease revoked)",
				n.cfg.Discovery, ttl)
		}
		n.fail(fmt.Errorf("%w: %s in etcd cluster %s: %s", ErrMembershipLost, n.cfg.self(), n.cfg.Cluster, why))
	}
}

// parallelHint names the flags whose values differ between a peer's
// parallelism (got) and the one this node expects of it (want), both
// normalized: the peer's --tp, --pp or --pp-stages against this node's
// --peer-tp, --peer-pp or --peer-pp-stages; where they agree, the rank's
// coordinates (--tp-rank, --pp-rank) put it elsewhere.
func parallelHint(got, want kvcache.Parallel) string {
	var c []string
	if got.TP != want.TP {
		c = append(c, "the peer's --tp with this node's --peer-tp")
	}
	if got.PP != want.PP {
		c = append(c, "the peer's --pp with this node's --peer-pp")
	} else if got.Stages != want.Stages {
		c = append(c, "the peer's --pp-stages with this node's --peer-pp-stages")
	}
	if len(c) == 0 {
		return "compare the peer's --tp-rank and --pp-rank with its rank"
	}
	return "compare " + strings.Join(c, ", and ")
}

// peerUp wires a peer etcd found into the control link: its key admitted
// at the handshake and bound to its rank, then its endpoint (so that the
// link dials it with the key known).
func (n *Node) peerUp(rec discovery.Record) {
	if h := peerUpHook.Load(); h != nil {
		(*h)(n.cfg.instance(), rec)
	}
	id := rec.Peer()
	if id.Instance == n.cfg.instance() {
		// This node, or a rank of its own instance: KV moves between
		// instances. A sibling rank started with another --tp is named
		// here, where its peers' refusal of it would otherwise be the
		// only word of it.
		own := n.cfg.Parallel.orOne()
		if rec.Parallel != (messages.Parallel{}) && (rec.Parallel.TP != int32(own.TP) || rec.Parallel.PP != int32(own.PP)) {
			n.log.Error().Str("peer", id.String()).Msgf("rank %s of this instance registered as TP%d/PP%d, this rank runs TP%d/PP%d: give every rank of %s the same --tp and --pp",
				id, rec.Parallel.TP, rec.Parallel.PP, own.TP, own.PP, id.Instance)
		}
		return
	}
	lg := n.log.With().Str("peer", id.String()).Uint64("incarnation", rec.Incarnation).Logger()
	refuse := func(format string, args ...any) {
		why := fmt.Sprintf(format, args...)
		lg.Error().Msgf("etcd record of %s refused: %s", id, why)
		n.mu.Lock()
		n.refused[id] = why
		n.mu.Unlock()
	}
	// A rank this node's config lists must be the rank it expects: the
	// same parallelism (the peer's --tp, this side's --peer-tp) and the
	// same coordinates. Ranks of one instance that disagree would move
	// KV for another head split and fail only at each request's Result.
	// A rank the config does not list, of an instance it lists ranks of,
	// must run as that instance's configured parallelism too, at the
	// coordinates of its rank there: it would be dialed and planned for
	// as a writer of that instance.
	if rec.Parallel != (messages.Parallel{}) {
		layers := n.eng.Layout().Layers
		got := kvcache.Parallel{TP: int(rec.Parallel.TP), PP: int(rec.Parallel.PP), Stages: rec.Parallel.Stages}
		at := kvcache.Rank{TP: int(rec.TP), PP: int(rec.PP)}
		var listed, sibling *Peer
		for i, p := range n.peers {
			if p.id() == id {
				listed = &n.peers[i]
				break
			}
			if p.Instance == id.Instance && sibling == nil {
				sibling = &n.peers[i]
			}
		}
		switch {
		case listed != nil:
			want := listed.Parallel.orOne().kv().Normal(layers)
			if got.Normal(layers) != want || at != listed.Rank.kv() {
				refuse("it registered as rank tp%d/pp%d of %v, this node expects rank tp%d/pp%d of %v (%s)",
					rec.TP, rec.PP, got, listed.Rank.TP, listed.Rank.PP, want, parallelHint(got.Normal(layers), want))
				return
			}
		case sibling != nil:
			want := sibling.Parallel.orOne().kv().Normal(layers)
			if got.Normal(layers) != want {
				refuse("it registered as rank tp%d/pp%d of %v, but this node's config gives instance %s %v (%s)",
					rec.TP, rec.PP, got, id.Instance, want, parallelHint(got.Normal(layers), want))
				return
			}
			if want.Index(at) != int(id.Rank) {
				refuse("it registered as rank tp%d/pp%d of %v, which is rank %d of %s, not %d",
					rec.TP, rec.PP, got, want.Index(at), id.Instance, id.Rank)
				return
			}
		}
	}
	if pinned, ok := n.pinnedKey(id); ok && pinned != rec.CurvePublicKey {
		refuse("its CURVE key %.8s… is not the key this node's config pins (%.8s…)", rec.CurvePublicKey, pinned)
		return
	}
	if !n.cfg.Insecure {
		if rec.CurvePublicKey == "" {
			refuse("it has no CURVE key but this node uses CURVE (is %s insecure?)", id)
			return
		}
		if err := n.link.AllowKey(rec.CurvePublicKey); err != nil {
			refuse("%v", err)
			return
		}
		if err := n.link.SetPeerServerKey(id, rec.CurvePublicKey); err != nil {
			refuse("%v", err)
			return
		}
	}
	if err := n.link.AddPeer(id, rec.ControlEndpoint); err != nil {
		refuse("%v", err)
		return
	}
	// A new record may be a new incarnation at the endpoint (and with the
	// key) of one this node is connected to: that connection, and what the
	// link says of it (up), are the previous incarnation's until its
	// monitor is read, and libzmq's own reconnection to the new one may be
	// refused at its handshake (it has not admitted this node's key yet)
	// and never retried. A fresh dial makes tend judge the connection
	// this incarnation answered. (A first dial takes it as its own.)
	_ = n.link.Redial(id)
	n.mu.Lock()
	n.found[id] = &found{rec: rec, at: time.Now()}
	delete(n.refused, id)
	delete(n.departed, id)
	n.mu.Unlock()
	lg.Info().Str("endpoint", rec.ControlEndpoint).Msgf("peer %s found in etcd cluster %s at %s", id, n.cfg.Cluster, rec.ControlEndpoint)
}

// pinnedKey is the public key the config gives for peer id, if any.
func (n *Node) pinnedKey(id messages.PeerID) (string, bool) {
	k, ok := n.pinned[id]
	return k, ok
}

// tend checks the peers etcd found until each said Hello and this node's
// own connection to it is up: a Hello is checked (model) and logged once;
// a heartbeat refused at the peer's handshake (it had not learned this
// node's key yet) is redialed, at most once per heartbeat interval — also
// when the peer's Hello came first (its connection to us is not ours to
// it: the peer would never hear this node's Hello). It reports whether a
// peer is still left to tend.
func (n *Node) tend() (more bool) {
	n.mu.Lock()
	var wait []messages.PeerID
	for id, f := range n.found {
		if !f.hello || !f.linked {
			wait = append(wait, id)
		}
	}
	n.mu.Unlock()
	for _, id := range wait {
		if h, err := n.link.Hello(id); err == nil {
			n.mu.Lock()
			f := n.found[id]
			var other error
			if f != nil {
				other = n.otherIncarnationLocked(id, h, f.rec)
			}
			// A Hello of another incarnation is not the found one's: it
			// is neither checked nor taken for it.
			first := f != nil && !f.hello && other == nil
			if first {
				f.hello = true
			}
			tell := other != nil && f.otherHello != h.Incarnation
			if tell {
				f.otherHello = h.Incarnation
			}
			n.mu.Unlock()
			if tell {
				n.log.Warn().Str("peer", id.String()).Uint64("hello_incarnation", h.Incarnation).
					Msgf("%v: waiting for the Hello of the incarnation etcd holds", other)
			}
			if first {
				if err := n.eng.CheckPeer(h); err != nil {
					n.log.Error().Err(err).Str("peer", id.String()).Msg(n.incompatible(h))
				} else {
					n.log.Info().Str("peer", id.String()).Str("model", h.Model).Msg("peer said Hello")
				}
			}
		}
		st, err := n.link.PeerState(id)
		if errors.Is(err, zmq.ErrNoHeartbeats) {
			st.Conn = zmq.ConnUp // no connection of ours is watched: nothing to redial
		} else if err != nil {
			continue
		}
		if st.Conn == zmq.ConnUp {
			n.mu.Lock()
			if f := n.found[id]; f != nil {
				f.linked = true
			}
			n.mu.Unlock()
			continue
		}
		if st.Conn != zmq.ConnHandshakeFailed {
			continue
		}
		n.mu.Lock()
		f := n.found[id]
		again := f != nil && time.Since(f.redialed) >= n.heartbeat()
		if again {
			f.redialed = time.Now()
		}
		n.mu.Unlock()
		if again {
			n.log.Debug().Str("peer", id.String()).Str("reason", st.Reason).Msg("redialing an etcd peer whose handshake refused this node")
			_ = n.link.Redial(id)
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, f := range n.found {
		if !f.hello || !f.linked {
			return true
		}
	}
	return false
}

// fail marks the node failed (Err) once: it logs why and fails every
// request with every peer it knows (Engine.PeerDown), so that its writers
// stop posting and their endpoints close.
func (n *Node) fail(err error) {
	n.mu.Lock()
	if n.err != nil {
		n.mu.Unlock()
		return
	}
	n.err = err
	var peers []messages.PeerID
	for id := range n.found {
		peers = append(peers, id)
	}
	for _, p := range n.peers {
		peers = append(peers, p.id())
	}
	n.mu.Unlock()
	n.log.Error().Err(err).Msg("this node is out of the cluster: its requests fail; close it and open a new one")
	for _, p := range peers {
		n.eng.PeerDownBecause(p, "is out of reach: this node left the cluster ("+err.Error()+")")
	}
}

// Err is nil while the node is a member; after its etcd membership was
// lost (ErrMembershipLost) it says why. The node then fails its requests
// and must be closed.
func (n *Node) Err() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.err
}

// Incarnation is the incarnation this node registered in etcd (0 with
// static discovery).
func (n *Node) Incarnation() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.self.Incarnation
}

// Members are the peer ranks etcd reports up now (none with static
// discovery).
func (n *Node) Members() []discovery.Record {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]discovery.Record, 0, len(n.found))
	for _, f := range n.found {
		out = append(out, f.rec)
	}
	return out
}

// member is the record of an etcd peer up now.
func (n *Node) member(id messages.PeerID) (discovery.Record, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f := n.found[id]; f != nil {
		return f.rec, true
	}
	return discovery.Record{}, false
}

// returning is the record of peer id and when the node found it, when
// etcd holds a record of id whose incarnation has not said Hello yet and
// an earlier incarnation of id left etcd (the engine was told it is down,
// and refuses requests it writes for until the new incarnation's Hello).
// One that said Hello and fell silent since is not returning: it is down.
func (n *Node) returning(id messages.PeerID) (discovery.Record, time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f := n.found[id]; f != nil && !f.hello && len(n.pastIncs[id]) > 0 {
		return f.rec, f.at, true
	}
	return discovery.Record{}, time.Time{}, false
}

// whyRefused says why this node refused the latest etcd record of id
// ("" if it did not).
func (n *Node) whyRefused(id messages.PeerID) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.refused[id]
}

// departure is when and why a peer's record left etcd.
type departure struct {
	at     time.Time
	reason string
}

// departure reports whether peer id's record left etcd and has not come
// back, and when and why.
func (n *Node) departure(id messages.PeerID) (departure, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	d, ok := n.departed[id]
	return d, ok
}

// registeredOf are the ranks of instance etcd reports up now, by rank.
func (n *Node) registeredOf(instance string) []messages.PeerID {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []messages.PeerID
	for id := range n.found {
		if id.Instance == instance {
			out = append(out, id)
		}
	}
	slices.SortFunc(out, func(a, b messages.PeerID) int { return int(a.Rank) - int(b.Rank) })
	return out
}

// missingRankHint is what WaitPeers adds to peer p's "(not registered in
// etcd cluster C)" when other ranks of p's instance are registered: the
// instance runs, one of its ranks was not started. "" when none is.
func (n *Node) missingRankHint(p Peer) string {
	ids := n.registeredOf(p.Instance)
	if len(ids) == 0 {
		return ""
	}
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = id.String()
	}
	verb := "is"
	if len(ids) > 1 {
		verb = "are"
	}
	par := p.Parallel.orOne()
	cli := fmt.Sprintf("--tp %d --tp-rank %d", par.TP, p.Rank.TP)
	if par.PP > 1 {
		cli += fmt.Sprintf(" --pp %d --pp-rank %d", par.PP, p.Rank.PP)
	}
	return fmt.Sprintf(": of instance %s (%s), %s %s registered, this rank is not: start rank tp%d/pp%d of instance %s (the CLI: %s)",
		p.Instance, par, strings.Join(names, ", "), verb, p.Rank.TP, p.Rank.PP, p.Instance, cli)
}

// maxNamedRanks bounds the registered ranks notRegisteredHint names.
const maxNamedRanks = 8

// notRegisteredHint is what follows peer p's "(not registered in etcd
// cluster C)" in WaitPeers and Receive. Where other ranks of p's instance
// are registered it is missingRankHint (the instance runs, one of its
// ranks was not started). Where none is, it names the etcd the node
// registered at, asks whether that instance's process runs with this
// cluster and that instance name, and names the ranks of other instances
// that are registered in the cluster (a misspelt instance name shows
// there; the CLI adds where another --cluster holds the instance). told
// holds the instances one message already gave that hint (each is given
// it once); nil gives it always.
func (n *Node) notRegisteredHint(p Peer, told map[string]bool) string {
	if h := n.missingRankHint(p); h != "" {
		return h
	}
	if told != nil {
		if told[p.Instance] {
			return ""
		}
		told[p.Instance] = true
	}
	return fmt.Sprintf(": no rank of instance %s is registered there (etcd at %s): is the %s process running, started with cluster %s and instance name %q? Ranks of other instances registered in %s: %s",
		p.Instance, n.cfg.Discovery, p.Instance, n.cfg.Cluster, p.Instance, n.cfg.Cluster, n.othersRegistered())
}

// othersRegistered names the ranks of other instances than this node's
// that etcd reports up in its cluster, sorted, at most maxNamedRanks of
// them ("none" when there is none).
func (n *Node) othersRegistered() string {
	n.mu.Lock()
	ids := make([]messages.PeerID, 0, len(n.found))
	for id := range n.found {
		ids = append(ids, id)
	}
	n.mu.Unlock()
	if len(ids) == 0 {
		return "none"
	}
	slices.SortFunc(ids, func(a, b messages.PeerID) int {
		if c := strings.Compare(a.Instance, b.Instance); c != 0 {
			return c
		}
		return int(a.Rank) - int(b.Rank)
	})
	names := make([]string, 0, min(len(ids), maxNamedRanks))
	for _, id := range ids[:min(len(ids), maxNamedRanks)] {
		names = append(names, id.String())
	}
	out := strings.Join(names, ", ")
	if more := len(ids) - len(names); more > 0 {
		out += fmt.Sprintf(" and %d more", more)
	}
	return out
}

// foundEndpoint is the endpoint of an etcd peer up now.
func (n *Node) foundEndpoint(id messages.PeerID) (string, bool) {
	r, ok := n.member(id)
	return r.ControlEndpoint, ok
}
