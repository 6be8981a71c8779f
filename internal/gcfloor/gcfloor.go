// Package gcfloor keeps the Go collector from running while the heap is
// small, in the processes kvxfer runs itself.
//
// Why: a kvxfer engine allocates ~14 KB of short-lived objects per request
// (its actors, steps and frames) on a live heap of a few MB — its KV pools
// are mapped memory, not Go heap — so under GOGC=100 the collector runs
// every few hundred requests, and on a busy CPU a cycle sits in front of
// the control frames that arrive during it: the control round trip's p99
// is the collector's (BENCHMARKS.md, "The pinned round trip's p99 is the
// garbage collector": p99 halved with the collector off). A heap floor
// lets the heap grow to Floor before a cycle, then paces the collector as
// GOGC=100 would once the live heap is larger than Floor/2: after each
// cycle the next one's goal is max(Floor, 2 × live heap).
//
// It changes nothing where the process's owner chose: GOGC set in the
// environment, or KVXFER_GC_FLOOR=off. A process that embeds kvxfer as a
// Go library keeps its own collector settings; kvxfer never calls Set
// there. GOMEMLIMIT still caps the heap: the runtime collects before the
// limit whatever the goal.
package gcfloor

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/internal/meminfo"
	"github.com/kvxfer/kvxfer/internal/quote"
)

// Env names the variable that sets the floor: a size (64MiB) or "off".
const Env = "KVXFER_GC_FLOOR"

// Default is the floor of a kvxfer process whose environment sets neither
// GOGC nor KVXFER_GC_FLOOR: ~4,500 requests of garbage between two cycles,
// against a few hundred under GOGC=100.
const Default = 64 << 20

// basePercent is GOGC's default, the pace above the floor.
const basePercent = 100

var (
	once  sync.Once
	floor atomic.Uint64 // the floor in force; 0: none
	cycle atomic.Uint64 // collections seen by the hook
)

// Floor is the floor in force, 0 when none is.
func Floor() uint64 { return floor.Load() }

// FromEnv sets the floor the environment asks for: KVXFER_GC_FLOOR's size,
// or Default when it is unset; nothing when it is "off" or when GOGC is
// set (the process's owner chose a collector setting). It returns the
// floor set (0: none) and an error naming a value it cannot read.
func FromEnv() (uint64, error) {
	v, set := os.LookupEnv(Env)
	v = strings.TrimSpace(v)
	switch {
	case set && strings.EqualFold(v, "off"):
		return 0, nil
	case set:
		n, err := config.ParseSize(v)
		if err != nil {
			return 0, fmt.Errorf("%s=%s: want a size such as 64MiB, or off: %w", Env, quote.String(v), quote.In(err, v))
		}
		// Warm makes the floor's heap resident at once: a floor past the
		// memory available ended the process out of memory as it opened
		// its first engine, naming nothing.
		if avail, ok := meminfo.Available(); ok && n > avail {
			return 0, fmt.Errorf("%s=%s: more than the %.1fGiB of memory available (MemAvailable), which the floor's heap is made resident from: want a size such as 64MiB, or off",
				Env, quote.String(v), float64(avail)/(1<<30))
		}
		if _, gogc := os.LookupEnv("GOGC"); gogc {
			return 0, nil
		}
		Set(n)
		return n, nil
	}
	if _, gogc := os.LookupEnv("GOGC"); gogc {
		return 0, nil
	}
	Set(Default)
	return Default, nil
}

// Set keeps the collector's goal at n bytes of heap at least, from now on;
// the first call wins (a process has one collector), later ones change
// nothing.
func Set(n uint64) {
	once.Do(func() {
		floor.Store(n)
		retune()
		arm()
	})
}

// Warm makes the heap the floor lets grow resident now, once per
// process, where a floor is in force (nothing otherwise): it allocates the
// floor's bytes, touches each page and collects them, so that the pages
// stay with the runtime, free. A process that runs engines calls it as it
// opens the first one.
//
// Why: under the floor the collector does not run for the first ~5,000
// requests, so each request's garbage lands in pages the process never
// touched and pays their faults (~12 KiB a request; mspan.initHeapBits →
// memclrNoHeapPointers took 5.7 % of the Go CPU of 12,000 control round
// trips). After the first collection the runtime reuses those pages — the
// scavenger keeps a heap of the goal's size — so a server pays this once,
// over its first requests; Warm pays it at the start instead, in one pass.
// The price is the floor's resident memory from the start rather than
// after the first collection.
func Warm() {
	if f := floor.Load(); f > 0 {
		warmOnce.Do(func() { warm(f) })
	}
}

var warmOnce sync.Once

// pageSize is the smallest page the kernel faults in.
const pageSize = 4096

// warm touches n bytes of fresh heap (at most half of a memory limit, so
// that warming never makes the runtime collect for the limit) and
// collects them.
func warm(n uint64) {
	if lim := debug.SetMemoryLimit(-1); lim > 0 && uint64(lim)/2 < n {
		n = uint64(lim) / 2
	}
	b := make([]byte, n)
	for i := 0; i < len(b); i += pageSize {
		b[i] = 1
	}
	runtime.KeepAlive(b)
	runtime.GC() // frees b's pages to the runtime's page heap, resident
}

// sentinel is allocated for each cycle: its finalizer runs after the
// collection that finds it unreachable, retunes, and allocates the next.
// It holds a pointer so that it is never a tiny allocation (whose
// finalizer could wait for a neighbour).
type sentinel struct {
	_ *byte
	_ [8]byte
}

func arm() {
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) {
		cycle.Add(1)
		retune()
		arm()
	})
}

// The runtime's figures the goal is made of (runtime/metrics).
var samples = []metrics.Sample{
	{Name: "/gc/heap/live:bytes"},    // marked by the last cycle
	{Name: "/gc/scan/stack:bytes"},   // scannable stacks
	{Name: "/gc/scan/globals:bytes"}, // scannable globals
}

// retune sets GOGC for the next collection's goal to be max(floor, the
// goal basePercent gives). It runs on the finalizer goroutine (one at a
// time) and once in Set.
func retune() {
	metrics.Read(samples)
	var v [3]uint64
	for i, s := range samples {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	debug.SetGCPercent(percent(floor.Load(), v[0], v[1]+v[2]))
}

// heapMinimum is the runtime's goal before its first cycle at GOGC=100
// (defaultHeapMinimum); at GOGC=p its minimum goal is heapMinimum × p/100.
const heapMinimum = 4 << 20

// percent is the GOGC at which the runtime's next goal is max(floor, the
// goal at basePercent), given live bytes marked by the last cycle and roots
// bytes of stacks and globals. The runtime's goal at GOGC=p is
//
//	max(live + (live + roots) × p/100, heapMinimum × p/100)
//
// (runtime/mgcpacer.go), so p is the largest that keeps both terms within
// the floor — never below basePercent. Before the first cycle (live 0)
// only the minimum counts.
func percent(floor, live, roots uint64) int {
	p := floor * 100 / heapMinimum
	if live > 0 && floor > live {
		p = min(p, (floor-live)*100/(live+roots))
	} else if live > 0 {
		p = 0
	}
	if p < basePercent {
		return basePercent
	}
	const maxPercent = 1 << 30 // SetGCPercent takes an int32
	return int(min(p, maxPercent))
}
