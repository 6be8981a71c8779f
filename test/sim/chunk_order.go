package sim

import (
	"errors"
	"slices"

	"github.com/kvxfer/kvxfer/kvcache"
)

// WrongChunk is a chunk or layer part handed out of its request's order,
// which kvcache.ChunkOrder (the order TxHandle.Chunk keeps) must refuse.
type WrongChunk uint8

// Wrong chunks the serving process sometimes tries before the right one.
const (
	// WrongSkipLayers: a part that starts past the layer the chunk's next
	// part starts at (its first part: past layer 0).
	WrongSkipLayers WrongChunk = iota
	// WrongOtherChunk: another chunk while a chunk's parts are pending.
	WrongOtherChunk
	// WrongSources: a later part with source blocks other than its first
	// part's.
	WrongSources
	// WrongTokenOrder: a chunk that does not start where the last ended
	// (one already handed, or one past the next).
	WrongTokenOrder
	// WrongAfterLast: a chunk after the last one was handed.
	WrongAfterLast

	numWrongChunks
)

var wrongChunkNames = [numWrongChunks]string{
	"part that skips layers", "other chunk while parts are pending", "part with other sources",
	"chunk out of token order", "chunk after the last",
}

func (w WrongChunk) String() string { return wrongChunkNames[w] }

// wrongEvery: one hand in wrongEvery (drawn from Sim.or) first tries a
// wrong chunk.
const wrongEvery = 8

// orderChunk runs part j of request chunk i (ch, with sources src) through
// the app's ChunkOrder as TxHandle.Chunk does (Check, then Took) and
// reports whether it was accepted; a refusal is a failure. Chosen by the
// seed, it first tries a wrong chunk, which Check must refuse without
// changing the order (the right one is then accepted), or, after the
// request's last part, one after the last.
func (a *ctxApp) orderChunk(i, j int, ch kvcache.Chunk, src []kvcache.BlockRun) bool {
	s, q := a.c.s, a.q
	var kinds []WrongChunk
	if s.or.IntN(wrongEvery) == 0 {
		if ch.Layers.Lo+1 < s.layout.Layers {
			kinds = append(kinds, WrongSkipLayers)
		}
		if a.order.InPart() {
			if len(q.chunks) > 1 {
				kinds = append(kinds, WrongOtherChunk)
			}
			kinds = append(kinds, WrongSources)
		} else if len(q.chunks) > 1 {
			kinds = append(kinds, WrongTokenOrder)
		}
		if i == len(q.chunks)-1 && j == len(q.parts[i])-1 {
			kinds = append(kinds, WrongAfterLast)
		}
	}
	kind := numWrongChunks
	if len(kinds) > 0 {
		kind = kinds[s.or.IntN(len(kinds))]
	}
	if kind != numWrongChunks && kind != WrongAfterLast && !a.refuses(kind, a.wrongChunk(kind, i, ch, src), ch.String()) {
		return false
	}
	if err := a.order.Check(ch, src); err != nil {
		s.failf("%s: kvcache.ChunkOrder refused %v, the part the serving process hands next: %v", a.name(), ch, err)
		return false
	}
	a.order.Took(ch, src)
	if kind == WrongAfterLast {
		if !a.order.Done() {
			s.failf("%s: kvcache.ChunkOrder: not Done after %v, the last part of the last chunk", a.name(), ch)
			return false
		}
		return a.refuses(kind, a.wrongChunk(kind, i, ch, src), "none: "+ch.String()+" was the last")
	}
	return true
}

// wrongTry is a wrong chunk with its sources.
type wrongTry struct {
	c   kvcache.Chunk
	src []kvcache.BlockRun
}

// wrongChunk builds a wrong chunk of that kind for the hand of ch (part of
// request chunk i, with sources src).
func (a *ctxApp) wrongChunk(kind WrongChunk, i int, ch kvcache.Chunk, src []kvcache.BlockRun) wrongTry {
	s, q := a.c.s, a.q
	of := s.layout.Layers
	w := wrongTry{c: ch, src: src}
	other := func() kvcache.Chunk { // a chunk other than i, as the serving process would hand it
		k := i + 1
		if k == len(q.chunks) || s.or.IntN(2) == 0 && i > 0 {
			k = s.or.IntN(i)
		}
		return q.chunks[k]
	}
	switch kind {
	case WrongSkipLayers:
		w.c.Layers = kvcache.LayerPart{Lo: ch.Layers.Lo + 1 + s.or.IntN(of-ch.Layers.Lo-1), Hi: of, Of: of}
	case WrongOtherChunk, WrongTokenOrder:
		w.c = other()
		if s.or.IntN(2) == 0 {
			w.c.Layers = kvcache.LayerPart{Lo: 0, Hi: 1 + s.or.IntN(of), Of: of}
		}
		w.src = w.c.Runs(s.layout.TokensPerBlock, a.blocks)
	case WrongSources:
		w.src = make([]kvcache.BlockRun, len(src))
		for g, r := range src {
			w.src[g] = kvcache.BlockRun{First: r.First, IDs: slices.Clone(r.IDs)}
		}
		if g := slices.IndexFunc(w.src, func(r kvcache.BlockRun) bool { return len(r.IDs) > 0 }); g >= 0 {
			w.src[g].IDs[s.or.IntN(len(w.src[g].IDs))] += 1 + kvcache.BlockID(s.or.IntN(4))
		} else {
			w.src = append(w.src, kvcache.BlockRun{})
		}
	case WrongAfterLast:
		w.c = q.chunks[s.or.IntN(len(q.chunks))]
		w.src = w.c.Runs(s.layout.TokensPerBlock, a.blocks)
	}
	return w
}

// refuses checks that the app's ChunkOrder refuses w as out of order
// (next is the part that may come next), and counts it.
func (a *ctxApp) refuses(kind WrongChunk, w wrongTry, next string) bool {
	s := a.c.s
	err := a.order.Check(w.c, w.src)
	if err == nil {
		s.failf("%s: kvcache.ChunkOrder accepted a %s, %v with sources %v; the next part is %s", a.name(), kind, w.c, w.src, next)
		return false
	}
	if !errors.Is(err, kvcache.ErrChunkOrder) {
		s.failf("%s: kvcache.ChunkOrder refused a %s, %v, but not as out of order: %v", a.name(), kind, w.c, err)
		return false
	}
	s.res.WrongChunks[kind]++
	return true
}
