package scratch

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/messages"
)

// TestSweepRemovesOnlyTheDeadsDirectories: of directories with the prefix,
// only those whose owner file names a process of this host that is gone
// (no such pid; the pid's process started at another time) are removed;
// a live process's, another host's, one without an owner file, one with
// an unreadable owner, another prefix's and a link to a dead one's stay.
func TestSweepRemovesOnlyTheDeadsDirectories(t *testing.T) {
	self, err := pidwatch.Self()
	if err != nil {
		t.Skipf("no process identity here: %v", err)
	}
	ppid := os.Getppid()
	pst, err := pidwatch.StartTime(ppid)
	if err != nil {
		t.Fatal(err)
	}
	parent := messages.ProcessID{Pid: uint32(ppid), StartTime: pst, Host: self.Host}
	root := t.TempDir()
	mk := func(name, owner string) string {
		d := filepath.Join(root, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "ctx.key"), []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(d, OwnerFile), []byte(owner), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	noPid := messages.ProcessID{Pid: 1<<31 - 1, StartTime: 7, Host: self.Host} // past any pid_max
	reused := self
	reused.StartTime++
	other := parent
	other.Host = "another-boot/pid:[1]"
	deadNoPid := mk("kvxfer-demo-1", format(noPid))
	deadReused := mk("kvxfer-demo-2", format(reused))
	keep := []string{
		mk("kvxfer-demo-3", format(parent)),
		mk("kvxfer-demo-4", format(self)),
		mk("kvxfer-demo-5", format(other)),
		mk("kvxfer-demo-6", ""),
		mk("kvxfer-demo-7", "12 not-a-number host"),
		mk("kvxfer-cluster-1", format(noPid)),
	}
	link := filepath.Join(root, "kvxfer-demo-8")
	if err := os.Symlink(mk("elsewhere", format(noPid)), link); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, link, filepath.Join(root, "elsewhere"))

	got := Sweep(root, "kvxfer-demo-", self)
	slices.Sort(got)
	if want := []string{deadNoPid, deadReused}; !slices.Equal(got, want) {
		t.Errorf("swept %q, want %q", got, want)
	}
	for _, d := range []string{deadNoPid, deadReused} {
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", d, err)
		}
	}
	for _, d := range keep {
		if _, err := os.Lstat(d); err != nil {
			t.Errorf("%s was removed (%v)", d, err)
		}
	}
}

// TestDirNamesItsProcess: Dir's directory holds an owner file naming this
// process, which parse reads back, and a sweep leaves it.
func TestDirNamesItsProcess(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	dir, _, err := Dir("kvxfer-test-")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, OwnerFile))
	if err != nil {
		t.Fatal(err)
	}
	self, _ := pidwatch.Self()
	if got, err := parse(string(b)); err != nil || got != self {
		t.Fatalf("owner %q parses to %+v (%v), want %+v", b, got, err, self)
	}
	if swept := Sweep(os.TempDir(), "kvxfer-test-", self); len(swept) != 0 {
		t.Errorf("a live directory swept: %q", swept)
	}
}
