// Package copier is the memory-copy engine shared by the backends whose
// remote memory is addressable from this process (rdma/loopback, rdma/shm):
// a per-endpoint queue drained by one goroutine that copies each batch's
// segments, completes it exactly once and honours Close, plus the Lease word
// that counts a registration's batches in flight, the writer slots beside a
// Lease in shared memory that let its owner release the batches of a writer
// process proven dead (WriterSlot, ProvenDead; "Writer slots" below), and
// CheckSegments.
//
// A Copier hands a batch over once (one lock, one wake-up signal); it does
// not allocate per segment. Large segments are copied in chunks of
// ChunkBytes so that Close stops a copy within one chunk.
//
// # Memory faults
//
// Memory that a peer owns can vanish under a mapping of it (the peer
// truncates its region file): a copy into it then faults, and by default
// the Go runtime kills the whole process. A job whose destination lies in a
// PeerMemory is run under a fault guard instead: the copier's goroutine
// runs with runtime/debug.SetPanicOnFault(true), and the job's copies and
// lease releases recover a memory fault (only that: every other panic is
// re-raised). The job then fails with an error naming the side and the
// address: wrapping rdma.ErrPeerGone for a fault inside the PeerMemory,
// which is marked gone so that later jobs into it fail without copying,
// and kvcache.ErrBadRegion for a fault elsewhere (the source). The process
// and the copier go on. Jobs without a PeerMemory (both regions this
// process's own) are not guarded: a fault there is a bug of ours and still
// ends the process. CatchFault guards one call on another goroutine (a
// backend's Post reading the peer's header page).
//
// # Writer slots
//
// A Lease in shared memory counts the batches in flight of every writer
// process together. A writer that dies (SIGKILL) with batches in flight
// never releases them, and the count alone cannot say whose they were: the
// lease stays busy for ever although nothing can write any more.
//
// A WriterSlot, beside the Lease in the same shared memory, is one writer
// process's own count: its identity (ProcessID) and the batches it holds.
// The writer counts a batch in its slot AFTER the shared word on acquire
// and BEFORE it on release (WriterSlot.Acquire, WriterSlot.Release), so at
// every instant a slot's count is at most that writer's share of the
// shared word. Once the writer is proven dead (ProvenDead) the lease's
// owner subtracts the slot's count from the shared word — never more than
// the writer added — and frees the slot (ReclaimDead). A writer that dies
// between the shared word and its slot leaves one batch counted in the
// shared word and not in its slot: the lease stays busy, which is the safe
// side (busy for ever, never free while a write may land).
//
// A writer that finds no free slot (the table is bounded) counts in the
// shared word only, as before slots existed: its batches are never
// reclaimed, and it never fails a write for want of a slot. So does a
// writer that cannot name itself (no /proc).
//
// # Who changes a slot
//
// A slot's tag word says whose it is; every change of it is a
// compare-and-swap, except the plain stores noted below, each made by the
// only party that may change the slot in that state. States:
//
//	free      tag 0
//	claiming  pid|slotClaiming: a writer took it and writes its identity
//	held      pid|slotHeld: identity complete; the writer counts in it
//	held+r    pid|slotHeld|slotReclaim: the owner is checking the writer
//	held+r+a  …|slotAbandon: the writer gave it back during that check
//
// Transitions, and who makes them:
//
//   - free → claiming: a writer, by CAS (ClaimSlot). Only it then writes
//     the identity words and zeroes the count; nobody else touches a
//     claiming slot, so its plain Store claiming → held is safe.
//   - held → free: the writer itself, by CAS, with its count at 0
//     (WriterSlot.Free, once its batches are all released).
//   - held → held+r: the owner, by CAS, before it reads the identity: from
//     then on no claim can reuse the slot (it is not free) and its writer
//     cannot free it (its CAS from held fails), so the identity the owner
//     reads is the one it judges, even if the slot was freed and claimed
//     again between the owner's first load and its CAS (that ABA is
//     harmless: the owner reads every word after the CAS).
//   - held+r → held+r+a: the writer, by CAS, when it frees its slot during
//     the owner's check (count 0): it leaves at once, never waiting for the
//     owner.
//   - held+r(+a) → held or free: the owner, after its check. A live
//     writer's slot goes back to held (CAS; if the writer abandoned it
//     meanwhile, the owner frees it with a plain store: its count is 0, and
//     only the owner changes a slot it is checking). A dead writer's slot
//     is emptied and freed with plain stores: the writer can no longer
//     touch it, and no other writer can claim it while it is not free.
//
// The count is changed only by the slot's writer (atomic adds, from its
// Post and its copier's goroutine) and, once that writer is proven dead,
// by the owner. Owners serialise their ReclaimDead calls on one table (one
// owner process; a lock there).
//
// A writer killed between its claim and its held store leaves the slot
// claiming for ever: its identity is incomplete, so nothing can prove it
// dead, and its count is 0. That costs one slot, never a wrong release.
package copier
