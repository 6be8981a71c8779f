package core

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps_NoActorRuntimeNoCgo: the pure steps depend on neither
// protoactor nor zmq nor any cgo package (DESIGN.md §7), in a default
// build and with the kvxfer_invariants tag.
func TestDeps_NoActorRuntimeNoCgo(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with")
	}
	for _, tags := range []string{"", "kvxfer_invariants"} {
		out, err := exec.Command(goBin, "list", "-deps", "-tags", tags,
			"-f", "{{.ImportPath}} {{len .CgoFiles}}", ".").CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps (tags %q): %v\n%s", tags, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) < 2 || !strings.HasPrefix(lines[len(lines)-1], "github.com/kvxfer/kvxfer/actors/core ") {
			t.Fatalf("go list -deps (tags %q) did not list the package last:\n%s", tags, out)
		}
		for _, l := range lines {
			path, cgo, _ := strings.Cut(l, " ")
			switch {
			case strings.Contains(path, "protoactor"), strings.Contains(path, "zmq"):
				t.Errorf("tags %q: actors/core depends on %s", tags, path)
			case path == "C", path == "runtime/cgo", cgo != "0":
				t.Errorf("tags %q: actors/core depends on cgo package %s", tags, path)
			}
		}
	}
}
