package sim

import (
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// request is one prompt moved from the context instance to the generation
// instance: every context rank sends it, every generation rank receives it.
type request struct {
	idx       int
	id        string
	promptLen int
	chunks    []kvcache.Chunk
	// parts is, per chunk, the layer parts it is handed in, in layer
	// order (one zero LayerPart: the whole chunk at once).
	parts       [][]kvcache.LayerPart
	parted      bool  // some chunk leaves in more than one part
	prefixHit   []int // per group, leading blocks the receivers already hold
	ctxStart    time.Duration
	genStart    time.Duration
	ctxDeadline time.Duration // after ctxStart
	genDeadline time.Duration // after genStart
	payload     []byte
	// genPrompt is, per generation rank, the prompt length its Receive
	// names: promptLen, but another length under FaultPromptMismatch.
	genPrompt []int
	// ghost marks the generation ranks whose Receive names a context
	// instance that does not exist (FaultNeverConnected).
	ghost []bool
}

// request returns the request with that id, or nil.
func (s *Sim) request(id string) *request {
	for _, q := range s.reqs {
		if q.id == id {
			return q
		}
	}
	return nil
}

// ghostInstance is the context instance a Receive names under
// FaultNeverConnected: no such instance exists.
const ghostInstance = "ctx-gone"

// setup draws the seed's world: layout, parallelism, ranks and their pools,
// requests and faults, and schedules the serving processes and faults.
func (s *Sim) setup() {
	r := s.r
	s.layout = s.drawLayout()
	s.layoutHash = s.layout.Hash()
	s.ctxPar = s.drawParallel()
	s.genPar = s.drawParallel()
	if r.IntN(2) == 0 && s.ctxPar.Size() <= 2 {
		// Fan out: each context rank writes to several generation ranks,
		// whose streams read the same source pages.
		if tp := s.ctxPar.TP * 2; (s.layout.MLA && tp <= 2 || !s.layout.MLA && s.layout.KVHeads%tp == 0) && tp*s.genPar.PP <= 4 {
			s.genPar.TP = tp
		} else if s.layout.Layers >= 2 && s.ctxPar.PP == 1 {
			s.genPar.PP = 2
			s.genPar.TP = min(s.genPar.TP, 2)
		}
	}
	s.ctxPar, s.genPar = s.drawStages(s.ctxPar), s.drawStages(s.genPar)
	pm, err := kvcache.NewPeerMap(s.layout, s.ctxPar, s.genPar)
	if err != nil {
		s.failf("setup: peer map: %v", err)
		return
	}
	s.pm = pm
	s.ctxW = 1 + r.IntN(3)
	s.genW = 1 + r.IntN(2)
	s.drainGrace = s.between(2*time.Millisecond, 20*time.Millisecond)
	s.orphan = 250 * time.Millisecond
	s.cancelResend = s.between(5*time.Millisecond, 40*time.Millisecond)

	// A calm seed has no faults and generous deadlines: every request must
	// end READY and DONE. Otherwise the fault density varies per seed.
	s.calm = r.IntN(10) == 0
	density := []float64{0.15, 0.3, 0.45, 0.6}[r.IntN(4)]
	if s.calm {
		density = 0
	}
	nReq := 1 + r.IntN(8)
	tpb := s.layout.TokensPerBlock
	for i := range nReq {
		q := &request{idx: i, id: fmt.Sprintf("req-%d", i)}
		q.promptLen = 1 + r.IntN(16*tpb)
		chunkTokens := tpb * (1 + r.IntN(4))
		q.chunks, err = kvcache.Chunks(q.promptLen, chunkTokens, tpb)
		if err != nil {
			s.failf("setup: chunks: %v", err)
			return
		}
		s.drawParts(q)
		blocks := s.layout.BlocksFor(q.promptLen)
		q.prefixHit = make([]int, len(s.layout.Groups))
		if r.IntN(5) == 0 {
			hit := r.IntN(blocks + 1)
			for g := range q.prefixHit {
				q.prefixHit[g] = hit
			}
		}
		q.ctxStart = s.between(0, 40*time.Millisecond)
		q.genStart = s.between(0, 40*time.Millisecond)
		q.ctxDeadline = s.between(20*time.Millisecond, 150*time.Millisecond)
		q.genDeadline = s.between(20*time.Millisecond, 150*time.Millisecond)
		if s.calm {
			q.ctxDeadline += 400 * time.Millisecond
			q.genDeadline += 400 * time.Millisecond
		}
		q.payload = []byte(fmt.Sprintf("tok-%d", i))
		s.lastStart = max(s.lastStart, q.ctxStart+q.ctxDeadline, q.genStart+q.genDeadline)
		handed := time.Duration(len(q.chunks))*3*time.Millisecond + partGap*time.Duration(q.extraParts())
		s.activeEnd = max(s.activeEnd, q.ctxStart+handed+5*time.Millisecond)
		s.reqs = append(s.reqs, q)
	}
	s.faults = newPlan(r, s.ctxPar.Size(), s.genPar.Size(), s.activeEnd, s.lastStart+20*time.Millisecond, density)
	s.faults.drawConnFaults(s.cr, s.activeEnd, s.lastStart+20*time.Millisecond, density)
	s.faults.drawHung(s.hr, density)
	s.faults.drawUnproven(s.xr, density)
	s.faults.drawSentLate(s.lr, density)
	s.faults.drawFrameRefused(s.fr, density)
	s.faults.drawIncDown(s.dr, density)
	s.faults.drawResultRefused(s.yr, density)
	s.faults.drawDownCloses(s.wr, density)
	var ctxBlocks, genMax, genSum int
	for _, q := range s.reqs {
		q.genPrompt = make([]int, s.genPar.Size())
		q.ghost = make([]bool, s.genPar.Size())
		other := q.promptLen
		if s.chance(s.faults.mismatch) {
			// Another prompt length, shorter or longer (possibly the same
			// number of blocks), on every generation rank or some.
			for other == q.promptLen {
				other = 1 + r.IntN(16*tpb)
			}
		}
		all := r.IntN(2) == 0
		blocks := s.layout.BlocksFor(q.promptLen)
		ctxBlocks += blocks
		most := blocks
		for gi := range q.genPrompt {
			q.genPrompt[gi] = q.promptLen
			if other != q.promptLen && (all || gi == 0 || r.IntN(2) == 0) {
				q.genPrompt[gi] = other
			}
			q.ghost[gi] = s.chance(s.faults.ghost)
			most = max(most, s.layout.BlocksFor(q.genPrompt[gi]))
		}
		genMax = max(genMax, most)
		genSum += most
	}
	genBlocks := max(genMax, genSum*(5+r.IntN(8))/10)
	pad := uint64(0)
	if r.IntN(3) == 0 {
		pad = uint64(1 + r.IntN(8))
	}
	for i := range s.ctxPar.Size() {
		c := &ctxRank{s: s, idx: i, rank: s.ctxPar.RankAt(i), poolBlocks: ctxBlocks + 1, pad: pad}
		c.self = messages.PeerID{Instance: "ctx", Rank: int32(i)}
		c.boot()
		s.ctx = append(s.ctx, c)
	}
	for i := range s.genPar.Size() {
		g := &genRank{s: s, idx: i, rank: s.genPar.RankAt(i), poolBlocks: genBlocks, pad: pad}
		g.self = messages.PeerID{Instance: "gen", Rank: int32(i)}
		g.boot()
		s.gen = append(s.gen, g)
	}
	for _, q := range s.reqs {
		for _, c := range s.ctx {
			s.scheduleCtxApp(q, c)
		}
		for _, g := range s.gen {
			s.scheduleGenApp(q, g)
		}
	}
	s.scheduleFaults()
}

// partGap bounds the time between two layer parts of one chunk: the
// forward pass computing the next layers.
const partGap = time.Millisecond

// drawParts draws how a request's chunks leave (from Sim.pr): whole (half
// the requests), one part per layer (as vLLM's save_kv_layer), or split
// unevenly at random layers, chunk by chunk (a split with no cut is the
// whole chunk, as the zero LayerPart or as [0, Of) of Of).
func (s *Sim) drawParts(q *request) {
	r, of := s.pr, s.layout.Layers
	mode := r.IntN(4)
	q.parts = make([][]kvcache.LayerPart, len(q.chunks))
	for i := range q.chunks {
		switch mode {
		case 0, 1:
			q.parts[i] = []kvcache.LayerPart{{}}
			continue
		case 2:
			for L := range of {
				q.parts[i] = append(q.parts[i], kvcache.LayerPart{Lo: L, Hi: L + 1, Of: of})
			}
		default:
			lo := 0
			for L := 1; L <= of; L++ {
				if L == of || r.IntN(2) == 0 {
					q.parts[i] = append(q.parts[i], kvcache.LayerPart{Lo: lo, Hi: L, Of: of})
					lo = L
				}
			}
			if len(q.parts[i]) == 1 && r.IntN(2) == 0 {
				q.parts[i][0] = kvcache.LayerPart{}
			}
		}
		q.parted = q.parted || len(q.parts[i]) > 1
	}
}

// extraParts is the number of parts handed besides one per chunk.
func (q *request) extraParts() int {
	n := 0
	for _, ps := range q.parts {
		n += len(ps) - 1
	}
	return n
}

func (s *Sim) drawLayout() kvcache.Layout {
	r := s.r
	l := kvcache.Layout{Name: "sim", Layers: 1 + r.IntN(4), HeadDim: 1 + r.IntN(3), DTypeBytes: 1 + r.IntN(2)}
	l.TokensPerBlock = []int{1, 2, 4}[r.IntN(3)]
	l.KVHeads = []int{1, 2, 4}[r.IntN(3)]
	if r.IntN(7) == 0 {
		l.MLA, l.KVHeads = true, 1
	}
	switch k := r.IntN(4); {
	case k == 2:
		l.Groups = []kvcache.LayerGroup{{Name: "swa", Layers: kvcache.LayerRange(0, l.Layers), Window: l.TokensPerBlock * (1 + r.IntN(3))}}
	case k == 3 && l.Layers >= 2:
		swa := kvcache.LayerGroup{Name: "swa", Window: l.TokensPerBlock*(1+r.IntN(3)) - r.IntN(2)}
		full := kvcache.LayerGroup{Name: "full"}
		for i := range l.Layers {
			if i%2 == 0 {
				swa.Layers = append(swa.Layers, i)
			} else {
				full.Layers = append(full.Layers, i)
			}
		}
		l.Groups = []kvcache.LayerGroup{swa, full}
	default:
		l.Groups = kvcache.FullAttention(l.Layers)
	}
	return l
}

func (s *Sim) drawParallel() kvcache.Parallel {
	r := s.r
	var tps []int
	for _, tp := range []int{1, 2, 4} {
		if s.layout.MLA && tp <= 2 || !s.layout.MLA && s.layout.KVHeads%tp == 0 {
			tps = append(tps, tp)
		}
	}
	p := kvcache.Parallel{TP: tps[r.IntN(len(tps))], PP: 1 + r.IntN(min(2, s.layout.Layers))}
	if p.Size() > 4 {
		p.PP = 1
	}
	return p
}

// drawStages gives half the pipelines of two stages or more a split of
// the layers of their own (as a framework's: vLLM's for an uneven count,
// or VLLM_PP_LAYER_PARTITION's), each stage at least one layer.
func (s *Sim) drawStages(p kvcache.Parallel) kvcache.Parallel {
	if p.PP < 2 || s.sr.IntN(2) == 0 {
		return p
	}
	counts := make([]int, p.PP)
	for i := range counts {
		counts[i] = 1
	}
	for range s.layout.Layers - p.PP {
		counts[s.sr.IntN(p.PP)]++
	}
	p.Stages = kvcache.FormatStages(counts)
	return p.Normal(s.layout.Layers)
}

// rankPools carves one region into one pool per layer group, as the root
// package does (a group the rank holds no layer of gets a 1-byte pool).
func rankPools(l kvcache.Layout, shape kvcache.Shape, blocks int, pad uint64) (*kvcache.Region, []*kvcache.Pool, []kvcache.PoolGeometry, error) {
	var total uint64
	bbs := make([]uint64, len(l.Groups))
	ns := make([]int, len(l.Groups))
	for g := range l.Groups {
		bbs[g], ns[g] = shape.BlockBytes(l, g), blocks
		if bbs[g] == 0 {
			bbs[g], ns[g] = 1, 1
		} else {
			bbs[g] += pad
		}
		total += bbs[g] * uint64(ns[g])
	}
	region, err := kvcache.NewHostRegion(total)
	if err != nil {
		return nil, nil, nil, err
	}
	var pools []*kvcache.Pool
	var geoms []kvcache.PoolGeometry
	var off uint64
	for g := range l.Groups {
		p, err := kvcache.NewPool(region, off, bbs[g], ns[g])
		if err != nil {
			return nil, nil, nil, err
		}
		pools = append(pools, p)
		geoms = append(geoms, kvcache.PoolGeometry{Offset: off, BlockBytes: bbs[g], Blocks: ns[g]})
		off += bbs[g] * uint64(ns[g])
	}
	return region, pools, geoms, nil
}

// pattern is the byte a serving process writes at one coordinate of the
// KV cache: a function of global coordinates only, so that every rank that
// holds the coordinate writes the same byte and a receiver can check its
// blocks without trusting the plan code.
func pattern(req, g, block, layer, part, head, token, k int) byte {
	x := uint64(req)<<52 ^ uint64(g)<<48 ^ uint64(block)<<32 ^ uint64(layer)<<24 ^
		uint64(part)<<22 ^ uint64(head)<<16 ^ uint64(token)<<8 ^ uint64(k)
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return byte(x)
}

// walkBlock calls f for every byte of the layers in part (the zero value:
// every layer) of one rank-local block of group g (in the byte order of
// kvcache/doc.go) with its offset in the block and its pattern value for
// request req, global block block.
func walkBlock(l kvcache.Layout, shape kvcache.Shape, g, req, block int, part kvcache.LayerPart, f func(off int, want byte) bool) {
	tb := l.TokenBytes()
	parts, heads, tpb := l.Parts(), shape.Heads(), l.TokensPerBlock
	off := 0
	for _, layer := range shape.Layers[g] {
		if !part.Contains(layer) {
			off += parts * heads * tpb * tb
			continue
		}
		for p := range parts {
			for h := range heads {
				for t := range tpb {
					for k := range tb {
						if !f(off, pattern(req, g, block, layer, p, shape.HeadLo+h, t, k)) {
							return
						}
						off++
					}
				}
			}
		}
	}
}

// checkData compares a generation rank's destination blocks of a READY
// request with the pattern every context rank wrote.
func (s *Sim) checkData(gr *genRank, rs *rxSess, when string) {
	for g, ids := range rs.blocks {
		first, _ := kvcache.NeededRange(rs.req.promptLen, s.layout.Groups[g].Window, s.layout.TokensPerBlock, rs.req.prefixHit[g])
		for i, id := range ids {
			buf := gr.pools[g].Block(id)
			block := first + i
			walkBlock(s.layout, gr.shape, g, rs.req.idx, block, kvcache.LayerPart{}, func(off int, want byte) bool {
				if buf[off] != want {
					s.failf("%s: request %s READY on %s but group %d block %d (id %d) byte %d is %#x, source wrote %#x",
						when, rs.req.id, gr.name(), g, block, id, off, buf[off], want)
					return false
				}
				return true
			})
			if s.fail != nil {
				return
			}
		}
	}
}

// actorsPools wraps a rank's pools in the engine's guard (the real
// Alloc/Free/Pin/Unpin paths).
func actorsPools(pools []*kvcache.Pool) *actors.Pools { return actors.NewPools(pools) }

// checkPools runs every pool's invariant check.
func (s *Sim) checkPools(name string, pools []*kvcache.Pool) {
	for g, p := range pools {
		if err := p.CheckInvariants(); err != nil {
			s.failf("%s group %d pool: %v", name, g, err)
			return
		}
	}
}

// blockRange is the byte range of block id of pool p in its region.
func blockRange(p *kvcache.Pool, id kvcache.BlockID) (uint64, uint64) {
	off := p.Offset(id)
	return off, off + p.BlockBytes()
}

// blocksOf maps a byte range of a rank's region onto (group, block) pairs.
func blocksOf(pools []*kvcache.Pool, lo, hi uint64, f func(g int, id kvcache.BlockID)) {
	for g, p := range pools {
		start := p.Offset(0)
		end := start + p.BlockBytes()*uint64(p.Len())
		if hi <= start || lo >= end {
			continue
		}
		a := max(lo, start)
		b := min(hi, end)
		for id := (a - start) / p.BlockBytes(); id*p.BlockBytes()+start < b; id++ {
			f(g, kvcache.BlockID(id))
		}
	}
}
