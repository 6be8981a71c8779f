// Package shm is the rdma backend for processes on one host: the receiver's
// region lives in a shared-memory file, which the sender maps and writes
// into directly, so a batch lands in the receiver's pool with one memory
// copy and no help from the receiver. Pure Go (mmap through syscall).
//
// # Regions
//
// NewRegion creates a file in Dir() (/dev/shm where it exists), maps it and
// returns the mapping's data part as a kvcache.Region (HostBytesRegion): the
// receiver builds its pool on it. Only such regions can receive writes; any
// host region can be a batch's source. The file starts with a one-page
// header: magic, version, data length, a random file id, the owning agent's
// nonce, the current registration's 128-bit secret, a Lease word (batches
// in flight, retired, owner gone) that every process updates atomically,
// and writer slots (each a writer process's identity and its own count of
// those batches).
// Files are created with mode 0600: the file system's permissions are the
// access control between users; the secret guards against stale and
// misdirected keys, as an RDMA rkey does. The maker holds a shared flock on
// the file for as long as it maps it (Held), so that a sweep of stale
// files by a process of another pid namespace can tell a live region.
//
// # Keys and addresses
//
// An agent's Address is "shm:<pid>:<nonce>". A file-backed registration's
// RemoteRegion.Key carries the owner's nonce, the file's id, the
// registration's secret and the file's base name. A sender's endpoint maps
// the named file on first use (one mapping per file per endpoint, kept until
// the endpoint closes) and refuses with rdma.ErrBadKey a key whose file,
// file id, owner or secret does not match, or whose registration was revoked;
// with rdma.ErrPeerGone one whose owner agent closed.
//
// # A peer that truncates its file
//
// The receiver owns its region file and can shrink it under a sender's
// mapping; the sender's next copy (or header access) then touches pages
// past the file's end, which would kill the sender's process (SIGBUS). The
// copier and Post catch that fault instead (rdma/internal/copier,
// "Memory faults"): the batch fails with rdma.ErrPeerGone naming the file
// and the address, the endpoint marks its mapping of the file gone and
// refuses later batches into it with rdma.ErrPeerGone (the mapping is
// unmapped when the endpoint closes), and every other region and endpoint
// goes on.
//
// # Busy regions across processes
//
// Post acquires the destination's Lease in the shared header (and the
// source's lease) before it accepts a batch, and the copier releases both
// just before Done; the receiver's Deregister retires the lease only when no
// batch of any process is in flight (else rdma.ErrRegionBusy).
//
// A sender that dies with batches in flight cannot release them. So each
// sender's mapping of a file claims a writer slot in its header (the
// sender's pid, start time and pid and time namespaces, and a count) and
// counts its batches there too, after the lease on acquire and before it on
// release, so that a slot never counts more than its writer holds in the
// lease (rdma/internal/copier, "Writer slots"). Before Deregister reports
// the region busy, when a region is registered, and whenever the owner
// calls Agent.ReclaimDead (a node does when a sender's process exits,
// seen through its pidfd, so that dead senders' slots do not fill the
// table over a long-lived region's life), the receiver releases the
// batches counted in the slots of senders proven dead and frees their
// slots: a sender is proven dead only in the receiver's own pid namespace,
// when no process has its pid, another process has it (a reused pid: other
// start time) or it is a zombie with no thread left; a sender that is
// stopped, in another pid namespace (another container sharing /dev/shm) or
// that /proc cannot show is not, and its batches keep the region busy.
// A killed sender's batches then no longer keep its receiver from
// deregistering and closing the region. Batches stay counted, the region
// busy, where nothing can prove them over: a sender that found no free slot
// (there are 60; it then counts in the lease only, as every sender did
// before slots; it never fails a write for want of one), a sender of an
// older build (it counts in the lease only: the slots lie in header bytes
// that older builds left zero and never touch, so the layout version did
// not change), or one killed between the lease and its slot. Deregister
// then refuses until the receiver closes its agent, which retires the lease
// by force: no batch is accepted after. A batch a live sender accepted
// before still lands in the file — nothing in the receiver can stop another
// process's copy — and a later registration of the same region keeps the
// count, so memory that a closed agent had registered is not for reuse
// while such a sender may live (the engine never registers a pool again).
// A sender's endpoint gives its slot back when it closes.
//
// # Revocable regions
//
// NewRevocableRegion makes a region whose file holds a reserve of spare
// blocks after the region's data. RevocableRegion.Revoke maps free spare
// blocks over a block-aligned range of the receiver's view (mmap
// MAP_FIXED|MAP_SHARED of the same file): the range's addresses stay valid
// and show pages no writer was told about, while the file blocks they showed
// — all a stale or stopped writer can still write — stay quarantined until
// ReleaseRevoked returns them to the reserve. Writers write at file
// offsets: FileOffset, Translate and Indirection give the block → file
// offset table the receiver sends them. A full reserve is ErrNoSpare (the
// caller falls back to plain quarantine). docs/membership.md §4 has the
// argument and the measured costs.
//
// # Goroutines
//
// Each endpoint copies on its own goroutine (rdma/internal/copier); Done runs
// there in post order. Endpoint.Close waits for that goroutine to stop, then
// unmaps the endpoint's mappings. The rules of package rdma hold as written
// there.
package shm
