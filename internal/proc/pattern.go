package proc

import (
	"encoding/binary"

	"github.com/kvxfer/kvxfer/kvcache"
)

// The pattern a context rank writes and the generation rank checks is a
// function of global coordinates only — request, layer group, block of the
// prompt, layer, part (K or V), KV head, token, byte — so that ranks of
// different tensor parallelism (a TP2 context and a TP1 generation rank)
// agree on every byte, wherever the plan puts it. A rank-local block is
// laid out as kvcache/doc.go says: layer, part, head, token, then the
// token's HeadDim × DTypeBytes bytes (a row).

// rowSeed is the seed of one row.
func rowSeed(req, g, blk, layer, part, head, token int) uint64 {
	x := uint64(req+1)*0x9E3779B97F4A7C15 ^ uint64(g+1)*0xBF58476D1CE4E5B9 ^ uint64(blk+1)*0x94D049BB133111EB ^
		uint64(layer+1)<<40 ^ uint64(part+1)<<36 ^ uint64(head+1)<<24 ^ uint64(token+1)
	x ^= x >> 31
	x *= 0xD6E8FEB86659FD93
	x ^= x >> 29
	return x
}

// eachRow calls f with every row of a rank-local block of group g and its
// seed, until f returns false.
func eachRow(b []byte, l kvcache.Layout, s kvcache.Shape, req, g, blk int, f func(row []byte, seed uint64) bool) bool {
	return eachRowOf(b, l, s, req, g, blk, kvcache.LayerPart{}, f)
}

// eachRowOf is eachRow over the rows of the layers in part only.
func eachRowOf(b []byte, l kvcache.Layout, s kvcache.Shape, req, g, blk int, part kvcache.LayerPart, f func(row []byte, seed uint64) bool) bool {
	tb := l.TokenBytes()
	perLayer := l.Parts() * (s.HeadHi - s.HeadLo) * l.TokensPerBlock * tb
	off := 0
	for _, layer := range s.Layers[g] {
		if !part.Contains(layer) {
			off += perLayer
			continue
		}
		for p := range l.Parts() {
			for h := s.HeadLo; h < s.HeadHi; h++ {
				for t := range l.TokensPerBlock {
					if !f(b[off:off+tb], rowSeed(req, g, blk, layer, p, h, t)) {
						return false
					}
					off += tb
				}
			}
		}
	}
	return true
}

// rowWord is word k of a row with seed s.
func rowWord(s uint64, k int) uint64 { return s + uint64(k)*0xA0761D6478BD642F }

// fillBlock writes the pattern into the rows of part's layers (the zero
// part: all) of a rank-local block of group g.
func fillBlock(b []byte, l kvcache.Layout, s kvcache.Shape, req, g, blk int, part kvcache.LayerPart) {
	eachRowOf(b, l, s, req, g, blk, part, func(row []byte, seed uint64) bool {
		k := 0
		for ; k+8 <= len(row); k += 8 {
			binary.LittleEndian.PutUint64(row[k:], rowWord(seed, k/8))
		}
		for ; k < len(row); k++ {
			row[k] = byte(rowWord(seed, k))
		}
		return true
	})
}

// checkBlock reports whether a rank-local block of group g holds the
// pattern.
func checkBlock(b []byte, l kvcache.Layout, s kvcache.Shape, req, g, blk int) bool {
	return eachRow(b, l, s, req, g, blk, func(row []byte, seed uint64) bool {
		k := 0
		for ; k+8 <= len(row); k += 8 {
			if binary.LittleEndian.Uint64(row[k:]) != rowWord(seed, k/8) {
				return false
			}
		}
		for ; k < len(row); k++ {
			if row[k] != byte(rowWord(seed, k)) {
				return false
			}
		}
		return true
	})
}
