package capi

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	quotepkg "github.com/kvxfer/kvxfer/internal/quote"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
)

// Status is a C ABI status code (kvxfer_status in include/kvxfer.h).
type Status int32

// Status codes; the values are the ABI's.
const (
	OK                 Status = 0
	ErrInvalidArgument Status = 1
	ErrBadHandle       Status = 2
	ErrConfig          Status = 3
	ErrBadChunk        Status = 4
	ErrBadRequest      Status = 5
	ErrRequestFailed   Status = 6
	ErrPin             Status = 7
	ErrTimeout         Status = 8
	ErrCancelled       Status = 9
	ErrPeerCancelled   Status = 10
	ErrPeerGone        Status = 11
	ErrMismatch        Status = 12
	ErrFence           Status = 13
	ErrEngineFailed    Status = 14
	ErrOutOfBlocks     Status = 15
	ErrBufferTooSmall  Status = 16
	ErrNotFinished     Status = 17
	ErrUnsupported     Status = 18
	ErrClosed          Status = 19
	ErrInternal        Status = 20
	ErrPeerFailed      Status = 21
)

var statusNames = [...]string{
	"KVXFER_OK", "KVXFER_ERR_INVALID_ARGUMENT", "KVXFER_ERR_BAD_HANDLE", "KVXFER_ERR_CONFIG",
	"KVXFER_ERR_BAD_CHUNK", "KVXFER_ERR_BAD_REQUEST", "KVXFER_ERR_REQUEST_FAILED", "KVXFER_ERR_PIN",
	"KVXFER_ERR_TIMEOUT", "KVXFER_ERR_CANCELLED", "KVXFER_ERR_PEER_CANCELLED", "KVXFER_ERR_PEER_GONE",
	"KVXFER_ERR_MISMATCH", "KVXFER_ERR_FENCE", "KVXFER_ERR_ENGINE_FAILED", "KVXFER_ERR_OUT_OF_BLOCKS",
	"KVXFER_ERR_BUFFER_TOO_SMALL", "KVXFER_ERR_NOT_FINISHED", "KVXFER_ERR_UNSUPPORTED", "KVXFER_ERR_CLOSED",
	"KVXFER_ERR_INTERNAL", "KVXFER_ERR_PEER_FAILED",
}

// NumStatus is the number of status codes, 0 to NumStatus-1: what a table
// indexed by code (kvxfer_status_name's) must hold.
const NumStatus = len(statusNames)

func (s Status) String() string {
	if s >= 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("kvxfer_status(%d)", int32(s))
}

// Error is an error with the status code the C ABI returns for it.
type Error struct {
	Code Status
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// errorf returns an *Error of code with a formatted message.
func errorf(code Status, format string, args ...any) error {
	return &Error{Code: code, Err: fmt.Errorf(format, args...)}
}

// quote is s quoted for a message; a value longer than quotepkg.Max (64)
// bytes shows its first ones (cut at a character boundary) and its
// length: the thread's message buffer (kvxfer_last_error) holds 1023
// bytes, and the reason must fit after the value.
func quote(s string) string { return quotepkg.String(s) }

// clip is err with every over-long value of the caller's (longer than
// quotepkg.Max) clipped in its message as quote clips it
// (quotepkg.In): the engine, node and kvcache name a request id (up to
// 256 bytes), an instance, a file name whole, and the message must fit
// kvxfer_last_error's 1023 bytes with its reason. The longest value is
// clipped first (a shorter one may be part of it); errors.Is and As, and
// so Code, see through the result.
func clip(err error, values ...string) error {
	if err == nil {
		return nil
	}
	long := values[:0:0]
	for _, v := range values {
		if len(v) > quotepkg.Max {
			long = append(long, v)
		}
	}
	sort.SliceStable(long, func(i, j int) bool { return len(long[i]) > len(long[j]) })
	for _, v := range long {
		err = quotepkg.In(err, v)
	}
	return err
}

// clipConfig is err (of an open of the JSON config js) with every
// over-long string of js, a key or a value at any depth, clipped (clip).
func clipConfig(err error, js string) error {
	if err == nil {
		return nil
	}
	var v any
	if json.Unmarshal([]byte(js), &v) != nil {
		return err // not JSON: the parser's error quotes js itself, clipped
	}
	var values []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			values = append(values, v)
		case []any:
			for _, x := range v {
				walk(x)
			}
		case map[string]any:
			for k, x := range v {
				values = append(values, k)
				walk(x)
			}
		}
	}
	walk(v)
	return clip(err, values...)
}

// Sentinels of this package, wrapped by the errors it returns.
var (
	// ErrFenceFailed is the cause of a request whose fence kvxfer_fence_fail
	// failed.
	ErrFenceFailed = errors.New("capi: fence failed")
	// ErrEngineClosed: the engine is closed or closing.
	ErrEngineClosed = errors.New("capi: engine closed")
)

// Code is the status code of err: OK for nil, the code of an *Error, else
// the code of the first kvxfer sentinel err wraps (the request-level ones
// before their causes), ErrInternal when it wraps none.
func Code(err error) Status {
	if err == nil {
		return OK
	}
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	for _, m := range codeMap {
		if errors.Is(err, m.err) {
			return m.code
		}
	}
	return ErrInternal
}

var codeMap = []struct {
	err  error
	code Status
}{
	{kvxfer.ErrRequestFailed, ErrRequestFailed},
	{ErrEngineClosed, ErrClosed},
	{actors.ErrClosed, ErrClosed}, // a request cancelled by its engine's close
	{ErrFenceFailed, ErrFence},
	{kvxfer.ErrConfig, ErrConfig},
	{node.ErrConfig, ErrConfig},
	{node.ErrUnknownPeer, ErrBadRequest},
	{node.ErrSendOnly, ErrBadRequest},
	{kvxfer.ErrSendOnly, ErrBadRequest},
	{node.ErrHandshake, ErrPeerGone},
	{node.ErrPeerSilent, ErrPeerGone},
	{node.ErrPeerUnreachable, ErrPeerGone},
	{kvxfer.ErrMisalignedChunk, ErrBadChunk},
	{kvxfer.ErrMissingSource, ErrBadChunk},
	{kvxfer.ErrBadChunk, ErrBadChunk},
	{kvcache.ErrBadChunk, ErrBadChunk},
	{kvxfer.ErrPin, ErrPin},
	{kvxfer.ErrTimeout, ErrTimeout},
	{kvxfer.ErrCancelled, ErrCancelled},
	{kvxfer.ErrPeerCancelled, ErrPeerCancelled},
	{kvxfer.ErrPeerGone, ErrPeerGone},
	{kvxfer.ErrFrameUnsent, ErrPeerGone}, // the peer could not be reached with its Result
	{kvxfer.ErrMismatch, ErrMismatch},
	{kvxfer.ErrEngineFailed, ErrEngineFailed},
	{kvcache.ErrOutOfBlocks, ErrOutOfBlocks},
	{kvcache.ErrPoolTooSmall, ErrOutOfBlocks},
	{kvxfer.ErrBadRequest, ErrBadRequest},
	{kvcache.ErrUnknownBlock, ErrInvalidArgument},
	{kvcache.ErrDoubleFree, ErrInvalidArgument},
	{kvcache.ErrBlockPinned, ErrInvalidArgument},
	// Blocks a caller frees, lends or releases in a state that refuses it:
	// its mistake, not the engine's.
	{kvcache.ErrBlockReceiving, ErrInvalidArgument}, // a live receive owns it
	{kvcache.ErrBlockQuarantined, ErrInvalidArgument},
	{kvcache.ErrNotQuarantined, ErrInvalidArgument},
	{kvcache.ErrNotReceiving, ErrInvalidArgument},
	{kvcache.ErrBlockFree, ErrInvalidArgument},
	{kvcache.ErrBadCount, ErrInvalidArgument},
	{kvcache.ErrBadPlan, ErrInvalidArgument},
	{kvcache.ErrBadRegion, ErrInvalidArgument},
	// Last: a peer's failure whose cause this side has no sentinel for
	// (its message says it), not a bug here.
	{actors.ErrPeerFailed, ErrPeerFailed},
}

// Outcome codes (kvxfer_outcome).
const (
	OutcomeDone      int32 = 1
	OutcomeReady     int32 = 2
	OutcomeFailed    int32 = 3
	OutcomeCancelled int32 = 4
	OutcomeTimedOut  int32 = 5
)

func outcomeCode(s kvxfer.Status) int32 {
	switch s {
	case kvxfer.StatusDone:
		return OutcomeDone
	case kvxfer.StatusReady:
		return OutcomeReady
	case kvxfer.StatusCancelled:
		return OutcomeCancelled
	case kvxfer.StatusTimedOut:
		return OutcomeTimedOut
	}
	return OutcomeFailed
}
