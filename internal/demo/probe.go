package demo

import (
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/rdma"
)

// Probe observes a run, for benchmarks that break its time down
// (internal/bench's DemoLoad). The demo calls Mark from its request
// goroutines, so an implementation must be goroutine-safe. A run without a
// Probe does none of this work.
type Probe interface {
	// Recorder receives every message each session of both engines
	// steps on (kvxfer.Config.Recorder).
	actors.Recorder
	// Agent returns the context engine's data-plane agent: a, or a
	// wrapper of it that observes posts and completions.
	Agent(mode string, a rdma.Agent) rdma.Agent
	// Mark records one demo-side event.
	Mark(e ProbeEvent)
}

// ProbeKind is what a ProbeEvent marks.
type ProbeKind uint8

// Demo-side events, in the order one chunk or request meets them.
const (
	// ProbeModeStart and ProbeModeEnd bracket a mode's run (Request
	// empty); ModeStart is at the clock's start (Row.Wall ends at the
	// last transfer's end, before ModeEnd).
	ProbeModeStart ProbeKind = iota
	// ProbeAdmit: the request waits for the generation side's room
	// (before its admission, then its source blocks).
	ProbeAdmit
	// ProbeAllocated: its source blocks are allocated.
	ProbeAllocated
	// ProbeHanded: tx.Chunk returned for the chunk (pipelined: before its
	// compute; after prefill: after every chunk's compute).
	ProbeHanded
	// ProbeCompute: the chunk's simulated prefill starts (its KV is
	// written with the CPU, then the rest of Compute is slept).
	ProbeCompute
	// ProbeFilled: the chunk's KV is written (the CPU part ends).
	ProbeFilled
	// ProbeComputed: the chunk's simulated prefill ends; its prefill
	// device is free after this mark.
	ProbeComputed
	// ProbeFence: the chunk's fence fires (after prefill: the last
	// chunk's compute ended).
	ProbeFence
	// ProbeReady: the generation side's Receive reported READY.
	ProbeReady
	// ProbeVerify and ProbeVerified bracket the request's byte check.
	ProbeVerify
	ProbeVerified
	ProbeModeEnd
)

// ProbeEvent is one demo-side event of a chunk (Chunk ≥ 0) or of a whole
// request (Chunk -1).
type ProbeEvent struct {
	Mode    string
	Request string // the request id both engines use
	Chunk   int
	Kind    ProbeKind
	At      time.Time
	// Bytes (ProbeFilled, ProbeVerified) is how many bytes the step
	// wrote or read.
	Bytes uint64
}

// mark records e at its At, or now when At is zero.
func (o Options) mark(e ProbeEvent) {
	if o.Probe != nil {
		if e.At.IsZero() {
			e.At = time.Now()
		}
		o.Probe.Mark(e)
	}
}
