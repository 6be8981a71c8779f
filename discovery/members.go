package discovery

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/kvxfer/kvxfer/messages"
)

// members is the membership table: a state machine without I/O. The etcd
// shell feeds it what it reads (puts and deletes, in revision order, or a
// resynchronised snapshot) and delivers the events it returns.
//
// Per rank it holds the registration the rank's incarnation key names
// (incarnation and lease), the live record (if any) and the highest
// incarnation this table has seen. A record is accepted only when it is
// the registration's own (same incarnation, same lease) and above what was
// seen before, so an incarnation that went down is never accepted again:
// by this table, because it saw it; by a table started later, because the
// incarnation key still names it, under a lease that has ended.
type members struct {
	cluster string
	prefix  string
	ranks   map[messages.PeerID]*rankState
	// self is this registry's own rank once it registers; selfInc its
	// incarnation. Events about selfInc are not Up/Down but Lost.
	self    messages.PeerID
	selfInc uint64
	hasSelf bool
	// confirmed: the Register of self completed (confirm). Until then a
	// loss of its record or lease is no Lost: it fails the Register
	// (lostWhy says why).
	confirmed bool
	lost      bool
	lostWhy   string
	// selfRev is the etcd revision self's registration was committed at
	// (confirm): a snapshot read at or after it must hold its record
	// (sync).
	selfRev int64
	// missingRev is the revision of the last snapshot applied before
	// self's Register completed when it did not hold self's record, and
	// missingWhy why (0, "": it held it, or none was applied): confirm
	// fails if that read came after the commit.
	missingRev int64
	missingWhy string
	// failed holds this registry's own registrations (incarnation and
	// lease) whose Register failed after its lease was granted: etcd may
	// have committed the record (its reply lost) and, when the lease could
	// not be revoked, keeps it until its TTL. Such a record is never a
	// peer here: no Up, no Down, not in peers.
	failed   map[ownRegistration]bool
	rejected uint64
}

type ownRegistration struct {
	id    messages.PeerID
	inc   uint64
	lease int64
}

// storedValue is a value read from etcd and the lease that holds it.
type storedValue struct {
	value []byte
	lease int64
}

type rankState struct {
	reg  registration
	live *Record
	// liveLease is the lease live was registered under; reg may name a
	// later registration meanwhile (its incarnation key applied first).
	liveLease int64
	floor     uint64
}

func newMembers(cluster string) *members {
	return &members{cluster: cluster, prefix: ClusterPrefix(cluster), ranks: map[messages.PeerID]*rankState{}}
}

// isSelf: the record of this registry's own incarnation, also once it was
// Lost (its deletion afterwards is no Down, its record no Up or peer).
func (m *members) isSelf(id messages.PeerID, inc uint64) bool {
	return m.hasSelf && id == m.self && inc == m.selfInc
}

// isOwn: a record (under lease) of this registry's own, the incarnation
// registered (isSelf) or the registration of a Register that failed.
func (m *members) isOwn(id messages.PeerID, inc uint64, lease int64) bool {
	return m.isSelf(id, inc) || m.failed[ownRegistration{id, inc, lease}]
}

// register notes this registry's own record; it fails when the table
// already saw an incarnation of the rank at or above r's. The error names
// the rank's incarnation key, where the incarnation seen is stored (a
// record is accepted only at the incarnation that key names, so it holds
// the highest one seen).
func (m *members) register(r Record) error {
	st := m.ranks[r.Peer()]
	if st != nil && st.live != nil && r.Incarnation <= st.live.Incarnation && !m.isOwn(r.Peer(), st.live.Incarnation, st.liveLease) {
		return heldBelow(r, *st.live, IncarnationKey(m.cluster, r.Instance, r.Rank))
	}
	if st != nil && (r.Incarnation <= st.floor || r.Incarnation <= st.reg.Incarnation) {
		return fmt.Errorf("%w: %s names incarnation %d, already registered for %s: incarnation %d is not above it "+
			"(an incarnation is the rank's start time in nanoseconds: did this host's clock step back, or was the key written by hand?)",
			ErrStaleIncarnation, IncarnationKey(m.cluster, r.Instance, r.Rank),
			max(st.floor, st.reg.Incarnation), r.Peer(), r.Incarnation)
	}
	m.self, m.selfInc, m.hasSelf = r.Peer(), r.Incarnation, true
	m.confirmed, m.lost, m.lostWhy, m.missingRev, m.missingWhy = false, false, "", 0, ""
	return nil
}

// heldBelow is Register's refusal of r when holder, a live record of its
// rank under a live lease, is of an incarnation not below r's: another
// process runs as the rank (its start stamped later: another host's clock
// ahead, or two started together). It matches ErrStaleIncarnation and
// ErrHeld.
func heldBelow(r, holder Record, incKey string) error {
	return heldError{fmt.Errorf("%w: %s is held by incarnation %d at %s, up under a live lease (%s names it): incarnation %d is not above it. "+
		"Another process runs as %s (same instance and rank?): give this one its own instance or rank, or stop that one",
		ErrStaleIncarnation, r.Peer(), holder.Incarnation, holder.ControlEndpoint, incKey, r.Incarnation, r.Peer())}
}

// confirm marks this registry's own registration, committed at etcd
// revision rev, complete: from now on the loss of its record is a Lost.
// It fails (naming the reason) when the record or its lease was lost
// before: the registration did not complete, and no Lost is ever said of
// it.
func (m *members) confirm(rev int64) error {
	if m.lost {
		return fmt.Errorf("its record was lost before the registration completed (%s)", m.lostWhy)
	}
	if m.missingWhy != "" && m.missingRev >= rev {
		return fmt.Errorf("its record was lost before the registration completed (%s: a read of etcd at revision %d, after its commit at %d, did not hold it)",
			m.missingWhy, m.missingRev, rev)
	}
	m.confirmed, m.selfRev = true, rev
	return nil
}

// unregister forgets this registry's own record after a failed Register
// whose lease was lease (0: none granted, so no record written); a
// record of that registration stays its own (isOwn), never a peer.
func (m *members) unregister(lease int64) {
	if m.hasSelf && lease != 0 {
		if m.failed == nil {
			m.failed = map[ownRegistration]bool{}
		}
		m.failed[ownRegistration{m.self, m.selfInc, lease}] = true
	}
	m.hasSelf, m.selfInc, m.confirmed, m.lost, m.lostWhy, m.missingRev, m.missingWhy = false, 0, false, false, "", 0, ""
}

func (m *members) reject(key string, err error) []Event {
	m.rejected++
	return []Event{{Kind: EventRejected, Key: key, Err: err}}
}

func (m *members) up(r Record, lease int64) []Event {
	if m.isOwn(r.Peer(), r.Incarnation, lease) {
		return nil
	}
	return []Event{{Kind: EventUp, Record: r}}
}

func (m *members) down(r *Record, lease int64, reason string) []Event {
	if m.isSelf(r.Peer(), r.Incarnation) {
		return m.lose(reason)
	}
	if m.isOwn(r.Peer(), r.Incarnation, lease) {
		return nil // a failed Register's record: it never was Up
	}
	return []Event{{Kind: EventDown, Instance: r.Instance, Rank: r.Rank, Incarnation: r.Incarnation, Reason: reason}}
}

// lose reports this registry's own rank out of the cluster, once, and
// only once its Register completed: before, the loss fails the Register
// instead (confirm).
func (m *members) lose(reason string) []Event {
	if !m.hasSelf || m.lost {
		return nil
	}
	m.lost, m.lostWhy = true, reason
	if !m.confirmed {
		return nil
	}
	return []Event{{Kind: EventLost, Instance: m.self.Instance, Rank: m.self.Rank, Incarnation: m.selfInc, Reason: reason}}
}

// put applies a value stored at key under lease (0: none): a record or an
// incarnation key. Anything refused changes nothing.
func (m *members) put(key string, value []byte, lease int64) []Event {
	id, isInc, err := parseKey(m.prefix, key)
	if err != nil {
		return m.reject(key, err)
	}
	if isInc {
		return m.putRegistration(key, id, value)
	}
	return m.putRecord(key, id, value, lease)
}

// putRegistration applies a rank's incarnation key. It only moves forward:
// to a higher incarnation, or (never) to another lease of the same one.
func (m *members) putRegistration(key string, id messages.PeerID, value []byte) []Event {
	g, err := decodeRegistration(value)
	if err != nil {
		return m.reject(key, fmt.Errorf("key %s: %w", key, err))
	}
	st := m.ranks[id]
	if st != nil && (g.Incarnation < st.reg.Incarnation || g.Incarnation == st.reg.Incarnation && g.Lease != st.reg.Lease) {
		return m.reject(key, fmt.Errorf("%w: key %s: incarnation %d under lease %x, after incarnation %d under lease %x",
			ErrStaleIncarnation, key, g.Incarnation, g.Lease, st.reg.Incarnation, st.reg.Lease))
	}
	if st == nil {
		st = &rankState{}
		m.ranks[id] = st
	}
	st.reg = g
	return nil
}

// putRecord applies a record. One that does not decode, does not match its
// key, is held by no lease (every registration has one, and a lease that
// ended cannot hold a key again), is not its rank's registration, or is
// not above the incarnations seen is rejected; one rejected at a live
// rank's key under another lease also puts that rank out (below).
func (m *members) putRecord(key string, id messages.PeerID, value []byte, lease int64) []Event {
	evs := m.applyRecord(key, id, value, lease)
	// A value refused at a live rank's key under another lease (or none)
	// has replaced the rank's record in etcd and taken the key off the
	// rank's lease: the lease's end will delete nothing, so no Down would
	// ever come. The record is gone from etcd: the rank is out (and its
	// incarnation, as any that went down, is never accepted again). Under
	// the rank's own lease the key still goes when the lease does. The
	// rank's lease is its live record's: a resynchronisation applies a
	// later registration's incarnation key before its record, so the
	// registration may already name the lease of the refused value.
	if len(evs) == 1 && evs[0].Kind == EventRejected {
		if st := m.ranks[id]; st != nil && st.live != nil && lease != st.liveLease {
			old := st.live
			st.live = nil
			evs = append(evs, m.down(old, st.liveLease, ReasonOverwritten)...)
		}
	}
	return evs
}

// applyRecord is putRecord's decision on the value itself.
func (m *members) applyRecord(key string, id messages.PeerID, value []byte, lease int64) []Event {
	r, leaving, err := decodeRecord(value)
	if err != nil {
		return m.reject(key, fmt.Errorf("key %s: %w", key, err))
	}
	if r.Peer() != id {
		return m.reject(key, fmt.Errorf("%w: key %s holds the record of %s", ErrInvalidRecord, key, r.Peer()))
	}
	if lease == 0 {
		return m.reject(key, fmt.Errorf("%w: key %s: the value is attached to no lease", ErrInvalidRecord, key))
	}
	st := m.ranks[id]
	switch {
	case st == nil || st.reg.Incarnation == 0:
		return m.reject(key, fmt.Errorf("%w: key %s: incarnation %d was never registered (%s names none)",
			ErrInvalidRecord, key, r.Incarnation, key+IncarnationSuffix))
	case r.Incarnation > st.reg.Incarnation:
		return m.reject(key, fmt.Errorf("%w: key %s: incarnation %d was never registered (%s names %d)",
			ErrInvalidRecord, key, r.Incarnation, key+IncarnationSuffix, st.reg.Incarnation))
	case r.Incarnation < st.reg.Incarnation || lease != st.reg.Lease:
		return m.reject(key, fmt.Errorf("%w: key %s: incarnation %d under lease %x; the rank's registration is incarnation %d under lease %x",
			ErrStaleIncarnation, key, r.Incarnation, lease, st.reg.Incarnation, st.reg.Lease))
	case st.live != nil && r.Incarnation == st.live.Incarnation:
		if leaving {
			old := st.live
			st.live = nil
			return m.down(old, st.liveLease, ReasonLeft)
		}
		if !reflect.DeepEqual(*st.live, r) {
			return m.reject(key, fmt.Errorf("%w: key %s: the record of incarnation %d changed while it is up", ErrInvalidRecord, key, r.Incarnation))
		}
		return nil
	case r.Incarnation <= st.floor:
		if leaving && r.Incarnation == st.floor {
			return nil // a departure already applied (seen again on a resync)
		}
		return m.reject(key, fmt.Errorf("%w: key %s: incarnation %d of %s is not above %d, already seen",
			ErrStaleIncarnation, key, r.Incarnation, id, st.floor))
	}
	var evs []Event
	if st.live != nil {
		old := st.live
		st.live = nil
		evs = m.down(old, st.liveLease, reasonSuperseded(r.Incarnation))
	}
	st.floor = r.Incarnation
	if leaving {
		return evs
	}
	st.live, st.liveLease = &r, lease
	return append(evs, m.up(r, lease)...)
}

// del applies the deletion of key: the incarnation registered there is
// out, for good. A key that held nothing accepted changes nothing; a
// deleted incarnation key changes nothing either (the table keeps what it
// named: forgetting it would let an older incarnation back).
func (m *members) del(key string) []Event {
	id, isInc, err := parseKey(m.prefix, key)
	if err != nil || isInc {
		return nil
	}
	st := m.ranks[id]
	if st == nil || st.live == nil {
		return nil
	}
	old := st.live
	st.live = nil
	return m.down(old, st.liveLease, ReasonLeaseExpired)
}

// sync applies a full snapshot of the prefix read at etcd revision rev
// (at the start, and after the watch lost its place): ranks no longer
// present went down; then the incarnation keys, then the records are
// applied, each in key order. Last, this registry's own record, once its
// Register completed at or before rev, must be its rank's live record:
// a watch gap may have hidden both its put and its deletion or
// overwrite, and then no event would ever say the rank is out (its
// keepalive renews a lease that holds nothing). Before its Register
// completed, a read without it is noted for confirm, which alone knows
// whether the read came after the commit.
func (m *members) sync(snapshot map[string]storedValue, rev int64) []Event {
	var evs []Event
	ids := make([]messages.PeerID, 0, len(m.ranks))
	for id := range m.ranks {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b messages.PeerID) int { return strings.Compare(a.String(), b.String()) })
	for _, id := range ids {
		if st := m.ranks[id]; st.live != nil {
			k := Key(m.cluster, id.Instance, id.Rank)
			if _, ok := snapshot[k]; !ok {
				evs = append(evs, m.del(k)...)
			}
		}
	}
	keys := make([]string, 0, len(snapshot))
	for k := range snapshot {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		ai, bi := strings.HasSuffix(a, IncarnationSuffix), strings.HasSuffix(b, IncarnationSuffix)
		if ai != bi {
			if ai {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	for _, k := range keys {
		evs = append(evs, m.put(k, snapshot[k].value, snapshot[k].lease)...)
	}
	if m.hasSelf && !m.lost && (!m.confirmed || rev >= m.selfRev) {
		reason := ""
		if st := m.ranks[m.self]; st == nil || st.live == nil || st.live.Incarnation != m.selfInc {
			reason = ReasonLeaseExpired // etcd tells a deletion from an expiry no more than del does
			if _, ok := snapshot[Key(m.cluster, m.self.Instance, m.self.Rank)]; ok {
				reason = ReasonOverwritten
			}
		}
		switch {
		case !m.confirmed:
			m.missingRev, m.missingWhy = rev, reason
		case reason != "":
			evs = append(evs, m.lose(reason)...)
		}
	}
	return evs
}

// peers lists the live records of other ranks, in key order.
func (m *members) peers() []Record {
	var out []Record
	for _, st := range m.ranks {
		if st.live != nil && !m.isOwn(st.live.Peer(), st.live.Incarnation, st.liveLease) {
			out = append(out, *st.live)
		}
	}
	slices.SortFunc(out, func(a, b Record) int {
		if c := strings.Compare(a.Instance, b.Instance); c != 0 {
			return c
		}
		return int(a.Rank - b.Rank)
	})
	return out
}
