package trace

import (
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kvcache"
)

// TestDigestTellsFreeingEffectsApart: the digest replay compares must
// differ where a step's effects free pages differently (DESIGN.md §3): a
// ReleaseDest out of quarantine is not a plain one, and a QuarantineDest
// names what it quarantines and for whom. When they digested alike,
// replay reported "identical" for a step that now frees pages another
// way.
func TestDigestTellsFreeingEffectsApart(t *testing.T) {
	blocks := [][]kvcache.BlockID{{1, 2, 3}}
	for _, c := range []struct {
		name string
		a, b actors.Effect
	}{
		{"release quarantined or not", actors.ReleaseDest{Blocks: blocks, Quarantined: true}, actors.ReleaseDest{Blocks: blocks}},
		{"quarantine, other blocks", actors.QuarantineDest{Blocks: blocks, Writers: []int{0}},
			actors.QuarantineDest{Blocks: [][]kvcache.BlockID{{1}}, Writers: []int{0}}},
		{"quarantine, other writers", actors.QuarantineDest{Blocks: blocks, Writers: []int{0}},
			actors.QuarantineDest{Blocks: blocks, Writers: []int{1}}},
	} {
		want := Digest{State: "CANCELLED", Eff: []string{EffectString(c.a)}}
		got := Digest{State: "CANCELLED", Eff: []string{EffectString(c.b)}}
		if field, w, g, ok := want.Diff(got); ok || field != "eff[0]" {
			t.Errorf("%s: %+v and %+v digest alike (%q, %q): replay cannot tell them apart", c.name, c.a, c.b, w, g)
		}
	}
}

// TestDigestOfOlderTraces: a trace of a version before the digest told
// these effects apart replays with the lines it recorded.
func TestDigestOfOlderTraces(t *testing.T) {
	blocks := [][]kvcache.BlockID{{1, 2, 3}}
	for _, v := range []int{1, 2, 3} {
		if got := effectString(actors.ReleaseDest{Blocks: blocks, Quarantined: true}, v); got != "ReleaseDest blocks=3" {
			t.Errorf("version %d: quarantined release %q, want the line it recorded", v, got)
		}
		if got := effectString(actors.QuarantineDest{Blocks: blocks, Writers: []int{0}}, v); got != "core.QuarantineDest" {
			t.Errorf("version %d: quarantine %q, want the line it recorded", v, got)
		}
	}
	if got := EffectString(actors.QuarantineDest{Blocks: blocks, Writers: []int{0, 2}}); !strings.Contains(got, "blocks=3") || !strings.Contains(got, "[0 2]") {
		t.Errorf("quarantine digests as %q, want its block count and writers", got)
	}
}
