//go:build cgo && linux && !kvxfer_noucx

package ucx

/*
#include "shim.h"
*/
import "C"

import (
	"sync/atomic"

	"golang.org/x/sys/cpu"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// Registration states.
const (
	regLive     int32 = iota // usable as a source, its key valid at peers
	regRevoking              // Deregister in progress: sources refused
	regDead                  // deregistered, or its agent closed
)

// registration is a region mapped with ucp_mem_map.
type registration struct {
	a      *Agent
	id     uint64
	region *kvcache.Region
	remote rdma.RemoteRegion
	memh   C.ucp_mem_h // progress goroutine only
	alloc  *allocation // the Alloc this region came from, if any
	// source: registered with RegisterSource, its rkey never packed nor
	// handed out: only this agent's batches read it, no peer can write
	// into it, so no peer's link bears on it (unprovenFor).
	source bool

	// state and busy sit on their own cache line: every Post and every
	// Done writes busy, and the progress goroutine reads memh and region
	// for every batch it issues (sharing a line cost a cache miss per
	// batch, about 3% of 64 KiB put bandwidth).
	_ cpu.CacheLinePad
	// state and busy order Post against Deregister without a lock: Post
	// counts itself in busy and then checks state, Deregister sets state
	// and then checks busy, so one of them sees the other.
	state atomic.Int32
	busy  atomic.Int64 // accepted batches reading it whose Done has not run
	_     cpu.CacheLinePad
}

// allocation is memory Alloc got from UCX (UCP_MEM_MAP_ALLOCATE): its
// mapping outlives registrations of it, until it is freed. Progress
// goroutine only.
type allocation struct {
	base uintptr
	len  uint64
	memh C.ucp_mem_h
	reg  *registration // the live registration of it
}

var _ rdma.Registration = (*registration)(nil)

func (r *registration) Region() *kvcache.Region   { return r.region }
func (r *registration) Remote() rdma.RemoteRegion { return r.remote }

// acquire counts a batch reading the region; false when it is not live.
func (r *registration) acquire() bool {
	r.busy.Add(1)
	if r.state.Load() != regLive {
		r.busy.Add(-1)
		return false
	}
	return true
}

func (r *registration) release() { r.busy.Add(-1) }

// tryRevoke moves a live registration to revoking unless a batch reads it.
func (r *registration) tryRevoke() bool {
	if !r.state.CompareAndSwap(regLive, regRevoking) {
		return false
	}
	if r.busy.Load() > 0 {
		r.state.Store(regLive)
		return false
	}
	return true
}
