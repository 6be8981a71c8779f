package actors

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// panickingStepper is a session whose every step panics with v.
type panickingStepper struct{ v any }

func (p panickingStepper) Step(any, time.Time) []Effect { panic(p.v) }
func (panickingStepper) Unreturned() []Effect           { return nil }
func (panickingStepper) Recycle([]Effect)               {}

// callsTracer is a session tracer that notes what it is told, in order.
type callsTracer struct{ calls []string }

func (c *callsTracer) Record(m any, _ time.Time) {
	c.calls = append(c.calls, fmt.Sprintf("Record %T", m))
}
func (c *callsTracer) Resolved(*messages.Hello, *messages.RequestData) {}
func (c *callsTracer) Stepped(any, []Effect)                           { c.calls = append(c.calls, "Stepped") }
func (c *callsTracer) StepPanicked(v any)                              { c.calls = append(c.calls, fmt.Sprint("StepPanicked ", v)) }

// TestTracedStepPanicIsTold: a step that panics is told to its tracer,
// with the panic's value, before the panic goes on up unchanged, so that
// a trace holds a session's last step when it panicked (nothing came
// after it to say so). (Checked to fail: the tracer heard only Record.)
func TestTracedStepPanicIsTold(t *testing.T) {
	tr := &callsTracer{}
	boom := fmt.Errorf("boom")
	var got any
	func() {
		defer func() { got = recover() }()
		traced(&shellEnv{}, "gen/0/$1", tr, panickingStepper{v: boom}, RxBegin{}, time.Unix(0, 1))
		t.Fatal("the step's panic did not go on up")
	}()
	if got != boom {
		t.Fatalf("panic %v went on up, want the step's own (%v)", got, boom)
	}
	want := []string{"Record core.RxBegin", "StepPanicked boom"}
	if fmt.Sprint(tr.calls) != fmt.Sprint(want) {
		t.Fatalf("the tracer was told %q, want %q", tr.calls, want)
	}
}
