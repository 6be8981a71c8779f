package actors

import (
	"sync"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// maxCachedPlans bounds a PlanCache's plans; a full cache starts over.
const maxCachedPlans = 4096

// maxCachedPeerMaps bounds its peer maps, one per pair of parallelisms
// seen (a handful in a cluster; a map of a large pair is megabytes).
const maxCachedPeerMaps = 16

// PlanCache keeps the plans ResolveRequest builds, so that a context rank
// plans each (generation peer, its rank in its parallelism, layer group)
// once, not per request: a plan from a framework descriptor costs tens to
// hundreds of microseconds on a 70B layout, and a plan is immutable and
// safe to share. It keeps the peer maps of the generation parallelisms it
// has seen too.
//
// An entry remembers the Hello it was built from. A request that comes
// with the same Hello (the same value the control link holds) hits; one
// with a different Hello — the peer's new incarnation, or a repeated
// Hello — hits only if what the plan depends on is unchanged (the peer's
// pool geometry, its memory descriptor and its region length for that
// group), and otherwise rebuilds the entry. A plan that failed is cached
// as its error, so that a peer's bad descriptor is validated once per
// Hello, not once per request.
//
// The zero value is ready to use; it is safe for concurrent use.
type PlanCache struct {
	mu           sync.Mutex
	m            map[planKey]*planEntry
	maps         map[mapKey]*kvcache.PeerMap
	hits, misses atomic.Uint64
}

// mapKey names a peer map: the two instances' parallelism over one layout.
type mapKey struct {
	layout   uint64
	ctx, gen kvcache.Parallel
}

// peerMap returns the cached peer map between ctx and gen over l (whose
// hash is hash), or computes and caches it. A peer map is immutable. A nil
// cache always computes; errors are not cached.
func (c *PlanCache) peerMap(l kvcache.Layout, hash uint64, ctx, gen kvcache.Parallel) (*kvcache.PeerMap, error) {
	if c == nil {
		return kvcache.NewPeerMap(l, ctx, gen)
	}
	key := mapKey{hash, ctx, gen}
	c.mu.Lock()
	pm := c.maps[key]
	c.mu.Unlock()
	if pm != nil {
		return pm, nil
	}
	pm, err := kvcache.NewPeerMap(l, ctx, gen)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.maps == nil || len(c.maps) >= maxCachedPeerMaps {
		c.maps = map[mapKey]*kvcache.PeerMap{}
	}
	c.maps[key] = pm
	c.mu.Unlock()
	return pm, nil
}

type planKey struct {
	peer    messages.PeerID
	genPar  kvcache.Parallel
	genRank kvcache.Rank
	group   int
	layers  kvcache.LayerPart // a chunk's layer part; zero: every layer
}

type planEntry struct {
	hello     *messages.Hello
	pool      messages.PoolGeometry
	mem       *messages.KVMemory
	regionLen uint64
	plan      *kvcache.Plan
	err       error
}

// NewPlanCache returns an empty cache.
func NewPlanCache() *PlanCache { return &PlanCache{} }

// Stats returns how many lookups hit and how many built a plan.
func (c *PlanCache) Stats() (hits, misses uint64) { return c.hits.Load(), c.misses.Load() }

// plan returns the cached plan (or error) for key built from hello, or
// calls build and caches its result. A nil cache always builds.
func (c *PlanCache) plan(key planKey, hello *messages.Hello, build func() (*kvcache.Plan, error)) (*kvcache.Plan, error) {
	if c == nil {
		return build()
	}
	pool := hello.Pools[key.group]
	mem := peerMemory(hello, key.group)
	c.mu.Lock()
	e := c.m[key]
	if e != nil && (e.hello == hello ||
		(e.pool == pool && e.regionLen == hello.Region.Len && sameMemory(e.mem, mem))) {
		e.hello, e.mem = hello, mem
		c.mu.Unlock()
		c.hits.Add(1)
		return e.plan, e.err
	}
	c.mu.Unlock()
	c.misses.Add(1)
	plan, err := build()
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedPlans {
		c.m = map[planKey]*planEntry{}
	}
	c.m[key] = &planEntry{hello: hello, pool: pool, mem: mem, regionLen: hello.Region.Len, plan: plan, err: err}
	c.mu.Unlock()
	return plan, err
}
