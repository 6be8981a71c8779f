// Package discovery is kvxfer's membership layer: the Registry seam
// through which an engine rank publishes how to reach it and learns which
// peer ranks are in the cluster.
//
// # What it owns
//
// A Record (instance, rank, incarnation, control endpoint, CURVE public
// key, backend, agent address, layout hash, parallelism), its stored form
// (versioned JSON, DecodeRecord), the key layout in etcd
// (/kvxfer/<cluster>/<instance>/<rank>) and two registries:
//
//   - Static: a fixed list from flags or a config file, no server and no
//     liveness of its own (the embedded default);
//   - Etcd: records attached to leases kept alive by their ranks, the
//     cluster's prefix watched by every rank. A key that disappears is a
//     Down for every peer at once, and its incarnation is refused from then
//     on — also by registries started later: each rank's incarnation key
//     (/kvxfer/<cluster>/<instance>/<rank>/incarnation) names the
//     incarnation last registered and its lease, and is never deleted
//     (by kvxfer; with one deleted by hand, Register still refuses an
//     incarnation not above the record that holds the rank's key under a
//     live lease).
//
// It does not own the control link, heartbeats or the decision to free
// pages: a Down is membership, not proof that the rank's writes are over
// (docs/membership.md says, per backend, what is).
//
// # Events and ordering
//
// Events are delivered on one channel, in the order the registry decided
// them. Per peer rank they follow Up(i1) → Down(i1) → Up(i2) → … with
// strictly growing incarnations; Rejected reports a value refused (and
// changes nothing); Lost reports, once, that this rank's own record is
// gone — only after its Register returned nil: a registration lost before
// it completed fails its Register instead. The membership table is a state machine without I/O (members);
// the etcd shell feeds it what the watch reads, under one mutex, so
// decisions and deliveries cannot interleave differently.
//
// # Concurrency
//
// A Registry is safe for concurrent use. Its goroutines (the watch, the
// lease keepalive, the event deliverer) all end in Close; a Register in
// flight is cut short by Close (ErrClosed) and over before Close returns. The consumer of
// Events must keep reading: a registry that would hold more than its queue
// bound (the etcd registry: beyond room for its cluster's size) stops
// with ErrEventOverflow instead of blocking or dropping.
//
// # Values from etcd are peer bytes
//
// Anyone with access to the prefix can write anything. Every value is
// bounded, strictly decoded (one version; every field this build knows
// present, of its type and in range; no trailing bytes), validated and
// checked against its key before it touches the table; a value that fails
// is a Rejected event naming its key. Fields this build does not know — a
// later build of the same version may add some (RecordVersion) — are
// skipped, never kept, so that ranks upgraded one at a time keep seeing
// each other.
package discovery
