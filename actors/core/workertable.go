package core

import "slices"

// WorkerTable is a sender worker's state and decisions, without I/O: its
// open endpoints by peer address, the Connect running for an address with
// what waits for it (in arrival order), and the ops it has in flight with
// their session and endpoint. The worker's shell (actors) connects,
// posts, flushes and closes on other goroutines and reports back; the
// table says what each report and each request leads to. S names a
// session (a PID in actors), E is an open endpoint.
type WorkerTable[S comparable, E any] struct {
	eps        map[string]E
	connecting map[string][]any
	inflight   map[OpRef]workerOp[S]
}

type workerOp[S comparable] struct {
	session S
	key     string
}

// SessionOps are ops of one session.
type SessionOps[S comparable] struct {
	Session S
	Ops     []OpRef
}

// NewWorkerTable returns an empty table.
func NewWorkerTable[S comparable, E any]() *WorkerTable[S, E] {
	return &WorkerTable[S, E]{eps: map[string]E{}, connecting: map[string][]any{}, inflight: map[OpRef]workerOp[S]{}}
}

// Admit records op, for session, as in flight to the peer at key. It
// comes first, before anything can fail, so that a crash from then on
// knows the op.
func (t *WorkerTable[S, E]) Admit(op OpRef, session S, key string) {
	t.inflight[op] = workerOp[S]{session: session, key: key}
}

// Settle forgets op: it completed, or was never posted.
func (t *WorkerTable[S, E]) Settle(op OpRef) { delete(t.inflight, op) }

// Endpoint is the way to key for m (a submit, flush or close): queued
// behind the Connect running for key (queued), or key's open endpoint
// (open), or neither (no endpoint: a submit connects, a flush has nothing
// to flush, a close nothing to close).
func (t *WorkerTable[S, E]) Endpoint(key string, m any) (ep E, open, queued bool) {
	if q, ok := t.connecting[key]; ok {
		t.connecting[key] = append(q, m)
		return ep, false, true
	}
	ep, open = t.eps[key]
	return ep, open, false
}

// Connecting records that a Connect to key started for m; what comes for
// key from now on waits behind it.
func (t *WorkerTable[S, E]) Connecting(key string, m any) { t.connecting[key] = []any{m} }

// Connected takes the outcome of the Connect to key: the endpoint is open
// when err is nil. It returns what waited for it, in arrival order, for
// the shell to handle again (a submit is refused when err is set).
func (t *WorkerTable[S, E]) Connected(key string, ep E, err error) (waiting []any) {
	waiting = t.connecting[key]
	delete(t.connecting, key)
	if err == nil {
		t.eps[key] = ep
	}
	return waiting
}

// Close takes key's endpoint out of the table (later ops to the peer
// connect afresh) and returns it with the ops in flight on it, by session
// in op order: they are retired once the endpoint's Close has returned,
// and not before. ok is false when key has no open endpoint.
func (t *WorkerTable[S, E]) Close(key string) (ep E, retired []SessionOps[S], ok bool) {
	ep, ok = t.eps[key]
	if !ok {
		return ep, nil, false
	}
	delete(t.eps, key)
	retired = t.take(func(o workerOp[S]) bool { return o.key == key })
	return ep, retired, true
}

// Restart is the worker's crash: submits waiting for a Connect are not
// posted after all (isSubmit names them; flushes and closes keep waiting);
// an op in flight with no open endpoint to its peer was never posted
// (refused); one with an endpoint is in doubt until that endpoint is
// closed, which retires it. It returns both by session, and the keys of
// every open endpoint, sorted, for the shell to close.
func (t *WorkerTable[S, E]) Restart(isSubmit func(any) bool) (refused, doubt []SessionOps[S], keys []string) {
	for key, q := range t.connecting {
		kept := q[:0]
		for _, m := range q {
			if !isSubmit(m) {
				kept = append(kept, m)
			}
		}
		t.connecting[key] = kept
	}
	refused = t.take(func(o workerOp[S]) bool { _, open := t.eps[o.key]; return !open })
	doubt = t.group(func(workerOp[S]) bool { return true })
	return refused, doubt, t.Keys()
}

// Keys are the keys of the open endpoints, sorted.
func (t *WorkerTable[S, E]) Keys() []string {
	keys := make([]string, 0, len(t.eps))
	for k := range t.eps {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Lookup returns key's open endpoint, if any, without queueing anything.
func (t *WorkerTable[S, E]) Lookup(key string) (ep E, open bool) {
	ep, open = t.eps[key]
	return ep, open
}

// InFlight is the number of ops in flight.
func (t *WorkerTable[S, E]) InFlight() int { return len(t.inflight) }

// KeyOf is the key of op's endpoint while op is in flight.
func (t *WorkerTable[S, E]) KeyOf(op OpRef) (key string, ok bool) {
	o, ok := t.inflight[op]
	return o.key, ok
}

// Carries reports whether an op of session's stream to peer (its rank
// index, OpRef.Peer) is in flight to key: posted on key's open endpoint,
// or waiting for the Connect that opens it. An op of an endpoint closed
// since is not: the Close took it, and that close's return retires it.
func (t *WorkerTable[S, E]) Carries(key string, session S, peer int) bool {
	for r, o := range t.inflight {
		if o.key == key && o.session == session && r.Peer == peer {
			return true
		}
	}
	return false
}

// InFlightOn is the number of ops in flight to the peer at key.
func (t *WorkerTable[S, E]) InFlightOn(key string) int {
	n := 0
	for _, o := range t.inflight {
		if o.key == key {
			n++
		}
	}
	return n
}

// take removes the ops in flight that match and returns them by session.
func (t *WorkerTable[S, E]) take(match func(workerOp[S]) bool) []SessionOps[S] {
	out := t.group(match)
	for _, so := range out {
		for _, r := range so.Ops {
			delete(t.inflight, r)
		}
	}
	return out
}

// group returns the ops in flight that match, by session: sessions in the
// order of their first op, ops in order (request, peer, sequence).
func (t *WorkerTable[S, E]) group(match func(workerOp[S]) bool) []SessionOps[S] {
	var refs []OpRef
	for r, o := range t.inflight {
		if match(o) {
			refs = append(refs, r)
		}
	}
	slices.SortFunc(refs, compareOps)
	var out []SessionOps[S]
	at := map[S]int{}
	for _, r := range refs {
		s := t.inflight[r].session
		i, ok := at[s]
		if !ok {
			i = len(out)
			at[s] = i
			out = append(out, SessionOps[S]{Session: s})
		}
		out[i].Ops = append(out[i].Ops, r)
	}
	return out
}

func compareOps(a, b OpRef) int {
	switch {
	case a.Request != b.Request:
		if a.Request < b.Request {
			return -1
		}
		return 1
	case a.Peer != b.Peer:
		return a.Peer - b.Peer
	}
	return a.Seq - b.Seq
}
