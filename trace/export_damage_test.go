package trace_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/trace"
)

// The exporter refuses what Replay refuses, naming the line: a record of
// an unknown kind is damage (it was taken as nothing, and when it had been
// a birth its session's records were counted as begun before the file,
// export exiting 0), and an unreadable op digest names its record's line
// as every other malformed record does. (Found in a review; checked to
// fail without the default case and the line.)
func TestExportRefusesDamageNamingTheLine(t *testing.T) {
	b, err := os.ReadFile("testdata/v2-ctx.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	const birth = 14 // testdata/v2-ctx.jsonl's first birth record
	if !strings.HasPrefix(lines[birth-1], `{"kind":"birth"`) {
		t.Fatalf("line %d of the test trace is not a birth: %.40s", birth, lines[birth-1])
	}
	lines[birth-1] = strings.Replace(lines[birth-1], `"kind":"birth"`, `"kind":"bogus"`, 1)
	damaged := strings.Join(lines, "")
	if _, err := trace.Replay(strings.NewReader(damaged)); !errors.Is(err, trace.ErrFormat) || !strings.Contains(err.Error(), "line 14") {
		t.Fatalf("replay of an unknown kind: %v, want ErrFormat naming line 14", err)
	}
	if err := export(t, damaged); !errors.Is(err, trace.ErrFormat) || !strings.Contains(err.Error(), `line 14: unknown record kind "bogus"`) {
		t.Fatalf("export of an unknown kind: %v, want ErrFormat naming line 14 and the kind", err)
	}

	const ops = `{"kind":"trace","version":2,"t":1}` + "\n" +
		`{"kind":"birth","actor":"c/0/1","engine":"c/0","side":"tx","request":"r","t":1,"type":"TxConfig","msg":{},"post":{"state":"INIT"}}` + "\n" +
		`{"kind":"step","actor":"c/0/1","seq":1,"t":2,"type":"TxStart","msg":{},"post":{"state":"INIT","ops":"x:GGGG"}}` + "\n"
	if err := export(t, ops); err == nil || !strings.Contains(err.Error(), "line 3: ") {
		t.Fatalf("export of an unreadable op digest: %v, want an error naming line 3", err)
	}
}
