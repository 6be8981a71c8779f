package kvcache

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestPresetBytesPerToken(t *testing.T) {
	tests := []struct {
		name          string
		layers        int
		kvHeads       int
		headDim       int
		mla           bool
		bytesPerToken int
		groups        int
	}{
		{"Llama-3.1-8B", 32, 8, 128, false, 128 << 10, 1},
		{"Llama-3.1-70B", 80, 8, 128, false, 80 * 2 * 8 * 128 * 2, 1},
		{"Qwen3-8B", 36, 8, 128, false, 36 * 2 * 8 * 128 * 2, 1},
		{"Mistral-7B-v0.1", 32, 8, 128, false, 128 << 10, 1},
		{"Gemma-3-27B", 62, 16, 128, false, 62 * 2 * 16 * 128 * 2, 2},
		{"GPT-OSS-120B", 36, 8, 64, false, 36 * 2 * 8 * 64 * 2, 2},
		{"DeepSeek-V3", 61, 1, 576, true, 61 * 1 * 576 * 2, 1},
	}
	if got, want := len(tests), len(Presets()); got != want {
		t.Fatalf("table covers %d presets, Presets() has %d", got, want)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Preset(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Validate(); err != nil {
				t.Fatalf("preset does not validate: %v", err)
			}
			if l.Name != tt.name || l.Layers != tt.layers || l.KVHeads != tt.kvHeads ||
				l.HeadDim != tt.headDim || l.MLA != tt.mla || l.DTypeBytes != 2 ||
				l.TokensPerBlock != DefaultTokensPerBlock {
				t.Errorf("got %+v", l)
			}
			if got := l.BytesPerToken(); got != tt.bytesPerToken {
				t.Errorf("BytesPerToken = %d, want %d", got, tt.bytesPerToken)
			}
			if got := len(l.Groups); got != tt.groups {
				t.Errorf("%d groups, want %d", got, tt.groups)
			}
		})
	}
}

func TestPresetLlama8BOneGiBPer8K(t *testing.T) {
	l, err := Preset("Llama-3.1-8B")
	if err != nil {
		t.Fatal(err)
	}
	if got := l.BytesPerToken() * 8192; got != 1<<30 {
		t.Fatalf("8k prompt = %d bytes, want 1 GiB", got)
	}
	if got, want := l.BlockBytes(0), 32*(128<<10); got != want {
		t.Fatalf("BlockBytes(0) = %d, want %d", got, want)
	}
}

func TestPresetGroups(t *testing.T) {
	tests := []struct {
		name      string
		wantFull  []int
		swaWindow int
	}{
		{"Gemma-3-27B", []int{5, 11, 17, 23, 29, 35, 41, 47, 53, 59}, 1024},
		{"GPT-OSS-120B", oddsBelow(36), 128},
		{"Mistral-7B-v0.1", nil, 4096},
		{"Llama-3.1-8B", LayerRange(0, 32), 0},
		{"DeepSeek-V3", LayerRange(0, 61), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Preset(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			var full, swa []int
			for _, g := range l.Groups {
				switch g.Window {
				case 0:
					full = append(full, g.Layers...)
				case tt.swaWindow:
					swa = append(swa, g.Layers...)
				default:
					t.Errorf("group %q has window %d, want 0 or %d", g.Name, g.Window, tt.swaWindow)
				}
			}
			if !slices.Equal(full, tt.wantFull) {
				t.Errorf("full-attention layers %v, want %v", full, tt.wantFull)
			}
			if got, want := len(full)+len(swa), l.Layers; got != want {
				t.Errorf("%d layers in groups, want %d", got, want)
			}
		})
	}
}

func oddsBelow(n int) []int {
	var out []int
	for i := 1; i < n; i += 2 {
		out = append(out, i)
	}
	return out
}

func TestPresetCaseInsensitive(t *testing.T) {
	for _, name := range []string{"llama-3.1-8b", "LLAMA-3.1-8B", "Llama-3.1-8B"} {
		l, err := Preset(name)
		if err != nil {
			t.Fatalf("Preset(%q): %v", name, err)
		}
		if l.Name != "Llama-3.1-8B" {
			t.Errorf("Preset(%q).Name = %q, want the canonical spelling", name, l.Name)
		}
	}
}

func TestPresetUnknown(t *testing.T) {
	for _, name := range []string{"", "llama", "Llama-3.1-8B "} {
		_, err := Preset(name)
		if !errors.Is(err, ErrBadLayout) {
			t.Fatalf("Preset(%q) = %v, want ErrBadLayout", name, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, `"`+name+`"`) || !strings.Contains(msg, "DeepSeek-V3") {
			t.Errorf("error %q should name %q and list the presets", msg, name)
		}
	}
}

func TestPresetsAreIndependentCopies(t *testing.T) {
	a, _ := Preset("Gemma-3-27B")
	a.Groups[0].Layers[0] = 99
	a.Groups[1].Window = 7
	b, _ := Preset("Gemma-3-27B")
	if b.Groups[0].Layers[0] != 0 || b.Groups[1].Window != 0 {
		t.Fatalf("modifying one Preset result changed the next: %+v", b.Groups)
	}
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	names := Presets()
	names[0] = "x"
	if Presets()[0] == "x" {
		t.Fatal("Presets returned shared storage")
	}
}

func TestWithTokensPerBlock(t *testing.T) {
	a, _ := Preset("GPT-OSS-120B")
	b := a.WithTokensPerBlock(16)
	if a.TokensPerBlock != DefaultTokensPerBlock || b.TokensPerBlock != 16 {
		t.Fatalf("TokensPerBlock: original %d, copy %d", a.TokensPerBlock, b.TokensPerBlock)
	}
	b.Groups[1].Layers[0] = 1000
	if a.Groups[1].Layers[0] != 1 {
		t.Fatal("WithTokensPerBlock shares Layers with the original")
	}
	if got, want := a.BlockBytes(0), 2*b.WithTokensPerBlock(16).BlockBytes(0); got != want {
		t.Fatalf("halving TokensPerBlock: BlockBytes %d, want half of %d", want/2, got)
	}
}
