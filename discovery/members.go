package discovery

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/kvxfer/kvxfer/messages"
)

// members is the membership table: a state machine without I/O. The etcd
// shell feeds it what it reads (put, delete, a resynchronised snapshot)
// and delivers the events it returns. It holds, per rank, the live
// incarnation (if any) and the highest incarnation ever seen, below or at
// which nothing is accepted again.
type members struct {
	cluster string
	prefix  string
	ranks   map[messages.PeerID]*rankState
	// self is this registry's own rank once it registers; selfInc its
	// incarnation. Events about selfInc are not Up/Down but Lost.
	self     messages.PeerID
	selfInc  uint64
	hasSelf  bool
	lost     bool
	rejected uint64
}

// storedValue is a value read from etcd and the lease that holds it.
type storedValue struct {
	value []byte
	lease int64
}

type rankState struct {
	live  *Record
	floor uint64
}

func newMembers(cluster string) *members {
	return &members{cluster: cluster, prefix: ClusterPrefix(cluster), ranks: map[messages.PeerID]*rankState{}}
}

func (m *members) isSelf(id messages.PeerID, inc uint64) bool {
	return m.hasSelf && !m.lost && id == m.self && inc == m.selfInc
}

// register notes this registry's own record; it fails when the table
// already saw an incarnation of the rank at or above r's.
func (m *members) register(r Record) error {
	if st := m.ranks[r.Peer()]; st != nil && r.Incarnation <= st.floor {
		return fmt.Errorf("%w: %s: incarnation %d is not above %d, already seen for %s",
			ErrStaleIncarnation, Key(m.cluster, r.Instance, r.Rank),
			r.Incarnation, st.floor, r.Peer())
	}
	m.self, m.selfInc, m.hasSelf, m.lost = r.Peer(), r.Incarnation, true, false
	return nil
}

func (m *members) reject(key string, err error) []Event {
	m.rejected++
	return []Event{{Kind: EventRejected, Key: key, Err: err}}
}

func (m *members) up(r Record) []Event {
	if m.isSelf(r.Peer(), r.Incarnation) {
		return nil
	}
	return []Event{{Kind: EventUp, Record: r}}
}

func (m *members) down(r *Record, reason string) []Event {
	if m.isSelf(r.Peer(), r.Incarnation) {
		return m.lose(reason)
	}
	return []Event{{Kind: EventDown, Instance: r.Instance, Rank: r.Rank, Incarnation: r.Incarnation, Reason: reason}}
}

// unregister forgets this registry's own record after a failed Register.
func (m *members) unregister() { m.hasSelf, m.selfInc = false, 0 }

// lose reports this registry's own rank out of the cluster, once.
func (m *members) lose(reason string) []Event {
	if !m.hasSelf || m.lost {
		return nil
	}
	m.lost = true
	return []Event{{Kind: EventLost, Instance: m.self.Instance, Rank: m.self.Rank, Incarnation: m.selfInc, Reason: reason}}
}

// put applies a value stored at key under lease (0: none). A value that
// does not decode, whose key does not match it, that no lease holds (every
// registration has one, and a lease that ended cannot hold a key again:
// a value without one was written by hand or replayed) or whose
// incarnation is stale is rejected and changes nothing.
func (m *members) put(key string, value []byte, lease int64) []Event {
	id, err := parseKey(m.prefix, key)
	if err != nil {
		return m.reject(key, err)
	}
	if lease == 0 {
		return m.reject(key, fmt.Errorf("%w: key %s: the value is attached to no lease", ErrInvalidRecord, key))
	}
	r, leaving, err := decodeRecord(value)
	if err != nil {
		return m.reject(key, fmt.Errorf("key %s: %w", key, err))
	}
	if r.Peer() != id {
		return m.reject(key, fmt.Errorf("%w: key %s holds the record of %s", ErrInvalidRecord, key, r.Peer()))
	}
	st := m.ranks[id]
	switch {
	case st != nil && st.live != nil && r.Incarnation == st.live.Incarnation:
		if leaving {
			old := st.live
			st.live = nil
			return m.down(old, ReasonLeft)
		}
		if !reflect.DeepEqual(*st.live, r) {
			return m.reject(key, fmt.Errorf("%w: key %s: the record of incarnation %d changed while it is up", ErrInvalidRecord, key, r.Incarnation))
		}
		return nil
	case st != nil && r.Incarnation <= st.floor:
		if leaving && r.Incarnation == st.floor {
			return nil // a departure already applied (seen again on a resync)
		}
		return m.reject(key, fmt.Errorf("%w: key %s: incarnation %d of %s is not above %d, already seen",
			ErrStaleIncarnation, key, r.Incarnation, id, st.floor))
	}
	if st == nil {
		st = &rankState{}
		m.ranks[id] = st
	}
	var evs []Event
	if st.live != nil {
		old := st.live
		st.live = nil
		evs = m.down(old, reasonSuperseded(r.Incarnation))
	}
	st.floor = r.Incarnation
	if leaving {
		return evs
	}
	st.live = &r
	return append(evs, m.up(r)...)
}

// del applies the deletion of key: the incarnation registered there is
// out, for good. A key that held nothing accepted changes nothing.
func (m *members) del(key string) []Event {
	id, err := parseKey(m.prefix, key)
	if err != nil {
		return nil
	}
	st := m.ranks[id]
	if st == nil || st.live == nil {
		return nil
	}
	old := st.live
	st.live = nil
	return m.down(old, ReasonLeaseExpired)
}

// sync applies a full snapshot of the prefix (after the watch lost its
// place): ranks no longer present went down, then every value is applied
// as a put, in key order.
func (m *members) sync(snapshot map[string]storedValue) []Event {
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
	slices.Sort(keys)
	for _, k := range keys {
		evs = append(evs, m.put(k, snapshot[k].value, snapshot[k].lease)...)
	}
	return evs
}

// peers lists the live records of other ranks, in key order.
func (m *members) peers() []Record {
	var out []Record
	for _, st := range m.ranks {
		if st.live != nil && !m.isSelf(st.live.Peer(), st.live.Incarnation) {
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
