package actors

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// mailbox is the mailbox of every engine actor: protoactor's default
// mailbox (actor.Unbounded) step for step — system messages before user
// messages, SuspendMailbox / ResumeMailbox, a panic escalated to the
// supervisor with the message that raised it, a yield every Throughput
// messages, a run that loops while messages arrived during it — without
// its allocations. The default allocates a closure each time an idle
// mailbox is scheduled (its processMessages method value, ~24 times a
// request), a node per system message, and three queues per mailbox; on
// the control round trip's path that was a fifth of each request's
// allocations (BENCHMARKS.md, "The engine's own mailbox"). Here the
// engine's pool dispatcher takes the mailbox itself (another dispatcher
// gets the run function, bound once per mailbox), and both queues are
// slices that keep their storage (a few slots inline) once drained.
type mailbox struct {
	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
	// pool is the dispatcher when it is the engine's pool, which takes
	// the mailbox itself; process is m.processMessages, bound once (at
	// RegisterHandlers), what any other dispatcher's Schedule gets.
	pool    *poolDispatcher
	process func()

	status    atomic.Int32 // mailboxIdle or mailboxRunning
	userN     atomic.Int32 // messages in user (read without mu)
	sysN      atomic.Int32 // messages in sys (read without mu)
	suspended atomic.Bool

	mu        sync.Mutex
	user, sys fifo
	userInl   [4]any
	sysInl    [2]any
}

const (
	mailboxIdle int32 = iota
	mailboxRunning
)

var _ actor.Mailbox = (*mailbox)(nil)

// newMailbox is an actor.MailboxProducer (actor.WithMailbox).
func newMailbox() actor.Mailbox {
	m := &mailbox{}
	m.user.items, m.sys.items = m.userInl[:0], m.sysInl[:0]
	return m
}

// PostUserMessage implements actor.Mailbox. A MessageBatch (or an envelope
// of one) posts its messages one by one and then itself, as the default
// mailbox does; the engine sends none.
func (m *mailbox) PostUserMessage(msg any) {
	if batch, ok := msg.(actor.MessageBatch); ok {
		for _, x := range batch.GetMessages() {
			m.PostUserMessage(x)
		}
	}
	if env, ok := msg.(*actor.MessageEnvelope); ok {
		if batch, ok := env.Message.(actor.MessageBatch); ok {
			for _, x := range batch.GetMessages() {
				m.PostUserMessage(x)
			}
		}
	}
	m.mu.Lock()
	m.user.push(msg)
	m.mu.Unlock()
	m.userN.Add(1)
	m.schedule()
}

// PostSystemMessage implements actor.Mailbox.
func (m *mailbox) PostSystemMessage(msg any) {
	m.mu.Lock()
	m.sys.push(msg)
	m.mu.Unlock()
	m.sysN.Add(1)
	m.schedule()
}

// RegisterHandlers implements actor.Mailbox.
func (m *mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker, m.dispatcher = invoker, dispatcher
	if d, ok := dispatcher.(*poolDispatcher); ok {
		m.pool = d
	} else {
		m.process = m.processMessages
	}
}

// Start implements actor.Mailbox (no middlewares).
func (m *mailbox) Start() {}

// UserMessageCount implements actor.Mailbox.
func (m *mailbox) UserMessageCount() int { return int(m.userN.Load()) }

func (m *mailbox) schedule() {
	if m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
		if m.pool != nil {
			m.pool.schedule(m)
			return
		}
		m.dispatcher.Schedule(m.process)
	}
}

// runTask implements task: the engine's pool runs the mailbox.
func (m *mailbox) runTask() { m.processMessages() }

func (m *mailbox) processMessages() {
	for {
		m.run()
		m.status.Store(mailboxIdle)
		sys, user := m.sysN.Load(), m.userN.Load()
		// Messages posted after the loop ended, whose poster saw the
		// mailbox running and did not schedule it: run again.
		if sys == 0 && (m.suspended.Load() || user == 0) {
			return
		}
		if !m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
			return // a poster scheduled it
		}
	}
}

func (m *mailbox) pop(q *fifo) (any, bool) {
	m.mu.Lock()
	x, ok := q.pop()
	m.mu.Unlock()
	return x, ok
}

func (m *mailbox) run() {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	i, t := 0, m.dispatcher.Throughput()
	for {
		if i > t {
			i = 0
			runtime.Gosched()
		}
		i++
		if m.sysN.Load() > 0 {
			if x, ok := m.pop(&m.sys); ok {
				msg = x
				m.sysN.Add(-1)
				switch x.(type) {
				case *actor.SuspendMailbox:
					m.suspended.Store(true)
				case *actor.ResumeMailbox:
					m.suspended.Store(false)
				default:
					m.invoker.InvokeSystemMessage(x)
				}
				continue
			}
		}
		if m.suspended.Load() {
			return
		}
		if m.userN.Load() == 0 {
			return
		}
		x, ok := m.pop(&m.user)
		if !ok {
			return
		}
		msg = x
		m.userN.Add(-1)
		m.invoker.InvokeUserMessage(x)
	}
}

// fifo is a queue on a slice: pop advances head; once drained, the slice
// is reused from its start (or, past fifoKeep slots, dropped, so a burst
// does not pin its peak for the actor's life).
type fifo struct {
	items []any
	head  int
}

const fifoKeep = 1024

func (q *fifo) push(x any) {
	if q.head > 0 && len(q.items) == cap(q.items) && q.head >= len(q.items)/2 {
		// Half the slice is popped slots: move the live ones down
		// instead of growing.
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, x)
}

func (q *fifo) pop() (any, bool) {
	if q.head == len(q.items) {
		return nil, false
	}
	x := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		if cap(q.items) > fifoKeep {
			q.items = nil
		} else {
			q.items = q.items[:0]
		}
		q.head = 0
	}
	return x, true
}
