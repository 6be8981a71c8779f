//go:build cgo && linux && !kvxfer_noucx

package ucx

/*
#cgo pkg-config: ucx
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import "fmt"

// UCS status values the Go side tests for.
const (
	ucsOK       = C.UCS_OK
	ucsBusy     = C.UCS_ERR_BUSY
	ucsCanceled = C.UCS_ERR_CANCELED
	// ucsEndpointTimeout: what UCX reports of an endpoint whose keepalive
	// or retries ran out (tests feed it to the error callback).
	ucsEndpointTimeout = C.UCS_ERR_ENDPOINT_TIMEOUT
)

// memTypeCUDA is ucs_memory_type_t's CUDA device memory.
const memTypeCUDA = C.UCS_MEMORY_TYPE_CUDA

// statusText is ucs_status_string; call it on the progress goroutine.
func statusText(st C.ucs_status_t) string {
	return fmt.Sprintf("%s (%d)", C.GoString(C.kvx_status_string(st)), int(st))
}

// memTypeNames lists the memory types set in a ucp_context_attr_t
// memory_types mask.
func memTypeNames(mask uint64) []string {
	names := []string{"host", "cuda", "cuda-managed", "rocm", "rocm-managed"}
	var out []string
	for i, n := range names {
		if mask&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}
