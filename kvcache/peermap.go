package kvcache

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Parallel is an instance's parallelism: TP tensor-parallel ranks per
// pipeline stage and PP pipeline stages, TP×PP ranks in all.
//
// Ranks are numbered TP-fastest: the rank at tensor position t of pipeline
// stage s has index s*TP + t (Index), the usual global-rank order of serving
// frameworks.
//
// Tensor parallelism splits a layout's KV heads into TP equal contiguous
// ranges (rank t holds heads [t*KVHeads/TP, (t+1)*KVHeads/TP)); MLA layouts
// are replicated instead: every TP rank holds all (the single latent) heads.
// Pipeline parallelism splits the layers 0..Layers-1 into PP contiguous
// ranges in stage order: as Stages says, or by default, when Layers%PP != 0,
// the first Layers%PP stages one layer longer (StageLayers), as
// TensorRT-LLM splits them.
type Parallel struct {
	// TP is the tensor-parallel degree (ranks per pipeline stage).
	TP int
	// PP is the pipeline-parallel degree (number of stages).
	PP int
	// Stages, when set, is how many layers each pipeline stage holds, in
	// stage order, as comma-separated counts (PP of them, each at least 1,
	// summing to the layout's Layers, no spaces or leading zeros) — the
	// format of vLLM's VLLM_PP_LAYER_PARTITION, "7,8,8,7" — for a
	// framework that splits an uneven count otherwise than the default:
	// vLLM and SGLang put the extra layers on the stages before the last
	// (VLLMStages). Empty: the default split. Both sides of a transfer
	// need each other's: it travels in Hello and RequestData, and a
	// Receive names its context's (ReceiveRequest.ContextParallel).
	Stages string
}

// ParseStages reads a Stages value: its layer counts, in stage order. An
// error (ErrBadParallelism) names what is wrong; "" is no counts.
func ParseStages(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]int, len(parts))
	for i, f := range parts {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > MaxLayers || strconv.Itoa(n) != f {
			return nil, fmt.Errorf("%w: Stages %q: stage %d's layer count %q, want an integer 1..%d", ErrBadParallelism, clipStages(s), i, clipStages(f), MaxLayers)
		}
		out[i] = n
	}
	return out, nil
}

// clipStages shortens a bad Stages value for an error message.
func clipStages(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// FormatStages writes layer counts as a Stages value.
func FormatStages(counts []int) string {
	var b strings.Builder
	for i, n := range counts {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

// VLLMStages is the Stages value of vLLM's default split of layers over pp
// stages (vllm.distributed.utils.get_pp_indices without
// VLLM_PP_LAYER_PARTITION; SGLang's is the same): the layers%pp extra
// layers on the stages before the last, the last first. "" when it is
// kvxfer's default split too.
func VLLMStages(layers, pp int) string {
	if pp < 1 || layers < pp {
		return ""
	}
	counts := make([]int, pp)
	for i := range counts {
		counts[i] = layers / pp
	}
	for i := 2; i < layers%pp+2; i++ {
		counts[pp-i]++
	}
	return Parallel{TP: 1, PP: pp, Stages: FormatStages(counts)}.Normal(layers).Stages
}

// Normal is p with Stages cleared when it names the default split of
// layers layers (so that a Parallel that spells the default out equals
// one that leaves it to the default). p need not be valid: one whose PP
// splits no layers (below 1, or past layers) is returned as it is, for
// Validate to name.
func (p Parallel) Normal(layers int) Parallel {
	if p.Stages == "" || p.PP < 1 || p.PP > layers {
		return p
	}
	if p.Stages == FormatStages(Parallel{TP: p.TP, PP: p.PP}.Split(layers)) {
		p.Stages = ""
	}
	return p
}

// Rank is one rank of an instance: its tensor position TP in [0, Parallel.TP)
// and its pipeline stage PP in [0, Parallel.PP).
type Rank struct {
	// TP is the rank's tensor position.
	TP int
	// PP is the rank's pipeline stage.
	PP int
}

// String renders the rank as "tp<t>/pp<s>".
func (r Rank) String() string { return fmt.Sprintf("tp%d/pp%d", r.TP, r.PP) }

// String renders the parallelism as "TP<t>/PP<s>", with its Stages when
// set: "TP1/PP4(7,8,8,7)".
func (p Parallel) String() string {
	if p.Stages != "" {
		return fmt.Sprintf("TP%d/PP%d(%s)", p.TP, p.PP, clipStages(p.Stages))
	}
	return fmt.Sprintf("TP%d/PP%d", p.TP, p.PP)
}

// Size is the number of ranks, TP×PP.
func (p Parallel) Size() int { return p.TP * p.PP }

// Index is r's position in TP-fastest order: r.PP*p.TP + r.TP.
func (p Parallel) Index(r Rank) int { return r.PP*p.TP + r.TP }

// RankAt is the inverse of Index: the rank at TP-fastest position i.
func (p Parallel) RankAt(i int) Rank { return Rank{TP: i % p.TP, PP: i / p.TP} }

// Contains reports whether r is a rank of p.
func (p Parallel) Contains(r Rank) bool {
	return r.TP >= 0 && r.TP < p.TP && r.PP >= 0 && r.PP < p.PP
}

// StageLayers is the global layer range [lo, hi) that pipeline stage stage
// owns when layers layers are split over p.PP stages: contiguous ranges in
// stage order, as Stages says, or by default the first layers%PP stages
// one layer longer. p must be valid (Validate) for Stages to be followed.
func (p Parallel) StageLayers(layers, stage int) (lo, hi int) {
	if counts, err := ParseStages(p.Stages); err == nil && len(counts) == p.PP && stage < len(counts) {
		for _, n := range counts[:stage] {
			lo += n
		}
		return lo, lo + counts[stage]
	}
	base, rem := layers/p.PP, layers%p.PP
	lo = stage*base + min(stage, rem)
	hi = lo + base
	if stage < rem {
		hi++
	}
	return lo, hi
}

// Split is the number of layers each pipeline stage owns when layers
// layers are split over p.PP stages (StageLayers), in stage order.
func (p Parallel) Split(layers int) []int {
	out := make([]int, p.PP)
	for st := range out {
		lo, hi := p.StageLayers(layers, st)
		out[st] = hi - lo
	}
	return out
}

// MaxTP bounds a Parallel's TP. A non-MLA layout's TP divides its KV
// heads (at most MaxKVHeads); an MLA layout replicates its latent head on
// every TP rank, so without this bound nothing would stop a TP that makes
// TP×PP shapes (NewPeerMap holds one per rank) exhaust memory or overflow.
const MaxTP = MaxKVHeads

// Validate checks that p can shard l: 1 ≤ TP ≤ MaxTP, 1 ≤ PP ≤ Layers, and
// for non-MLA layouts KVHeads divisible by TP. Errors wrap
// ErrBadParallelism, or ErrBadLayout when l itself fails Layout.Validate.
func (p Parallel) Validate(l Layout) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if p.TP < 1 {
		return fmt.Errorf("%w: TP %d < 1", ErrBadParallelism, p.TP)
	}
	if p.TP > MaxTP {
		return fmt.Errorf("%w: TP %d > %d", ErrBadParallelism, p.TP, MaxTP)
	}
	if p.PP < 1 {
		return fmt.Errorf("%w: PP %d < 1", ErrBadParallelism, p.PP)
	}
	if p.PP > l.Layers {
		return fmt.Errorf("%w: PP %d > Layers %d of %q", ErrBadParallelism, p.PP, l.Layers, l.Name)
	}
	if p.Stages != "" {
		counts, err := ParseStages(p.Stages)
		if err != nil {
			return err
		}
		sum := 0
		for _, n := range counts {
			sum += n
		}
		if len(counts) != p.PP || sum != l.Layers {
			return fmt.Errorf("%w: Stages %q: %d stages of %d layers in all, want PP %d stages of the %d layers of %q",
				ErrBadParallelism, clipStages(p.Stages), len(counts), sum, p.PP, l.Layers, l.Name)
		}
	}
	if !l.MLA && l.KVHeads%p.TP != 0 {
		why := "each TP rank holds an equal share of the KV heads"
		if p.TP > l.KVHeads {
			why = "fewer KV heads than TP ranks: KV heads replicated over TP ranks are not supported"
		}
		return fmt.Errorf("%w: KVHeads %d of %q not divisible by TP %d (%s): use a TP that divides %d",
			ErrBadParallelism, l.KVHeads, l.Name, p.TP, why, l.KVHeads)
	}
	return nil
}

// Shape is what one rank holds of a layout: the model KV heads
// [HeadLo, HeadHi) and the global layers [LayerLo, LayerHi) of its pipeline
// stage, listed per layer group in Layers.
type Shape struct {
	// Rank is the rank this shape belongs to.
	Rank Rank
	// HeadLo and HeadHi bound the model KV heads the rank holds.
	HeadLo, HeadHi int
	// LayerLo and LayerHi bound the global layers of the rank's stage.
	LayerLo, LayerHi int
	// Layers lists, per layer group, the group's global layers the rank
	// owns, ascending (empty when the stage holds none of the group).
	Layers [][]int
}

// Shape returns what rank r of an instance with parallelism p holds of l.
// Errors wrap ErrBadParallelism (or ErrBadLayout).
func (l Layout) Shape(p Parallel, r Rank) (Shape, error) {
	if err := p.Validate(l); err != nil {
		return Shape{}, err
	}
	if !p.Contains(r) {
		return Shape{}, fmt.Errorf("%w: rank %v outside %v", ErrBadParallelism, r, p)
	}
	s := Shape{Rank: r, HeadLo: 0, HeadHi: l.KVHeads}
	if !l.MLA {
		per := l.KVHeads / p.TP
		s.HeadLo, s.HeadHi = r.TP*per, (r.TP+1)*per
	}
	s.LayerLo, s.LayerHi = p.StageLayers(l.Layers, r.PP)
	s.Layers = make([][]int, len(l.Groups))
	for g, grp := range l.Groups {
		for _, L := range grp.Layers {
			if L >= s.LayerLo && L < s.LayerHi {
				s.Layers[g] = append(s.Layers[g], L)
			}
		}
	}
	return s, nil
}

// Heads is the number of KV heads the rank holds.
func (s Shape) Heads() int { return s.HeadHi - s.HeadLo }

// BlockBytes is the size of one rank-local block of group g:
// local layers of g × Parts × local heads × TokensPerBlock × HeadDim ×
// DTypeBytes, laid out in the byte order documented in doc.go.
func (s Shape) BlockBytes(l Layout, g int) uint64 {
	return uint64(len(s.Layers[g])) * uint64(l.Parts()) * uint64(s.Heads()) *
		uint64(l.TokensPerBlock) * uint64(l.TokenBytes())
}

// LayerIndex is the position of global layer layer among the rank's layers
// of group g (its index in the block's outermost dimension), or -1.
func (s Shape) LayerIndex(g, layer int) int {
	ls := s.Layers[g]
	lo, hi := 0, len(ls)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if ls[m] < layer {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(ls) && ls[lo] == layer {
		return lo
	}
	return -1
}

// PeerLink is one stream of a request: what context rank Ctx writes to
// generation rank Gen. Every block of group g carries the model heads
// [HeadLo, HeadHi) of the global layers Layers[g].
type PeerLink struct {
	// Ctx is the writing context rank.
	Ctx Rank
	// Gen is the receiving generation rank.
	Gen Rank
	// HeadLo and HeadHi bound the model KV heads carried.
	HeadLo, HeadHi int
	// Layers lists, per layer group, the global layers carried, ascending;
	// empty for a group the two ranks do not share.
	Layers [][]int
}

// BytesPerBlock is what the link moves per block of layer group g of
// layout l: the carried heads of each carried layer, for every part (K and
// V, or the one MLA latent). It is the same figure as the link's Plan's
// BytesPerBlock, computed without either side's pool geometry, so that the
// receiving side knows exactly what each writer must write.
func (k PeerLink) BytesPerBlock(l Layout, g int) uint64 {
	if g < 0 || g >= len(k.Layers) {
		return 0
	}
	return uint64(len(k.Layers[g])) * uint64(l.Parts()) * uint64(k.HeadHi-k.HeadLo) *
		uint64(l.TokensPerBlock) * uint64(l.TokenBytes())
}

// PeerMap is the static map of which context rank writes which part of the
// KV cache to which generation rank, for one (layout, context parallelism,
// generation parallelism) triple.
//
// Every byte a generation rank holds is written by exactly one link:
//
//   - Heads: with head splitting (non-MLA) a link carries the intersection
//     of the two ranks' head ranges, so a larger generation TP splits a
//     context rank's heads and a smaller one gathers several context ranks'.
//   - Layers: a link carries, per group, the layers both ranks' pipeline
//     stages own.
//   - MLA (replicated heads): every context TP rank of a stage holds the same
//     latent cache, so to write each destination byte once, generation TP
//     rank k receives only from context TP rank k mod ctx.TP. With ctx.TP >
//     gen.TP, context TP ranks gen.TP.. send nothing.
//
// A PeerMap is immutable; the slices it returns must not be modified.
type PeerMap struct {
	layout    Layout
	ctx, gen  Parallel
	ctxShapes []Shape // by ctx.Index
	genShapes []Shape // by gen.Index
	links     []PeerLink
	fromCtx   []int    // links[fromCtx[i]:fromCtx[i+1]] are ctx rank i's
	writers   [][]Rank // by gen.Index
}

// NewPeerMap computes the peer map between a context instance with
// parallelism ctx and a generation instance with parallelism gen, both
// serving layout l. Errors wrap ErrBadParallelism (or ErrBadLayout).
func NewPeerMap(l Layout, ctx, gen Parallel) (*PeerMap, error) {
	if err := ctx.Validate(l); err != nil {
		return nil, fmt.Errorf("context %w", err)
	}
	if err := gen.Validate(l); err != nil {
		return nil, fmt.Errorf("generation %w", err)
	}
	m := &PeerMap{
		layout:    l,
		ctx:       ctx,
		gen:       gen,
		ctxShapes: make([]Shape, ctx.Size()),
		genShapes: make([]Shape, gen.Size()),
		fromCtx:   make([]int, ctx.Size()+1),
		writers:   make([][]Rank, gen.Size()),
	}
	for i := range m.ctxShapes {
		m.ctxShapes[i], _ = l.Shape(ctx, ctx.RankAt(i)) // validated above
	}
	for i := range m.genShapes {
		m.genShapes[i], _ = l.Shape(gen, gen.RankAt(i))
	}
	for ci, cs := range m.ctxShapes {
		m.fromCtx[ci] = len(m.links)
		for gi, gs := range m.genShapes {
			link, ok := linkBetween(l, ctx, cs, gs)
			if !ok {
				continue
			}
			m.links = append(m.links, link)
			m.writers[gi] = append(m.writers[gi], cs.Rank)
		}
	}
	m.fromCtx[ctx.Size()] = len(m.links)
	return m, nil
}

// linkBetween returns what context shape cs writes to generation shape gs,
// and false when they share nothing.
func linkBetween(l Layout, ctx Parallel, cs, gs Shape) (PeerLink, bool) {
	link := PeerLink{Ctx: cs.Rank, Gen: gs.Rank}
	if l.MLA {
		if cs.Rank.TP != gs.Rank.TP%ctx.TP {
			return PeerLink{}, false
		}
		link.HeadLo, link.HeadHi = gs.HeadLo, gs.HeadHi
	} else {
		link.HeadLo, link.HeadHi = max(cs.HeadLo, gs.HeadLo), min(cs.HeadHi, gs.HeadHi)
		if link.HeadLo >= link.HeadHi {
			return PeerLink{}, false
		}
	}
	lo, hi := max(cs.LayerLo, gs.LayerLo), min(cs.LayerHi, gs.LayerHi)
	if lo >= hi {
		return PeerLink{}, false
	}
	link.Layers = make([][]int, len(l.Groups))
	shared := false
	for g := range l.Groups {
		for _, L := range cs.Layers[g] {
			if L >= lo && L < hi {
				link.Layers[g] = append(link.Layers[g], L)
				shared = true
			}
		}
	}
	return link, shared
}

// Clone returns a deep copy of m: what the copy's accessors return may be
// changed without changing m (an engine hands out copies of the maps it
// caches and plans from).
func (m *PeerMap) Clone() *PeerMap {
	c := *m
	c.layout = m.layout.Clone()
	c.ctxShapes, c.genShapes = cloneShapes(m.ctxShapes), cloneShapes(m.genShapes)
	c.links = make([]PeerLink, len(m.links))
	for i, link := range m.links {
		link.Layers = cloneLayers(link.Layers)
		c.links[i] = link
	}
	c.fromCtx = slices.Clone(m.fromCtx)
	c.writers = make([][]Rank, len(m.writers))
	for i, w := range m.writers {
		c.writers[i] = slices.Clone(w)
	}
	return &c
}

func cloneShapes(shapes []Shape) []Shape {
	out := make([]Shape, len(shapes))
	for i, s := range shapes {
		s.Layers = cloneLayers(s.Layers)
		out[i] = s
	}
	return out
}

func cloneLayers(layers [][]int) [][]int {
	if layers == nil {
		return nil
	}
	out := make([][]int, len(layers))
	for g, ls := range layers {
		out[g] = slices.Clone(ls)
	}
	return out
}

// Layout is the layout the map was built for.
func (m *PeerMap) Layout() Layout { return m.layout }

// Ctx is the context instance's parallelism.
func (m *PeerMap) Ctx() Parallel { return m.ctx }

// Gen is the generation instance's parallelism.
func (m *PeerMap) Gen() Parallel { return m.gen }

// Links returns every link, ordered by context rank index, then generation
// rank index.
func (m *PeerMap) Links() []PeerLink { return m.links }

// From returns the links of context rank r (the generation ranks it writes
// to), ordered by generation rank index; nil for a rank outside Ctx.
func (m *PeerMap) From(r Rank) []PeerLink {
	if !m.ctx.Contains(r) {
		return nil
	}
	i := m.ctx.Index(r)
	return m.links[m.fromCtx[i]:m.fromCtx[i+1]]
}

// Link returns the link from context rank c to generation rank g, and false
// when c writes nothing to g.
func (m *PeerMap) Link(c, g Rank) (PeerLink, bool) {
	for _, link := range m.From(c) {
		if link.Gen == g {
			return link, true
		}
	}
	return PeerLink{}, false
}

// WritersOf returns the context ranks that write to generation rank r (the
// ranks it expects a terminal result from), ordered by context rank index;
// nil for a rank outside Gen.
func (m *PeerMap) WritersOf(r Rank) []Rank {
	if !m.gen.Contains(r) {
		return nil
	}
	return m.writers[m.gen.Index(r)]
}

// CtxShape returns what context rank r holds.
func (m *PeerMap) CtxShape(r Rank) (Shape, error) {
	if !m.ctx.Contains(r) {
		return Shape{}, fmt.Errorf("%w: context rank %v outside %v", ErrBadParallelism, r, m.ctx)
	}
	return m.ctxShapes[m.ctx.Index(r)], nil
}

// GenShape returns what generation rank r holds.
func (m *PeerMap) GenShape(r Rank) (Shape, error) {
	if !m.gen.Contains(r) {
		return Shape{}, fmt.Errorf("%w: generation rank %v outside %v", ErrBadParallelism, r, m.gen)
	}
	return m.genShapes[m.gen.Index(r)], nil
}

// Plan builds the plan of link for layer group g between a source pool with
// geometry src on the link's context rank and a destination pool with
// geometry dst on its generation rank. See NewPlan.
func (m *PeerMap) Plan(link PeerLink, g int, src, dst PoolGeometry) (*Plan, error) {
	cs, err := m.CtxShape(link.Ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: link %v->%v: %w", ErrBadPlan, link.Ctx, link.Gen, err)
	}
	gs, err := m.GenShape(link.Gen)
	if err != nil {
		return nil, fmt.Errorf("%w: link %v->%v: %w", ErrBadPlan, link.Ctx, link.Gen, err)
	}
	return NewPlan(m.layout, cs, gs, link, g, src, dst)
}
