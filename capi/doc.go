// Package capi is the engine behind libkvxfer.so (cmd/libkvxfer, the C ABI
// in include/kvxfer.h): a process-wide handle table, engines opened from a
// JSON config, requests whose completions queue up as events for polling
// (or go to a callback), fences fired by a "ready" call, and the mapping of
// every error to a status code. It has no cgo: cmd/libkvxfer converts C
// arguments and calls it, so everything here is tested from Go.
//
// # Concurrency
//
// Every function is safe for concurrent use. Handles are integers; a handle
// names an engine, a request or a fence, and using one of the wrong kind is
// an error naming it. A request's event is posted once, after its outcome is
// final (context side: every pin dropped; generation side: no write can
// touch its blocks any more); the request handle stays valid until Release.
// Closing an engine wakes its blocked Polls and WaitPeers (ErrClosed),
// releases every handle it owns, and once it returns nothing more of it is
// posted, even when the drain timed out.
package capi
