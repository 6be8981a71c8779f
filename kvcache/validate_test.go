package kvcache

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func validLayout() Layout {
	return Layout{
		Name: "test", Layers: 4, KVHeads: 2, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 4,
		Groups: []LayerGroup{
			{Name: "swa", Layers: []int{0, 2}, Window: 16},
			{Name: "full", Layers: []int{1, 3}},
		},
	}
}

func TestValidateRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Layout)
		want   string // substring of the error
	}{
		{"zero layers", func(l *Layout) { l.Layers = 0 }, "Layers = 0, must be ≥ 1"},
		{"negative layers", func(l *Layout) { l.Layers = -3 }, "Layers = -3, must be ≥ 1"},
		{"huge layers", func(l *Layout) { l.Layers = MaxLayers + 1 }, "Layers = 4097, must be ≤ 4096"},
		{"zero kv heads", func(l *Layout) { l.KVHeads = 0 }, "KVHeads = 0, must be ≥ 1"},
		{"huge kv heads", func(l *Layout) { l.KVHeads = 1 << 40 }, "KVHeads = 1099511627776, must be ≤"},
		{"zero head dim", func(l *Layout) { l.HeadDim = 0 }, "HeadDim = 0, must be ≥ 1"},
		{"huge head dim", func(l *Layout) { l.HeadDim = MaxHeadDim + 1 }, "HeadDim = 65537, must be ≤ 65536"},
		{"zero dtype", func(l *Layout) { l.DTypeBytes = 0 }, "DTypeBytes = 0, must be ≥ 1"},
		{"huge dtype", func(l *Layout) { l.DTypeBytes = 17 }, "DTypeBytes = 17, must be ≤ 16"},
		{"zero tpb", func(l *Layout) { l.TokensPerBlock = 0 }, "TokensPerBlock = 0, must be ≥ 1"},
		{"huge tpb", func(l *Layout) { l.TokensPerBlock = 1 << 20 }, "TokensPerBlock = 1048576, must be ≤ 65536"},
		{"mla with heads", func(l *Layout) { l.MLA = true }, "KVHeads = 2 with MLA = true, must be 1"},
		{"no groups", func(l *Layout) { l.Groups = nil }, "Groups is empty"},
		{"empty group", func(l *Layout) { l.Groups = append(l.Groups, LayerGroup{Name: "x"}) }, `Groups[2] ("x") has no layers`},
		{"negative window", func(l *Layout) { l.Groups[0].Window = -1 }, "Groups[0].Window = -1"},
		{"layer out of range", func(l *Layout) { l.Groups[1].Layers[1] = 4 }, "Groups[1].Layers[1] = 4, must be in [0, 4)"},
		{"negative layer", func(l *Layout) { l.Groups[0].Layers[0] = -1 }, "Groups[0].Layers[0] = -1, must be in [0, 4)"},
		{"descending", func(l *Layout) { l.Groups[0].Layers = []int{2, 0} }, "Groups[0].Layers[1] = 0, must be > Layers[0] = 2"},
		{"repeated in group", func(l *Layout) { l.Groups[0].Layers = []int{0, 0, 2} }, "Groups[0].Layers[1] = 0, must be > Layers[0] = 0"},
		{"in two groups", func(l *Layout) { l.Groups[1].Layers = []int{1, 2, 3} }, "layer 2 is in Groups[0] and Groups[1]"},
		{"in no group", func(l *Layout) { l.Groups[1].Layers = []int{1} }, "layer 3 is in no group"},
	}
	if err := validLayout().Validate(); err != nil {
		t.Fatalf("base layout: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := validLayout()
			tt.mutate(&l)
			err := l.Validate()
			if !errors.Is(err, ErrBadLayout) {
				t.Fatalf("Validate() = %v, want ErrBadLayout", err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), `layout "test"`) {
				t.Fatalf("Validate() = %q, want it to contain %q and the layout name", err, tt.want)
			}
		})
	}
}

func TestValidateMessageFormat(t *testing.T) {
	l := validLayout()
	l.Name = ""
	l.KVHeads = 0
	if got, want := l.Validate().Error(), "kvcache: bad layout: KVHeads = 0, must be ≥ 1"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestValidateMLA(t *testing.T) {
	l := validLayout()
	l.MLA, l.KVHeads = true, 1
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestValidateRandom checks that every partition of the layers into groups
// validates, and that dropping or duplicating a layer does not.
func TestValidateRandom(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := randomLayout(t)
		if err := l.Validate(); err != nil {
			t.Fatalf("valid layout rejected: %v\n%+v", err, l)
		}
		g := rapid.IntRange(0, len(l.Groups)-1).Draw(t, "group")
		layers := l.Groups[g].Layers
		bad := l.Clone()
		switch rapid.IntRange(0, 2).Draw(t, "corruption") {
		case 0: // drop a layer
			i := rapid.IntRange(0, len(layers)-1).Draw(t, "drop")
			bad.Groups[g].Layers = append(append([]int(nil), layers[:i]...), layers[i+1:]...)
		case 1: // repeat a layer of another group (or its own)
			o := rapid.IntRange(0, len(l.Groups)-1).Draw(t, "other")
			x := rapid.SampledFrom(l.Groups[o].Layers).Draw(t, "layer")
			bad.Groups[g].Layers = append(bad.Groups[g].Layers, x)
		case 2: // swap two entries out of order
			if len(layers) < 2 {
				bad.Groups[g].Layers = append(bad.Groups[g].Layers, l.Layers)
				break
			}
			bad.Groups[g].Layers[0], bad.Groups[g].Layers[1] = layers[1], layers[0]
		}
		if err := bad.Validate(); !errors.Is(err, ErrBadLayout) {
			t.Fatalf("corrupted layout accepted (%v): %+v", err, bad.Groups)
		}
	})
}

// randomLayout draws a valid layout whose layers are split into 1..4 groups.
func randomLayout(t *rapid.T) Layout {
	layers := rapid.IntRange(1, 64).Draw(t, "layers")
	ngroups := rapid.IntRange(1, min(4, layers)).Draw(t, "groups")
	groups := make([]LayerGroup, ngroups)
	// Give each group one layer, then the rest at random.
	perm := rapid.Permutation(LayerRange(0, layers)).Draw(t, "perm")
	owner := make([]int, layers)
	for i, layer := range perm {
		if i < ngroups {
			owner[layer] = i
		} else {
			owner[layer] = rapid.IntRange(0, ngroups-1).Draw(t, "owner")
		}
	}
	for layer, g := range owner {
		groups[g].Layers = append(groups[g].Layers, layer)
	}
	for i := range groups {
		groups[i].Window = rapid.SampledFrom([]int{0, 0, 128, 4096}).Draw(t, "window")
	}
	mla := rapid.Bool().Draw(t, "mla")
	heads := 1
	if !mla {
		heads = rapid.IntRange(1, 64).Draw(t, "heads")
	}
	return Layout{
		Layers: layers, KVHeads: heads, MLA: mla,
		HeadDim:        rapid.IntRange(1, 1024).Draw(t, "headDim"),
		DTypeBytes:     rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "dtype"),
		TokensPerBlock: rapid.IntRange(1, 256).Draw(t, "tpb"),
		Groups:         groups,
	}
}

func TestHashEqualForEqualLayouts(t *testing.T) {
	for _, name := range Presets() {
		a, _ := Preset(name)
		b, _ := Preset(name)
		if a.Hash() != b.Hash() {
			t.Errorf("%s: two copies hash differently", name)
		}
		if a.Hash() != a.Clone().Hash() {
			t.Errorf("%s: clone hashes differently", name)
		}
	}
}

func TestHashDistinguishesEveryField(t *testing.T) {
	base := validLayout()
	tests := []struct {
		name   string
		mutate func(*Layout)
	}{
		{"Name", func(l *Layout) { l.Name = "test2" }},
		{"Layers", func(l *Layout) { l.Layers++ }},
		{"KVHeads", func(l *Layout) { l.KVHeads++ }},
		{"HeadDim", func(l *Layout) { l.HeadDim++ }},
		{"DTypeBytes", func(l *Layout) { l.DTypeBytes++ }},
		{"TokensPerBlock", func(l *Layout) { l.TokensPerBlock++ }},
		{"MLA", func(l *Layout) { l.MLA = true }},
		{"group order", func(l *Layout) { l.Groups[0], l.Groups[1] = l.Groups[1], l.Groups[0] }},
		{"group name", func(l *Layout) { l.Groups[0].Name = "swa2" }},
		{"group window", func(l *Layout) { l.Groups[0].Window++ }},
		{"group layers", func(l *Layout) { l.Groups[0].Layers = []int{0, 3}; l.Groups[1].Layers = []int{1, 2} }},
		{"extra group", func(l *Layout) { l.Groups = append(l.Groups, LayerGroup{}) }},
		// Moving a string boundary must change the hash: "ab"+"" ≠ "a"+"b".
		{"name boundary", func(l *Layout) { l.Name = "tes"; l.Groups[0].Name = "tswa" }},
	}
	seen := map[uint64]string{base.Hash(): "base"}
	for _, tt := range tests {
		l := base.Clone()
		tt.mutate(&l)
		h := l.Hash()
		if prev, ok := seen[h]; ok {
			t.Errorf("%s: hash %#x equals that of %s", tt.name, h, prev)
		}
		seen[h] = tt.name
	}
	for _, name := range Presets() {
		l, _ := Preset(name)
		if prev, ok := seen[l.Hash()]; ok {
			t.Errorf("%s: hash equals that of %s", name, prev)
		}
		seen[l.Hash()] = name
	}
}

// TestHashGolden pins the encoding: peers of different builds compare this
// value, so a change here is a wire-compatibility change (bump the tag).
func TestHashGolden(t *testing.T) {
	l, _ := Preset("Llama-3.1-8B")
	if got, want := l.Hash(), uint64(0x1617c3947da62294); got != want {
		t.Fatalf("Llama-3.1-8B Hash() = %#x, want %#x", got, want)
	}
}
