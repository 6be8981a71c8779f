// Package control is kvxfer's control-plane seam: a Link over which engine
// ranks exchange control frames (messages.Frame) — RequestData, Result,
// Cancel, CancelAck, Heartbeat — and learn each other's Hello.
//
// Ordering: frames sent on one Conn arrive in the order they were sent.
// Ownership: a Conn belongs to one goroutine at a time (a sender worker);
// a Listener's deliver callback runs on the link's goroutine and must not
// block (engines hand the frame to their listener actor's mailbox).
//
// Implementations: MemLink, the in-process twin used by tests and the
// one-process demo; the ZeroMQ link between processes.
package control
