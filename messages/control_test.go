package messages_test

import (
	"math/big"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvxfer/kvxfer/messages"
)

// TestHelloPoolsInsideRegion: whatever the geometry, a Hello that passes
// Validate places every block of every pool inside its region (computed
// without overflow).
func TestHelloPoolsInsideRegion(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := sampleHello()
		h.Region.Len = rapid.Uint64().Draw(t, "regionLen")
		h.Pools = []messages.PoolGeometry{{
			Offset:     rapid.Uint64().Draw(t, "offset"),
			BlockBytes: rapid.OneOf(rapid.Uint64(), rapid.Uint64Range(1, 1<<24), rapid.Just(uint64(1)<<63)).Draw(t, "blockBytes"),
			Blocks:     rapid.Int32Range(0, messages.MaxBlocks).Draw(t, "blocks"),
		}}
		if h.Validate() != nil {
			return
		}
		p := h.Pools[0]
		end := new(big.Int).Mul(big.NewInt(int64(p.Blocks)), new(big.Int).SetUint64(p.BlockBytes))
		end.Add(end, new(big.Int).SetUint64(p.Offset))
		if end.Cmp(new(big.Int).SetUint64(h.Region.Len)) > 0 {
			t.Fatalf("valid Hello's pool %+v ends at %s past region length %d", p, end, h.Region.Len)
		}
	})
}

// TestHelloWithoutKeyRoundTrips: a send-only rank's Hello names no region
// key (rdma.RegisterSource); it validates and decodes with no key, and
// its region's length still bounds its pools.
func TestHelloWithoutKeyRoundTrips(t *testing.T) {
	h := sampleHello()
	h.Region.Key = nil
	b, err := messages.Encode(h)
	if err != nil {
		t.Fatalf("Encode of a Hello without a region key: %v", err)
	}
	f, err := messages.Decode(b)
	if err != nil {
		t.Fatalf("Decode of a Hello without a region key: %v", err)
	}
	got, ok := f.(*messages.Hello)
	if !ok || len(got.Region.Key) != 0 || got.Region.Len != h.Region.Len {
		t.Fatalf("decoded %T %+v, want a Hello with no key and region length %d", f, f, h.Region.Len)
	}
	h.Region.Len = 0
	if err := h.Validate(); err == nil {
		t.Errorf("a keyless Hello whose pools lie past its region of length 0 validates")
	}
}

// TestCheckStages: the one check of a Parallel's Stages (the wire's and a
// discovery record's) names the value it refuses.
func TestCheckStages(t *testing.T) {
	for _, c := range []struct {
		stages string
		pp     int32
		want   string // "" accepted
	}{
		{"", 4, ""},
		{"7,8,8,7", 4, ""},
		{"3,4", 1, `stages "3,4" name 2 stages, PP=1`},
		{"x", 1, `stages: kvcache: bad parallelism: Stages "x": stage 0's layer count "x"`},
		{"07", 1, `stage 0's layer count "07"`},
		{"1,1,1", 1, `stages "1,1,1" name 3 stages, PP=1`},
		{"1,1,1,1", 1, "stages of 7 bytes for PP=1, want at most 5"},
		{"1", 0, "stages of 1 bytes for PP=0, want at most 0"},
		{"1", -3, "stages of 1 bytes for PP=-3, want at most 0"},
	} {
		err := messages.CheckStages(c.stages, c.pp)
		if c.want == "" {
			if err != nil {
				t.Errorf("CheckStages(%q, %d): %v, want nil", c.stages, c.pp, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckStages(%q, %d): %v, want an error naming %q", c.stages, c.pp, err, c.want)
		}
	}
}
