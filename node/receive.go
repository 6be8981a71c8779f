package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// helloPatience is how many heartbeat intervals a request waits for a
// writer's first Hello before the node logs that it waits.
const helloPatience = 2

// Receive is Engine().Receive with the mistakes this node can see named
// at once instead of at the request's deadline: a writer (a rank of
// req.Context under req.ContextParallel that this rank needs) that is not
// among the node's peers fails the call with ErrUnknownPeer naming it and
// the peers there are, and so does one to be found through etcd (a peer
// of the config without endpoint, or with etcd discovery any writer the
// config does not list) that etcd holds no record of now, saying why (it
// never registered, it left and when, its record was refused; for one
// that never registered, what WaitPeers adds to "not registered": the
// instance's ranks that are registered and the rank to start, or where
// none is, etcd's address, what to check and the ranks of other
// instances registered in the cluster); a writer that has not said
// Hello within 2 heartbeat intervals (for one found through etcd: the
// Hello of the incarnation etcd holds) is logged (with its handshake
// failure, if any) while the request goes on waiting for it. A writer
// that restarted (etcd holds a new record of it after an earlier
// incarnation left) and has not said Hello yet is waited for in Receive,
// at most HeartbeatMisses heartbeat intervals from when its record was
// found, then named (ErrPeerGone): the engine would fail the request at
// once, the earlier incarnation being down. On the in-process link it is
// Engine().Receive. A node opened with SendOnly refuses with ErrSendOnly;
// one whose etcd membership was lost with ErrMembershipLost.
func (n *Node) Receive(ctx context.Context, req kvxfer.ReceiveRequest) (*kvxfer.RxHandle, error) {
	if n.cfg.SendOnly {
		return nil, fmt.Errorf("%w: request %s: its pool is private memory (send_only)", ErrSendOnly, req.ID)
	}
	if n.link == nil {
		return n.eng.Receive(ctx, req)
	}
	if err := n.Err(); err != nil {
		return nil, fmt.Errorf("request %s: %w", req.ID, err)
	}
	if req.Context == n.cfg.instance() {
		// The engine names it (ErrBadRequest: this engine itself); the
		// peers' check below would call the own rank "not among this
		// node's peers".
		return n.eng.Receive(ctx, req)
	}
	derived := false
	if req.ContextParallel == (kvcache.Parallel{}) {
		// Not given: the context instance's own, as this node knows it.
		if p, ok := n.instanceParallel(req.Context); ok {
			req.ContextParallel, derived = p, true
		}
	}
	writers, err := n.writersOf(req)
	if err != nil || req.Context == "" { // the engine names a bad parallelism, and an empty Context, itself
		h, err := n.eng.Receive(ctx, req)
		if err != nil && derived {
			err = fmt.Errorf("%w (the request named no ContextParallel: %s is what context instance %s says it runs as)", err, req.ContextParallel, req.Context)
		}
		return h, err
	}
	var unknown, absent []string
	var silent []Peer
	told := map[string]bool{} // instances notRegisteredHint named as absent
	for _, w := range writers {
		p, ok := n.peer(w)
		switch {
		case !ok && n.configured(w):
			// A peer of this node's config that etcd holds no record of now.
			absent = append(absent, w.String()+" is not in etcd cluster "+n.cfg.Cluster+" "+n.whyAbsent(n.configuredPeer(w), told))
		case !ok:
			if why := n.whyRefused(w); why != "" {
				// A rank of an instance the config lists, whose record
				// this node refused.
				unknown = append(unknown, w.String()+" (its record in etcd cluster "+n.cfg.Cluster+" was refused: "+why+")")
				break
			}
			if n.cfg.etcd() {
				// A rank the config does not list, to be found through
				// etcd, which holds no record of it now.
				absent = append(absent, w.String()+" is not in etcd cluster "+n.cfg.Cluster+" "+n.whyAbsent(requestPeer(req, w), told))
				break
			}
			unknown = append(unknown, w.String())
		case !n.saidHello(w):
			silent = append(silent, p)
		}
	}
	if len(unknown) > 0 || len(absent) > 0 {
		var why []string
		if len(unknown) > 0 {
			var known []string
			for _, p := range n.peers {
				known = append(known, p.id().String())
			}
			for _, r := range n.Members() {
				if !slices.Contains(known, r.Peer().String()) {
					known = append(known, r.Peer().String())
				}
			}
			why = append(why, fmt.Sprintf("writer %s is not among this node's peers (%s)", strings.Join(unknown, ", "), strings.Join(known, ", ")))
		}
		for _, a := range absent {
			why = append(why, "writer "+a)
		}
		return nil, fmt.Errorf("%w: request %s: %s", ErrUnknownPeer, req.ID, strings.Join(why, "; "))
	}
	if len(silent) > 0 {
		if err := n.awaitReturning(ctx, req, silent); err != nil {
			return nil, err
		}
	}
	h, err := n.eng.Receive(ctx, req)
	if err != nil || len(silent) == 0 {
		return h, err
	}
	n.goWatch(func() { n.awaitHello(req.ID, silent, h) })
	return h, nil
}

// helloPoll is how often awaitReturning looks for a Hello.
const helloPoll = 5 * time.Millisecond

// awaitReturning waits for the Hello of each writer among silent that
// restarted: etcd holds a new record of it after an earlier incarnation
// of it left. The engine was told the earlier one is down, and would fail
// the request at once ("writer ctx/0 is down") until the new one speaks;
// the new one registered after it began to listen, so its Hello is due
// within HeartbeatMisses heartbeat intervals of its record. awaitReturning
// waits that long from when the record was found (no longer than the
// request's timeout, ctx or Close), then names a writer still silent
// (ErrPeerGone, its incarnation and when it registered). A writer that
// never left is not waited for here: the request waits for it.
func (n *Node) awaitReturning(ctx context.Context, req kvxfer.ReceiveRequest, silent []Peer) error {
	type ret struct {
		id  messages.PeerID
		rec discovery.Record
		at  time.Time
	}
	var waiting []ret
	iv, misses := n.cfg.heartbeatParams()
	var until time.Time
	for _, p := range silent {
		id := p.id()
		if rec, at, ok := n.returning(id); ok {
			waiting = append(waiting, ret{id, rec, at})
			if due := at.Add(misses * iv); due.After(until) {
				until = due
			}
		}
	}
	if len(waiting) == 0 {
		return nil
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = time.Duration(n.cfg.TransferTimeout)
	}
	if timeout > 0 && time.Now().Add(timeout).Before(until) {
		until = time.Now().Add(timeout)
	}
	if d, ok := ctx.Deadline(); ok && d.Before(until) {
		until = d
	}
	logged := false
	t := time.NewTicker(helloPoll)
	defer t.Stop()
	for {
		waiting = slices.DeleteFunc(waiting, func(r ret) bool { return n.saidHello(r.id) })
		if len(waiting) == 0 {
			return nil
		}
		if !time.Now().Before(until) {
			var who []string
			for _, r := range waiting {
				who = append(who, fmt.Sprintf("%s restarted: etcd cluster %s holds its incarnation %d, found %v ago at %s, which has not said Hello to this node since (due within %d heartbeat intervals of its record)",
					r.id, n.cfg.Cluster, r.rec.Incarnation, time.Since(r.at).Round(time.Millisecond), r.rec.ControlEndpoint, int(misses)))
			}
			return fmt.Errorf("%w: request %s: writer %s", kvxfer.ErrPeerGone, req.ID, strings.Join(who, "; writer "))
		}
		if !logged {
			logged = true
			n.log.Info().Str("request", req.ID).Str("peer", waiting[0].id.String()).
				Msgf("request %s waits for the Hello of %s's new incarnation %d", req.ID, waiting[0].id, waiting[0].rec.Incarnation)
		}
		select {
		case <-n.stop:
			return fmt.Errorf("%w: request %s: node %s closed while the request waited for the Hello of %s's new incarnation", kvxfer.ErrClosed, req.ID, n.cfg.self(), waiting[0].id)
		case <-ctx.Done():
			return fmt.Errorf("request %s: waiting for the Hello of %s's new incarnation: %w", req.ID, waiting[0].id, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// goWatch runs f on a goroutine that Close waits for, unless Close has
// begun (then f does not run).
func (n *Node) goWatch(f func()) {
	n.goMu.Lock()
	defer n.goMu.Unlock()
	if n.closing.Load() {
		return
	}
	n.watch.Add(1)
	go func() {
		defer n.watch.Done()
		f()
	}()
}

// instanceParallel is the parallelism of instance as this node knows it:
// what its rank 0 runs as, else what its other ranks' etcd records say,
// else what this node's config gives its peers; false when the node knows
// none of them. A Receive without a ContextParallel takes it, so that a
// caller that cannot know the context's parallelism (vLLM's decode side:
// the prefill instance's TP is not in a request's kv_transfer_params)
// plans for the writers the context instance has, not for one.
//
// What rank 0 runs as (pipeline split included) is its etcd record while
// etcd holds one (the incarnation etcd has now: the link's Hello of the
// rank may still be an incarnation etcd put out, whose process lives on
// and repeats its Hello), else its Hello, unless etcd put the rank out
// and no incarnation came back. Of the other ranks' records, the newest
// incarnation's: a rank of an earlier deployment of the instance may
// hold its record until its lease runs out.
func (n *Node) instanceParallel(instance string) (kvcache.Parallel, bool) {
	from := func(p messages.Parallel) kvcache.Parallel {
		return kvcache.Parallel{TP: int(p.TP), PP: int(p.PP), Stages: p.Stages}
	}
	rank0 := messages.PeerID{Instance: instance, Rank: 0}
	var p0, newest messages.Parallel
	var newestInc uint64
	n.mu.Lock()
	if f := n.found[rank0]; f != nil {
		p0 = f.rec.Parallel
	}
	_, out0 := n.departed[rank0]
	for id, f := range n.found {
		if id.Instance == instance && f.rec.Parallel != (messages.Parallel{}) && f.rec.Incarnation > newestInc {
			newest, newestInc = f.rec.Parallel, f.rec.Incarnation
		}
	}
	n.mu.Unlock()
	if p0 != (messages.Parallel{}) {
		return from(p0), true
	}
	if !out0 {
		if h, err := n.link.Hello(rank0); err == nil && h.Parallel != (messages.Parallel{}) {
			return from(h.Parallel), true
		}
	}
	if newest != (messages.Parallel{}) {
		return from(newest), true
	}
	for _, p := range n.peers {
		if p.Instance == instance {
			return p.Parallel.orOne().kv(), true
		}
	}
	return kvcache.Parallel{}, false
}

// writersOf are the context ranks this rank needs for req.
func (n *Node) writersOf(req kvxfer.ReceiveRequest) ([]messages.PeerID, error) {
	cp := req.ContextParallel
	if cp.TP == 0 && cp.PP == 0 {
		cp = kvcache.Parallel{TP: 1, PP: 1}
	}
	ranks, err := n.eng.WritersFrom(cp)
	if err != nil {
		return nil, err
	}
	out := make([]messages.PeerID, 0, len(ranks))
	for _, r := range ranks {
		out = append(out, messages.PeerID{Instance: req.Context, Rank: int32(cp.Index(r))})
	}
	return out, nil
}

// peer is the configured peer with identity id, or the peer etcd
// reports up (as its record describes it).
func (n *Node) peer(id messages.PeerID) (Peer, bool) {
	rec, isFound := n.member(id)
	for _, p := range n.peers {
		if p.id() == id {
			if p.Endpoint == "" {
				if !isFound {
					return Peer{}, false
				}
				p.Endpoint = rec.ControlEndpoint
			}
			return p, true
		}
	}
	if isFound {
		return peerOf(rec), true
	}
	return Peer{}, false
}

// configured reports whether id is one of the peers this node's config
// lists.
func (n *Node) configured(id messages.PeerID) bool {
	for _, p := range n.peers {
		if p.id() == id {
			return true
		}
	}
	return false
}

// whyAbsent says, in parentheses, why etcd holds no record of peer p now:
// its record was refused, it left (when and why), or it never registered
// (then followed by notRegisteredHint, told as there).
func (n *Node) whyAbsent(p Peer, told map[string]bool) string {
	id := p.id()
	if why := n.whyRefused(id); why != "" {
		return "(its record was refused: " + why + ")"
	}
	if d, ok := n.departure(id); ok {
		return fmt.Sprintf("(it left %v ago: %s)", time.Since(d.at).Round(time.Millisecond), d.reason)
	}
	return "(it never registered)" + n.notRegisteredHint(p, told)
}

// configuredPeer is the peer of this node's config with identity id.
func (n *Node) configuredPeer(id messages.PeerID) Peer {
	for _, p := range n.peers {
		if p.id() == id {
			return p
		}
	}
	return Peer{Instance: id.Instance}
}

// requestPeer is writer w of req (a rank of req.Context, its index w.Rank
// under req.ContextParallel) as a Peer: instance, parallelism and rank.
func requestPeer(req kvxfer.ReceiveRequest, w messages.PeerID) Peer {
	cp := req.ContextParallel
	if cp.TP == 0 && cp.PP == 0 {
		cp = kvcache.Parallel{TP: 1, PP: 1}
	}
	r := cp.RankAt(int(w.Rank))
	return Peer{Instance: w.Instance, Parallel: Parallel{TP: cp.TP, PP: cp.PP}, Rank: Rank{TP: r.TP, PP: r.PP}}
}

// peerOf is the Peer a record describes.
func peerOf(r discovery.Record) Peer {
	return Peer{Instance: r.Instance, Parallel: Parallel{TP: int(r.Parallel.TP), PP: int(r.Parallel.PP), Stages: r.Parallel.Stages},
		Rank: Rank{TP: int(r.TP), PP: int(r.PP)}, Endpoint: r.ControlEndpoint, PublicKey: r.CurvePublicKey}
}

// saidHello reports whether peer id said Hello (the incarnation etcd
// holds, for a peer etcd found).
func (n *Node) saidHello(id messages.PeerID) bool {
	_, err := n.hello(id)
	return err == nil
}

// heartbeat is the link's heartbeat interval.
func (n *Node) heartbeat() time.Duration {
	if n.cfg.HeartbeatInterval > 0 {
		return time.Duration(n.cfg.HeartbeatInterval)
	}
	return zmq.DefaultHeartbeatInterval
}

// awaitHello logs, once, each writer of request id that has not said
// Hello after helloPatience heartbeat intervals, unless the request ended
// first.
func (n *Node) awaitHello(id string, writers []Peer, h *kvxfer.RxHandle) {
	t := time.NewTimer(helloPatience * n.heartbeat())
	defer t.Stop()
	select {
	case <-n.stop:
		return
	case <-h.Finished(): // never Done: that would take the caller's outcome
		return
	case <-t.C:
	}
	for _, p := range writers {
		w := p.id()
		_, err := n.hello(w)
		if err == nil {
			continue
		}
		ev := n.log.Warn().Str("request", id).Str("peer", w.String()).Str("endpoint", p.Endpoint)
		if oi := (*otherIncarnationError)(nil); errors.As(err, &oi) {
			ev.Msgf("request %s waits for %s at %s: %v", id, w, p.Endpoint, oi)
			continue
		}
		if pv := (*zmq.PeerVersionError)(nil); errors.As(err, &pv) {
			ev.Msgf("request %s waits for %s at %s, which speaks %v: it cannot answer", id, w, p.Endpoint, pv)
			continue
		}
		st, err := n.link.PeerState(w)
		if err == nil && st.Conn == zmq.ConnHandshakeFailed {
			ev.Str("reason", st.Reason).Msgf("request %s waits for %s at %s, whose handshake failed: %s", id, w, p.Endpoint, st.Reason)
			continue
		}
		why := n.silentWhy(st, err) // what WaitPeers would say of it
		if why == "" {
			why = "is it running?"
		}
		ev.Msgf("request %s waits for %s at %s, which has not said Hello after %d heartbeats: %s%s", id, w, p.Endpoint, helloPatience, why, n.unnamedVersion())
	}
}
