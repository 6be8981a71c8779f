package discovery

import "fmt"

// EventKind says what an Event reports.
//
// For one peer rank (instance, rank) the events a registry delivers follow
//
//	Up(i1) → Down(i1) → Up(i2) → Down(i2) → …     with i1 < i2 < …
//
// An Up always names an incarnation above every one seen before for that
// rank, and a Down always follows the Up of the same incarnation. Rejected
// may come at any point and changes no rank's state. Lost concerns this
// registry's own rank and comes at most once.
type EventKind uint8

const (
	// EventUnknown is the zero value; never delivered.
	EventUnknown EventKind = iota
	// EventUp: a peer rank's incarnation joined (Record is set).
	EventUp
	// EventDown: a peer rank's incarnation is out of the cluster for good
	// (Instance, Rank, Incarnation and Reason are set). It is membership,
	// not proof that the incarnation's writes are over: docs/membership.md.
	EventDown
	// EventRejected: a value under the cluster's prefix was refused
	// (Key and Err are set): malformed, or a stale incarnation.
	EventRejected
	// EventLost: this registry's own record is gone (its lease expired or
	// could not be renewed, or its key was deleted or taken by a newer
	// incarnation). The rank is out of the cluster: its writers must stop.
	// Reason is set. It comes only after this registry's Register returned
	// nil: a registration whose lease or record was lost before it
	// completed fails its Register, with no Lost.
	EventLost
)

var eventKindNames = [...]string{"UNKNOWN", "UP", "DOWN", "REJECTED", "LOST"}

func (k EventKind) String() string {
	if int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Reasons a Down or Lost gives.
const (
	// ReasonLeaseExpired: the rank's key disappeared from etcd without the
	// rank saying it leaves: its lease expired (or an operator deleted the
	// key, which etcd does not tell apart).
	ReasonLeaseExpired = "lease expired"
	// ReasonLeft: the rank marked its record leaving (Close) before it
	// revoked its lease.
	ReasonLeft = "left"
	// ReasonOverwritten: the rank's key was overwritten with a value that
	// is not its record, under another lease or none: etcd no longer
	// holds the record, and the rank's lease no longer deletes the key.
	ReasonOverwritten = "its key was overwritten under another lease"
	// ReasonKeepaliveStopped: this registry could not renew its lease
	// before it expired (Lost only).
	ReasonKeepaliveStopped = "keepalive stopped"
)

// reasonSuperseded is the Down reason when a newer incarnation of the rank
// registered over an older one still registered.
func reasonSuperseded(inc uint64) string {
	return fmt.Sprintf("superseded by incarnation %d", inc)
}

// Event is one membership change a Registry reports.
type Event struct {
	Kind EventKind
	// Record is the peer that joined (Up).
	Record Record
	// Instance, Rank and Incarnation name the peer that went Down, or this
	// registry's own rank (Lost).
	Instance    string
	Rank        int32
	Incarnation uint64
	Reason      string
	// Key and Err describe a Rejected value.
	Key string
	Err error
}

func (e Event) String() string {
	switch e.Kind {
	case EventUp:
		return fmt.Sprintf("UP %s", e.Record)
	case EventDown, EventLost:
		return fmt.Sprintf("%s %s/%d#%d: %s", e.Kind, e.Instance, e.Rank, e.Incarnation, e.Reason)
	case EventRejected:
		return fmt.Sprintf("REJECTED %s: %v", e.Key, e.Err)
	}
	return e.Kind.String()
}
