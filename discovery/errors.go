package discovery

import "errors"

// Sentinels, matched with errors.Is. Every error that names a record or a
// key wraps one of them and says which record, key or value was wrong.
var (
	// ErrInvalidRecord: a record failed validation (a field out of range,
	// a value that does not decode, a key that does not match its value).
	ErrInvalidRecord = errors.New("discovery: invalid record")
	// ErrStaleIncarnation: a record's incarnation is not newer than one the
	// registry already saw for that rank (live or gone). An incarnation
	// that went down is never accepted again.
	ErrStaleIncarnation = errors.New("discovery: stale incarnation")
	// ErrInvalidURL: a discovery URL (etcd://host:port[,host:port]) that
	// does not parse.
	ErrInvalidURL = errors.New("discovery: invalid URL")
	// ErrRegistered: Register was called twice on one registry.
	ErrRegistered = errors.New("discovery: already registered")
	// ErrClosed: the registry is closed.
	ErrClosed = errors.New("discovery: registry closed")
	// ErrEventOverflow: the consumer of Events fell more than the queue
	// bound behind; the registry stopped rather than drop or block.
	ErrEventOverflow = errors.New("discovery: event queue overflow")
	// ErrNotWithdrawn: Close could not mark the record leaving or revoke
	// its lease (etcd unreachable at the end): the record stays until its
	// lease expires (the TTL), and peers see it go as "lease expired",
	// not "left". Nothing else is wrong with the registry.
	ErrNotWithdrawn = errors.New("discovery: the record could not be withdrawn; it expires with its lease")
	// ErrHeld: Register gave up (its context ended) while the rank's key
	// was held by another incarnation under a live lease: the rank's
	// previous run, or another process running as the same rank. The
	// error also wraps the context's error. A Register refused at once
	// because the live holder's incarnation is not below its own
	// (another process of the rank, started later by another clock)
	// matches it too, with ErrStaleIncarnation.
	ErrHeld = errors.New("discovery: rank held by a live lease")
)

// heldError is Register's error when it gave up waiting for a held key:
// its words are its cause's, and it matches ErrHeld as well.
type heldError struct{ err error }

func (e heldError) Error() string   { return e.err.Error() }
func (e heldError) Unwrap() []error { return []error{e.err, ErrHeld} }
