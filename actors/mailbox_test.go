package actors

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// recInvoker records what a mailbox invokes; a user message "boom" panics.
type recInvoker struct {
	mu        sync.Mutex
	got       []string
	escalated []string
}

func (r *recInvoker) add(s string) { r.mu.Lock(); r.got = append(r.got, s); r.mu.Unlock() }

func (r *recInvoker) InvokeSystemMessage(m any) { r.add(fmt.Sprint("sys:", m)) }

func (r *recInvoker) InvokeUserMessage(m any) {
	if m == "boom" {
		panic("boom")
	}
	r.add(fmt.Sprint(m))
}

func (r *recInvoker) EscalateFailure(reason, m any) {
	r.mu.Lock()
	r.escalated = append(r.escalated, fmt.Sprint(reason, "/", m))
	r.mu.Unlock()
}

func (r *recInvoker) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.got
	r.got = nil
	return g
}

// heldDispatcher keeps scheduled runs until the test runs them.
type heldDispatcher struct{ runs []func() }

func (d *heldDispatcher) Schedule(fn func()) { d.runs = append(d.runs, fn) }
func (d *heldDispatcher) Throughput() int    { return 2 }
func (d *heldDispatcher) runAll() {
	for len(d.runs) > 0 {
		fn := d.runs[0]
		d.runs = d.runs[1:]
		fn()
	}
}

// TestMailboxSemantics: the engine's mailbox does what protoactor's default
// does: one schedule while running, system messages first, suspension
// holds user messages (not system ones) until resumed, and a panic is
// escalated with its message while the messages after it still run.
func TestMailboxSemantics(t *testing.T) {
	inv, d := &recInvoker{}, &heldDispatcher{}
	m := newMailbox()
	m.RegisterHandlers(inv, d)
	m.Start()

	m.PostUserMessage("a")
	m.PostUserMessage("b")
	m.PostSystemMessage("s1")
	if len(d.runs) != 1 || m.UserMessageCount() != 2 {
		t.Fatalf("3 posts to an idle mailbox: %d runs scheduled, %d user messages; want 1, 2", len(d.runs), m.UserMessageCount())
	}
	d.runAll()
	if got, want := inv.take(), []string{"sys:s1", "a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if m.UserMessageCount() != 0 {
		t.Fatalf("%d user messages left", m.UserMessageCount())
	}

	m.PostSystemMessage(&actor.SuspendMailbox{})
	m.PostUserMessage("c")
	d.runAll()
	if got := inv.take(); len(got) != 0 {
		t.Fatalf("suspended: invoked %q", got)
	}
	m.PostSystemMessage("s2")
	d.runAll()
	if got, want := inv.take(), []string{"sys:s2"}; !slices.Equal(got, want) {
		t.Fatalf("suspended: got %q, want %q (system messages pass)", got, want)
	}
	m.PostSystemMessage(&actor.ResumeMailbox{})
	d.runAll()
	if got, want := inv.take(), []string{"c"}; !slices.Equal(got, want) {
		t.Fatalf("resumed: got %q, want %q", got, want)
	}

	m.PostUserMessage("boom")
	m.PostUserMessage("d")
	d.runAll()
	if got, want := inv.take(), []string{"d"}; !slices.Equal(got, want) {
		t.Fatalf("after a panic: got %q, want %q", got, want)
	}
	if want := []string{"boom/boom"}; !slices.Equal(inv.escalated, want) {
		t.Fatalf("escalated %q, want %q", inv.escalated, want)
	}
}

// goDispatcher runs each scheduled run on a goroutine of its own.
type goDispatcher struct{}

func (goDispatcher) Schedule(fn func()) { go fn() }
func (goDispatcher) Throughput() int    { return 300 }

// TestMailboxConcurrentPosters: posts from many goroutines while the
// mailbox runs are all invoked exactly once, each poster's in its order
// (no wake-up lost between a run's end and a post).
func TestMailboxConcurrentPosters(t *testing.T) {
	t.Run("goroutine each run", func(t *testing.T) { concurrentPosters(t, goDispatcher{}) })
	// The engine's pool takes the mailbox itself (no bound run function).
	t.Run("engine pool", func(t *testing.T) {
		d := newPoolDispatcher(300, 4)
		defer d.close()
		concurrentPosters(t, d)
	})
}

func concurrentPosters(t *testing.T, d actor.Dispatcher) {
	const posters, each = 8, 5000
	type msg struct{ from, n int }
	var (
		mu   sync.Mutex
		next [posters]int
		bad  []string
		seen int
	)
	inv := &funcInvoker{user: func(m any) {
		x := m.(msg)
		mu.Lock()
		defer mu.Unlock()
		if next[x.from] != x.n {
			bad = append(bad, fmt.Sprintf("poster %d: got %d, want %d", x.from, x.n, next[x.from]))
		}
		next[x.from] = x.n + 1
		seen++
	}}
	m := newMailbox()
	m.RegisterHandlers(inv, d)
	var wg sync.WaitGroup
	for p := range posters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range each {
				m.PostUserMessage(msg{p, n})
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		s, b := seen, bad
		mu.Unlock()
		if len(b) > 0 {
			t.Fatalf("out of order: %q", b[:min(len(b), 5)])
		}
		if s == posters*each {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages invoked after a minute: a wake-up was lost", s, posters*each)
		}
		time.Sleep(time.Millisecond)
	}
	if n := m.UserMessageCount(); n != 0 {
		t.Fatalf("%d user messages counted after all were invoked", n)
	}
}

type funcInvoker struct{ user func(any) }

func (f *funcInvoker) InvokeSystemMessage(any)  {}
func (f *funcInvoker) InvokeUserMessage(m any)  { f.user(m) }
func (f *funcInvoker) EscalateFailure(r, _ any) { panic(r) }

// TestFIFOKeepsItsStorageBounded: a drained queue reuses its slice, a
// queue that never drains compacts instead of growing, and a burst past
// fifoKeep drops its storage once drained.
func TestFIFOKeepsItsStorageBounded(t *testing.T) {
	m := newMailbox().(*mailbox)
	q := &m.user
	inl := len(m.userInl)
	for round := range 3 {
		for i := range inl {
			q.push(i)
		}
		for i := range inl {
			if x, ok := q.pop(); !ok || x != i {
				t.Fatalf("round %d: pop %d = %v, %v", round, i, x, ok)
			}
		}
	}
	if cap(q.items) != len(m.userInl) {
		t.Fatalf("%d at a time: cap %d, want the inline %d", inl, cap(q.items), inl)
	}
	// Never empty: 4 live, one in one out, 10k times.
	for i := range 4 {
		q.push(i)
	}
	for i := 4; i < 10_004; i++ {
		q.push(i)
		if x, _ := q.pop(); x != i-4 {
			t.Fatalf("pop = %v, want %d", x, i-4)
		}
	}
	if cap(q.items) > 64 {
		t.Fatalf("a queue of ≤ 5 grew to cap %d", cap(q.items))
	}
	for q.head < len(q.items) {
		q.pop()
	}
	for i := range 5000 {
		q.push(i)
	}
	for i := range 5000 {
		if x, _ := q.pop(); x != i {
			t.Fatalf("burst: pop = %v, want %d", x, i)
		}
	}
	if cap(q.items) != 0 {
		t.Fatalf("after a burst of 5000: cap %d kept, want the storage dropped", cap(q.items))
	}
	if _, ok := q.pop(); ok {
		t.Fatal("pop from an empty queue")
	}
}

// BenchmarkMailbox: one user message posted to an idle mailbox and run (a
// synchronized dispatcher runs it on the poster's goroutine), the engine's
// mailbox beside protoactor's default (actor.Unbounded) in the same run:
// what each message hop of the engine costs in its mailbox.
func BenchmarkMailbox(b *testing.B) {
	for _, mb := range []struct {
		name string
		make actor.MailboxProducer
	}{{"engine", newMailbox}, {"protoactor-unbounded", actor.Unbounded()}} {
		b.Run(mb.name, func(b *testing.B) {
			n := 0
			m := mb.make()
			m.RegisterHandlers(&funcInvoker{user: func(any) { n++ }}, actor.NewSynchronizedDispatcher(300))
			m.Start()
			msg := any(&struct{ x int }{})
			b.ReportAllocs()
			for b.Loop() {
				m.PostUserMessage(msg)
			}
			if n != b.N {
				b.Fatalf("%d of %d messages invoked", n, b.N)
			}
		})
	}
}

var mailboxSink actor.Mailbox

// TestPoolMailboxAllocatesOnce pins a mailbox on the engine's pool to one
// allocation, itself: the pool takes the mailbox, so no run function is
// bound for it (one more allocation each of a request's session actors).
func TestPoolMailboxAllocatesOnce(t *testing.T) {
	d := newPoolDispatcher(300, 4)
	defer d.close()
	inv := &funcInvoker{user: func(any) {}}
	if n := testing.AllocsPerRun(100, func() {
		m := newMailbox()
		m.RegisterHandlers(inv, d)
		mailboxSink = m
	}); n != 1 {
		t.Fatalf("a mailbox on the engine's pool allocates %v objects, want 1", n)
	}
}
