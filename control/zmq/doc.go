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
//     hands them to the listener goroutine, which alone uses and closes them;
//   - one DEALER per directory peer, owned by the heartbeat goroutine, which
//     says Hello and then sends a Heartbeat every HeartbeatInterval;
//   - one DEALER per Conn returned by Dial, owned by the goroutine that holds
//     the Conn (a sender worker). Conn.Send never blocks: when the socket's
//     send high-water mark is reached it returns ErrQueueFull.
//
// Close stops both goroutines, which close their sockets with linger 0. The
// context is terminated when the Link is closed and its last Conn is closed.
//
// # Authentication (CURVE and ZAP)
//
// Unless Config.Insecure, the ROUTER is a CURVE server with the link's
// secret key, Conns and heartbeats are CURVE clients that know each peer's
// server key (Curve.PeerServerKeys), and every incoming handshake is put to
// the link's own ZAP handler, which admits only Curve.AllowedPeers (and keys
// added with AllowKey). zmq4's AuthStart/AuthCurveAdd are not used: they are
// process-global (one handler goroutine and unsynchronised policy maps for the
// whole process, bound in the default context only), so two links in a
// process, or a link and any other zmq4 user, would share and race on one
// policy. Instead each Link makes its own zmq context, so its ZAP endpoint
// (inproc://zeromq.zap.01 is per context) belongs to it alone, and the
// listener goroutine serves ZAP requests from the same poll loop as the
// ROUTER. A refused handshake is counted (Refused) and never reaches the
// ROUTER: the peer's frames are never seen, its Hello never stored. libzmq
// ends a session that failed authentication for good (no reconnect), so a
// peer admitted later (AllowKey) must dial again; a heartbeat socket that
// was refused stays silent until its link restarts.
//
// Insecure links use the NULL mechanism with no ZAP at all; New logs a
// warning. Frames are then neither authenticated nor encrypted.
//
// # What the listener accepts
//
// Every message on the ROUTER is checked in this order, and a failure is a
// logged (sampled) and counted rejection (Rejected), never a delivery:
//
//  1. envelope: exactly one payload part after the routing id;
//  2. size: at most Config.MaxFrameBytes (libzmq itself drops the connection
//     of a peer announcing more than MaxFrameBytes+64 KiB, before allocating;
//     those are not counted here);
//  3. messages.Decode: version, type and every field range-checked;
//  4. binding: a connection (a ROUTER routing id) must say Hello first, and
//     every later frame on it must name the Hello's PeerID as Sender; a
//     second Hello on the connection may not change the PeerID; in CURVE
//     mode the connection's authenticated key must not change either, and a
//     PeerID stays bound to the key of its first Hello while it is alive.
//     A peer can therefore not speak for another PeerID (spoofing) unless it
//     holds that peer's secret key; in insecure mode it can still claim any
//     PeerID on its own connection.
//
// Hello is stored in the directory (Hello(peer) returns it); Heartbeat only
// marks the peer alive; every other frame goes to deliver, in the order its
// connection sent it. Any accepted frame counts as a sign of life.
//
// Bounds: a listener binds at most 16384 connections (bindings of peers
// that are down are forgotten first when full) and learns at most 4096
// PeerIDs; past that, Hellos are rejected. Each Conn queues at most
// Config.SendHWM frames; heartbeat sockets a few.
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
//
// deliver and OnPeerDown run on the listener goroutine and must not block
// (nor close the link, which waits for that goroutine).
//
// # Time
//
// Liveness reads Config.Clock, so a test can drive it; heartbeats are sent
// on a real ticker. The liveness rules themselves are a pure type
// (liveness) tested with fabricated times.
package zmq
