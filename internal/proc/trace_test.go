package proc

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvxfer/kvxfer/trace"
)

// TestRoleTraceRotates: a role's TraceMaxBytes and TraceKeep (the CLI's
// --trace-max-bytes and --trace-keep) reach its engine through the node:
// its --trace file rotates at the bound and each file of the set replays
// on its own. (Checked to fail with nodeConfig, or the node, not passing
// them on: one file, truncated.)
func TestRoleTraceRotates(t *testing.T) {
	ctxO, genO := pairOptions(t, 4)
	path := filepath.Join(t.TempDir(), "ctx.trace")
	ctxO.TracePath, ctxO.TraceMaxBytes, ctxO.TraceKeep = path, 8<<10, 2
	runPair(t, ctxO, genO, nil, false)
	for _, f := range []string{path + ".1", path} {
		res, err := trace.ReplayFile(f)
		if err != nil {
			b, _ := os.ReadFile(f)
			t.Fatalf("replay %s: %v\n%s", filepath.Base(f), err, b)
		}
		if !res.Identical() || res.Truncated || res.Engines != 1 {
			t.Fatalf("%s: %+v", filepath.Base(f), res)
		}
	}
}
