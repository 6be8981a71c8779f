package actors

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Revocation (issue 17, docs/membership.md §4): with EngineConfig.Revoker
// set (a shared-memory pool whose receiver can move its view), the
// destination blocks of a request that failed without proof are revoked
// instead of quarantined: the receiver's view of them moves onto spare
// memory, they go back to the pool at once, and only the memory a stale
// writer can still reach stays quarantined (in the Revoker) until the
// proof. Every later RequestData names the runs of its blocks that moved
// (RequestData.Remap), so their writers write where the view now shows.

// blockRuns calls f with the region range of each run of consecutive block
// ids of blocks, group by group.
func (env *shellEnv) blockRuns(blocks [][]kvcache.BlockID, f func(g int, ids []kvcache.BlockID, off, n uint64)) {
	for g, ids := range blocks {
		if len(ids) == 0 {
			continue
		}
		geom := env.pools.Geometry(g)
		start := 0
		for i := 1; i <= len(ids); i++ {
			if i < len(ids) && ids[i] == ids[i-1]+1 {
				continue
			}
			run := ids[start:i]
			f(g, run, geom.Offset+uint64(run[0])*geom.BlockBytes, uint64(len(run))*geom.BlockBytes)
			start = i
		}
	}
}

// remapFor returns the runs of blocks' memory that writers must address
// elsewhere (nil without a Revoker or while none moved), sorted by view
// offset; an error when there are more than a RequestData may carry.
func (env *shellEnv) remapFor(blocks [][]kvcache.BlockID) ([]messages.Extent, error) {
	if env.revoker == nil {
		return nil, nil
	}
	var xs []kvcache.Extent
	env.blockRuns(blocks, func(_ int, _ []kvcache.BlockID, off, n uint64) {
		xs = env.revoker.Remap(xs, off, n)
	})
	if len(xs) == 0 {
		return nil, nil
	}
	slices.SortFunc(xs, func(a, b kvcache.Extent) int { return cmp.Compare(a.View, b.View) })
	out := make([]messages.Extent, 0, len(xs))
	for _, x := range xs {
		if last := len(out) - 1; last >= 0 && out[last].View+out[last].Len == x.View && out[last].File+out[last].Len == x.File {
			out[last].Len += x.Len
			continue
		}
		out = append(out, messages.Extent{View: x.View, File: x.File, Len: x.Len})
	}
	if len(out) > messages.MaxRemap {
		return nil, fmt.Errorf("%w: its destination blocks span %d revoked runs, more than a RequestData carries (%d)",
			ErrBadRequest, len(out), messages.MaxRemap)
	}
	return out, nil
}

// revoked is what a request's revocation left: the releases of the
// memory stale writers may still reach, and the blocks that could not be
// revoked and went to quarantine instead.
type revoked struct {
	releases []revokedRun
	held     [][]kvcache.BlockID
}

// revokedRun is one revoked run: the release of its old memory and how
// many blocks it covers (Counters.RevokedHeld).
type revokedRun struct {
	release func() error
	blocks  int
}

// revokeDest revokes the destination blocks of a request that failed
// without proof and hands them back to the pool; a run the Revoker refuses
// (its spare reserve is spent, or the run is not aligned to its blocks) is
// quarantined as without a Revoker.
func (env *shellEnv) revokeDest(request string, blocks [][]kvcache.BlockID) revoked {
	var r revoked
	free := make([][]kvcache.BlockID, len(blocks))
	r.held = make([][]kvcache.BlockID, len(blocks))
	var refused error
	env.blockRuns(blocks, func(g int, ids []kvcache.BlockID, off, n uint64) {
		release, err := env.revoker.Revoke(off, n)
		if err != nil {
			refused = errors.Join(refused, err)
			r.held[g] = append(r.held[g], ids...)
			return
		}
		r.releases = append(r.releases, revokedRun{release: release, blocks: len(ids)})
		free[g] = append(free[g], ids...)
		env.stats.BlocksRevoked.Add(int64(len(ids)))
		env.stats.RevokedHeld.Add(int64(len(ids)))
	})
	if err := env.pools.Free(free); err != nil {
		env.destRefused(request, "free (revoked)", free, err)
	}
	if refused != nil {
		env.log.Warn().Err(refused).Str("request", request).Msg("destination blocks not revoked: quarantined until proof")
	}
	if err := env.pools.Quarantine(r.held); err != nil {
		// Not quarantined: the proof's release must not release them
		// from a quarantine they are not in.
		env.destRefused(request, "quarantine", r.held, err)
		r.held = nil
	}
	return r
}

// release returns what revokeDest kept, once proof arrived.
func (env *shellEnv) releaseRevoked(request string, r revoked) {
	for _, run := range r.releases {
		if err := run.release(); err != nil {
			// The Revoker keeps that memory: counted as the pools'
			// refusals are, never only logged, and still held
			// (Counters.RevokedHeld).
			env.stats.DestBlockErrors.Add(1)
			env.log.Error().Err(err).Str("request", request).Int("blocks", run.blocks).Msg("release revoked memory: the Revoker keeps it (counted in kvxfer_dest_block_errors_total, still in kvxfer_revoked_held_blocks)")
			continue
		}
		env.stats.RevokedHeld.Add(-int64(run.blocks))
	}
	if err := env.pools.ReleaseQuarantine(r.held); err != nil {
		env.destRefused(request, "release from quarantine", r.held, err)
	}
}
