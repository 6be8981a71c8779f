package node

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/internal/pidwatch/pidwatchtest"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

func TestUCXSharedMemory(t *testing.T) {
	for tls, want := range map[string]bool{
		"": true, "all": true, "sm": true, "posix,cma": true, "tcp,sysv": true, "^tcp": true,
		"tcp": false, "rc,ud": false, "^sm": false, "^shm,tcp": false,
	} {
		if got := ucxSharedMemory(tls); got != want {
			t.Errorf("UCX_TLS=%q: shared memory %v, want %v", tls, got, want)
		}
	}
}

// Issue 17: a peer's Hello gets a pidfd only when it names a process of
// this host and pid namespace whose start time matches, on a backend
// whose exit is proof, once per incarnation; otherwise no proof of death
// will come from its process.
func TestWatchExitTrustsOnlyThisHostsProcess(t *testing.T) {
	self, err := pidwatch.Self()
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	n := &Node{backend: "shm", pids: pidwatch.New(), watched: map[messages.PeerID]*watch{}, log: zerolog.Nop()}
	defer n.closePids()
	noEngine := func() exitSink { return nil }
	inc := uint64(0)
	hello := func(p messages.ProcessID, backend string) *messages.Hello {
		inc++
		return &messages.Hello{From: messages.PeerID{Instance: "ctx", Rank: 0}, Backend: backend, Incarnation: inc, Process: p}
	}
	other := self
	other.Host = "00000000-0000-0000-0000-000000000000/pid:[1]"
	reused := self
	reused.StartTime++
	for name, h := range map[string]*messages.Hello{
		"another host":       hello(other, "shm"),
		"another start time": hello(reused, "shm"),
		"no process":         hello(messages.ProcessID{}, "shm"),
		"no incarnation":     {From: messages.PeerID{Instance: "ctx", Rank: 1}, Backend: "shm", Process: self},
	} {
		n.watchExit(h, noEngine)
		if w := n.pids.Watching(); w != 0 {
			t.Fatalf("%s: %d pidfds open, want none", name, w)
		}
	}
	h := hello(self, "shm")
	n.watchExit(h, noEngine)
	n.watchExit(h, noEngine) // the same incarnation again
	if w := n.pids.Watching(); w != 1 {
		t.Fatalf("this host's process: %d pidfds open, want 1", w)
	}
	// A peer of another backend: its exit says it is down, and proves
	// nothing (no pool file here either: not a tie-checked watch).
	other2 := messages.PeerID{Instance: "ctx", Rank: 2}
	n.watchExit(&messages.Hello{From: other2, Backend: "ucx", Incarnation: 1, Process: self}, noEngine)
	if w := n.pids.Watching(); w != 2 {
		t.Fatalf("another backend: %d pidfds open, want 2", w)
	}
	if w := n.watched[other2]; w.proves || !w.done || n.untied.Load() != 0 {
		t.Fatalf("another backend: proves %v, done %v, %d untied; want a watch for liveness only", w.proves, w.done, n.untied.Load())
	}
}

// sink is an exitSink that records what the node told it.
type sink struct {
	mu       sync.Mutex
	exited   []messages.PeerID  // WriterProven calls
	kinds    []kvxfer.ProofKind // their kinds
	asked    []messages.PeerID  // WriterRequests calls
	downs    []string           // PeerIncarnationDown calls: "peer inc why"
	requests int                // what both answer
}

func (s *sink) WriterProven(peer messages.PeerID, inc uint64, kind kvxfer.ProofKind, how string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exited = append(s.exited, peer)
	s.kinds = append(s.kinds, kind)
	return s.requests, nil
}

func (s *sink) WriterRequests(peer messages.PeerID, inc uint64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, peer)
	return s.requests, nil
}

func (s *sink) PeerIncarnationDown(peer messages.PeerID, inc uint64, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.downs = append(s.downs, fmt.Sprintf("%s %d %s", peer, inc, why))
}

// calls is how many exits the node reported, proven or not.
func (s *sink) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.exited) + len(s.asked)
}

// Issue 17: a process's exit is proof for a peer's writes only when that
// process was seen mapping this node's pool. A Hello that names a
// process of this host that does not map the pool (a lie, or a mistake)
// gets a pidfd, but when that process exits the engine hears no
// WriterProven: the peer's pages stay quarantined. A Hello that names the
// process that maps the pool gets WriterProven (ProofPidfdExit) when it
// exits.
func TestExitIsProofOnlyForAProcessMappingThePool(t *testing.T) {
	n, path := newShmNode(t)
	s := &sink{}
	eng := func() exitSink { return s }
	mapper, mp := pidwatchtest.Mapper(t, path)
	liar, lp := pidwatchtest.Idle(t)
	honest := messages.PeerID{Instance: "ctx", Rank: 0}
	lying := messages.PeerID{Instance: "ctx", Rank: 1}
	n.watchExit(&messages.Hello{From: honest, Backend: "shm", Incarnation: 1, Process: mp}, eng)
	n.watchExit(&messages.Hello{From: lying, Backend: "shm", Incarnation: 1, Process: lp}, eng)
	if w := n.pids.Watching(); w != 2 {
		t.Fatalf("%d pidfds open, want 2", w)
	}
	// Each peer says it wrote (a Result of SUCCESS with bytes), as often
	// as the node checks.
	for i := 0; i < maxTieMisses; i++ {
		for _, p := range []messages.PeerID{honest, lying} {
			n.onFrame(&messages.Result{RequestID: fmt.Sprint("r", i), From: p, Status: messages.StatusSuccess, Bytes: 4096})
		}
	}
	if !n.watched[honest].tied.Load() || n.watched[lying].tied.Load() {
		t.Fatalf("tied: the mapping process %v, the other %v; want true, false", n.watched[honest].tied.Load(), n.watched[lying].tied.Load())
	}
	if u := n.untied.Load(); u != 0 {
		t.Fatalf("%d watches still checked after %d Results", u, maxTieMisses)
	}
	for _, c := range []interface{ Kill() error }{liar.Process, mapper.Process} {
		if err := c.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	awaitCalls(t, s, 2)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.exited) != 1 || s.exited[0] != honest || s.kinds[0] != kvxfer.ProofPidfdExit {
		t.Fatalf("WriterProven for %v (%v), want only %v (the process that maps the pool), a pidfd exit", s.exited, s.kinds, honest)
	}
	if len(s.asked) != 1 || s.asked[0] != lying {
		t.Fatalf("requests asked for %v, want %v (the exit that proves nothing)", s.asked, lying)
	}
}

// newShmNode returns a node whose pool is a shm region file (its path
// second) with its pidfd watches on.
func newShmNode(t *testing.T) (*Node, string) {
	t.Helper()
	if _, err := pidwatch.Self(); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	name := fmt.Sprintf("kvxfer-exit-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	region, closer, err := shm.NewRegion(name, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	n := &Node{backend: "shm", watched: map[messages.PeerID]*watch{}, log: zerolog.Nop()}
	n.watchPools(region)
	if n.pids == nil {
		t.Fatal("no pidfd watches over a shm region file")
	}
	t.Cleanup(n.closePids)
	return n, filepath.Join(shm.Dir(), name)
}

// awaitCalls polls until s heard of want exits.
func awaitCalls(t *testing.T, s *sink, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for s.calls() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d exits reported within a minute", s.calls(), want)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}

// Two peers whose Hellos name the same process (one of them lies, or
// both): the process maps the pool, but which peer it is cannot be told,
// so its exit is proof for neither.
func TestExitOfAProcessTwoPeersNameIsNoProof(t *testing.T) {
	n, path := newShmNode(t)
	s := &sink{}
	eng := func() exitSink { return s }
	mapper, mp := pidwatchtest.Mapper(t, path)
	a, b := messages.PeerID{Instance: "ctx", Rank: 0}, messages.PeerID{Instance: "ctx", Rank: 1}
	for _, p := range []messages.PeerID{a, b} {
		n.watchExit(&messages.Hello{From: p, Backend: "shm", Incarnation: 1, Process: mp}, eng)
		n.onFrame(&messages.Result{RequestID: "r", From: p, Status: messages.StatusSuccess, Bytes: 4096})
	}
	if !n.watched[a].tied.Load() || !n.watched[b].disputed.Load() || !n.watched[a].disputed.Load() {
		t.Fatalf("a tied %v, disputed %v/%v; want tied and both disputed", n.watched[a].tied.Load(), n.watched[a].disputed.Load(), n.watched[b].disputed.Load())
	}
	if err := mapper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	awaitCalls(t, s, 2)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.exited) != 0 {
		t.Fatalf("WriterProven for %v; want none (a process two peers name)", s.exited)
	}
}

// logLines runs fn with the node logging JSON into a buffer and returns
// the lines' level and message.
func logLines(t *testing.T, n *Node, fn func()) []map[string]any {
	t.Helper()
	var buf bytes.Buffer
	n.log = zerolog.New(&buf)
	fn()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		m := map[string]any{}
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// A peer that exits at the end of a normal run, with no request live or
// quarantined here, is logged at info; one whose exit fails requests (or,
// not tied to the pool, leaves them quarantined) at warn, with how many.
func TestExitLogLevel(t *testing.T) {
	peer := messages.PeerID{Instance: "ctx", Rank: 0}
	for _, c := range []struct {
		proves, tied bool
		requests     int
		level        string
		says         string
	}{
		{true, true, 0, "info", "no request of it was live"},
		{true, true, 3, "warn", "its 3 requests here fail"},
		{true, false, 0, "info", "no request of it is live"},
		{true, false, 2, "warn", "its 2 requests here keep their pages quarantined"},
		// Watched for liveness only: down, whether or not requests wait.
		{false, false, 0, "info", "exited: it is down, its requests here fail"},
		{false, false, 2, "warn", "it is down, its requests here fail; its exit is no proof that its writes are over: its 2 requests here keep their pages quarantined"},
	} {
		n := &Node{log: zerolog.Nop()}
		w := &watch{peer: peer, inc: 1, pid: 42, proves: c.proves}
		w.tied.Store(c.tied)
		s := &sink{requests: c.requests}
		lines := logLines(t, n, func() { n.writerExited(w, func() exitSink { return s }) })
		if len(lines) != 1 {
			t.Fatalf("tied %v, %d requests: %d log lines %v, want 1", c.tied, c.requests, len(lines), lines)
		}
		msg, _ := lines[0]["message"].(string)
		if lines[0]["level"] != c.level || !strings.Contains(msg, c.says) || lines[0]["requests"] != float64(c.requests) {
			t.Errorf("tied %v, %d requests: logged %v, want level %s saying %q", c.tied, c.requests, lines[0], c.level, c.says)
		}
	}
}

// Issue 17, UCX: UCX 1.13 (the version this package is built against)
// has no ucp_ep_query field for the transports an endpoint uses (its
// ucp_ep_attr_t holds a name and socket addresses only), so whether a
// ucx writer's exit may be proof is read from UCX_TLS: shm always; ucx
// while UCX_TLS leaves it a shared-memory or cma transport (which UCX
// picks within one host); never over tcp or RDMA alone; never loopback.
// The pool tie (TestExitIsProofOnlyForAProcessMappingThePool) applies on
// top. This pins the rule until a UCX with per-endpoint transports lets
// the node ask the endpoint.
func TestExitProvesByBackendAndUCXTLS(t *testing.T) {
	for _, c := range []struct {
		backend, tls string
		want         bool
	}{
		{"shm", "", true}, {"shm", "tcp", true},
		{"loopback", "", false}, {"cudaipc", "", false},
		{"ucx", "", true}, {"ucx", "sm", true}, {"ucx", "tcp,cma", true}, {"ucx", "^tcp", true},
		{"ucx", "tcp", false}, {"ucx", "rc,dc", false}, {"ucx", "^sm", false}, {"ucx", "^tcp,shm", false},
	} {
		t.Setenv("UCX_TLS", c.tls)
		if got := exitProves(c.backend); got != c.want {
			t.Errorf("backend %s, UCX_TLS=%q: exit proves %v, want %v", c.backend, c.tls, got, c.want)
		}
	}
}

// reclaimAgent is an agent that counts ReclaimDead calls.
type reclaimAgent struct {
	rdma.Agent
	calls atomic.Int32
}

func (a *reclaimAgent) ReclaimDead() int { a.calls.Add(1); return 0 }

// A writer process's exit makes the node's agent reclaim the writer slots
// of dead writers in its pool file (shm.Agent.ReclaimDead): without it a
// long-lived pool's slot table filled with writers killed over its life,
// and a later writer's death kept the pool busy (found by review; the
// shm side is TestSlotTableDoesNotFillWithDeadWriters).
func TestWriterExitReclaimsDeadWritersSlots(t *testing.T) {
	n, path := newShmNode(t)
	a := &reclaimAgent{}
	n.agent = a
	s := &sink{}
	mapper, mp := pidwatchtest.Mapper(t, path)
	n.watchExit(&messages.Hello{From: messages.PeerID{Instance: "ctx"}, Backend: "shm", Incarnation: 1, Process: mp}, func() exitSink { return s })
	if err := mapper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	awaitCalls(t, s, 1)
	if c := a.calls.Load(); c != 1 {
		t.Fatalf("ReclaimDead called %d times on the writer's exit, want 1", c)
	}
}

// exitAgent is an agent that records the exit proofs handed to it
// (rdma.ExitProofTaker).
type exitAgent struct {
	rdma.Agent
	mu     sync.Mutex
	proofs []string // "addr identity how"
}

func (a *exitAgent) PeerExited(addr []byte, identity, how string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.proofs = append(a.proofs, fmt.Sprintf("%s %s %s", addr, identity, how))
	return nil
}

// A ucx agent keeps its memory mapped while its link to a peer failed
// without proof (an endpoint error is none, docs/membership.md §4): the
// node's proof of a writer's exit must reach it, for the agent address
// and identity the writer's Hello named — and only a proof: the exit of
// a process never seen mapping the pool reaches the agent no more than
// the engine. Before the wiring no proof reached the agent, and a node
// whose ucx agent's link to a killed writer failed on an endpoint error
// could not close (rdma.ErrCloseUnproven).
func TestExitProofReachesTheAgent(t *testing.T) {
	n, path := newShmNode(t)
	a := &exitAgent{}
	n.agent = a
	s := &sink{}
	eng := func() exitSink { return s }
	mapper, mp := pidwatchtest.Mapper(t, path)
	liar, lp := pidwatchtest.Idle(t)
	honest := messages.PeerID{Instance: "ctx", Rank: 0}
	lying := messages.PeerID{Instance: "ctx", Rank: 1}
	n.watchExit(&messages.Hello{From: honest, Backend: "shm", Incarnation: 1, Process: mp, AgentAddr: []byte("agent-0")}, eng)
	n.watchExit(&messages.Hello{From: lying, Backend: "shm", Incarnation: 1, Process: lp, AgentAddr: []byte("agent-1")}, eng)
	for i := 0; i < maxTieMisses; i++ {
		for _, p := range []messages.PeerID{honest, lying} {
			n.onFrame(&messages.Result{RequestID: fmt.Sprint("r", i), From: p, Status: messages.StatusSuccess, Bytes: 4096})
		}
	}
	for _, c := range []interface{ Kill() error }{liar.Process, mapper.Process} {
		if err := c.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	awaitCalls(t, s, 2) // the agent hears first
	a.mu.Lock()
	defer a.mu.Unlock()
	if want := "agent-0 ctx/0 " + exitHow; len(a.proofs) != 1 || a.proofs[0] != want {
		t.Fatalf("the agent got the exit proofs %q, want only %q (the process that maps the pool)", a.proofs, want)
	}
}

// closedSink is an engine that closed: every query says ErrClosed.
type closedSink struct{}

func (closedSink) WriterProven(peer messages.PeerID, inc uint64, _ kvxfer.ProofKind, how string) (int, error) {
	return 0, fmt.Errorf("kvxfer: WriterProven(%s, incarnation %d): %w", peer, inc, kvxfer.ErrClosed)
}

func (closedSink) WriterRequests(peer messages.PeerID, inc uint64) (int, error) {
	return 0, fmt.Errorf("kvxfer: WriterRequests(%s, incarnation %d): %w", peer, inc, kvxfer.ErrClosed)
}

func (closedSink) PeerIncarnationDown(messages.PeerID, uint64, string) {}

// A proof (a pidfd exit, a drained goodbye) that reaches this node's
// engine as it closes (its Close began before the node set engDone) is
// logged at debug, not as a warning that the engine did not answer: the
// clean end of every two-process run warned. (Checked to fail without the
// ErrClosed case: the lines came at warn.)
func TestProofDuringEngineCloseIsNoWarning(t *testing.T) {
	peer := messages.PeerID{Instance: "ctx", Rank: 0}
	closed := func() exitSink { return closedSink{} }
	for name, fn := range map[string]func(n *Node){
		"pidfd exit": func(n *Node) {
			w := &watch{peer: peer, inc: 1, pid: 42}
			w.tied.Store(true)
			n.writerExited(w, closed)
		},
		"drained goodbye": func(n *Node) { n.writerDrained(peer, 1, closed) },
	} {
		n := &Node{log: zerolog.Nop()}
		lines := logLines(t, n, func() { fn(n) })
		if len(lines) != 1 {
			t.Fatalf("%s: %d log lines %v, want 1", name, len(lines), lines)
		}
		msg, _ := lines[0]["message"].(string)
		if lines[0]["level"] != "debug" || !strings.Contains(msg, "as this node's engine closes") {
			t.Errorf("%s: logged %v, want one debug line saying the engine closes", name, lines[0])
		}
	}
}

// drainAgent is an agent that records the drained goodbyes handed to it
// (ucx.Agent.PeerDrained).
type drainAgent struct {
	rdma.Agent
	proofs []string // "addr identity how"
}

func (a *drainAgent) PeerDrained(addr []byte, identity, how string) error {
	a.proofs = append(a.proofs, fmt.Sprintf("%s %s %s", addr, identity, how))
	return nil
}

// A drained goodbye is proof that the peer's writes are over for the ucx
// agent as for the engine: the node hands it to its agent for the agent
// address the Hello of that very incarnation named (a later
// incarnation's agent is another one, and an earlier Hello does not
// replace a later one's), whether or not the engine still runs, and the
// engine gets it as a ProofDrainedGoodbye. Before the wiring the agent
// got nothing, and kept what a failed link to the drained peer left
// unproven.
func TestDrainedGoodbyeReachesTheAgent(t *testing.T) {
	a := &drainAgent{}
	n := &Node{agent: a, agents: map[messages.PeerID]helloAgent{}, log: zerolog.Nop()}
	s := &sink{}
	eng := func() exitSink { return s }
	peer := messages.PeerID{Instance: "ctx", Rank: 0}
	hello := func(inc uint64, addr string) *messages.Hello {
		return &messages.Hello{From: peer, Incarnation: inc, AgentAddr: []byte(addr)}
	}
	n.noteAgent(hello(1, "agent-1"))
	n.noteAgent(hello(3, "agent-3"))
	n.noteAgent(hello(2, "agent-2")) // late: no news
	n.writerDrained(peer, 1, eng)    // superseded: its agent address is not known any more
	n.writerDrained(peer, 3, eng)
	n.writerDrained(peer, 3, func() exitSink { return nil }) // the engine gone: the agent still hears
	want := "agent-3 ctx/0 " + drainedHow
	if len(a.proofs) != 2 || a.proofs[0] != want || a.proofs[1] != want {
		t.Fatalf("the agent got the drained goodbyes %q, want %q twice", a.proofs, want)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.kinds) != 2 || s.kinds[0] != kvxfer.ProofDrainedGoodbye || s.kinds[1] != kvxfer.ProofDrainedGoodbye {
		t.Fatalf("the engine got proofs of kinds %v, want two drained goodbyes", s.kinds)
	}
}

// A peer's process that exits is down at once, whatever the backend and
// whether or not its exit proves anything (here no pool file: never a
// proof): the engine hears PeerIncarnationDown for that incarnation,
// naming the exit, and the application OnPeerDown — not after missed
// heartbeats. A restarted peer (a newer incarnation said Hello) is not
// taken down by its predecessor's exit: the Down names the old
// incarnation alone, and OnPeerDown is not called.
func TestPeerExitIsDownForItsIncarnation(t *testing.T) {
	if _, err := pidwatch.Self(); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	var mu sync.Mutex
	var told []string
	n := &Node{backend: "shm", pids: pidwatch.New(), watched: map[messages.PeerID]*watch{}, log: zerolog.Nop()}
	n.cfg.OnPeerDown = func(instance string, rank int) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, fmt.Sprintf("%s/%d", instance, rank))
	}
	t.Cleanup(n.closePids)
	s := &sink{}
	eng := func() exitSink { return s }
	// seen is what the node told, once it told want Downs and wantTold
	// OnPeerDowns (polled, with a deadline).
	seen := func(want, wantTold int) (downs, onDown []string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			s.mu.Lock()
			downs = slices.Clone(s.downs)
			s.mu.Unlock()
			mu.Lock()
			onDown = slices.Clone(told)
			mu.Unlock()
			if len(downs) >= want && len(onDown) >= wantTold {
				return downs, onDown
			}
			if time.Now().After(deadline) {
				t.Fatalf("within a minute: Downs %q, OnPeerDown %v; want %d and %d", downs, onDown, want, wantTold)
			}
			time.Sleep(time.Millisecond) // poll with a deadline
		}
	}
	gen := messages.PeerID{Instance: "gen", Rank: 0}
	first, fp := pidwatchtest.Idle(t)
	second, sp := pidwatchtest.Idle(t)
	n.watchExit(&messages.Hello{From: gen, Backend: "cudaipc", Incarnation: 7, Process: fp}, eng)
	n.watchExit(&messages.Hello{From: gen, Backend: "cudaipc", Incarnation: 8, Process: sp}, eng)
	if w := n.pids.Watching(); w != 2 {
		t.Fatalf("%d pidfds open, want 2 (one per incarnation)", w)
	}
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	downs, _ := seen(1, 0)
	if len(downs) != 1 || !strings.HasPrefix(downs[0], gen.String()+" 7 exited") {
		t.Fatalf("the old incarnation's exit: Downs %q; want one, of incarnation 7, naming the exit", downs)
	}
	if err := second.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	downs, _ = seen(2, 1)
	want := fmt.Sprintf("%s 8 exited (its process %d is gone: pidfd)", gen, sp.Pid)
	if len(downs) != 2 || downs[1] != want {
		t.Fatalf("the current incarnation's exit: Downs %q; want the second %q", downs, want)
	}
	// Told once, for the current incarnation's exit: the old one's came
	// first and told nothing. Close waits for the watches' callbacks.
	n.closePids()
	mu.Lock()
	onDown := slices.Clone(told)
	mu.Unlock()
	if len(onDown) != 1 || onDown[0] != "gen/0" {
		t.Fatalf("OnPeerDown %v; want gen/0 once (the restart's exit only)", onDown)
	}
	if c := s.calls(); c != 2 {
		t.Fatalf("%d exits reported, want 2", c)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.exited) != 0 {
		t.Fatalf("WriterProven for %v; want none (no pool file: no proof)", s.exited)
	}
}

// A rolling restart: a peer's new incarnation said Hello while the
// process of its earlier one lives on, mapping the pool (its writes may
// still land). That watch stays, and its exit is proof for the earlier
// incarnation: its Hello still names the process. Another peer whose
// Hello names that process too disputes it, as it would the current
// incarnation's, and the exit is proof for neither. (Checked to fail
// before: only the peers' latest watches were compared, so the other
// peer was tied to the process and its exit was WriterProven for both,
// freeing the other peer's pages while its own process may still write.)
func TestExitOfAProcessAnEarlierIncarnationNamesIsNoProofForAnother(t *testing.T) {
	n, path := newShmNode(t)
	s := &sink{}
	eng := func() exitSink { return s }
	lingering, lp := pidwatchtest.Mapper(t, path)
	_, np := pidwatchtest.Idle(t)
	a, b := messages.PeerID{Instance: "ctx", Rank: 0}, messages.PeerID{Instance: "ctx", Rank: 1}
	n.watchExit(&messages.Hello{From: a, Backend: "shm", Incarnation: 1, Process: lp}, eng)
	earlier := n.watched[a]
	n.watchExit(&messages.Hello{From: a, Backend: "shm", Incarnation: 2, Process: np}, eng)
	n.watchExit(&messages.Hello{From: b, Backend: "shm", Incarnation: 1, Process: lp}, eng)
	n.mu.Lock()
	other := n.watched[b]
	n.mu.Unlock()
	if !earlier.tied.Load() || !other.tied.Load() {
		t.Fatalf("tied: %s's earlier incarnation %v, %s %v; want both (the process maps the pool)", a, earlier.tied.Load(), b, other.tied.Load())
	}
	if !other.disputed.Load() || !earlier.disputed.Load() {
		t.Errorf("disputed: %s %v, %s's earlier incarnation %v; want both (they name one process)", b, other.disputed.Load(), a, earlier.disputed.Load())
	}
	if err := lingering.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	awaitCalls(t, s, 2)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.exited) != 0 {
		t.Fatalf("WriterProven for %v; want none (a process two peers name)", s.exited)
	}
}

// A departed peer's watch is forgotten with its departure (past
// maxDepartedPeers), as its agent address is, once no exit can come of
// it: a peer of another host (no pidfd), or one whose process exited.
// Before, nothing removed a watch: a long-lived node whose peers come
// and go under new names (an instance per pod) kept one per peer name
// ever seen (checked to fail: all four stayed). A watch whose process
// lives, the current one's or an earlier incarnation's, stays: its exit
// may still be proof, and its process still disputed.
func TestDepartedPeersWatchesAreBounded(t *testing.T) {
	self, err := pidwatch.Self()
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	old := maxDepartedPeers
	maxDepartedPeers = 2
	t.Cleanup(func() { maxDepartedPeers = old })
	n := &Node{backend: "shm", pids: pidwatch.New(), watched: map[messages.PeerID]*watch{}, log: zerolog.Nop(),
		pastIncs: map[messages.PeerID][]uint64{}, departed: map[messages.PeerID]departure{},
		found: map[messages.PeerID]*found{}, agents: map[messages.PeerID]helloAgent{}}
	t.Cleanup(n.closePids)
	s := &sink{}
	eng := func() exitSink { return s }
	elsewhere := self
	elsewhere.Host = "00000000-0000-0000-0000-000000000000/pid:[1]"
	id := func(r int32) messages.PeerID { return messages.PeerID{Instance: "ctx", Rank: r} }
	hello := func(r int32, inc uint64, p messages.ProcessID) {
		n.watchExit(&messages.Hello{From: id(r), Backend: "shm", Incarnation: inc, Process: p}, eng)
	}
	_, live := pidwatchtest.Idle(t)
	lingerer, lingering := pidwatchtest.Idle(t)
	exiting, ep := pidwatchtest.Idle(t)
	hello(0, 1, elsewhere) // another host: no pidfd
	hello(1, 1, live)
	hello(2, 1, lingering)
	hello(2, 2, elsewhere) // its earlier incarnation's process lives on
	hello(3, 1, ep)
	if err := exiting.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	awaitCalls(t, s, 1)
	n.mu.Lock()
	for r := int32(0); r < 6; r++ {
		n.notePastLocked(id(r), 1)
	}
	var kept []string
	for p := range n.watched {
		kept = append(kept, p.String())
	}
	n.mu.Unlock()
	slices.Sort(kept)
	want := []string{id(1).String(), id(2).String()}
	if !slices.Equal(kept, want) {
		t.Fatalf("watches kept %v after ctx/0 to ctx/3's departures were forgotten; want %v (those whose process lives)", kept, want)
	}
	// The process ctx/2's earlier incarnation names exits: no exit of
	// ctx/2's processes can come any more, and its watch goes. (Checked
	// to fail: a watch kept at the forgetting stayed for good.)
	if err := lingerer.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	awaitCalls(t, s, 2)
	n.mu.Lock()
	_, still := n.watched[id(2)]
	_, live1 := n.watched[id(1)]
	n.mu.Unlock()
	if still || !live1 {
		t.Fatalf("after ctx/2's last process exited: its watch kept %v, ctx/1's (alive) kept %v; want false, true", still, live1)
	}
}
