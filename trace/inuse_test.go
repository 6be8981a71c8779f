package trace_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/trace"
)

// holdRole is a child process of TestCreateRefusesAFileAnotherProcessWrites:
// it writes a trace to the file optsEnv names, says "ready", and closes it
// when its standard input ends.
const holdRole = "hold"

func holdTrace(path string) int {
	w, err := trace.Create(path)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hold:", err)
		return 1
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := w.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "hold:", err)
		return 1
	}
	return 0
}

// TestCreateRefusesAFileAnotherProcessWrites: kvxfer ctx --trace F and
// kvxfer gen --trace F (one file given to both processes) both truncated
// and wrote F at once, each run ended well, and F read back as garbage
// ("malformed trace: line 77: invalid character 'o' after top-level
// value"). The second Create is now refused, naming the file, and the
// first process's trace is left whole.
func TestCreateRefusesAFileAnotherProcessWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.trace")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"="+holdRole, optsEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	before, err := os.ReadFile(path)
	if err != nil || len(before) == 0 {
		t.Fatalf("the child's trace: %d bytes, %v", len(before), err)
	}

	w, err := trace.Create(path)
	if err == nil {
		_ = w.Close()
		t.Fatalf("Create of a file another process writes its trace to: no error")
	}
	if !errors.Is(err, trace.ErrInUse) || !strings.Contains(err.Error(), path) {
		t.Errorf("Create: %v, want ErrInUse naming %s", err, path)
	}
	if after, err := os.ReadFile(path); err != nil || string(after) != string(before) {
		t.Errorf("the other process's trace changed under a refused Create: %d bytes before, %d after (%v)", len(before), len(after), err)
	}

	// Once that process closed it, the file is free again.
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	w, err = trace.Create(path)
	if err != nil {
		t.Fatalf("Create of a file no one writes any more: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}
