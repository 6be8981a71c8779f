package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// run executes the CLI with args and returns its stdout and error.
func run(args ...string) (string, error) {
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestBenchRawJSON(t *testing.T) {
	for _, backend := range []string{"loopback", "shm"} {
		out, err := run("bench", "raw", "--backend", backend, "--sizes", "4KiB,64KiB", "--json", "--rounds", "1", "--bytes", "1MiB")
		if err != nil {
			t.Fatalf("%s: %v", backend, err)
		}
		var sizes []uint64
		s := bufio.NewScanner(strings.NewReader(out))
		for s.Scan() {
			var obj map[string]any
			if err := json.Unmarshal(s.Bytes(), &obj); err != nil {
				t.Fatalf("%s: line %q: %v", backend, s.Text(), err)
			}
			for _, k := range []string{"size_bytes", "bytes_per_sec", "copy_bytes_per_sec", "ratio"} {
				if v, ok := obj[k].(float64); !ok || v <= 0 {
					t.Errorf("%s: %s = %v in %s", backend, k, obj[k], s.Text())
				}
			}
			if obj["backend"] != backend {
				t.Errorf("backend = %v, want %s", obj["backend"], backend)
			}
			sizes = append(sizes, uint64(obj["size_bytes"].(float64)))
		}
		if len(sizes) != 2 || sizes[0] != 4096 || sizes[1] != 65536 {
			t.Errorf("%s: sizes %v, want [4096 65536], one object each", backend, sizes)
		}
	}
}

func TestBenchRawTable(t *testing.T) {
	out, err := run("bench", "raw", "--backend", "loopback", "--sizes", "4096", "--rounds", "1", "--bytes", "64KiB")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "LOOPBACK GB/s") || !strings.Contains(lines[1], "4KiB") {
		t.Errorf("table:\n%s", out)
	}
	if len(lines) == 2 && len(lines[0]) != len(lines[1]) {
		t.Errorf("table columns are not aligned:\n%s", out)
	}
}

func TestBenchRawRefuses(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--sizes", "64KiB,12XB"}, `"12XB"`},
		{[]string{"--backend", "carrier-pigeon"}, `"carrier-pigeon"`},
		{[]string{"--bytes", "lots"}, `"lots"`},
		{[]string{"--rounds", "0"}, "--rounds 0"},
		{[]string{"--segments", "0"}, "--segments 0"},
		{[]string{"extra"}, "extra"},
	} {
		_, err := run(append([]string{"bench", "raw"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("bench raw %v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}
