package kvcache

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
)

// Upper bounds Validate enforces. They are far above any real model and
// exist to reject hostile or corrupt values (from a config file or a peer)
// before they reach arithmetic: with every field at its bound, BlockBytes
// still fits in an int64.
const (
	MaxLayers         = 4096
	MaxKVHeads        = 4096
	MaxHeadDim        = 65536
	MaxDTypeBytes     = 16
	MaxTokensPerBlock = 65536
	MaxWindow         = math.MaxInt32
)

// Validate reports whether l is a usable layout. It returns nil or an error
// wrapping ErrBadLayout that names the first offending field and its value,
// for example "kvcache: bad layout: KVHeads = 0, must be ≥ 1".
//
// It checks: Layers, KVHeads, HeadDim, DTypeBytes and TokensPerBlock are
// positive and at most their Max bound; MLA layouts have KVHeads == 1;
// Groups is non-empty; each group's Layers is non-empty and strictly
// ascending; every layer 0..Layers-1 is in exactly one group; every Window is
// in [0, MaxWindow].
func (l Layout) Validate() error {
	for _, f := range []struct {
		name     string
		val, max int
	}{
		{"Layers", l.Layers, MaxLayers},
		{"KVHeads", l.KVHeads, MaxKVHeads},
		{"HeadDim", l.HeadDim, MaxHeadDim},
		{"DTypeBytes", l.DTypeBytes, MaxDTypeBytes},
		{"TokensPerBlock", l.TokensPerBlock, MaxTokensPerBlock},
	} {
		if f.val < 1 {
			return l.errorf("%s = %d, must be ≥ 1", f.name, f.val)
		}
		if f.val > f.max {
			return l.errorf("%s = %d, must be ≤ %d", f.name, f.val, f.max)
		}
	}
	if l.MLA && l.KVHeads != 1 {
		return l.errorf("KVHeads = %d with MLA = true, must be 1", l.KVHeads)
	}
	if len(l.Groups) == 0 {
		return l.errorf("Groups is empty, must hold ≥ 1 group")
	}
	owner := make([]int, l.Layers) // group index + 1 of each layer; 0 = none yet
	for gi, g := range l.Groups {
		if g.Window < 0 || g.Window > MaxWindow {
			return l.errorf("Groups[%d].Window = %d, must be in [0, %d]", gi, g.Window, MaxWindow)
		}
		if len(g.Layers) == 0 {
			return l.errorf("Groups[%d] (%q) has no layers, must have ≥ 1", gi, g.Name)
		}
		for li, layer := range g.Layers {
			if layer < 0 || layer >= l.Layers {
				return l.errorf("Groups[%d].Layers[%d] = %d, must be in [0, %d)", gi, li, layer, l.Layers)
			}
			if li > 0 && layer <= g.Layers[li-1] {
				return l.errorf("Groups[%d].Layers[%d] = %d, must be > Layers[%d] = %d (strictly ascending)",
					gi, li, layer, li-1, g.Layers[li-1])
			}
			if prev := owner[layer]; prev != 0 {
				return l.errorf("layer %d is in Groups[%d] and Groups[%d], must be in exactly one", layer, prev-1, gi)
			}
			owner[layer] = gi + 1
		}
	}
	for layer, o := range owner {
		if o == 0 {
			return l.errorf("layer %d is in no group, must be in exactly one", layer)
		}
	}
	return nil
}

func (l Layout) errorf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if l.Name != "" {
		msg += fmt.Sprintf(" (layout %q)", l.Name)
	}
	return fmt.Errorf("%w: %s", ErrBadLayout, msg)
}

// layoutHashTag versions the canonical encoding Hash digests. Changing the
// encoding means changing the tag, so that peers of different versions see
// different hashes rather than silently agreeing.
const layoutHashTag = "kvxfer/kvcache.Layout/v1"

// Hash returns a fingerprint of the layout that two peers compare (it is
// carried in Hello) to agree that they lay out KV blocks the same way.
//
// It is the first 8 bytes, read big-endian, of the SHA-256 of this canonical
// encoding, where every integer is a big-endian int64, a bool is one byte
// (0 or 1) and a string is its length as an int64 followed by its bytes:
//
//	"kvxfer/kvcache.Layout/v1" (the bytes, without length),
//	Name, Layers, KVHeads, HeadDim, DTypeBytes, TokensPerBlock, MLA,
//	len(Groups), then for each group in order:
//	  Name, Window, len(Layers), each layer.
//
// Every field takes part, names included (as Layout.Name documents): two
// layouts of the same shape under different names do not match, which is
// the conservative choice for a compatibility check. Equal layouts (field by
// field, group order included) hash equal; a Layout that differs in any
// field hashes differently except with probability about 2^-64. Hash does
// not validate l.
func (l Layout) Hash() uint64 {
	h := sha256.New()
	var buf [8]byte
	putInt := func(v int) {
		binary.BigEndian.PutUint64(buf[:], uint64(int64(v)))
		h.Write(buf[:])
	}
	putString := func(s string) {
		putInt(len(s))
		h.Write([]byte(s))
	}
	h.Write([]byte(layoutHashTag))
	putString(l.Name)
	putInt(l.Layers)
	putInt(l.KVHeads)
	putInt(l.HeadDim)
	putInt(l.DTypeBytes)
	putInt(l.TokensPerBlock)
	if l.MLA {
		h.Write([]byte{1})
	} else {
		h.Write([]byte{0})
	}
	putInt(len(l.Groups))
	for _, g := range l.Groups {
		putString(g.Name)
		putInt(g.Window)
		putInt(len(g.Layers))
		for _, layer := range g.Layers {
			putInt(layer)
		}
	}
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}
