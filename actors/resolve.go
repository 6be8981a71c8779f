package actors

import (
	"fmt"
	"slices"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// Topology is what an engine rank knows about itself for planning.
type Topology struct {
	Layout     kvcache.Layout
	LayoutHash uint64
	Parallel   kvcache.Parallel
	Rank       kvcache.Rank
	Pools      []kvcache.PoolGeometry
	// Memory, when set, is this rank's KV memory per layer group as the
	// serving framework lays it out (NHD, HND, split K/V, MLA or strided;
	// offsets in the engine's registered region); a context rank plans from
	// Memory[g] into the receiver's pool. A nil slice or entry means the
	// pool's own layout (Pools[g]). Block ids are still checked against
	// Pools[g].Blocks.
	//
	// A generation rank's Memory travels in its Hello (messages.KVMemory):
	// a context rank then plans from its own memory (Memory[g], or its
	// pool) into the receiver's descriptor instead of its pool, and checks
	// destination block ids against the descriptor's Blocks.
	Memory []*kvcache.KVMemory
	// Plans, when set, caches the plans ResolveRequest builds (PlanCache);
	// nil builds every request's plans afresh.
	Plans *PlanCache `json:"-"`
	// CompletionsDeliver: this rank's data-plane agent proves delivery by
	// its completions (rdma.CompletionsDeliver); StartEngine sets it from
	// the agent. Routes carry it (Route.CompletionsDeliver).
	CompletionsDeliver bool `json:",omitempty"`
}

// routePlanner plans one stream: per layer group, the kvcache plan for the
// link and the receiver's destination blocks.
type routePlanner struct {
	tpb   int
	plans []*kvcache.Plan
	dst   []kvcache.BlockRun
	// remap: runs of the receiver's region its writers address elsewhere
	// (RequestData.Remap), sorted by View.
	remap []messages.Extent
	// parts builds the plan of group g restricted to a chunk's layer part
	// (cached in the topology's PlanCache beside the whole plans).
	parts partPlanner
	// plansBuf and dstBuf back plans and dst for a one-group layout: no
	// slices to allocate per request.
	plansBuf [1]*kvcache.Plan
	dstBuf   [1]kvcache.BlockRun
}

// partPlanner is what a route keeps of ResolveRequest to plan a chunk's
// layer part: held in the routePlanner, not captured by a closure (which
// moved the whole Topology to the heap, and the closure with it, each
// request).
type partPlanner struct {
	self               Topology
	hello              *messages.Hello
	link               kvcache.PeerLink
	peer               messages.PeerID
	genPar             kvcache.Parallel
	genRank            kvcache.Rank
	ctxShape, genShape kvcache.Shape
}

// plan is the plan of group g restricted to part: nil when none of the
// link's layers of g are in part.
func (pp *partPlanner) plan(g int, part kvcache.LayerPart) (*kvcache.Plan, error) {
	if !slices.ContainsFunc(pp.link.Layers[g], part.Contains) {
		return nil, nil
	}
	key := planKey{peer: pp.peer, genPar: pp.genPar, genRank: pp.genRank, group: g, layers: part}
	return pp.self.Plans.plan(key, pp.hello, func() (*kvcache.Plan, error) {
		sub := pp.link
		sub.Layers = slices.Clone(pp.link.Layers)
		sub.Layers[g] = slices.DeleteFunc(slices.Clone(pp.link.Layers[g]), func(L int) bool { return !part.Contains(L) })
		return planGroup(pp.self, pp.hello, sub, pp.ctxShape, pp.genShape, g)
	})
}

func (p *routePlanner) Plan(c kvcache.Chunk, src []kvcache.BlockRun, buf []kvcache.Segment) ([]kvcache.Segment, uint64, error) {
	var bytes uint64
	for g, plan := range p.plans {
		if plan == nil {
			continue
		}
		if !c.Layers.Whole() && !mutWholePlanForParts() {
			var err error
			if plan, err = p.parts.plan(g, c.Layers); err != nil {
				return nil, 0, fmt.Errorf("group %d: %w", g, err)
			}
			if plan == nil {
				continue // none of the group's layers in this part
			}
		}
		var run kvcache.BlockRun
		if g < len(src) {
			run = src[g]
		}
		sIDs, dIDs, err := kvcache.Project(c, p.tpb, run, p.dst[g])
		if err != nil {
			return nil, 0, fmt.Errorf("group %d: %w", g, err)
		}
		if len(sIDs) == 0 {
			continue
		}
		start := len(buf)
		if buf, err = plan.Append(buf, sIDs, dIDs); err != nil {
			return nil, 0, fmt.Errorf("group %d: %w", g, err)
		}
		if len(p.remap) > 0 {
			buf = append(buf[:start], remapSegments(slices.Clone(buf[start:]), p.remap)...)
		}
		bytes += plan.Bytes(len(sIDs))
	}
	return buf, bytes, nil
}

// remapSegments rewrites the destination of every part of segs that lies
// in an extent of remap (sorted, disjoint) to the extent's File range,
// splitting segments at extent boundaries.
func remapSegments(segs []kvcache.Segment, remap []messages.Extent) []kvcache.Segment {
	out := make([]kvcache.Segment, 0, len(segs))
	for _, s := range segs {
		for s.Len > 0 {
			// The first extent that ends past s.Dst.
			i, _ := slices.BinarySearchFunc(remap, s.Dst, func(x messages.Extent, dst uint64) int {
				if x.View+x.Len <= dst {
					return -1
				}
				return 1
			})
			if i == len(remap) || remap[i].View >= s.Dst+s.Len {
				out = append(out, s) // nothing of it moved
				break
			}
			x := remap[i]
			if x.View > s.Dst { // the part before the extent stays
				n := x.View - s.Dst
				out = append(out, kvcache.Segment{Src: s.Src, Dst: s.Dst, Len: n})
				s = kvcache.Segment{Src: s.Src + n, Dst: s.Dst + n, Len: s.Len - n}
			}
			n := min(s.Len, x.View+x.Len-s.Dst)
			out = append(out, kvcache.Segment{Src: s.Src, Dst: x.File + (s.Dst - x.View), Len: n})
			s = kvcache.Segment{Src: s.Src + n, Dst: s.Dst + n, Len: s.Len - n}
		}
	}
	return out
}

// checkRemap checks a RequestData's remap against the receiver's region:
// every extent inside it (the message checked order and overflow).
func checkRemap(rd *messages.RequestData, regionLen uint64) error {
	for i, x := range rd.Remap {
		if x.View+x.Len > regionLen || x.File+x.Len > regionLen {
			return fmt.Errorf("%w: request %s: remap[%d] (view %d, file %d, %d bytes) outside the receiver's region of %d bytes",
				ErrBadRequest, rd.RequestID, i, x.View, x.File, x.Len, regionLen)
		}
	}
	return nil
}

// modelName is what a Hello says the layout is: its name, or "unnamed".
func modelName(l kvcache.Layout) string {
	if l.Name == "" {
		return "unnamed"
	}
	return messages.TruncateText(l.Name, messages.MaxModelLen)
}

// LayoutMismatch compares a peer's Hello with this rank's layout: nil when
// they serve the same layout, else an error wrapping ErrMismatch that names
// both models and both hashes. Engines log it when the Hello arrives, and
// every request between the two fails with it.
func LayoutMismatch(self Topology, hello *messages.Hello) error {
	if hello.LayoutHash == self.LayoutHash {
		return nil
	}
	same := ""
	if hello.Model == modelName(self.Layout) {
		// One name, two layouts: what differs is a setting, not the model.
		if d := settingApart(self.Layout, hello.LayoutHash); d != "" {
			same = ": the same model laid out differently: " + d
		} else {
			same = fmt.Sprintf(": the same model laid out differently: compare both sides' tokens per block (here %d), "+
				"KV dtype, heads and layer groups", self.Layout.TokensPerBlock)
		}
	}
	return &LayoutMismatchError{Peer: hello.From, PeerModel: hello.Model, Model: modelName(self.Layout),
		PeerHash: hello.LayoutHash, Hash: self.LayoutHash, detail: same}
}

// LayoutMismatchError is LayoutMismatch's error (it wraps ErrMismatch):
// peer Peer's Hello names model PeerModel laid out as PeerHash, this rank
// serves Model as Hash. One model laid out two ways (PeerModel == Model)
// is a setting apart, which the message names.
type LayoutMismatchError struct {
	Peer             messages.PeerID
	PeerModel, Model string
	PeerHash, Hash   uint64
	detail           string
}

func (e *LayoutMismatchError) Error() string {
	return fmt.Sprintf("%v: peer %s serves model %q (layout hash %#x), this rank serves %q (layout hash %#x)%s",
		ErrMismatch, e.Peer, e.PeerModel, e.PeerHash, e.Model, e.Hash, e.detail)
}

func (e *LayoutMismatchError) Unwrap() error { return ErrMismatch }

// settingApart names the one setting by which the peer's layout (its hash)
// differs from l, when it is the tokens per block or the KV element size
// alone ("" otherwise): the Hello carries the layout's hash, not its
// fields, so the usual settings are tried. Called on a mismatch only (a
// few dozen hashes).
func settingApart(l kvcache.Layout, peerHash uint64) string {
	for tpb := 1; tpb <= 4096; tpb *= 2 {
		if tpb == l.TokensPerBlock {
			continue
		}
		v := l
		v.TokensPerBlock = tpb
		if v.Hash() == peerHash {
			return fmt.Sprintf("the peer's blocks hold %d tokens, this rank's %d (compare both sides' --tokens-per-block)", tpb, l.TokensPerBlock)
		}
	}
	for _, b := range []int{1, 2, 4, 8} {
		if b == l.DTypeBytes {
			continue
		}
		v := l
		v.DTypeBytes = b
		if v.Hash() == peerHash {
			return fmt.Sprintf("the peer's KV elements are %d bytes, this rank's %d (compare both sides' KV dtype)", b, l.DTypeBytes)
		}
	}
	return ""
}

// ResolveRequest turns a generation rank's RequestData and Hello into the
// context rank's route to it, and lists every generation rank index this
// rank writes to for requests of that generation instance. Every field
// that refers to the receiver's pool is checked here; an error names it.
func ResolveRequest(self Topology, hello *messages.Hello, rd *messages.RequestData) (*Route, []int, error) {
	if hello.LayoutHash != self.LayoutHash {
		return nil, nil, fmt.Errorf("%w: request %s: %w", ErrBadRequest, rd.RequestID, LayoutMismatch(self, hello))
	}
	genPar := kvcache.Parallel{TP: int(rd.GenParallel.TP), PP: int(rd.GenParallel.PP), Stages: rd.GenParallel.Stages}
	genRank := kvcache.Rank{TP: int(rd.GenTP), PP: int(rd.GenPP)}
	// The receiver's place comes from its RequestData and its Hello: both
	// must say the same before anything is built from it (a peer map
	// costs O(ranks²) and is cached).
	if rd.GenParallel != hello.Parallel || rd.GenTP != hello.TP || rd.GenPP != hello.PP {
		helloPar := kvcache.Parallel{TP: int(hello.Parallel.TP), PP: int(hello.Parallel.PP), Stages: hello.Parallel.Stages}
		return nil, nil, fmt.Errorf("%w: request %s: names generation rank tp%d/pp%d of %v, its sender's Hello says tp%d/pp%d of %v",
			ErrBadRequest, rd.RequestID, rd.GenTP, rd.GenPP, genPar, hello.TP, hello.PP, helloPar)
	}
	if !genPar.Contains(genRank) || genPar.Index(genRank) != int(rd.From.Rank) {
		return nil, nil, fmt.Errorf("%w: request %s: sender rank %d does not match generation rank %v of %v",
			ErrBadRequest, rd.RequestID, rd.From.Rank, genRank, genPar)
	}
	pm, err := self.Plans.peerMap(self.Layout, self.LayoutHash, self.Parallel, genPar)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: request %s: %w", ErrBadRequest, rd.RequestID, err)
	}
	var expected []int
	for _, l := range pm.From(self.Rank) {
		expected = append(expected, genPar.Index(l.Gen))
	}
	link, ok := pm.Link(self.Rank, genRank)
	if !ok {
		return nil, expected, fmt.Errorf("%w: request %s: generation rank %v is not a peer of context rank %v",
			ErrBadRequest, rd.RequestID, genRank, self.Rank)
	}
	if hello.Has(messages.FeatureSendOnly) || len(hello.Region.Key) == 0 {
		return nil, expected, fmt.Errorf("%w: request %s: generation rank %s receives no writes: its Hello says it is a send-only rank",
			ErrBadRequest, rd.RequestID, rd.From)
	}
	groups := len(self.Layout.Groups)
	if len(rd.Groups) != groups || len(hello.Pools) != groups {
		return nil, expected, fmt.Errorf("%w: request %s: %d destination groups, %d peer pools, layout has %d",
			ErrBadRequest, rd.RequestID, len(rd.Groups), len(hello.Pools), groups)
	}
	ctxShape, err := pm.CtxShape(self.Rank)
	if err != nil {
		return nil, expected, err
	}
	genShape, err := pm.GenShape(genRank)
	if err != nil {
		return nil, expected, err
	}
	if err := checkRemap(rd, hello.Region.Len); err != nil {
		return nil, expected, err
	}
	maxBlocks := self.Layout.BlocksFor(int(rd.PromptLen))
	rp := &routePlanner{tpb: self.Layout.TokensPerBlock, remap: rd.Remap, parts: partPlanner{self: self, hello: hello, link: link,
		peer: rd.From, genPar: genPar, genRank: genRank, ctxShape: ctxShape, genShape: genShape}}
	if groups <= len(rp.plansBuf) {
		rp.plans, rp.dst = rp.plansBuf[:groups], rp.dstBuf[:groups]
	} else {
		rp.plans, rp.dst = make([]*kvcache.Plan, groups), make([]kvcache.BlockRun, groups)
	}
	for g := 0; g < groups; g++ {
		d := rd.Groups[g]
		pg := hello.Pools[g]
		if int(d.First)+len(d.Blocks) > maxBlocks {
			return nil, expected, fmt.Errorf("%w: request %s group %d: blocks [%d,%d) beyond prompt of %d blocks",
				ErrBadRequest, rd.RequestID, g, d.First, int(d.First)+len(d.Blocks), maxBlocks)
		}
		// Destination ids name blocks of the receiver's descriptor when it
		// sent one, else of its pool.
		peerMem, what, limit := peerMemory(hello, g), "pool", pg.Blocks
		if peerMem != nil {
			what, limit = fmt.Sprintf("%v memory", kvcache.MemoryKind(peerMem.Kind)), peerMem.Blocks
		}
		ids := make([]kvcache.BlockID, len(d.Blocks))
		for i, b := range d.Blocks {
			if b >= limit {
				return nil, expected, fmt.Errorf("%w: request %s group %d: destination block %d outside %s of %d blocks",
					ErrBadRequest, rd.RequestID, g, b, what, limit)
			}
			ids[i] = kvcache.BlockID(b)
		}
		rp.dst[g] = kvcache.BlockRun{First: int(d.First), IDs: ids}
		if len(link.Layers[g]) == 0 {
			continue
		}
		key := planKey{peer: rd.From, genPar: genPar, genRank: genRank, group: g}
		plan, err := self.Plans.plan(key, hello, func() (*kvcache.Plan, error) {
			return planGroup(self, hello, link, ctxShape, genShape, g)
		})
		if err != nil {
			return nil, expected, fmt.Errorf("%w: request %s: %w", ErrBadRequest, rd.RequestID, err)
		}
		rp.plans[g] = plan
	}
	return &Route{Peer: rd.From, AgentAddr: hello.AgentAddr, RegionKey: hello.Region.Key, RegionLen: hello.Region.Len, Planner: rp,
		CompletionsDeliver: self.CompletionsDeliver, SmallPayload: !hello.Has(messages.FeatureLargePayload)}, expected, nil
}

// planGroup builds the plan of link for layer group g into the receiver
// that sent hello: from this rank's descriptor (Topology.Memory) or pool
// into the receiver's descriptor (Hello.Memory) or pool. Two pools plan
// with NewPlan; any descriptor on either side with NewMemoryPlan, the pool
// side described by PoolMemory. An error from the receiver's descriptor
// names the receiver and the group.
func planGroup(self Topology, hello *messages.Hello, link kvcache.PeerLink, ctxShape, genShape kvcache.Shape, g int) (*kvcache.Plan, error) {
	pg := hello.Pools[g]
	dstGeom := kvcache.PoolGeometry{Offset: pg.Offset, BlockBytes: pg.BlockBytes, Blocks: int(pg.Blocks)}
	var src *kvcache.KVMemory
	if g < len(self.Memory) {
		src = self.Memory[g]
	}
	peerMem := peerMemory(hello, g)
	if src == nil && peerMem == nil {
		return kvcache.NewPlan(self.Layout, ctxShape, genShape, link, g, self.Pools[g], dstGeom)
	}
	var err error
	if src == nil {
		if src, err = kvcache.PoolMemory(self.Layout, ctxShape, g, self.Pools[g]); err != nil {
			return nil, err
		}
	}
	var dst *kvcache.KVMemory
	if peerMem != nil {
		// Checked against this rank's memory and layout before
		// NewMemoryPlan validates it: Validate's work grows with the
		// descriptor's tokens, heads and elements, which this layout
		// then bounds, not the peer.
		if err := peerMemoryFits(self.Layout, src, peerMem); err != nil {
			return nil, fmt.Errorf("receiver %s group %d: %w", hello.From, g, err)
		}
		dst = kvMemory(peerMem, hello.Region.Len)
	} else if dst, err = kvcache.PoolMemory(self.Layout, genShape, g, dstGeom); err != nil {
		return nil, err
	}
	plan, err := kvcache.NewMemoryPlan(link, g, src, dst)
	if err != nil && peerMem != nil {
		return nil, fmt.Errorf("receiver %s group %d: %w", hello.From, g, err)
	}
	return plan, err
}

// peerMemoryFits checks a receiver's descriptor against this rank's memory
// src of the same group and layout l, on the fields that size the work of
// validating it: the same tokens per block, head width, element size and
// parts as src, and heads that are l's. Errors wrap kvcache.ErrBadMemory
// and name the value.
func peerMemoryFits(l kvcache.Layout, src *kvcache.KVMemory, m *messages.KVMemory) error {
	kind := kvcache.MemoryKind(m.Kind)
	for _, f := range []struct {
		what      string
		peer, own int
	}{
		{"tokens per block", int(m.TokensPerBlock), src.TokensPerBlock},
		{"head dim", int(m.HeadDim), src.HeadDim},
		{"element bytes", int(m.ElemBytes), src.ElemBytes},
		{"parts", int(m.Parts), src.Parts},
	} {
		if f.peer != f.own {
			return fmt.Errorf("%w: the receiver's %v memory has %s %d, this rank's %d: both sides must describe the layout of model %q",
				kvcache.ErrBadMemory, kind, f.what, f.peer, f.own, modelName(l))
		}
	}
	if lo, n := int(m.HeadLo), int(m.Heads); lo < 0 || n < 1 || lo+n > l.KVHeads {
		return fmt.Errorf("%w: the receiver's %v memory holds heads [%d,%d), outside the model's KV heads [0,%d): a rank's memory holds heads of its model only",
			kvcache.ErrBadMemory, kind, lo, lo+n, l.KVHeads)
	}
	return nil
}
