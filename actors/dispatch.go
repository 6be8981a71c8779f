package actors

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// poolDispatcher runs the engine's mailboxes on goroutines that outlive
// one run of a mailbox. protoactor's default dispatcher starts a goroutine
// each time an idle mailbox gets a message; each such goroutine starts
// with a small stack and grows it (copying it) as it runs an actor's
// step: a quarter of the engine's CPU on the chunk path
// (BenchmarkChunkOverhead's profile). Here a mailbox run is handed to a
// parked goroutine when one is idle (its stack already grown) and to a new
// one otherwise; at most maxParked wait idle, the others exit.
type poolDispatcher struct {
	throughput int
	maxParked  int32
	work       chan task
	done       chan struct{}
	closeOnce  sync.Once
	parked     atomic.Int32
}

var _ actor.Dispatcher = (*poolDispatcher)(nil)

func newPoolDispatcher(throughput, maxParked int) *poolDispatcher {
	return &poolDispatcher{throughput: throughput, maxParked: int32(maxParked),
		work: make(chan task), done: make(chan struct{})}
}

// task is a run the pool's goroutines take: an engine mailbox's, handed
// over as itself (no func value bound per mailbox), or any other
// function Schedule is given.
type task interface{ runTask() }

// funcTask is a function as a task (converting a func to an interface
// allocates nothing).
type funcTask func()

func (f funcTask) runTask() { f() }

// Schedule implements actor.Dispatcher.
func (d *poolDispatcher) Schedule(fn func()) { d.schedule(funcTask(fn)) }

// schedule runs t on a parked goroutine, or on a new one when none is.
func (d *poolDispatcher) schedule(t task) {
	select {
	case d.work <- t: // a parked goroutine took it
	default:
		go d.loop(t)
	}
}

// Throughput implements actor.Dispatcher.
func (d *poolDispatcher) Throughput() int { return d.throughput }

func (d *poolDispatcher) loop(t task) {
	for {
		t.runTask()
		if d.parked.Add(1) > d.maxParked {
			d.parked.Add(-1)
			return
		}
		select {
		case t = <-d.work:
			d.parked.Add(-1)
		case <-d.done:
			d.parked.Add(-1)
			return
		}
	}
}

// close lets every parked goroutine exit; a mailbox scheduled after it
// still runs, on a goroutine of its own.
func (d *poolDispatcher) close() { d.closeOnce.Do(func() { close(d.done) }) }
