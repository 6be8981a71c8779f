// Command libkvxfer is kvxfer's C ABI, built with -buildmode=c-shared into
// libkvxfer.so (`make lib`); include/kvxfer.h declares and documents it.
// Each exported function converts its C arguments, calls package capi and
// returns a status code; a failure's message goes to the calling thread's
// buffer (kvxfer_last_error). No Go pointer is handed to C: handles are
// integers from capi's table, and what C passes in is copied.
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../../include -DKVXFER_TYPES_ONLY
#include <stdlib.h>
#include <string.h>
#include "kvxfer.h"

void kvxfer_set_error(const char *msg, size_t n);
const char *kvxfer_last_error(void);
void kvxfer_invoke_callback(kvxfer_callback cb, const kvxfer_event *ev, uintptr_t user, uint64_t engine);
int kvxfer_in_callback_of(uint64_t engine);
*/
import "C"

import (
	"fmt"
	"runtime/debug"
	"slices"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/capi"
	"github.com/kvxfer/kvxfer/internal/quote"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

func main() {}

// abiVersion is KVXFER_ABI_VERSION of include/kvxfer.h.
const abiVersion = 1

var statusCStrings = func() []*C.char {
	out := make([]*C.char, capi.NumStatus)
	for i := range out {
		out[i] = C.CString(capi.Status(i).String()) // static for the process's life
	}
	return out
}()

var unknownStatus = C.CString("KVXFER_ERR_UNKNOWN")

// fail records err's message for the calling thread and returns its code.
func fail(err error) C.int32_t {
	msg := err.Error()
	if msg == "" {
		C.kvxfer_set_error(nil, 0)
	} else {
		C.kvxfer_set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
	}
	return C.int32_t(capi.Code(err))
}

// lastError is the calling thread's kvxfer_last_error (a test locks its
// goroutine to its thread around fail and this).
func lastError() string { return C.GoString(C.kvxfer_last_error()) }

func status(err error) C.int32_t {
	if err == nil {
		return 0
	}
	return fail(err)
}

// guard turns a panic into KVXFER_ERR_INTERNAL with the stack: no panic
// may unwind into C.
func guard(st *C.int32_t, fn string) {
	if r := recover(); r != nil {
		*st = fail(&capi.Error{Code: capi.ErrInternal, Err: fmt.Errorf("%s: panic: %v\n%s", fn, r, debug.Stack())})
	}
}

func nullArg(fn, name string) error {
	return &capi.Error{Code: capi.ErrInvalidArgument, Err: fmt.Errorf("%s: %s is NULL", fn, name)}
}

// An array the caller passes with a count arrives as an integer
// (C.uintptr_t, passed as the header's pointer is) and becomes a Go
// pointer only in cArray, when the count is not 0: an empty array may come
// with any pointer (Rust's empty slice is a dangling non-NULL one, 0x4 for
// an int32_t), and such a value held as a Go pointer, in a local or a
// struct copied from C, aborts the process when a stack move finds it
// ("invalid pointer found on stack"). Pointers inside the caller's structs
// are read the same way (addrAt).

// argName names an array in errors: arg, or arg[i].field for one in the
// i-th element of the array arg (formatted only for an error).
type argName struct {
	arg   string
	i     int
	field string
}

func (a argName) String() string {
	if a.field == "" {
		return a.arg
	}
	return fmt.Sprintf("%s[%d].%s", a.arg, a.i, a.field)
}

// cArray is the caller's array of n T at addr (arg of fn names it): nil
// when n is 0, whatever addr is; a non-zero n at NULL, or at an address
// below the first page, is refused naming it.
func cArray[T any](fn string, arg argName, addr uintptr, n uint32) ([]T, error) {
	if n == 0 {
		return nil, nil
	}
	if addr == 0 {
		return nil, nullArg(fn, arg.String())
	}
	if capi.HostAddress("", uint64(addr)) != nil { // named only when refused
		return nil, capi.HostAddress(fmt.Sprintf("%s: %s (%d elements)", fn, arg, n), uint64(addr))
	}
	// The caller's (C) address, never a Go pointer: reinterpret its bits.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*T)(p), n), nil
}

// addrAt is the address held in the caller's pointer field at f, as an
// integer: it is never loaded as a Go pointer.
func addrAt[P any](f *P) uintptr { return *(*uintptr)(unsafe.Pointer(f)) }

//export kvxfer_abi_version
func kvxfer_abi_version() C.int32_t { return abiVersion }

//export kvxfer_status_name
func kvxfer_status_name(s C.int32_t) *C.char {
	if s >= 0 && int(s) < len(statusCStrings) {
		return statusCStrings[s]
	}
	return unknownStatus
}

//export kvxfer_handle_count
func kvxfer_handle_count() C.uint64_t { return C.uint64_t(capi.HandleCount()) }

// kvxfer_engine_open's pool arrives as an integer (kvxfer.h: void *,
// passed the same way) and becomes a pointer only once it is checked: an
// address below the first page held as an unsafe.Pointer aborts the
// process at the next stack move instead of being refused.
//
//export kvxfer_engine_open
func kvxfer_engine_open(cfg *C.char, poolAddr C.uintptr_t, poolBytes C.uint64_t, out *C.kvxfer_engine_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_engine_open")
	if cfg == nil {
		return fail(nullArg("kvxfer_engine_open", "config_json"))
	}
	if out == nil {
		return fail(nullArg("kvxfer_engine_open", "out"))
	}
	if err := capi.HostAddress("kvxfer_engine_open: pool", uint64(poolAddr)); err != nil {
		return fail(err)
	}
	// The caller's (C) address, never a Go pointer: reinterpret its bits.
	pool := *(*unsafe.Pointer)(unsafe.Pointer(&poolAddr))
	_, h, err := capi.Open(C.GoString(cfg), pool, uint64(poolBytes))
	if err != nil {
		return fail(err)
	}
	*out = C.kvxfer_engine_t(h)
	return 0
}

//export kvxfer_node_open
func kvxfer_node_open(cfg *C.char, out *C.kvxfer_engine_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_node_open")
	if cfg == nil {
		return fail(nullArg("kvxfer_node_open", "config_json"))
	}
	if out == nil {
		return fail(nullArg("kvxfer_node_open", "out"))
	}
	_, h, err := capi.OpenNode(C.GoString(cfg))
	if err != nil {
		return fail(err)
	}
	*out = C.kvxfer_engine_t(h)
	return 0
}

// putString copies s and a NUL into buf of cap bytes.
func putString(fn string, s string, buf uintptr, cap C.uint32_t) error {
	// The size first: (NULL, 0) asks for it, as a count-0 array is never
	// read (kvxfer.h), and gets KVXFER_ERR_BUFFER_TOO_SMALL naming it.
	if len(s)+1 > int(cap) {
		return &capi.Error{Code: capi.ErrBufferTooSmall, Err: fmt.Errorf("%s: %d bytes needed, cap is %d", fn, len(s)+1, cap)}
	}
	if buf == 0 {
		return nullArg(fn, "buf")
	}
	dst, err := cArray[byte](fn, argName{arg: "buf"}, buf, uint32(cap))
	if err != nil {
		return err
	}
	dst[copy(dst, s)] = 0
	return nil
}

//export kvxfer_node_endpoint
func kvxfer_node_endpoint(eh C.kvxfer_engine_t, buf C.uintptr_t, cap C.uint32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_node_endpoint")
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	s, err := e.Endpoint()
	if err != nil {
		return fail(err)
	}
	return status(putString("kvxfer_node_endpoint", s, uintptr(buf), cap))
}

//export kvxfer_node_public_key
func kvxfer_node_public_key(eh C.kvxfer_engine_t, buf C.uintptr_t, cap C.uint32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_node_public_key")
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	s, err := e.PublicKey()
	if err != nil {
		return fail(err)
	}
	return status(putString("kvxfer_node_public_key", s, uintptr(buf), cap))
}

//export kvxfer_node_wait_peers
func kvxfer_node_wait_peers(eh C.kvxfer_engine_t, timeoutMs C.int32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_node_wait_peers")
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	if timeoutMs < 0 {
		return fail(invalid("kvxfer_node_wait_peers: timeout_ms = %d is negative", timeoutMs))
	}
	return status(e.WaitPeers(timeoutOf(timeoutMs)))
}

//export kvxfer_keygen
func kvxfer_keygen(public, secret *C.char) (st C.int32_t) {
	defer guard(&st, "kvxfer_keygen")
	if public == nil || secret == nil {
		return fail(nullArg("kvxfer_keygen", "public or secret"))
	}
	pub, sec, err := capi.Keygen()
	if err != nil {
		return fail(err)
	}
	if err := putString("kvxfer_keygen", pub, addrAt(&public), 41); err != nil {
		return fail(err)
	}
	return status(putString("kvxfer_keygen", sec, addrAt(&secret), 41))
}

//export kvxfer_engine_close
func kvxfer_engine_close(eh C.kvxfer_engine_t, timeoutMs C.int32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_engine_close")
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	if timeoutMs < 0 {
		return fail(&capi.Error{Code: capi.ErrInvalidArgument, Err: fmt.Errorf("kvxfer_engine_close: timeout_ms %d < 0", timeoutMs)})
	}
	// From the engine's own callback the close would wait for that
	// callback to return, forever: refused, the engine left as it was.
	if C.kvxfer_in_callback_of(C.uint64_t(eh)) != 0 {
		return fail(&capi.Error{Code: capi.ErrInvalidArgument, Err: fmt.Errorf(
			"kvxfer_engine_close: engine %d called from its own callback: the close waits for every callback under way, "+
				"this one too, and would never return; nothing was closed: close it from another thread once the callback "+
				"returned (signal that thread from the callback)", eh)})
	}
	return status(e.Close(time.Duration(timeoutMs) * time.Millisecond))
}

//export kvxfer_engine_info_get
func kvxfer_engine_info_get(eh C.kvxfer_engine_t, out *C.kvxfer_engine_info) (st C.int32_t) {
	defer guard(&st, "kvxfer_engine_info_get")
	if out == nil {
		return fail(nullArg("kvxfer_engine_info_get", "out"))
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	i := e.Info()
	*out = C.kvxfer_engine_info{groups: C.uint32_t(i.Groups), tokens_per_block: C.uint32_t(i.TokensPerBlock),
		kv_heads: C.uint32_t(i.KVHeads), head_dim: C.uint32_t(i.HeadDim), dtype_bytes: C.uint32_t(i.DTypeBytes),
		parts: C.uint32_t(i.Parts), pool_base: C.uint64_t(i.PoolBase), pool_bytes: C.uint64_t(i.PoolBytes),
		bytes_per_token: C.uint64_t(i.BytesPerToken)}
	return 0
}

//export kvxfer_engine_pool_device
func kvxfer_engine_pool_device(eh C.kvxfer_engine_t, device *C.int32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_engine_pool_device")
	if device == nil {
		return fail(nullArg("kvxfer_engine_pool_device", "device"))
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	*device = C.int32_t(e.Info().PoolDevice)
	return 0
}

//export kvxfer_engine_group
func kvxfer_engine_group(eh C.kvxfer_engine_t, g C.uint32_t, out *C.kvxfer_group_info) (st C.int32_t) {
	defer guard(&st, "kvxfer_engine_group")
	if out == nil {
		return fail(nullArg("kvxfer_engine_group", "out"))
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	gi, err := e.Group(int(g))
	if err != nil {
		return fail(err)
	}
	*out = C.kvxfer_group_info{offset: C.uint64_t(gi.Offset), block_bytes: C.uint64_t(gi.BlockBytes),
		blocks: C.uint32_t(gi.Blocks), layers: C.uint32_t(gi.Layers), window: C.int32_t(gi.Window)}
	return 0
}

//export kvxfer_engine_stats_get
func kvxfer_engine_stats_get(eh C.kvxfer_engine_t, out *C.kvxfer_engine_stats) (st C.int32_t) {
	defer guard(&st, "kvxfer_engine_stats_get")
	if out == nil {
		return fail(nullArg("kvxfer_engine_stats_get", "out"))
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	*out = engineStats(e.Inner().Stats())
	return 0
}

//export kvxfer_engine_stats_ext_get
func kvxfer_engine_stats_ext_get(eh C.kvxfer_engine_t, out *C.kvxfer_engine_stats, ext *C.kvxfer_engine_stats_ext,
	size C.size_t, written *C.size_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_engine_stats_ext_get")
	if out == nil {
		return fail(nullArg("kvxfer_engine_stats_ext_get", "out"))
	}
	if ext == nil {
		return fail(nullArg("kvxfer_engine_stats_ext_get", "ext"))
	}
	if size == 0 || size%8 != 0 {
		return fail(invalid("kvxfer_engine_stats_ext_get: size = %d bytes, not a positive multiple of 8: pass sizeof(kvxfer_engine_stats_ext)", uint64(size)))
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	s := e.Inner().Stats()
	*out = engineStats(s)
	full := engineStatsExt(s)
	n := min(uintptr(size), unsafe.Sizeof(full))
	// The caller's struct may be shorter (an older header) or longer (a
	// newer one) than this library's: only its first n bytes are written.
	copy(unsafe.Slice((*byte)(unsafe.Pointer(ext)), n), unsafe.Slice((*byte)(unsafe.Pointer(&full)), n))
	if written != nil {
		*written = C.size_t(n)
	}
	return 0
}

// engineStatsExt is kvxfer_engine_stats_ext of s: the Stats fields added
// after kvxfer_engine_stats, whose layout is fixed.
func engineStatsExt(s kvxfer.Stats) C.kvxfer_engine_stats_ext {
	return C.kvxfer_engine_stats_ext{ops_in_doubt: C.int64_t(s.OpsInDoubt)}
}

// engineStats is kvxfer_engine_stats of s, field for field (the struct's
// layout is fixed: a Stats field added later goes in
// kvxfer_engine_stats_ext, engineStatsExt).
func engineStats(s kvxfer.Stats) C.kvxfer_engine_stats {
	p := s.WriteProofs
	return C.kvxfer_engine_stats{
		ops_posted: C.int64_t(s.OpsPosted), worker_restarts: C.int64_t(s.WorkerRestarts),
		frames_unsent: C.int64_t(s.FramesUnsent), frames_rejected: C.int64_t(s.FramesRejected),
		frames_stale: C.int64_t(s.FramesStale), frames_shed: C.int64_t(s.FramesShed),
		cancels_deferred: C.int64_t(s.CancelsDeferred), session_panics: C.int64_t(s.SessionPanics),
		session_panics_past_budget: C.int64_t(s.SessionPanicsPastBudget), parent_panics: C.int64_t(s.ParentPanics),
		pin_errors: C.int64_t(s.PinErrors), leases_lapsed: C.int64_t(s.LeasesLapsed),
		stream_violations: C.int64_t(s.StreamViolations), blocks_revoked: C.int64_t(s.BlocksRevoked),
		revoked_held_blocks: C.int64_t(s.RevokedHeldBlocks), caller_blocks_awaiting_proof: C.int64_t(s.CallerBlocksAwaitingProof),
		dest_block_errors: C.int64_t(s.DestBlockErrors), quarantined_bytes: C.uint64_t(s.QuarantinedBytes),
		quarantine_limit_bytes: C.uint64_t(s.QuarantineLimitBytes), closes_unproven: C.int64_t(s.ClosesUnproven),
		frames_silenced: C.int64_t(s.FramesSilenced), waiting_for_blocks: C.int64_t(s.WaitingForBlocks),
		orphan_requests: C.int64_t(s.OrphanRequests), orphans_ended: C.int64_t(s.OrphansEnded),
		write_proofs_exited:                  C.int64_t(p[kvxfer.ProofExited].Proofs),
		write_proof_requests_exited:          C.int64_t(p[kvxfer.ProofExited].Requests),
		write_proofs_pidfd_exit:              C.int64_t(p[kvxfer.ProofPidfdExit].Proofs),
		write_proof_requests_pidfd_exit:      C.int64_t(p[kvxfer.ProofPidfdExit].Requests),
		write_proofs_drained_goodbye:         C.int64_t(p[kvxfer.ProofDrainedGoodbye].Proofs),
		write_proof_requests_drained_goodbye: C.int64_t(p[kvxfer.ProofDrainedGoodbye].Requests),
	}
}

//export kvxfer_blocks_alloc
func kvxfer_blocks_alloc(eh C.kvxfer_engine_t, g, n C.uint32_t, ids C.uintptr_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_blocks_alloc")
	dst, err := cArray[C.int32_t]("kvxfer_blocks_alloc", argName{arg: "ids"}, uintptr(ids), uint32(n))
	if err != nil {
		return fail(err)
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	got, err := e.AllocBlocks(int(g), int(n))
	if err != nil {
		return fail(err)
	}
	for i, id := range got {
		dst[i] = C.int32_t(id)
	}
	return 0
}

//export kvxfer_blocks_free
func kvxfer_blocks_free(eh C.kvxfer_engine_t, g C.uint32_t, ids C.uintptr_t, n C.uint32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_blocks_free")
	if ids == 0 && n > 0 {
		return fail(nullArg("kvxfer_blocks_free", "ids"))
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	if n > messages.MaxBlocks {
		return fail(invalid("kvxfer_blocks_free: n = %d block ids, more than the %d a request may name", n, messages.MaxBlocks))
	}
	src, err := blockIDs("kvxfer_blocks_free", argName{arg: "ids"}, uintptr(ids), n)
	if err != nil {
		return fail(err)
	}
	return status(e.FreeBlocks(int(g), src))
}

//export kvxfer_blocks_used
func kvxfer_blocks_used(eh C.kvxfer_engine_t, g C.uint32_t, out *C.uint32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_blocks_used")
	if out == nil {
		return fail(nullArg("kvxfer_blocks_used", "out"))
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	n, err := e.UsedBlocks(int(g))
	if err != nil {
		return fail(err)
	}
	*out = C.uint32_t(n)
	return 0
}

// blockIDs copies the n block ids at p (arg of fn); n is at most
// messages.MaxBlocks (the callers check), so that a wild count is an
// error, not an allocation that aborts the process.
func blockIDs(fn string, arg argName, p uintptr, n C.uint32_t) ([]kvcache.BlockID, error) {
	src, err := cArray[C.int32_t](fn, arg, p, uint32(n))
	if err != nil || len(src) == 0 {
		return nil, err
	}
	out := make([]kvcache.BlockID, len(src))
	for i, v := range src {
		out[i] = kvcache.BlockID(v)
	}
	return out, nil
}

// runs copies n block runs; fn and arg name them in errors. A run's ids
// are read as an address (addrAt), the run is never copied whole: a run
// with count 0 may hold any pointer.
func runs(fn, arg string, p uintptr, n C.uint32_t) ([]kvcache.BlockRun, error) {
	if n > 0 && p == 0 {
		return nil, nullArg(fn, arg)
	}
	if err := groupCount(fn, n); err != nil {
		return nil, err
	}
	src, err := cArray[C.kvxfer_block_run](fn, argName{arg: arg}, p, uint32(n))
	if err != nil || len(src) == 0 {
		return nil, err
	}
	out := make([]kvcache.BlockRun, len(src))
	for g := range src {
		r := &src[g]
		if r.count > messages.MaxBlocks {
			return nil, invalid("%s: %s[%d].count = %d block ids, more than the %d a request may name", fn, arg, g, r.count, messages.MaxBlocks)
		}
		if out[g].IDs, err = blockIDs(fn, argName{arg, g, "ids"}, addrAt(&r.ids), r.count); err != nil {
			return nil, err
		}
		out[g].First = int(r.first)
	}
	return out, nil
}

// groupCount refuses a layer-group count no layout can have, before
// anything is read or allocated from it.
func groupCount(fn string, n C.uint32_t) error {
	if n > messages.MaxGroups {
		return invalid("%s: groups = %d, more than the %d layer groups a layout may have", fn, n, messages.MaxGroups)
	}
	return nil
}

func timeoutOf(ms C.int32_t) time.Duration { return time.Duration(ms) * time.Millisecond }

func invalid(format string, args ...any) error {
	return &capi.Error{Code: capi.ErrInvalidArgument, Err: fmt.Errorf(format, args...)}
}

// requestID is the request id at p (fn's req->id, not NULL), read up to
// its NUL but never past messages.MaxRequestIDLen+1 bytes, the longest id
// and its NUL: an id with no NUL in them is refused (kvxfer.h: 1 to 256
// bytes, else KVXFER_ERR_BAD_REQUEST naming it) with no byte past them
// read. C.GoString reads up to the first NUL wherever it is: past the end
// of the caller's buffer, to a fault where that ends at an unmapped page.
func requestID(fn string, p *C.char) (string, error) {
	n := int(C.strnlen(p, messages.MaxRequestIDLen+1))
	s := C.GoStringN(p, C.int(n))
	if n <= messages.MaxRequestIDLen {
		return s, nil
	}
	k := quote.Max // its first bytes, cut before a character
	for k > 0 && !utf8.RuneStart(s[k]) {
		k--
	}
	return "", &capi.Error{Code: capi.ErrBadRequest, Err: fmt.Errorf(
		"%s: req->id %q… is longer than %d bytes (no NUL in its first %d): give an id of 1 to %d bytes, NUL-terminated",
		fn, s[:k], messages.MaxRequestIDLen, n, messages.MaxRequestIDLen)}
}

// requestTimeout is a request's timeout_ms: 0 is the engine's transfer
// timeout, a negative one is refused.
func requestTimeout(fn string, ms C.int32_t) (time.Duration, error) {
	if ms < 0 {
		return 0, invalid("%s: req->timeout_ms = %d is negative (0 is the engine's transfer timeout)", fn, ms)
	}
	return timeoutOf(ms), nil
}

//export kvxfer_send
func kvxfer_send(eh C.kvxfer_engine_t, req *C.kvxfer_send_request, out *C.kvxfer_request_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_send")
	return send("kvxfer_send", eh, req, 0, 0, out)
}

//export kvxfer_send_parallel
func kvxfer_send_parallel(eh C.kvxfer_engine_t, req *C.kvxfer_send_request, genTP, genPP C.int32_t,
	out *C.kvxfer_request_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_send_parallel")
	return send("kvxfer_send_parallel", eh, req, genTP, genPP, out)
}

// generationParallel is kvxfer_send_parallel's generation_tp and
// generation_pp: 0 and 0 is not told (the zero Parallel), both ≥ 1 is the
// generation instance's parallelism, anything else is refused.
func generationParallel(fn string, tp, pp C.int32_t) (kvcache.Parallel, error) {
	if tp == 0 && pp == 0 {
		return kvcache.Parallel{}, nil
	}
	if tp < 1 || pp < 1 {
		return kvcache.Parallel{}, invalid("%s: generation_tp = %d, generation_pp = %d: give both (each ≥ 1), or 0 and 0 when not known",
			fn, tp, pp)
	}
	return kvcache.Parallel{TP: int(tp), PP: int(pp)}, nil
}

// send is kvxfer_send and kvxfer_send_parallel (genTP, genPP: 0, 0 for
// the first).
func send(fn string, eh C.kvxfer_engine_t, req *C.kvxfer_send_request, genTP, genPP C.int32_t,
	out *C.kvxfer_request_t) C.int32_t {
	if req == nil {
		return fail(nullArg(fn, "req"))
	}
	if out == nil {
		return fail(nullArg(fn, "out"))
	}
	if req.id == nil {
		return fail(nullArg(fn, "req->id"))
	}
	if addrAt(&req.payload) == 0 && req.payload_len > 0 {
		return fail(nullArg(fn, "req->payload"))
	}
	if req.payload_len > messages.MaxPayload {
		return fail(invalid("%s: req->payload_len = %d bytes, more than the limit of %d (messages.MaxPayload)",
			fn, req.payload_len, messages.MaxPayload))
	}
	timeout, err := requestTimeout(fn, req.timeout_ms)
	if err != nil {
		return fail(err)
	}
	gp, err := generationParallel(fn, genTP, genPP)
	if err != nil {
		return fail(err)
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	id, err := requestID(fn, req.id)
	if err != nil {
		return fail(err)
	}
	sr := capi.SendRequest{SendRequest: kvxfer.SendRequest{ID: id, PromptLen: int(req.prompt_len),
		Timeout: timeout, GenerationParallel: gp}, UserData: uint64(req.user_data)}
	payload, err := cArray[byte](fn, argName{arg: "req->payload"}, addrAt(&req.payload), uint32(req.payload_len))
	if err != nil {
		return fail(err)
	}
	if len(payload) > 0 {
		sr.Payload = slices.Clone(payload)
	}
	if req.generation != nil {
		sr.Generation = C.GoString(req.generation)
	}
	_, h, err := e.Send(sr)
	if err != nil {
		return fail(err)
	}
	*out = C.kvxfer_request_t(h)
	return 0
}

//export kvxfer_chunk
func kvxfer_chunk(rh C.kvxfer_request_t, start, end, last C.int32_t, rs C.uintptr_t, groups C.uint32_t,
	fence *C.kvxfer_fence_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_chunk")
	return chunk("kvxfer_chunk", rh, start, end, last, kvcache.LayerPart{}, rs, groups, fence)
}

//export kvxfer_chunk_layers
func kvxfer_chunk_layers(rh C.kvxfer_request_t, start, end, last, layerLo, layerHi, layers C.int32_t,
	rs C.uintptr_t, groups C.uint32_t, fence *C.kvxfer_fence_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_chunk_layers")
	return chunk("kvxfer_chunk_layers", rh, start, end, last, layerPart(layerLo, layerHi, layers), rs, groups, fence)
}

// chunk is kvxfer_chunk and kvxfer_chunk_layers (the zero part: every
// layer).
func chunk(fn string, rh C.kvxfer_request_t, start, end, last C.int32_t, part kvcache.LayerPart,
	rs C.uintptr_t, groups C.uint32_t, fence *C.kvxfer_fence_t) C.int32_t {
	r, err := capi.LookupRequest(uint64(rh))
	if err != nil {
		return fail(err)
	}
	src, err := runs(fn, "runs", uintptr(rs), groups)
	if err != nil {
		return fail(err)
	}
	f, err := r.ChunkLayers(int(start), int(end), last != 0, part, src, fence != nil)
	if err != nil {
		return fail(err)
	}
	if fence != nil {
		*fence = C.kvxfer_fence_t(f)
	}
	return 0
}

//export kvxfer_chunk_cuda
func kvxfer_chunk_cuda(rh C.kvxfer_request_t, start, end, last C.int32_t, rs C.uintptr_t, groups C.uint32_t,
	cuEvent C.uint64_t, device C.int32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_chunk_cuda")
	return chunkCUDA("kvxfer_chunk_cuda", rh, start, end, last, kvcache.LayerPart{}, rs, groups, cuEvent, device)
}

//export kvxfer_chunk_layers_cuda
func kvxfer_chunk_layers_cuda(rh C.kvxfer_request_t, start, end, last, layerLo, layerHi, layers C.int32_t,
	rs C.uintptr_t, groups C.uint32_t, cuEvent C.uint64_t, device C.int32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_chunk_layers_cuda")
	return chunkCUDA("kvxfer_chunk_layers_cuda", rh, start, end, last, layerPart(layerLo, layerHi, layers), rs, groups,
		cuEvent, device)
}

// chunkCUDA is kvxfer_chunk_cuda and kvxfer_chunk_layers_cuda.
func chunkCUDA(fn string, rh C.kvxfer_request_t, start, end, last C.int32_t, part kvcache.LayerPart,
	rs C.uintptr_t, groups C.uint32_t, cuEvent C.uint64_t, device C.int32_t) C.int32_t {
	r, err := capi.LookupRequest(uint64(rh))
	if err != nil {
		return fail(err)
	}
	src, err := runs(fn, "runs", uintptr(rs), groups)
	if err != nil {
		return fail(err)
	}
	return status(r.ChunkLayersCUDA(int(start), int(end), last != 0, part, src, uint64(cuEvent), int(device)))
}

// layerPart is the part of kvxfer_chunk_layers' layer_lo, layer_hi and
// layers (0, 0, 0: every layer); capi checks it against the model.
func layerPart(lo, hi, of C.int32_t) kvcache.LayerPart {
	return kvcache.LayerPart{Lo: int(lo), Hi: int(hi), Of: int(of)}
}

//export kvxfer_fence_ready
func kvxfer_fence_ready(fh C.kvxfer_fence_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_fence_ready")
	return status(capi.FenceReady(uint64(fh)))
}

//export kvxfer_fence_fail
func kvxfer_fence_fail(fh C.kvxfer_fence_t, reason *C.char) (st C.int32_t) {
	defer guard(&st, "kvxfer_fence_fail")
	why := "(no reason given)"
	if reason != nil {
		why = C.GoString(reason)
	}
	return status(capi.FenceFail(uint64(fh), why))
}

//export kvxfer_receive
func kvxfer_receive(eh C.kvxfer_engine_t, req *C.kvxfer_receive_request, out *C.kvxfer_request_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_receive")
	return receive("kvxfer_receive", eh, req, nil, out)
}

//export kvxfer_receive_stages
func kvxfer_receive_stages(eh C.kvxfer_engine_t, req *C.kvxfer_receive_request, contextPPStages *C.char,
	out *C.kvxfer_request_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_receive_stages")
	return receive("kvxfer_receive_stages", eh, req, contextPPStages, out)
}

// receive is kvxfer_receive and kvxfer_receive_stages (stages: NULL for
// the first): stages, the context's split of its layers over its
// context_pp stages, is checked by capi (ErrInvalidArgument naming it).
func receive(fn string, eh C.kvxfer_engine_t, req *C.kvxfer_receive_request, stages *C.char,
	out *C.kvxfer_request_t) C.int32_t {
	if req == nil {
		return fail(nullArg(fn, "req"))
	}
	if out == nil {
		return fail(nullArg(fn, "out"))
	}
	if req.id == nil {
		return fail(nullArg(fn, "req->id"))
	}
	if req.context == nil {
		return fail(nullArg(fn, "req->context"))
	}
	if req.context_tp < 0 || req.context_pp < 0 {
		return fail(invalid("%s: req->context_tp = %d, req->context_pp = %d: a parallelism is ≥ 1 (0 and 0 mean 1 x 1)",
			fn, req.context_tp, req.context_pp))
	}
	timeout, err := requestTimeout(fn, req.timeout_ms)
	if err != nil {
		return fail(err)
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	if err := groupCount(fn, req.groups); err != nil {
		return fail(err)
	}
	id, err := requestID(fn, req.id)
	if err != nil {
		return fail(err)
	}
	rr := capi.ReceiveRequest{ReceiveRequest: kvxfer.ReceiveRequest{ID: id, PromptLen: int(req.prompt_len),
		Context: C.GoString(req.context), ContextParallel: kvcache.Parallel{TP: int(req.context_tp), PP: int(req.context_pp)},
		Timeout: timeout}, UserData: uint64(req.user_data)}
	if stages != nil {
		rr.ContextParallel.Stages = C.GoString(stages)
	}
	// blocks and prefix_hit_blocks with groups 0 are NULL, whatever the
	// pointers (an empty array's may be any).
	if blocks := addrAt(&req.blocks); blocks != 0 && req.groups > 0 {
		rs, err := runs(fn, "req->blocks", blocks, req.groups)
		if err != nil {
			return fail(err)
		}
		rr.Blocks = make([][]kvcache.BlockID, len(rs))
		rr.Firsts = make([]int, len(rs))
		for g, r := range rs {
			rr.Blocks[g], rr.Firsts[g] = r.IDs, r.First
		}
	}
	if hits := addrAt(&req.prefix_hit_blocks); hits != 0 && req.groups > 0 {
		src, err := cArray[C.int32_t](fn, argName{arg: "req->prefix_hit_blocks"}, hits, uint32(req.groups))
		if err != nil {
			return fail(err)
		}
		for _, v := range src {
			rr.PrefixHitBlocks = append(rr.PrefixHitBlocks, int(v))
		}
	}
	_, h, err := e.Receive(rr)
	if err != nil {
		return fail(err)
	}
	*out = C.kvxfer_request_t(h)
	return 0
}

//export kvxfer_cancel
func kvxfer_cancel(rh C.kvxfer_request_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_cancel")
	r, err := capi.LookupRequest(uint64(rh))
	if err != nil {
		return fail(err)
	}
	r.Cancel()
	return 0
}

//export kvxfer_poll
func kvxfer_poll(eh C.kvxfer_engine_t, events C.uintptr_t, n C.uint32_t, got *C.uint32_t, timeoutMs C.int32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_poll")
	if got == nil {
		return fail(nullArg("kvxfer_poll", "got"))
	}
	*got = 0
	dst, err := cArray[C.kvxfer_event]("kvxfer_poll", argName{arg: "events"}, uintptr(events), uint32(n))
	if err != nil {
		return fail(err)
	}
	if timeoutMs < 0 {
		return fail(invalid("kvxfer_poll: timeout_ms = %d is negative (0: do not wait)", timeoutMs))
	}
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	var stack [64]capi.Event
	buf := stack[:min(int(n), len(stack))]
	k, err := e.PollErr(buf, timeoutOf(timeoutMs))
	if err != nil {
		return fail(err)
	}
	for i, ev := range buf[:k] {
		dst[i] = cEvent(ev)
	}
	*got = C.uint32_t(k)
	return 0
}

func cEvent(ev capi.Event) C.kvxfer_event {
	return C.kvxfer_event{request: C.kvxfer_request_t(ev.Request), outcome: C.int32_t(ev.Outcome),
		error: C.int32_t(ev.Error), bytes: C.uint64_t(ev.Bytes), user_data: C.uint64_t(ev.UserData)}
}

// kvxfer_set_callback's user is the caller's opaque value, often no
// pointer at all (an index cast to void *): Go holds it as an integer,
// never an unsafe.Pointer, which a stack move would check and, when it is
// a small integer, abort the process over ("invalid pointer found on
// stack"). The prototype in kvxfer.h says void *; uintptr_t is passed the
// same way.
//
//export kvxfer_set_callback
func kvxfer_set_callback(eh C.kvxfer_engine_t, cb C.kvxfer_callback, user C.uintptr_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_set_callback")
	e, err := capi.LookupEngine(uint64(eh))
	if err != nil {
		return fail(err)
	}
	if cb == nil {
		e.SetNotify(nil)
		return 0
	}
	e.SetNotify(func(ev capi.Event) {
		cev := cEvent(ev)
		C.kvxfer_invoke_callback(cb, &cev, user, C.uint64_t(eh))
	})
	return 0
}

//export kvxfer_request_blocks
func kvxfer_request_blocks(rh C.kvxfer_request_t, g C.uint32_t, ids C.uintptr_t, cap C.uint32_t, n *C.uint32_t, first *C.int32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_request_blocks")
	if n == nil {
		return fail(nullArg("kvxfer_request_blocks", "n"))
	}
	dst, err := cArray[C.int32_t]("kvxfer_request_blocks", argName{arg: "ids"}, uintptr(ids), uint32(cap))
	if err != nil {
		return fail(err)
	}
	r, err := capi.LookupRequest(uint64(rh))
	if err != nil {
		return fail(err)
	}
	got, f, err := r.Blocks(int(g))
	if err != nil {
		return fail(err)
	}
	*n = C.uint32_t(len(got))
	if first != nil {
		*first = C.int32_t(f)
	}
	if len(got) > int(cap) {
		return fail(&capi.Error{Code: capi.ErrBufferTooSmall, Err: fmt.Errorf(
			"kvxfer_request_blocks: request %d group %d has %d blocks, cap is %d", rh, g, len(got), cap)})
	}
	for i, id := range got {
		dst[i] = C.int32_t(id)
	}
	return 0
}

//export kvxfer_request_payload
func kvxfer_request_payload(rh C.kvxfer_request_t, buf C.uintptr_t, cap C.uint32_t, n *C.uint32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_request_payload")
	if n == nil {
		return fail(nullArg("kvxfer_request_payload", "n"))
	}
	dst, err := cArray[byte]("kvxfer_request_payload", argName{arg: "buf"}, uintptr(buf), uint32(cap))
	if err != nil {
		return fail(err)
	}
	r, err := capi.LookupRequest(uint64(rh))
	if err != nil {
		return fail(err)
	}
	payload, err := r.Payload()
	if err != nil {
		return fail(err)
	}
	*n = C.uint32_t(len(payload))
	if len(payload) > int(cap) {
		return fail(&capi.Error{Code: capi.ErrBufferTooSmall, Err: fmt.Errorf(
			"kvxfer_request_payload: request %d payload is %d bytes, cap is %d", rh, len(payload), cap)})
	}
	copy(dst, payload)
	return 0
}

//export kvxfer_request_error
func kvxfer_request_error(rh C.kvxfer_request_t, buf C.uintptr_t, cap C.uint32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_request_error")
	if buf == 0 {
		return fail(nullArg("kvxfer_request_error", "buf"))
	}
	if cap == 0 {
		return fail(&capi.Error{Code: capi.ErrInvalidArgument, Err: fmt.Errorf(
			"kvxfer_request_error: cap is 0: give buf's size, room for at least the terminating NUL")})
	}
	dst, err := cArray[byte]("kvxfer_request_error", argName{arg: "buf"}, uintptr(buf), uint32(cap))
	if err != nil {
		return fail(err)
	}
	r, err := capi.LookupRequest(uint64(rh))
	if err != nil {
		return fail(err)
	}
	msg, err := r.ErrorMessage()
	if err != nil {
		return fail(err)
	}
	k := copy(dst[:cap-1], msg)
	for k < len(msg) && k > 0 && !utf8.RuneStart(msg[k]) { // cut before a character, not inside it
		k--
	}
	dst[k] = 0
	return 0
}

//export kvxfer_request_set_payload
func kvxfer_request_set_payload(rh C.kvxfer_request_t, buf C.uintptr_t, n C.uint32_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_request_set_payload")
	if buf == 0 && n > 0 {
		return fail(nullArg("kvxfer_request_set_payload", "buf"))
	}
	if n > messages.MaxPayload { // before the bytes are read
		return fail(invalid("kvxfer_request_set_payload: n = %d bytes, more than the limit of %d (messages.MaxPayload)", n, messages.MaxPayload))
	}
	r, err := capi.LookupRequest(uint64(rh))
	if err != nil {
		return fail(err)
	}
	p, err := cArray[byte]("kvxfer_request_set_payload", argName{arg: "buf"}, uintptr(buf), uint32(n)) // SetPayload copies it
	if err != nil {
		return fail(err)
	}
	if p == nil {
		p = []byte{}
	}
	return status(r.SetPayload(p))
}

//export kvxfer_request_free_blocks
func kvxfer_request_free_blocks(rh C.kvxfer_request_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_request_free_blocks")
	r, err := capi.LookupRequest(uint64(rh))
	if err != nil {
		return fail(err)
	}
	return status(r.FreeBlocks())
}

//export kvxfer_request_release
func kvxfer_request_release(rh C.kvxfer_request_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_request_release")
	r, err := capi.LookupRequest(uint64(rh))
	if err != nil {
		return fail(err)
	}
	return status(r.Release())
}

//export kvxfer_bench_go
func kvxfer_bench_go(sh, dh C.kvxfer_engine_t, promptLen, chunkTokens, iters C.int32_t, seconds *C.double, bytes *C.uint64_t) (st C.int32_t) {
	defer guard(&st, "kvxfer_bench_go")
	if seconds == nil || bytes == nil {
		return fail(nullArg("kvxfer_bench_go", "seconds or bytes"))
	}
	src, err := capi.LookupEngine(uint64(sh))
	if err != nil {
		return fail(err)
	}
	dst, err := capi.LookupEngine(uint64(dh))
	if err != nil {
		return fail(err)
	}
	d, b, err := capi.BenchGo(src, dst, int(promptLen), int(chunkTokens), int(iters))
	if err != nil {
		return fail(err)
	}
	*seconds, *bytes = C.double(d.Seconds()), C.uint64_t(b)
	return 0
}
