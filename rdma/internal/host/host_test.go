package host

import (
	"os"
	"os/exec"
	"testing"
)

func TestDirIsADirectory(t *testing.T) {
	fi, err := os.Stat(Dir())
	if err != nil || !fi.IsDir() {
		t.Fatalf("Dir() = %q: %v, %v", Dir(), fi, err)
	}
	if first, again := Dir(), Dir(); first != again {
		t.Fatalf("Dir changed between calls: %q, then %q", first, again)
	}
}

func TestProcessGone(t *testing.T) {
	if ProcessGone(os.Getpid()) {
		t.Fatal("this process is reported gone")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if !ProcessGone(cmd.Process.Pid) {
		t.Errorf("reaped process %d is not reported gone", cmd.Process.Pid)
	}
}
