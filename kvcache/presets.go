package kvcache

import (
	"fmt"
	"strings"

	"github.com/kvxfer/kvxfer/internal/quote"
)

// DefaultTokensPerBlock is the block size, in tokens, of every preset.
// Layout.WithTokensPerBlock changes it.
const DefaultTokensPerBlock = 32

// bf16Bytes is the element size of every preset (bfloat16).
const bf16Bytes = 2

// preset builds one model's layout. Each call returns fresh slices, so a
// caller may modify the Layout it gets without affecting later lookups.
type preset struct {
	name  string
	build func(name string) Layout
}

// presets lists the models of DESIGN.md §10, in the order Presets reports.
var presets = []preset{
	{"Llama-3.1-8B", func(n string) Layout { return denseLayout(n, 32, 8, 128, FullAttention(32)) }},
	{"Llama-3.1-70B", func(n string) Layout { return denseLayout(n, 80, 8, 128, FullAttention(80)) }},
	{"Qwen3-8B", func(n string) Layout { return denseLayout(n, 36, 8, 128, FullAttention(36)) }},
	{"Mistral-7B-v0.1", func(n string) Layout {
		return denseLayout(n, 32, 8, 128, []LayerGroup{swaGroup(4096, LayerRange(0, 32))})
	}},
	{"Gemma-3-27B", func(n string) Layout {
		// Every sixth layer (i+1)%6 == 0 is global; the rest are local
		// sliding-window layers.
		return denseLayout(n, 62, 16, 128, interleaved(62, 1024, func(i int) bool { return (i+1)%6 == 0 }))
	}},
	{"GPT-OSS-120B", func(n string) Layout {
		// Even layers are sliding-window (128 tokens), odd layers are full.
		return denseLayout(n, 36, 8, 64, interleaved(36, 128, func(i int) bool { return i%2 == 1 }))
	}},
	{"DeepSeek-V3", func(n string) Layout {
		// Multi-head latent attention: one 576-wide latent (512 + 64 rope)
		// per token per layer, replicated across TP ranks.
		l := denseLayout(n, 61, 1, 576, FullAttention(61))
		l.MLA = true
		return l
	}},
}

// Preset returns the layout of a named model from DESIGN.md §10 (bf16,
// DefaultTokensPerBlock tokens per block). The name is matched
// case-insensitively; the returned Layout carries the canonical spelling in
// Name. Each call returns a fresh Layout that the caller may modify. An
// unknown name is an error wrapping ErrBadLayout that lists the known names.
func Preset(name string) (Layout, error) {
	for _, p := range presets {
		if strings.EqualFold(p.name, name) {
			return p.build(p.name), nil
		}
	}
	return Layout{}, fmt.Errorf("%w: unknown preset %s (known: %s)",
		ErrBadLayout, quote.String(name), strings.Join(Presets(), ", "))
}

// Presets returns the canonical names Preset accepts, in a fixed order.
func Presets() []string {
	out := make([]string, len(presets))
	for i, p := range presets {
		out[i] = p.name
	}
	return out
}

// WithTokensPerBlock returns a copy of l with TokensPerBlock set to n. The
// copy shares no slices with l. It does not validate n; call Validate.
func (l Layout) WithTokensPerBlock(n int) Layout {
	c := l.Clone()
	c.TokensPerBlock = n
	return c
}

// Clone returns a deep copy of l: its Groups and their Layers are fresh
// slices.
func (l Layout) Clone() Layout {
	c := l
	if l.Groups != nil {
		c.Groups = make([]LayerGroup, len(l.Groups))
		for i, g := range l.Groups {
			c.Groups[i] = g
			if g.Layers != nil {
				c.Groups[i].Layers = append([]int(nil), g.Layers...)
			}
		}
	}
	return c
}

func denseLayout(name string, layers, kvHeads, headDim int, groups []LayerGroup) Layout {
	return Layout{
		Name:           name,
		Layers:         layers,
		KVHeads:        kvHeads,
		HeadDim:        headDim,
		DTypeBytes:     bf16Bytes,
		TokensPerBlock: DefaultTokensPerBlock,
		Groups:         groups,
	}
}

func swaGroup(window int, layers []int) LayerGroup {
	return LayerGroup{Name: fmt.Sprintf("swa-%d", window), Layers: layers, Window: window}
}

// interleaved splits layers 0..n-1 into a sliding-window group (window
// tokens) and a full-attention group (layers where full(i) is true). The
// sliding-window group comes first, as it holds the lower layer 0 in every
// preset that uses it.
func interleaved(n, window int, full func(i int) bool) []LayerGroup {
	var swa, glob []int
	for i := range n {
		if full(i) {
			glob = append(glob, i)
		} else {
			swa = append(swa, i)
		}
	}
	return []LayerGroup{
		swaGroup(window, swa),
		{Name: "full", Layers: glob, Window: 0},
	}
}
