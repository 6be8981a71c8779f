package actors

import (
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"
)

// BenchmarkScheduleAfterIdle is what one hand-off costs the goroutine that
// makes it: after a pause (every goroutine of the process parked, as
// between two frames of a lightly loaded link), a mailbox run is scheduled
// on the engine's dispatcher, which readies a parked goroutine. Reported
// are the sender's side of that call (the runtime may wake an idle P's
// thread from inside it: a futex wake, on a VM an inter-processor
// interrupt) at GOMAXPROCS 1 and at the machine's, side by side.
func BenchmarkScheduleAfterIdle(b *testing.B) {
	procs := []int{1}
	if n := runtime.NumCPU(); n > 1 {
		procs = append(procs, n)
	}
	for _, p := range procs {
		b.Run("gomaxprocs="+strconv.Itoa(p), func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(p))
			d := newPoolDispatcher(300, 4)
			defer d.close()
			ran := make(chan struct{})
			run := func() { ran <- struct{}{} }
			d.Schedule(run) // start the pool's goroutine
			<-ran
			took := make([]time.Duration, 0, b.N)
			for b.Loop() {
				time.Sleep(50 * time.Microsecond)
				t0 := time.Now()
				d.Schedule(run)
				took = append(took, time.Since(t0))
				<-ran
			}
			slices.Sort(took)
			q := func(f float64) float64 { return float64(took[int(f*float64(len(took)-1))].Nanoseconds()) }
			b.ReportMetric(q(0.5), "p50-ns")
			b.ReportMetric(q(0.9), "p90-ns")
			b.ReportMetric(q(0.99), "p99-ns")
		})
	}
}
