// Package zmq is kvxfer's control plane between processes: a control.Link
// over ZeroMQ (pebbe/zmq4, cgo on libzmq ≥ 4.3).
//
// # Sockets and who owns them
//
// No zmq socket is ever touched by two goroutines (libzmq sockets are not
// thread safe). Each Link has its own zmq context and:
//
//   - one ROUTER, bound by Listen to Config.Bind, and, unless insecure, one
//     REP socket bound to the context's ZAP endpoint. Listen creates both and
//     hands them to the listener goroutine, which alone uses and closes the
//     ROUTER and starts the ZAP goroutine, which alone uses and closes the
//     REP socket. Both wait in Go's netpoller on their socket's ZMQ_FD
//     (sockwait.go), not in zmq_poll: a goroutine blocked in a cgo call
//     keeps its P, and the goroutines a frame wakes would wait for it;
//   - the PAIR connected to the ROUTER's socket monitor (failed handshakes
//     only: FailedHandshakes), which Listen makes and a goroutine of the
//     listener's reads, waiting in the netpoller too; once that goroutine
//     ended, the listener goroutine stops the monitor and closes the PAIR,
//     then the ROUTER;
//   - one DEALER per directory peer, owned by the heartbeat goroutine, which
//     says Hello and then sends a Heartbeat every HeartbeatInterval, and,
//     for each, the PAIR socket connected to that DEALER's socket monitor
//     (inproc), owned by the same goroutine, which polls them without
//     blocking (sleeping in Go between polls) every 100 ms while a peer's
//     connection is not up, else at each beat, and closes both (monitor
//     stopped first) when the peer's socket is remade or the link closes
//     — but for the DEALERs of connected peers, which it hands, as it
//     stops, to Link.Close to say goodbye on (see Goodbye below); Close
//     uses them only after that goroutine has ended;
//   - one DEALER per Conn returned by Dial, used by the goroutine that
//     holds the Conn (a sender worker) and, while the Conn has a terminal
//     backlog, by that backlog's flusher goroutine, one at a time under the
//     Conn's mutex, and, until a frame first leaves on it, the PAIR
//     connected to its socket monitor (handshake failures only), used
//     the same way. Conn.Send never blocks (see Send queues below).
//
// Close stops these goroutines, which close their sockets with linger 0, and
// every flusher; the heartbeat DEALERs that carry a goodbye close with a
// linger of 200 ms (goodbyeLinger). The context is terminated when the
// Link is closed and its last Conn is closed.
//
// # Send queues
//
// Each Conn queues at most Config.SendHWM frames in its socket. When that
// queue is full (the peer is slow, unreachable, or refuses our key):
//
//   - a RequestData (or Hello) is refused with ErrQueueFull; it was not
//     queued, the Conn stays usable and what it queued before stays queued;
//   - a terminal frame (Result, Cancel, CancelAck, Misaddressed) is never refused for the
//     queue: it waits in the Conn's terminal backlog, in order, and a
//     flusher goroutine moves the backlog into the socket as the queue
//     drains (retrying every 1..50ms). While a backlog waits, every later
//     frame queues behind it: a RequestData is refused, a terminal frame
//     joins it. The backlog is bounded too (Config.TerminalBacklog, 4096
//     frames by default: a peer that takes nothing for long cannot make us
//     grow without bound); past it, terminal frames get
//     ErrTerminalBacklogFull, an ErrQueueFull (keep the Conn) that says
//     the frame is lost for good: unlike a refused RequestData nothing
//     sends it later, so its caller must end the request knowingly.
//
// Only heartbeats are shed: a heartbeat socket that cannot queue a beat
// drops it (the peer then sees silence, which is the truth). Closing a
// Conn drops whatever it still queues, its backlog included, so a caller
// keeps a Conn on ErrQueueFull. A terminal frame Send accepted is never
// dropped unsaid: when its backlog is dropped (the Conn's Close after
// its linger, the Link's Close, a socket that fails for good), Close
// returns ErrTerminalDropped naming the peer and the count (and Send
// returns it once the socket failed). Frames already in the socket's
// queue when it closes get its linger (closeLinger) and are not
// counted: libzmq does not say what it dropped. Stats counts refusals
// (QueueFull; TerminalRefused of them terminal), frames that waited in
// a backlog (Backlogged) and terminal frames dropped from one
// (TerminalDropped).
//
// # Authentication (CURVE and ZAP)
//
// Unless Config.Insecure, the ROUTER is a CURVE server with the link's
// secret key, Conns and heartbeats are CURVE clients that know each peer's
// server key (Curve.PeerServerKeys), and every incoming handshake is put to
// the link's own ZAP handler, which admits only the keys of
// Curve.AllowedPeers and Curve.Identities (and those added with AllowKey
// and AddIdentity), and hands the ROUTER the key as the connection's
// User-Id. zmq4's AuthStart/AuthCurveAdd are not used: they are
// process-global (one handler goroutine and unsynchronised policy maps for the
// whole process, bound in the default context only), so two links in a
// process, or a link and any other zmq4 user, would share and race on one
// policy. Instead each Link makes its own zmq context, so its ZAP endpoint
// (inproc://zeromq.zap.01 is per context) belongs to it alone, and the
// link's ZAP goroutine serves its ZAP requests. A refused handshake is counted (Refused) and never reaches the
// ROUTER: the peer's frames are never seen, its Hello never stored. libzmq
// ends a session that failed authentication for good (no reconnect), so a
// peer admitted later (AllowKey) must dial again; a heartbeat socket that
// was refused is made again once the peer says Hello on a new connection
// of its own (it learned this link's key: a registry told it of this link
// after this link dialed it), or at Redial; else it stays silent until its
// link restarts. So is a Conn's DEALER refused before any frame left on
// it (its monitor says so; Redial also redials one that failed on a
// protocol error): nothing left, so everything the Conn queued (its
// Hello first, then its terminal backlog) goes on the new connection, in
// order. A Conn refused after a frame left on it (the peer restarted at
// its endpoint refusing our key) is not watched: its owner dials anew
// once it sees the peer down.
//
// # Startup mistakes are named, on the side that sees them
//
// A refused client key is logged by the ZAP handler at warn ("refused
// CURVE handshake from ADDRESS: key PREFIX is not allowed"), throttled per
// key. The client learns it from its heartbeat DEALER's socket monitor
// (handshake succeeded, failed: auth, protocol, no detail; connected,
// disconnected), which also names a wrong server key (the server hangs up
// during the handshake), a CURVE/insecure mismatch, and an endpoint where
// something that is no kvxfer engine accepts the connection and then
// hangs up or never completes a ZeroMQ handshake (a handshake silent for
// a second is named as a hint, which allows a peer too loaded to answer
// yet, and as timed out only at libzmq's handshake timeout, 30 s; one
// that ends sooner is a hang-up): the link logs
// "CURVE handshake with PEER at ENDPOINT failed: REASON" at warn
// (throttled per peer) and PeerState(peer) reports the connection's
// ConnState and the reason, for an embedder to print while it waits for a
// peer's Hello. Only heartbeat sockets are watched for it: PeerState
// needs heartbeats on.
//
// Endpoints must name a transport: "127.0.0.1:5000" is refused (ErrConfig)
// with "did you mean tcp://127.0.0.1:5000?". An IPv6 address goes in
// brackets, tcp://[::1]:5000 (the sockets for it get ZMQ_IPV6, and so do
// those for a peer's host name that resolves to IPv6 addresses only, such
// as one mapped to ::1 alone; other tcp:// endpoints, host names with an
// IPv4 address included, resolve IPv4 only). Listen refuses an ipc:// path
// a live process accepts on (ErrEndpointInUse): libzmq would unlink the
// path and take it over. A socket file nobody accepts on (its process
// died) is stale and replaced.
//
// # Identity: a key speaks only for what it is bound to
//
// Admission is not identity. Each key is bound to the PeerIDs it may
// speak for, from two sources:
//
//   - Curve.Identities (and AddIdentity): the key may speak as any rank of
//     Instance, or only as Ranks when they are given;
//   - PeerServerKeys (and SetPeerServerKey): a link uses one keypair as its
//     ROUTER's server key and its DEALERs' client key, so the server key we
//     hold for a PeerID also binds that key to that PeerID. This keeps the
//     older form (AllowedPeers plus PeerServerKeys of the same keys) secure
//     and working unchanged.
//
// A key admitted (AllowedPeers, AllowKey) but bound to nothing speaks for
// no one: every frame on its connections is rejected (New logs a warning
// for each such key). There is no "any PeerID" binding.
//
// The listener reads the User-Id with every message, and rejects (reason
// identity) a frame, Hello included, whose sender its key may not speak
// for. Besides, a PeerID stays bound to the key of its first Hello while it
// is alive: a Hello for it from another key that may also speak for it (a
// key rotation binds two keys to one instance) is rejected (reason taken);
// a Hello from the same key is a reconnect or a new incarnation and is
// accepted.
//
// Insecure links use the NULL mechanism with no ZAP at all; New logs a
// warning. Frames are then neither authenticated nor encrypted.
//
// # What the listener accepts
//
// Every message on the ROUTER is checked in this order, and a failure is a
// counted rejection (Stats.Rejected, by RejectReason) and a throttled log
// line, never a delivery:
//
//  1. envelope: exactly one payload part after the routing id (envelope);
//  2. size: at most Config.MaxFrameBytes (oversize; libzmq itself drops the
//     connection of a peer announcing more than MaxFrameBytes+64 KiB, before
//     allocating; those are not counted here). The listener's Hello says
//     its limit (Hello.MaxFrameBytes, range-checked by Decode), and a Conn
//     to it refuses at Send, with ErrFrameTooLarge naming the request, the
//     size and both limits, a frame past it, and every frame once our own
//     Hello is past it: of a peer of this version, this check drops only a
//     Hello past the limit (said at Dial and by heartbeats, and named
//     here with its size), never a request's frame;
//  3. messages.Decode: the protocol version (version: a frame of another
//     version; on a CURVE connection the link remembers the version the
//     key speaks, and Hello(peer) for the peers it may speak for fails
//     with a PeerVersionError naming it, until the key says a valid
//     Hello; without a key, OtherVersionUnnamed keeps the last such
//     version), then type and every field range-checked (decode);
//  4. identity, in CURVE mode: the connection has a key, it has not
//     changed, and it may speak for the frame's sender (identity);
//  5. binding: a connection (a ROUTER routing id) must say Hello first
//     (no_hello), and every later frame on it must name the Hello's PeerID
//     as Sender and, when the Hello named an incarnation, no other
//     incarnation as its FromIncarnation (one naming none is taken as the
//     Hello's; sender); a second Hello on the connection may not change the
//     PeerID, nor claim the listener's own (sender); a PeerID stays bound
//     to the key of its first Hello while it is alive (taken); bounds
//     (full); a Hello of an incarnation RemovePeer forgot puts nothing
//     back in the directory and binds the name to no key, until an
//     AddPeer or SetPeerServerKey of the name lets it back (departed; its
//     connection is bound all the same: its last frames are delivered).
//
// One frame before Hello is delivered instead of rejected (no_hello): a
// RequestData addressed to an earlier incarnation of this rank whose
// sender says it takes a Misaddressed answer (RequestData.Features). Its
// connection was made to that earlier incarnation and reconnected to this
// one, restarted on the same endpoint, before the sender heard of it; the
// engine drops the frame and answers it, so that the request is addressed
// anew instead of lost. It binds nothing, is no sign of life, and passes
// the identity check first, as every frame.
//
// A peer can therefore not speak for a PeerID its key is not bound to,
// whatever key it holds; in insecure mode it can still claim any PeerID on
// its own connection.
//
// Hello is stored in the directory (Hello(peer) returns it); Heartbeat only
// marks the peer alive, and a goodbye (a Heartbeat with Leaving) marks it
// down (see Goodbye); every other frame goes to deliver, in the order its
// connection sent it. Any accepted frame counts as a sign of life, except
// those on a connection whose Hello named an incarnation RemovePeer
// forgot (and no AddPeer or SetPeerServerKey let back), or one that said
// goodbye (see Goodbye): there heartbeats
// are dropped and other frames delivered, and none keeps the name alive,
// brings it back from down, tells OnPeerAlive or counts as a twin.
//
// Bounds: a listener binds at most 16384 connections (bindings of peers
// that are down, or that the full directory forgot, then of superseded
// incarnations, are forgotten first when full), at most 4096 of them for
// one identity (one CURVE key; insecure, one PeerID), and learns at most
// 4096 PeerIDs; past that, Hellos are rejected (full). An identity at its
// 4096 makes room only from its own bindings that would be forgotten
// when full; else its new connection's Hello is rejected, naming the
// identity and the bound (a later frame on its connection tries again,
// see below), and its bound connections and every other
// identity's stay: one peer saying Hello on many connections cannot take
// the others' room. A rank opens one connection per sender worker and a
// heartbeat socket to each listener (1025 at most), and a new one on
// each redial. The ROUTER does not tell the listener that a connection
// closed (ZMQ_ROUTER_NOTIFY is a draft API), so a live peer's closed
// connections (a worker restarted, a redial) keep their bindings; at a
// bound (the identity's, the table's) the listener therefore first
// probes the bindings it would make room from, at most once a second
// each: it sends each connection an empty message (ZMQ_ROUTER_MANDATORY),
// and forgets those whose connection is gone (EHOSTUNREACH). Nothing
// reads such a message: it waits in the DEALER's receive queue, at most
// a few per connection (ROUTER send HWM 4). A live
// connection whose transport is being re-established just then (a TCP
// reconnect keeps its routing id, but the ROUTER holds none for it in
// between) looks gone too; the listener therefore remembers the bindings
// a probe forgot (at most 4096; past that, those older than a minute go
// first) and binds the connection again, room permitting, when a frame
// of the same key and sender comes on its routing id: its frames are
// delivered, where they were refused (no_hello) until a Hello that a
// Conn repeats only when the peer's incarnation changes. A probe finds
// a connection at most once a second, so a connection closed within that
// second still counts as there, and a Hello at the bound is refused
// then; the listener remembers such a refused Hello's binding too, and a
// later frame on its connection binds it once there is room (while the
// directory holds that Hello's incarnation). A frame on such a
// connection (or on one a probe forgot) that finds no room is held, not
// rejected: its sender took it as sent and would never learn of a
// rejection. The listener tries the connection's room again at its next
// frame and every 100 ms, and once it is bound delivers the held frames
// first, in order. Held frames are bounded (1024 per connection, 16 MiB
// in all); past that, and for frames held when their connection is
// forgotten (maxGhosts) or held a minute without room, they are
// rejected (full), counted and logged. A frame on a refused Hello's
// connection while the directory holds another incarnation of its peer
// is held too, until the directory holds the Hello's incarnation (then
// bound, room permitting), for at most a minute (then rejected,
// no_hello); but a RequestData the engine answers as misaddressed
// (below) is delivered at once.
// Each Conn queues at most
// Config.SendHWM frames plus Config.TerminalBacklog terminal ones;
// heartbeat sockets a few.
//
// # Logs and counters
//
// Warnings about peers (rejected frames, refused handshakes, dropped
// backlogs) go through a control.Throttle: a few lines per (peer, kind),
// then one per 10 seconds saying how many were held back, so a flood from
// or to one peer cannot flood the log nor hide another peer's warnings.
// Every rejection is counted whatever is logged: Stats, and
// FramesRejected (control.RejectCounter) for the engine's
// kvxfer_frames_rejected_total{reason}.
//
// Dialers set a random routing id on each DEALER, so a transparent TCP
// reconnect keeps its binding. A peer that restarts loses its bindings; a
// Conn therefore sends its Hello again before its next frame whenever the
// directory learns a Hello from the peer on a connection it had not seen
// (a new incarnation), and heartbeat sockets repeat their Hello every
// HeartbeatMisses intervals. Frames that reach a listener before their
// connection's Hello are rejected: they were meant for the peer's previous
// incarnation.
//
// # Liveness
//
// The listener records when each PeerID that said Hello was last heard
// from (Config.Clock). After HeartbeatMisses intervals of silence it marks
// the peer down, Hello(peer) returns control.ErrPeerGone, and OnPeerDown is
// called once, on the listener goroutine (it must not block). It is called
// again only after the peer was heard from again and fell silent again.
// Silence is judged after a read of what waits in the ROUTER: a listener
// held past a peer's timeout (a slow delivery, a collection, a starved
// CPU) reads the heartbeats that came meanwhile first.
//
// deliver and OnPeerDown run on the listener goroutine and must not block
// (nor close the link, which waits for that goroutine).
//
// # Goodbye
//
// A graceful Close says goodbye: a link whose Hello names an incarnation
// sends, as Close ends it, a last Heartbeat with Leaving set (and its
// incarnation) on the heartbeat connection of each peer that connection
// is up to (as its socket monitor says) and that heard the link's Hello
// on it. It is sent in Link.Close, not when the Listener closes: an engine
// closes its listener before its workers send their last frames (a FAILED
// Result, a CancelAck), which a goodbye sent then would overtake. Best
// effort: a goodbye that cannot be queued is dropped, and one queued waits
// at most 200 ms (the socket's linger, which the context's end waits for)
// for a peer that is gone: Close never hangs on it. A peer that does not
// get it learns the close from missed heartbeats, as before.
//
// The listener takes a goodbye only as its connection's own: past the
// checks of every frame (bound, its sender the Hello's, no other
// incarnation than the Hello's: sender), it acts only when the
// connection's incarnation is named (not 0), is the one the directory
// holds for the peer (not an earlier process's, still connected), and
// liveness tracks the peer; else it is rejected (reason goodbye), counted
// and logged, and changes nothing, making no entry for anyone. The
// goodbye of an incarnation that left (RemovePeer: with etcd, its lease
// revoke came first) is its own and no news: ignored, not counted, but
// for the reason it may give (below), which OnPeerGoodbye hears.
//
// Taken, it marks the peer down at once, as missed heartbeats do:
// Hello(peer) returns control.ErrPeerGone and ErrPeerClosed ("closed (it
// said goodbye)"), and OnPeerGoodbye(peer, incarnation, reason) is called once
// (OnPeerDown when OnPeerGoodbye is nil); a goodbye of a peer already
// down changes nothing. "At once" is once a read finds the ROUTER empty:
// the peer's last frames come on its other connections, which the ROUTER
// fair-queues with the goodbye's, so a goodbye is acted on after every
// frame read before the ROUTER was empty (a Result sent just before the
// close ends its request as sent, not failed by the goodbye); while
// other connections keep the ROUTER busy, a goodbye waits at most the
// heartbeat timeout (one second without heartbeats). From then on,
// that incarnation's frames are no sign of life (its heartbeats are
// dropped; its Results and CancelAcks are delivered: they are proofs),
// and a late Hello of it (a Conn's, fair-queued behind the goodbye)
// brings nothing back: its connection is bound, for its last frames, but
// the directory, liveness and OnHello do not hear of it, and it is not
// counted as a rejection. The listener remembers the last four
// incarnations of each peer that said goodbye (also one down already by
// silence when its goodbye came). A new incarnation's Hello brings the
// name back.
//
// A goodbye may say why its sender closes: Link.SetGoodbyeReason, before
// Close, gives it a reason (messages.Heartbeat.Reason: the error its
// owner exits on, made to fit messages.GoodbyeReason: control characters
// escaped, at most messages.MaxGoodbyeReasonLen bytes). A goodbye whose
// reason breaks those bounds fails messages.Decode and is rejected
// (decode) like any invalid frame: nothing is told and no state is made.
// OnPeerGoodbye gets the reason ("" for none: a graceful stop, or an
// older peer), and the listener logs it; a goodbye with a reason says its
// sender is not coming back, one without may be a restart. A close with a
// reason (given before the listener closes) waits, at most 1 to 2 s,
// for the heartbeat connections that are not up yet, connecting or
// reconnecting, to peers it heard from (that said Hello on this link) to
// come up, and says Hello and then the goodbye on each: the mistake is
// often found at startup, before this side's connection to the peer is
// up, and without it the peer would wait for a restart until its
// timeout. A peer never heard from (a static peer that never started)
// waits for no goodbye and is not waited for (one that starts during
// the wait learns the close from missed heartbeats, without the
// reason), nor is a connection whose handshake failed; a plain close
// waits for none.
//
// A plain goodbye is liveness, never proof that the peer's writes are
// over (DESIGN.md §3): what a receiver does with it is what it does with
// a Down. A drained goodbye is also proof: the link's owner calls
// Link.MarkDrained before Close only when the engine that writes under
// the link's Hello has stopped taking the frames that start writes and
// every write it started is over (kvxfer.Engine.WritesOver), and the
// goodbye then says Drained. The listener takes it as a goodbye, by the
// same checks, and then tells OnPeerDrained(peer, incarnation), after
// OnPeerGoodbye: that incarnation writes no more. It tells it also for a
// drained goodbye that is no news (an incarnation that left the cluster,
// or a peer down already): its proof is not; and for one rejected only
// as liveness news (an earlier incarnation's, on its own connection, once
// its successor said Hello; one of a peer the directory no longer holds),
// which takes no peer down but proves for its own incarnation. A goodbye
// rejected by the checks every frame passes proves nothing.
// docs/membership.md argues why the proof is sound.
//
// Mixed versions: Leaving, Drained, Reason and FromIncarnation are
// optional fields of Heartbeat (an older build takes a goodbye with a
// reason for one without). A build that predates them ignores them
// (messages.Decode skips unknown fields) and takes a goodbye for a
// heartbeat: it learns the close from missed heartbeats counted from the
// goodbye (one more beat), at most one interval later than from a peer
// that sends none. Such a build sends no goodbye, and its heartbeats name
// no incarnation (taken as the connection's). A build that knows Leaving
// but not Drained takes a drained goodbye for a plain one (no proof, as
// before); a plain goodbye, from such a build or from a close that left
// a write in doubt, proves nothing here.
//
// # Time
//
// Liveness reads Config.Clock, so a test can drive it; heartbeats are sent
// on a real ticker. The liveness rules themselves are a pure type
// (liveness) tested with fabricated times. With the wall clock the
// listener sleeps until the first alive peer's silence could reach the
// timeout (an idle link wakes about once per timeout); with an injected
// clock, which a test moves by hand, it polls every HeartbeatInterval/2
// (at most 50 ms). Close interrupts the listener's and the ZAP handler's
// waits.
package zmq
