// Package sim is kvxfer's deterministic simulator (DESIGN.md §8): one
// goroutine, a seeded PCG (math/rand/v2) and one queue ordered by virtual
// time then sequence number drive the real step functions — every
// actors.TxSession of a context instance (TP a × PP b) and every
// actors.RxSession of a generation instance (TP c × PP d) — with a
// simulated backend, clock and control link, and check invariants after
// every step.
//
// # The model
//
// A seed draws a small layout (kvcache types, tiny head dimensions, full or
// sliding-window groups, sometimes MLA), both instances' parallelism, the
// workers, a few requests (prompt, chunking, prefix hits, start times and
// deadlines) and a fault plan. Each rank has real kvcache pools over a host
// region, driven through actors.Pools, so pins and frees are real and
// CheckInvariants runs after every step. Routes come from
// actors.ResolveRequest with the generation rank's Hello, so plans are the
// real ones; destination blocks are allocated as actors/parents.go does.
//
// The parents' decisions are the real ones, as actors/parents.go drives
// them: core.TxTable (Send's adoption, tombstones, the generation instance
// a request is bound to, refusals of unresolvable RequestData nobody
// claimed, Cancel answered at once, a tombstone left when no session
// has the request) and core.RxTable (each writer's RequestData, worker
// and planned bytes, the epoch, routing by writer, the down set) with
// core.AllocQueue (requests start in arrival order while blocks last, one
// that needs no block even behind a waiting head; one that can never fit
// fails), and each sender worker's
// decisions are core.WorkerTable's (its endpoints, its ops in flight, what
// closing an endpoint retires, what a crash puts in doubt; connects are
// synchronous here). The rest of the shells are models of the real ones: the tx
// parent's I/O (spawning sessions, replies, TxPeerRequest with the
// RequestData's prompt length), the tx shell (a refused Pin stepped back
// as TxPinFailed right after the effects that caused it; Decide handed to
// the handle), the rx parent's I/O (each writer's planned bytes are
// checked against the two ranks' shapes), the rx shell (RxBegin stepped
// first, as on Started; timers carry their kind), sender workers (what
// actors/worker.go does with Submit — TxSubmitted once the post returns —,
// Flush, CloseEndpoint, SendFrame — TxSent with the control link's answer
// for a stream's terminal frame —, SendRequestData — RxSent likewise; the
// link puts a frame on the wire before the worker reports it, and under
// FaultSentLate (a stream of its own) a generation worker is held up
// between the two, stepping nothing else, until an answer of the writer
// (a Misaddressed, a Result) reached the session, or a while —
// and a restart: TxInDoubt, then close every endpoint, which retires its
// ops, then every control connection; a restart inside a terminal frame's
// send reports it not sent, inside a RequestData's reports nothing — a
// generation rank's workers restart too, closing their connections — and
// a stop for good (FaultWorkerDead: its endpoints and connections closed,
// its mailbox lost, then TxWorkerDead or RxWorkerDead to every session,
// its frames through the next live worker, its ops never posted, Send and
// Receive refused)), and
// the serving processes (Send and
// chunks — refused once the handle's Decided carries an error, or its
// pin ledger was swept (the session stopped) —, Receive,
// cancel, and freeing blocks after Done). A batch lands —
// its segments are copied between the two regions — at a scheduled time; a
// closed endpoint's batches never land and complete with
// rdma.ErrEndpointClosed, as the rdma.Endpoint contract says; under
// FaultHungBatch (a stream of its own) a batch hangs — its peer alive
// but not progressing — and neither lands nor completes until its
// endpoint is closed or its peer's death detected, so that only the
// closes a session owes (after its deadline's drain grace, or when its
// peer is declared gone) end its drain. Under FaultCloseUnproven (a
// stream of its own) a context rank's close of an endpoint with writes
// on the wire may prove nothing (rdma.ErrCloseUnproven): the cut batches
// complete saying so (TxCompleted.Unproven), no op is retired, a worker
// that stops names those ops (TxWorkerDead.InDoubt), and the cut writes
// still land later, where every physical check above applies; the
// writer's process exits a while later (its supervisor restarts it:
// 20 ms to 4 s after its first such close, log-uniform), and the
// generation ranks' exit proofs settle what it held. A write the backend
// did not prove over owes nothing to when it was due: each cut batch's
// landing is drawn anew at the cut — soon after it, any time before the
// exit, just before the exit, or never (it settles with the exit) — so
// that it may land past deadlines, drain graces, Cancel re-sends, worker
// stops and session stops, into whatever the engine did meanwhile with
// the pages it reads and writes; with Config.CtxWorkerStops the worker
// that closed may also stop for good before the exit, holding those ops
// in doubt (its stop must name them, whatever sessions stopped since).
// FaultCutLandsLate counts the cut writes that land 100 ms or more after
// their cut, so that coverage fails if the model stops reaching them.
// A write whose close proved it over lands before that proof. Under
// FaultCloseSourcesReleased (half of those closes, a stream of its own)
// the close also proves the backend reads none of the cut writes'
// sources any more (rdma.ErrSourcesReleased, as UCX's): each cut batch
// keeps the bytes it had read (what still lands) and reads its source no
// more, the ops are retired unproven (TxRetired.Unproven), and their
// sessions unpin and stop while no frame tells the peer the writes are
// over — the checks catch a terminal frame to it, or a CancelAck that
// frees blocks a cut write then lands in. A serving
// process writes each chunk's KV (a function of global coordinates only)
// just before the chunk's fence fires, so a receiver can check its bytes
// without trusting the plan code.
//
// A request's chunks may leave in layer parts (kvcache.Chunk.Layers),
// drawn per request from a stream of their own: whole, one part per layer
// (as vLLM's save_kv_layer), or split unevenly at random layers, chunk by
// chunk. Each part is a TxChunk with its own fence; a chunk's parts are
// handed in layer order from layer 0 with the chunk's source blocks, as
// TxHandle.Chunk requires, and their fences fire in that order, each after
// the serving process wrote only that part's layers. Every part goes
// through a kvcache.ChunkOrder, the order TxHandle.Chunk keeps (Check, then
// Took), and one hand in eight, drawn from a stream of its own, first tries
// a wrong one (WrongChunk: a part that skips layers, another chunk while a
// chunk's parts are pending, other sources, a chunk out of token order, one
// after the last), which Check must refuse as out of order without moving
// the order; then the right one must be accepted. The handle's checks of
// the source blocks themselves (allocated, covering the chunk) are not
// modelled: the session takes any chunk it is handed. A chunk's source
// blocks are pinned by the handle before it reaches the session
// (TxChunk.Pinned), but a serving process in four, drawn from a stream of
// its own, hands them unpinned (as a replayed trace of an engine whose
// handle did not pin): the session's Pin takes them, and under
// FaultPinRefused (FaultSessionPinRefused) a block freed just before is
// refused there and the session hears TxPinFailed.
//
// Mailboxes are FIFO per (sender, receiver); the control link encodes and
// decodes every frame and is FIFO per connection (a worker's DEALER to a
// peer), as ZeroMQ over TCP is: reordering happens across connections.
// A worker's connection to a peer is not forever (conn.go): it is dialled
// on the first frame, and remade — the next frame dials a new one — after
// the worker restarts or stops, or a send fails other than for a full
// queue (actors/worker.go). Frames of the new connection owe nothing to
// those still on the old one: under FaultConnRemade a closed connection's
// frames leave late, within its linger, so that the new one's overtake
// them (a Cancel its RequestData, on the generation side; a CancelAck or
// a FAILED reply a Result, on the context side), or the tail of them is
// lost; that fault also restarts workers with frames in flight, on both
// sides. A Cancel that reaches a context rank while its RequestData is
// still on its way is counted (Result.CancelsOvertook).
// A send fails (the frame never leaves) when the peer is in no directory
// (a context instance that does not exist) or the seed makes the
// connection refuse frames; a frame to a dead peer is taken and lost.
// Under FaultFrameRefused (a stream of its own) the control plane refuses
// a RequestData for the frame itself (control.ErrFrameRefused, as past
// the writer's MaxFrameBytes), at any send of it — the first, a re-send
// after a refusal for the connection, one re-addressed to a restarted
// writer —, also when other writers of the request already have theirs:
// the session must fail the request at once naming the refusal, owe that
// writer nothing, and send it one Cancel carrying the reason; the
// writer's session that Cancel reaches must fail naming it, and a Send
// that comes after it must be refused naming it (the first Cancel's
// reason, whatever it is).
// Under FaultDownClosesConn (a stream of its own) a rank that hears a
// peer is down closes each sender worker's connection to it, a mailbox
// hop later, as actors/worker.go does on workerPeerDown: the frames still
// in flight on it leave late within the linger or are lost from some
// point on, and the worker's next frame dials anew.
// A context rank the failure detector declared down for a stall, or for a
// partition it suspected, is heard again as the stall ends or the
// partition heals (Engine.PeerAlive, FaultHeardAgain): its generation
// ranks' sessions hear RxHeard, and those that suspected it of missed
// heartbeats send it the Cancel again at once; their blocks leave
// quarantine only on its answer (a session that took hearing it as a
// proof fails in 9 seeds in 100).
// Under FaultResultRefused (a stream of its own) the control plane
// refuses a context rank's SUCCESS Result for the frame itself (as past
// the generation rank's MaxFrameBytes with its payload): the session must
// not end DONE, must fail naming the refusal when it decides the request,
// and must answer that stream's peer in the same step with its outcome
// without payload, which the generation side takes as its proof.
// A rank's death takes its incarnation's state, its in-flight frames (both
// ways) and its in-flight writes with it; a return boots a fresh
// incarnation (new region, new agent address). Frames a generation rank
// sends to a context rank while it is down, and will return, wait on their
// connection and reach its next incarnation (ZeroMQ reconnects a DEALER to
// the same endpoint), addressed to the incarnation the sender knew: that
// incarnation drops a RequestData addressed to its predecessor and answers
// it with a Misaddressed (core.IncarnationTable.Misaddressed,
// core.MisaddressedAnswer, as the tx parent), through the link like any
// reply; the session that takes it sends the RequestData again to the new
// incarnation (Readdress: the rx parent's table follows). From then on the
// checks count only the new incarnation's terminal frame or exit as the
// writer's end, and a Misaddressed whose claim is true (the incarnation
// it names is gone and never admitted that RequestData: the simulator
// records what each incarnation admitted) shows the earlier copies were
// never acted on, and the exit of an incarnation the RequestData no
// longer goes to must not move the session. So that the answer may come
// before the requests are decided: one context return in three comes at
// once (0.2 to 2 ms, before the failure detector's timeout); for a rank
// that returns, its death's exit proof comes only after the return one
// time in two (0.1 to 30 ms after it, as a proof through the control
// plane, the next incarnation's record replacing the dead one's, rather
// than a pidfd); and each live generation rank's control link holds the
// previous incarnation's Hello for 0.1 to 20 ms after a return (or until
// a frame of the new one comes), so that requests started meanwhile are
// addressed to the dead incarnation (one proven exited fails at start,
// as rxParent.start does). A rank that returns is only suspected, never
// proven dead, when its heartbeats stop (its next incarnation may still
// get the frames). Result counts the answers sent and taken and the
// frames that reached the next incarnation. The control plane's
// failure detector is modelled as heartbeats: a rank that died and stays
// silent for a while is declared to every live rank on the other side (and
// to any that boots later) through the engine's own peer-down path —
// TxPeerGone to every tx session, RxSuspect to every rx session it writes
// for (heartbeats prove nothing), the rx parent's down set; when the rank
// really is dead, the backend's proof of its death (shm: a pidfd) comes
// with it as RxPeerGone. A rank that came back first is never declared.
// Under FaultIncarnationDown (a stream of its own) a rank's exit is also
// seen at once by every live rank on the other side (a same-host peer's
// pidfd, which is no proof): Engine.PeerIncarnationDown for that
// incarnation, through each side's parent — TxPeerGone naming it to every
// tx session (only streams to it or an earlier incarnation fail),
// core.RxTable.PeerDown with it and RxSuspect naming it on the generation
// side (blocks quarantined until a proof) — soon after the exit or, for a
// rank that returns, one time in two after its next incarnation booted,
// whose requests must go on (a session that re-addressed a writer to it
// while the parent's table still named the dead one included).
// Partitions delay frames and writes until the heal; Config.SuspectPartitions
// (make sim's default) declares them too. A stalled context rank
// (FaultStall: SIGSTOP, GC) steps nothing until it resumes, its posted
// writes land on time (RDMA) or after the resume (an shm copy stopped
// midway), and every generation rank suspects it meanwhile. Clocks drift
// within ±2 % (FaultClockDrift) besides jumping. A request that fails while
// a writer has given no proof quarantines its blocks (issue 17) until one.
// With FaultWriterLease, context ranks hold writer leases on generation
// ranks (core.PeerLeases) renewed by periodic heartbeats (lost in a
// partition, heard late by a stalled rank) and by frames; a lapse fences
// the writer from that peer as the real tx parent does.
//
// As actors/parents.go does, the tx parent finishes the handle of a
// session that stopped before Engine.Send adopted it, and the rx parent
// fails a request whose writer is declared dead before any RequestData
// leaves.
//
// # Invariants
//
// After every step: a session's Violations stay empty; the first terminal
// outcome is never overwritten and Finish reports it; no Pin and no new op
// after the outcome; an Unpin only when every op is quiescent and no
// posted, unsettled write reads the blocks (DESIGN.md §3's rule, checked
// logically and physically); a terminal frame (Result other than SUCCESS,
// CancelAck) only when every op that wrote that epoch is quiescent;
// ReleaseDest only when no posted write may still land in the blocks; a
// write reads only pinned source blocks and lands only in blocks its
// request's session still owns, never after its endpoint closed, and
// reads only source layers whose fence fired (the serving process wrote
// them: an op of a layer part that read a later part's layers would copy
// stale bytes), never a block's padding; the serving process writes a
// chunk's KV, until its fence fires, into source blocks it still holds
// (a session that let Done fire first would let it free them while its
// kernel writes: the pages could be reused); every
// pool passes CheckInvariants; a READY request's bytes equal what the
// sources wrote (at READY and again when its blocks are freed), and each
// of its writers reported SUCCESS with exactly the bytes the two ranks'
// shapes give; ReleaseDest never treats a writer whose RequestData left as
// quiescent without its terminal frame or death; a Misaddressed whose
// claim is true, about the copy the session knows left to the
// incarnation its writer is addressed to, is taken (the writer addressed
// anew) once the session stepped both it and the report that the copy
// left, in whichever order they came; Decide comes once, at the
// terminal transition; a completion never precedes its TxSubmitted. A
// request whose Receive names another prompt length is never READY there,
// and no context rank writing to that rank ends DONE. A request with a
// writer that was never connected is decided by its deadline and its
// blocks are released (at once when no RequestData ever left).
//
// At the end (the queue is empty): every session stopped and terminal,
// every request answered, every block back in its pool (none leaked or
// quarantined), nothing in flight. In a calm seed (no faults, long
// deadlines) every request must end READY and DONE.
//
// # Faults and coverage
//
// Fault and Race list the fault kinds a seed may inject and the races of
// DESIGN.md §3; Result counts which fired, the layer parts sessions took,
// the wrong chunks refused, the Cancels that overtook their
// RequestData and the answers a session took before the report that
// their RequestData left (by kind). TestSeeds fails when a fault kind, a
// race, a kind of wrong chunk or a Cancel overtaking its RequestData is
// reached in fewer than one seed in 1,000, or when fewer seeds than that
// have a request handed in parts end READY, a Misaddressed taken, or a
// Misaddressed or a Result reach its session before that report. (A
// CancelAck does so only when its Cancel left through another worker:
// the Cancel waits in the same worker's mailbox behind the report.) TestMutations turns on
// each actors.Mutations switch and requires a failing seed within 1,000.
//
// FaultWorkerDead stops generation ranks' workers, and context ranks' too
// with Config.CtxWorkerStops (-ctx-worker-stops; TestCtxWorkerStop runs
// as many seeds as TestSeeds with it, and keeps fixed the bug it found).
// A rank keeps one live worker, and a generation rank
// with a writer that can never be reached keeps them all: a RequestData
// lost with a stopped worker gets no report, so its session waits for a
// proof only that writer could give.
//
// # Reproducing a failure
//
// A failing seed is reported with a command that reproduces it
// (go test ./test/sim -run 'TestSeed$' -seed=N -v) and the path of its
// trace: JSON lines of every message delivered to every actor (actor,
// per-actor sequence number, type, payload summary, virtual time). `make
// sim SEEDS=N` runs N seeds on every core.
package sim
