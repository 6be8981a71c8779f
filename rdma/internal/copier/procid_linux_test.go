package copier

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeProc is a procfs in a temporary directory: the tests' own process
// (pid selfPID) and the others they add. Its namespace files are plain
// files: their inodes and device stand for the namespaces'.
type fakeProc struct {
	t    *testing.T
	root string
	gone map[uint32]bool // what kill(pid, 0) says
}

const selfPID = 4242

func newFakeProc(t *testing.T, nspid string) *fakeProc {
	p := &fakeProc{t: t, root: t.TempDir(), gone: map[uint32]bool{}}
	p.write("self/stat", stat(selfPID, "kvxfer", 'R', 500))
	p.write("self/status", "Name:\tkvxfer\nState:\tR (running)\n"+nspid+"Threads:\t1\n")
	p.write("self/ns/pid", "")
	p.write("self/ns/time", "")
	return p
}

func (p *fakeProc) write(name, content string) {
	p.t.Helper()
	path := filepath.Join(p.root, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// process adds pid with its threads' states (the first is the leader's).
func (p *fakeProc) process(pid uint32, start uint64, states ...byte) {
	p.write(fmt.Sprintf("%d/stat", pid), stat(pid, "ctx) (x", states[0], start))
	for i, s := range states {
		tid := pid + uint32(i)
		p.write(fmt.Sprintf("%d/task/%d/stat", pid, tid), stat(tid, "ctx) (x", s, start))
	}
}

func (p *fakeProc) view() *procView {
	return newProcView(p.root, selfPID, func(pid uint32) bool { return p.gone[pid] })
}

// stat is a /proc/<pid>/stat line whose start time (field 22) is start.
func stat(pid uint32, comm string, state byte, start uint64) string {
	f := []string{fmt.Sprintf("%d (%s) %c", pid, comm, state)}
	for i := 4; i <= 52; i++ {
		v := "0"
		if i == 22 {
			v = strconv.FormatUint(start, 10)
		}
		f = append(f, v)
	}
	return strings.Join(f, " ") + "\n"
}

func TestParseStat(t *testing.T) {
	st, err := parseStat([]byte(stat(77, "a) (b c) Z 1", 'S', 123456789)))
	if err != nil || st != (procStat{pid: 77, state: 'S', start: 123456789}) {
		t.Fatalf("parseStat = %+v, %v", st, err)
	}
	for _, bad := range []string{"", "77 (x)", "(x) S 1", "x (y) S 1 2 3", "77 (x) S " + strings.Repeat("1 ", 18) + "notanumber"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) succeeded", bad)
		}
	}
}

// TestProvenDeadFakeProc: what proves a writer dead, and what does not,
// through a procfs whose every answer the test sets.
func TestProvenDeadFakeProc(t *testing.T) {
	p := newFakeProc(t, "NSpid:\t4242\n")
	v := p.view()
	if v.judgeErr != nil || v.selfErr != nil {
		t.Fatalf("fake procfs refused: %v / %v", v.judgeErr, v.selfErr)
	}
	if v.self.PID != selfPID || v.self.Start != 500 || v.self.PIDNS == 0 || v.self.TimeNS == 0 || v.self.PIDNS == v.self.TimeNS {
		t.Fatalf("self %+v", v.self)
	}
	writer := func(pid uint32, start uint64) ProcessID {
		id := v.self
		id.PID, id.Start = pid, start
		return id
	}

	p.process(100, 9000, 'S')      // running (sleeping)
	p.process(101, 9001, 'T')      // stopped (SIGSTOP): alive
	p.process(102, 9002, 'Z')      // a zombie
	p.process(103, 9003, 'Z', 'S') // a zombie leader whose other thread runs
	p.process(104, 9004, 'Z', 'Z') // every thread a zombie
	p.process(105, 7777, 'S')      // pid 105 reused: the writer had 9005
	p.gone[106] = true             // no process 106
	// 107: /proc shows nothing (hidepid), but kill says it exists.
	p.process(108, 9008, 'D') // uninterruptible sleep: alive
	p.process(109, 9009, 'X') // dead, being released

	for _, c := range []struct {
		name string
		id   ProcessID
		dead bool
	}{
		{"self", v.self, false},
		{"running", writer(100, 9000), false},
		{"stopped", writer(101, 9001), false},
		{"zombie", writer(102, 9002), true},
		{"zombie leader, thread running", writer(103, 9003), false},
		{"zombie leader, threads zombies", writer(104, 9004), true},
		{"pid reused by another start time", writer(105, 9005), true},
		{"the pid's new process", writer(105, 7777), false},
		{"no such pid", writer(106, 9006), true},
		{"hidden but existing", writer(107, 9007), false},
		{"disk sleep", writer(108, 9008), false},
		{"exit dead", writer(109, 9009), true},
		{"no pid", writer(0, 0), false},
	} {
		if got := v.provenDead(c.id); got != c.dead {
			t.Errorf("%s (%+v): provenDead = %v, want %v", c.name, c.id, got, c.dead)
		}
	}

	// Another namespace: its pids and start times are not ours to
	// judge, even where ours say dead.
	for _, c := range []struct {
		name string
		mod  func(*ProcessID)
	}{
		{"another pid namespace", func(id *ProcessID) { id.PIDNS++ }},
		{"another time namespace", func(id *ProcessID) { id.TimeNS++ }},
		{"another namespace device", func(id *ProcessID) { id.NSDev++ }},
	} {
		for _, pid := range []uint32{102, 105, 106} {
			id := writer(pid, 9000+uint64(pid-100))
			c.mod(&id)
			if v.provenDead(id) {
				t.Errorf("%s: pid %d proven dead", c.name, pid)
			}
		}
	}
}

// TestProvenDeadNeedsItsOwnProcfs: a procfs of another pid namespace (its
// NSpid line lists more than this process's own pid), or one that cannot
// say whose it is, proves nothing.
func TestProvenDeadNeedsItsOwnProcfs(t *testing.T) {
	for _, nspid := range []string{"NSpid:\t17\t4242\n", "NSpid:\t17\n", ""} {
		p := newFakeProc(t, nspid)
		v := p.view()
		if v.judgeErr == nil {
			t.Errorf("NSpid %q: procfs taken for this process's own", nspid)
		}
		p.gone[106] = true
		p.process(105, 7777, 'S')
		id := v.self
		for _, pid := range []uint32{105, 106} {
			id.PID, id.Start = pid, 9000
			if v.provenDead(id) {
				t.Errorf("NSpid %q: pid %d proven dead", nspid, pid)
			}
		}
	}
}

// TestProvenDeadRealProcesses: through this host's /proc: this process is
// alive; a child is alive running and stopped, dead as a zombie and once
// reaped; this process's pid with another start time is a dead writer's
// (its pid was reused); the same identity in another pid namespace is not
// judged.
func TestProvenDeadRealProcesses(t *testing.T) {
	self, err := Self()
	if err != nil {
		t.Skipf("no identity here: %v", err)
	}
	if err := procOnce().judgeErr; err != nil {
		t.Skipf("this process cannot prove deaths here: %v", err)
	}
	if ProvenDead(self) {
		t.Fatal("this process is proven dead")
	}
	if self.PID != uint32(os.Getpid()) || self.Start == 0 || self.PIDNS == 0 {
		t.Fatalf("Self() = %+v", self)
	}
	reused := self
	reused.Start++
	if !ProvenDead(reused) {
		t.Error("a writer whose pid another start time holds is not proven dead")
	}
	other := reused
	other.PIDNS++
	if ProvenDead(other) {
		t.Error("a writer of another pid namespace is proven dead")
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestProvenDeadChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KVXFER_COPIER_CHILD=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	defer in.Close()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "READY\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	child := self
	child.PID = uint32(cmd.Process.Pid)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child.PID))
	if err != nil {
		t.Fatal(err)
	}
	st, err := parseStat(b)
	if err != nil {
		t.Fatal(err)
	}
	child.Start = st.start
	if ProvenDead(child) {
		t.Fatal("a running child is proven dead")
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, child.PID, 'T')
	if ProvenDead(child) {
		t.Fatal("a stopped child is proven dead")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped (os/exec reaps in Wait only): a zombie, proven dead once
	// its last thread has exited (the leader turns Z first).
	waitState(t, child.PID, 'Z')
	deadline := time.Now().Add(30 * time.Second)
	for !ProvenDead(child) {
		if time.Now().After(deadline) {
			t.Fatal("a zombie child is not proven dead within 30 s")
		}
		time.Sleep(time.Millisecond)
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child.PID)); err != nil {
		t.Fatalf("the zombie was reaped under the test: %v", err)
	} else if st, _ := parseStat(b); st.state != 'Z' {
		t.Fatalf("the child is no zombie: %s", b)
	}
	cmd.Wait()
	if !ProvenDead(child) {
		t.Fatal("a reaped child is not proven dead")
	}
}

// TestProvenDeadChild is TestProvenDeadRealProcesses's child: it waits for
// its stdin to close.
func TestProvenDeadChild(t *testing.T) {
	if os.Getenv("KVXFER_COPIER_CHILD") == "" {
		t.Skip("runs only as TestProvenDeadRealProcesses's child")
	}
	fmt.Println("READY")
	os.Stdin.Read(make([]byte, 1))
}

// waitState waits until /proc shows pid's leader in state.
func waitState(t *testing.T, pid uint32, state byte) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		if st, err := parseStat(b); err == nil && st.state == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not in state %c within 30 s: %s", pid, state, b)
		}
		time.Sleep(time.Millisecond)
	}
}
