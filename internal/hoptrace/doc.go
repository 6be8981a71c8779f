// Package hoptrace timestamps a request's hops through the engine (actor
// mailboxes, the control link's sockets) for the control round trip's
// breakdown. It is compiled in only with the kvxfer_hoptrace build tag;
// without it On is false and Mark is an empty function, so call sites
// guarded by On cost nothing.
//
// With the tag, Mark appends (hop, request, wall-clock ns) to an in-memory
// log, and Dump writes it as tab-separated lines to
// $KVXFER_HOPTRACE/<pid>.tsv. Wall-clock time is comparable across the two
// processes of a benchmark on one machine.
package hoptrace
