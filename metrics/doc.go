// Package metrics is kvxfer's Prometheus exposition: one Set of metrics per
// engine, in a registry of its own, and a small HTTP server for it.
//
// # Contract
//
// An engine started with Config.MetricsAddr set makes a Set (New), serves
// it on MetricsAddr at /metrics (Serve) and shuts the server down in
// Engine.Close. With MetricsAddr empty there is no Set, no server, and the
// shells pay one nil check per message. Several engines in one process
// never share a registry (the process-wide default registry is never
// used); every series carries the constant label engine="instance/rank",
// so Handler can serve several engines' registries on one port.
//
// The engine's shells (package actors) update the metrics after the pure
// steps ran, from the messages and the session state; steps know nothing
// of metrics. Every label value except a heartbeat miss's peer is known
// when the engine starts, so the shells resolve the label children once
// then: an update on the chunk path is an atomic add or a histogram
// observation, with no allocation and no label lookup (a session's meter
// only grows its per-chunk and per-op bookkeeping by amortised appends). Pool occupancy and
// the engine's plain counters (actors.Counters) are read only when scraped.
//
// A Set's metrics are safe for concurrent use. Serve owns one goroutine;
// Server.Close waits for it.
//
// # Metrics
//
// Every name has the kvxfer_ prefix and every series the engine label.
// tx is the context (sending) side, rx the generation (receiving) side.
//
//	name                                type       labels          meaning
//	kvxfer_bytes_transferred_total      counter    side            tx: bytes of ops whose write completed without error (BACKEND_DONE), added as each op lands;
//	                                                               rx: bytes the writers' Results report, added as each Result arrives
//	kvxfer_transfer_duration_seconds    histogram  side, outcome   tx: Engine.Send to Done (after every pin is released), outcome DONE | FAILED | CANCELLED;
//	                                                               rx: Engine.Receive to the outcome (queueing for blocks included), outcome READY | FAILED | CANCELLED | TIMED_OUT
//	kvxfer_chunk_write_latency_seconds  histogram  -               a chunk handed over (TxHandle.Chunk reached its session) to one of its ops BACKEND_DONE
//	                                                               without error; one observation per op (per generation rank the chunk goes to)
//	kvxfer_ops                          gauge      state           ops of live tx sessions by state: ADMITTED, NOT_SUBMITTED, SUBMITTING, SUBMITTED,
//	                                                               BACKEND_DONE, IN_DOUBT, RETIRED, SOURCES_RELEASED; a session's ops leave the gauge when it releases
//	kvxfer_ops_in_doubt                 gauge      -               kvxfer_ops{state="IN_DOUBT"}: writes whose outcome is unknown until their endpoint is
//	                                                               flushed or closed (their pages stay pinned); Stats.OpsInDoubt, metrics on or off
//	kvxfer_sessions                     gauge      side, state     live sessions by state; tx: INIT, READY, TRANSFERRING, DONE, FAILED, CANCELLED;
//	                                                               rx: REQUESTED, RECEIVING, READY, FAILED, CANCELLED, TIMED_OUT. A terminal state
//	                                                               counts a session that is decided and still draining; rx requests waiting for
//	                                                               destination blocks have no session yet
//	kvxfer_failures_total               counter    side, reason    requests that ended without success, counted when decided; reason is the first
//	                                                               sentinel the error wraps: closed, cancelled, peer_cancelled, timeout, unsent
//	                                                               (a SUCCESS Result the control plane refused), peer_gone,
//	                                                               worker_crashed, session_crashed, fence, peer_failed, bad_chunk, bad_request, mismatch, other
//	                                                               (the actors.Err* sentinels of the same names; closed: Engine.Close)
//	kvxfer_frames_rejected_total        counter    reason          control frames refused or dropped: invalid (failed validation at the listener;
//	                                                               a RequestData that names its request is answered FAILED with the reason, by the
//	                                                               request's session when bound to the sender and without a stream of it (the
//	                                                               request fails), else by the tx parent; a Result that names a live request of its writer
//	                                                               fails it, reason mismatch, the blocks quarantined until the writer's CancelAck),
//	                                                               not_writer (from a peer that is not a writer of the request), stale (too late
//	                                                               to act on: for a request unknown or finished here, or no Send took while the
//	                                                               engine closes; sent by an earlier incarnation of its peer or addressed to an
//	                                                               earlier one of this engine; a stale epoch or a duplicate a live request ignored;
//	                                                               the frames kvxfer.Stats.FramesStale counts), unresolved (a RequestData
//	                                                               that could not be resolved into a route; the request fails), not_bound (from
//	                                                               another generation instance than the request's), orphan_limit (a new request
//	                                                               past its instance's MaxOrphanRequests), shed (a RequestData or Cancel dropped
//	                                                               because its peer's frame credits were spent: FrameCredits unhandled frames;
//	                                                               the RequestData answered as an invalid one;
//	                                                               at most 256 of a peer wait for their answer), tombstones_full (a Cancel
//	                                                               left unanswered, to be re-sent, while every cancel tombstone of its instance
//	                                                               is younger than 30 s), silenced (a Cancel or RequestData left unanswered
//	                                                               for good: writes of its request to its sender were cut without proof);
//	                                                               over the zmq link also the listener's own: envelope (not one payload part),
//	                                                               oversize (past MaxFrameBytes), version (written in another control protocol
//	                                                               version), decode (refused by messages.Decode), identity
//	                                                               (a sender its CURVE key may not speak for), taken (a Hello for a live peer bound
//	                                                               to another key), no_hello (before Hello), sender (another PeerID than its
//	                                                               connection's Hello), full (a Hello past the bounds on connections or peers),
//	                                                               departed (a Hello of an incarnation removed from the cluster),
//	                                                               goodbye (a peer's goodbye not taken: not its current incarnation's)
//	kvxfer_worker_restarts_total        counter    -               sender workers restarted after a panic
//	kvxfer_heartbeat_misses_total       counter    peer            peers declared down by the control plane (Engine.PeerDown, the zmq link's
//	                                                               OnPeerDown); peer is "instance/rank", or "other" past the first 256
//	                                                               peers (MaxPeerSeries: peers choose their names); a goodbye is not counted
//	kvxfer_pool_blocks                  gauge      group, state    blocks of each layer group's pool by state: free, allocated (no pin), pinned,
//	                                                               quarantined; they sum to the pool's size. Sampled at scrape
//	kvxfer_quarantined_bytes            gauge      -               bytes of destination blocks in quarantine: their request failed (suspicion,
//	                                                               deadline, cancel) while a writer had given no proof that its writes are over
//	                                                               (DESIGN.md §3); released by a proof. Sampled at scrape
//	kvxfer_quarantine_limit_bytes       gauge      -               quarantined bytes past which new requests wait for destination blocks
//	kvxfer_requests_waiting_for_blocks  gauge      -               receive requests waiting for destination blocks (too few free when they
//	                                                               came, or the quarantine bound hit); they start in order as blocks are freed,
//	                                                               or fail at their deadline. Sampled at scrape
//	kvxfer_revoked_blocks_total         counter    -               destination blocks revoked instead of quarantined (Config.Revoker): reused at
//	                                                               once, their old memory held until the proof
//	kvxfer_revoked_held_blocks          gauge      -               revoked blocks whose old memory still waits for its proof (or that a failed release left held). Sampled at scrape
//	kvxfer_caller_blocks_awaiting_proof gauge      -               the framework's own destination blocks (ReceiveRequest.Blocks) in the same state:
//	                                                               their request failed without a writer's proof; not Released yet (kvxfer's pool
//	                                                               does not hold them, so kvxfer_quarantined_bytes does not count them). Sampled at scrape
//	kvxfer_orphan_requests              gauge      -               requests a generation instance's RequestData asked this context engine for that no
//	                                                               Send adopted yet (Stats.OrphanRequests; a Send normally adopts them within
//	                                                               moments). Sampled at scrape
//	kvxfer_orphan_requests_ended_total  counter    -               such requests that ended with no Send ever adopting them (Stats.OrphansEnded):
//	                                                               the generation side asked for requests this side never sent
//	kvxfer_write_proofs_total           counter    kind            proofs that every write of one writer incarnation is over (DESIGN.md §3) the engine took,
//	                                                               each ending the quarantine of that incarnation's requests (Stats.WriteProofs);
//	                                                               kind (kvxfer.ProofKind): exited (Engine.WriterExited, the caller's own detector),
//	                                                               pidfd_exit (node: the writer's process exited, seen by a pidfd, the process seen
//	                                                               mapping this rank's pool), drained_goodbye (node: the writer closed after draining
//	                                                               every write it started and said so in its goodbye). A proof that concerned no
//	                                                               request counts; one refused (an untied or disputed process, a plain goodbye, a
//	                                                               goodbye the link refused, an engine that closed) counts nothing. A request's own
//	                                                               proofs (its writer's Result or CancelAck, a proven endpoint close) are not counted here
//	kvxfer_write_proof_requests_total   counter    kind            requests those proofs concerned (addressed to the proven incarnation; live, draining or
//	                                                               quarantined): they fail, and their blocks leave quarantine once every writer of the
//	                                                               request is proven quiescent; the bytes released show in kvxfer_quarantined_bytes
//	kvxfer_ops_posted_total             counter    -               ops posted to the data-plane backend
//	kvxfer_frames_unsent_total          counter    -               control frames not sent: a worker's dial or send failed, a
//	                                                               connection closed with terminal frames it had accepted still
//	                                                               unsent, or a RequestData waited for its writer's Hello (none known)
//	kvxfer_session_panics_total         counter    -               sessions restarted after a panic
//	kvxfer_pin_errors_total             counter    -               pin or unpin calls the pools refused
//	kvxfer_dest_block_errors_total      counter    -               quarantines, releases and frees of a finished request's destination
//	                                                               blocks the pools refused (a bug): the blocks stay held as they were
//	kvxfer_writer_leases_lapsed_total   counter    -               writer leases that lapsed (WriterLease): the writer stopped posting to that
//	                                                               peer and failed its requests with it
//	kvxfer_session_panics_past_budget_total
//	                                    counter    -               session panics after the session's restart budget was spent
//	                                                               (Stats.SessionPanicsPastBudget): each resumed its session to drain, the
//	                                                               message it panicked on dropped. A bug: report it with the engine's error log
//	kvxfer_parent_panics_total          counter    -               panics of the engine's top-level actors (tx and rx parents, senders) or of its
//	                                                               listener routing a control frame (Stats.ParentPanics): each failed the engine
//	                                                               (ErrEngineFailed: new requests refused, live ones drain). A bug: report it with
//	                                                               the engine's error log, then restart the engine
//	kvxfer_stream_violations_total      counter    -               peer-stream actors that disagreed with their session's step
//	                                                               (Stats.StreamViolations): the stream held its terminal frame. A bug: report it
//	                                                               with the engine's error log
//	kvxfer_closes_unproven_total        counter    -               data-plane endpoint closes that could not prove the writes on them over
//	                                                               (Stats.ClosesUnproven): their ops stay in doubt (kvxfer_ops_in_doubt), their
//	                                                               requests send no terminal frame and keep their source pages unless the backend
//	                                                               proved it reads none of them. Rising: check the data-plane links and peers
//
// Buckets: TransferBuckets (100 µs to 60 s) and ChunkWriteBuckets (10 µs to
// 10 s).
package metrics
