// Package trace records the messages kvxfer's sessions step on, replays
// them through the same step functions, and exports them as a timeline
// (DESIGN.md §8).
//
// # Recording
//
// A Writer is an actors.Tracer: set it as kvxfer.Config.Recorder, or set
// kvxfer.Config.TracePath and the engine opens one (and flushes and closes
// it in Engine.Close). Recording is off by default and costs nothing then
// (the shells test a nil recorder). When on, each session encodes its own
// records on its own actor — the message before the step, a digest of
// what the step left behind after it — and the Writer only appends whole
// lines to a buffered file under a mutex, so sessions never wait on each
// other's encoding. The file is bounded: past MaxBytes (DefaultMaxBytes
// unless WithMaxBytes says otherwise) the Writer writes one "truncated"
// record and counts, but drops, everything after it.
//
// # Deviation from DESIGN.md §7
//
// The tree's "tracer" is this Writer, not an actor: a tracer actor would
// add a mailbox hop and a copy per step and an unbounded mailbox, while
// encoding on the session's own actor keeps per-actor order for free
// (a session's records are written in the order it stepped).
//
// # Format (version 1)
//
// JSON lines, one object per record, each with a "kind":
//
//	{"kind":"trace","version":1,"t":T}                          first line
//	{"kind":"engine","engine":"ctx/0","t":T,"msg":EngineInfo}   once per engine
//	{"kind":"birth","actor":A,"seq":0,"engine":"ctx/0","side":"tx","request":"r1",
//	 "t":T,"type":"TxConfig","msg":TxConfig,"post":DIGEST}       once per session
//	{"kind":"step","actor":A,"seq":N,"t":T,"type":"TxChunk","msg":MSG,"post":DIGEST}
//	{"kind":"msg","actor":A,"t":T,"type":…,"msg":…}             plain Record calls
//	{"kind":"truncated","t":T}                                  MaxBytes reached
//
// T is the shell's clock in Unix nanoseconds (wall time: monotonic clock
// readings are not recorded, so a run during which the wall clock jumps may
// replay differently). A is the session's actor path, "instance/rank/pid",
// unique within a trace; seq counts each actor's records from 0 (its birth)
// and is gapless.
//
// "msg" is the Go value as encoding/json writes it (field names as in
// package actors; times as RFC 3339 with nanoseconds), with three
// exceptions: an error is its text (replay rebuilds it with errors.New, as
// steps only test and format errors); a messages.Frame is
// {"Type":"Result","Result":{…}}; and a TxPeerRequest carries, instead of
// its Route (whose Planner is code, not data), the generation rank's Hello
// and RequestData that built it — replay calls actors.ResolveRequest on
// them with the engine record's Topology and checks that the error and
// Expected come out as recorded. An EngineInfo is the engine's Self,
// Topology (layout, parallelism, rank, pool geometries) and Workers.
//
// DIGEST (type Digest) is what the step left behind: the session's state,
// error text, whether it stopped, each stream's op states (one letter per
// op, see OpLetter), pinned chunks, counters (late completions, stale
// frames, violations), pending writers, and one line per effect. A step
// that panicked has no digest and "panic":true.
//
// # Replay
//
// Replay reads a trace, rebuilds each session from its birth record, steps
// every recorded message in per-actor sequence order at its recorded time,
// and compares the digest after each step with the recorded one. It
// reports the final state of every session, or the first divergence (in
// file order): actor, sequence, message type, the first digest field that
// differs, expected and got.
//
// # Timeline
//
// ExportPerfetto turns a trace into Chrome trace-event JSON that Perfetto
// (ui.perfetto.dev) and chrome://tracing open: one process per engine, one
// thread track per session with a slice for its life, nested slices for
// its states (INIT, READY, TRANSFERRING, …) and an instant per message it
// stepped on; and async slices for ops, from the step that submitted each
// op (SUBMITTING) to the step that made it quiescent (BACKEND_DONE,
// NOT_SUBMITTED or RETIRED), one group per (request, peer).
package trace
