// Package trace records the messages kvxfer's sessions step on and the
// calls the tx and rx parents, the listener and the sender workers make on
// their pure tables, replays both through the same step functions, and
// exports them as a timeline (DESIGN.md §8).
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
// # Rotation
//
// A long-running process would keep only its first MaxBytes that way, not
// the incident that came later. With WithRotate(keep) a Writer from
// Create instead rotates at its bound: it ends the file with its "end"
// record, renames PATH to PATH.1 (PATH.1 to PATH.2, …, deleting PATH.keep
// beyond keep) and starts a new PATH — made and locked beside it first
// (PATH.rotating) and put in its place before the ended file is closed,
// so that PATH stays locked and a Create there during the rotation is
// refused (ErrInUse; on a file system without hard links, PATH is briefly
// missing between two renames) — whose header names its part
// ("part":2 for the first rotation's file, and so on) followed by every
// engine record the Writer wrote, so that each file replays and exports
// on its own. Nothing else is written again: a session's or table's state
// after its birth is not a record (re-emitting the birth would make its
// later steps diverge), so a session in flight at the rotation, and the
// parents', listener's and workers' tables, which live as long as their
// engine, have only their later records in the new file. Replay of a part
// past the first skips those records and names their actors
// (Result.Earlier: "began in an earlier file"), not a divergence and not
// a malformed trace; it replays everything born in the file. In a file
// without a part (a first file) a record before its actor's birth is
// still malformed. The rotation runs where a full buffer's flush runs, on
// the recording goroutine that crossed the bound under the Writer's lock
// (a flush, a create, up to keep renames, a link, a rename and a
// close); one that fails stops the Writer as a failed write does
// (WithOnStop, Close's error), and the files written so far stay whole.
// Create moves an earlier run's trace at PATH aside, never truncating it
// (it may be the failed run's): PATH to PATH.prev-<UTC time> and its
// rotated parts (PATH.1 … PATH.N while each begins as a trace) to
// PATH.prev-<UTC time>.1 …, so that PATH and PATH.N hold one run
// (Writer.MovedAside names where it went). It
// keeps the newest DefaultKeepPrevious (4) earlier runs so moved
// (WithKeepPrevious), by the time and -N in their names, the one it just
// moved always among them, and removes the older sets with their parts,
// so that a process restarted in a loop does not fill its disk; it
// removes only names of exactly that form, and Writer.NotPruned says why
// one could not be removed.
//
// # Deviation from DESIGN.md §7
//
// The tree's "tracer" is this Writer, not an actor: a tracer actor would
// add a mailbox hop and a copy per step and an unbounded mailbox, while
// encoding on the session's own actor keeps per-actor order for free
// (a session's records are written in the order it stepped).
//
// # Format (version 4)
//
// JSON lines, one object per record, each with a "kind". Version 2 adds
// the "table" and "call" records, version 3 the "end" record, version 4
// digest lines that tell a ReleaseDest out of quarantine ("ReleaseDest
// blocks=N quarantined") from a plain one and name a QuarantineDest's
// blocks and writers; version 1 (sessions only), 2 and 3 traces still
// read and replay, their digests compared in the form they were written.
//
//	{"kind":"trace","version":4,"build":B,"t":T}                first line
//	{"kind":"trace","version":4,"part":N,"build":B,"t":T}       first line of a rotated-in file
//	{"kind":"engine","engine":"ctx/0","t":T,"msg":EngineInfo}   once per engine
//	{"kind":"birth","actor":A,"seq":0,"engine":"ctx/0","side":"tx","request":"r1",
//	 "t":T,"type":"TxConfig","msg":TxConfig,"post":DIGEST}       once per session
//	{"kind":"step","actor":A,"seq":N,"t":T,"type":"TxChunk","msg":MSG,"post":DIGEST}
//	{"kind":"step",…,"type":"RxFrame","msg":MSG,"panic":true,"panic_value":P}  a step that panicked
//	{"kind":"msg","actor":A,"t":T,"type":…,"msg":…}             plain Record calls
//	{"kind":"table","actor":P,"engine":"ctx/0","t":T,"type":KIND,"msg":TableBirth}
//	{"kind":"call","actor":P,"seq":N,"t":T,"type":METHOD,"msg":TableIn,"out":TableOut}
//	{"kind":"truncated","t":T}                                  MaxBytes reached
//	{"kind":"end","t":T,"msg":{"records":N,"dropped":D}}        Close, last line
//
// B names the kvxfer build that wrote the trace ("v1.2.0", "(devel)
// 0123456789ab+modified"; absent in traces of earlier builds, and not a
// format change: readers ignore it). A header is the first line only: a
// file with a second one holds two traces joined (cat), which replay
// refuses. T is the shell's clock in Unix nanoseconds (wall time:
// monotonic clock readings are not recorded, so a run during which the
// wall clock jumps may replay differently). A is the session's actor path, "instance/rank/pid",
// unique within a trace; seq counts each actor's records from 0 (its birth)
// and is gapless.
//
// "msg" is the Go value as encoding/json writes it (field names as in
// package actors; times as RFC 3339 with nanoseconds), with three
// exceptions: an error is its text (replay rebuilds it with errors.New, as
// steps only test and format errors); a messages.Frame is
// {"Type":"Result","Result":{…}} (with "WireStatus", the status as it
// came, for a Result of a status this build does not define); and a
// TxPeerRequest carries, instead of
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
// that panicked has no digest, "panic":true and P, what it panicked with
// (fmt.Sprint of the value; absent in traces of earlier builds, and not a
// format change). Its record is written, and the trace flushed to its
// file, as the panic goes up to the session's supervisor
// (actors.StepPanicTracer): a session's last step is in the trace when it
// panicked too, and so is it when the process dies of the panic.
//
// # Parent and worker steps (version 2)
//
// Each table a shell makes — the tx parent's core.TxTable ("TxTable", P
// "ctx/0/tx"), the rx parent's core.RxTable ("RxTable", "ctx/0/rx") and
// allocation queue ("AllocQueue", "ctx/0/rx/queue"), the listener's
// core.RouteFrame ("RouteFrame", "ctx/0/listener") and each sender
// worker's core.WorkerTable ("WorkerTable", "ctx/0/worker-1") — has a
// "table" record with what it is made from (actors.TableBirth), then one
// "call" record per call that decides or changes something, in the order
// the actor made them: METHOD is the table's method ("Open", "Route",
// "Drain", "Admit", …), "msg" its inputs (actors.TableIn) and "out" its
// outputs (actors.TableOut), T the shell's clock when it was called (the
// "now" RxTable.Start takes). A table made again (its actor restarted) is
// "P#2", and so on. seq counts a table's calls from 1, gapless. The
// encodings: frames as in session records; an error as its text; a
// worker's session as its actor's id and an endpoint as its key's bytes
// (base64); a message queued behind a Connect as actors.WorkerMsg names it
// ("submit REQ/peerN/opM", "flush PEER", "close PEER"); a Drain's inputs
// are the pool's answers in order (blocks, or an error and whether it was
// kvcache.ErrOutOfBlocks) and its outputs the requests it started or
// failed. A Tracer records tables when it is also an actors.TableRecorder
// (the Writer and Tee are).
//
// # Replay
//
// Replay reads a trace, rebuilds each session from its birth record, steps
// every recorded message in per-actor sequence order at its recorded time,
// and compares the digest after each step with the recorded one. It
// reports the final state of every session, or the first divergence (in
// file order): actor, sequence, message type, the first digest field that
// differs, expected and got. It makes each recorded table anew — the real
// core tables, not models — makes every recorded call on it in sequence
// order at its recorded time (a Drain's pool answering as recorded, a
// worker's endpoint being its key), and compares the outputs with the
// recorded ones: a divergence there names the table's actor, the call's
// sequence, method and line, the first output field that differs
// ("out.Verdict"), expected, got, and the recorded inputs. A step
// recorded as panicking must panic in replay too (one that does not, or
// one that panics unrecorded, is a divergence, field "panic"); each that
// does is in Result.Panics with what it panicked with, recorded and in
// replay, and Result.Print says so — a reproduced panic, not a
// divergence. A step of a message type this kvxfer does not know (a newer
// build's, or one an older build's codec did not encode) is not stepped:
// it is a divergence naming the type and its line (field "type"), as an
// unknown table method is. An RxTable Route records whether its sender
// was down (it leaves the down set on any frame), and replay compares
// that too. A trace whose last line is a partial record (its process
// was killed or crashed while writing it) replays up to its last whole
// record, and Result.TornLine
// names the partial one; so does a trace whose last line ends in zero
// bytes (its machine stopped before the file's last writes reached the
// disk: Result.TornZeros). A trace of version 3 or later without its "end"
// record was not closed (its process stopped between two flushes, or
// still writes it): it replays, and Result.Unclosed says its last records
// may be missing. A divergence in a trace that another kvxfer build
// recorded (or an older format, or a build before headers named theirs)
// may be a change of behaviour between the two builds, not a fault of
// the run: Result.Print says so, naming both.
//
// # Timeline
//
// ExportPerfetto turns a trace into Chrome trace-event JSON that Perfetto
// (ui.perfetto.dev) and chrome://tracing open: one process per engine, one
// thread track per session with a slice for its life, nested slices for
// its states (INIT, READY, TRANSFERRING, …) and an instant per message it
// stepped on; and async slices for ops, from the step that submitted each
// op (SUBMITTING) to the step that made it quiescent (BACKEND_DONE,
// NOT_SUBMITTED or RETIRED) or released its source (SOURCES_RELEASED), one
// group per (request, peer). Above the
// sessions, each table has a track ("tx (TxTable)", "worker-1
// (WorkerTable)") with an instant per call (category "table"), named for
// its method and what it is about ("Admit r1/peer0/op3", "Route Result
// SUCCESS r1 from ctx/0"), its inputs and outputs in its arguments.
// Timestamps count from the trace's header, whose wall-clock time the
// document's otherData names (trace_start, trace_start_ns). A part past
// the first of a rotated trace exports what was born in it; the records
// of sessions and tables born earlier are left out and counted
// (ExportStats.Skipped, SkippedActors), and `kvxfer trace export` says so.
package trace
