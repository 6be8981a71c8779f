// Package cpustat reads how the machine's CPUs spent their time (Linux's
// /proc/stat), so that a benchmark can print, beside its figures, how much
// CPU time the host took from this machine while they were measured.
//
// On a virtual machine the hypervisor runs other guests on the same
// physical CPUs; the time a vCPU was ready to run but not running is
// "steal". Steal lengthens every wake-up and every hand-off between
// threads, so it moves latency figures far more than the share suggests:
// two runs of the same binary minutes apart differ by 2× when one of them
// lost a fifth of its CPU time to the host (BENCHMARKS.md). A ratio
// measured side by side in one run is still fair between its two sides,
// but only when both saw the same steal: the tools print it per side.
package cpustat

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Times are the machine's CPU times (all CPUs together), in the kernel's
// clock ticks, from the "cpu" line of /proc/stat.
type Times struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal uint64
}

// Total is the sum of every field: the wall time of all CPUs, in ticks.
func (t Times) Total() uint64 {
	return t.User + t.Nice + t.System + t.Idle + t.IOWait + t.IRQ + t.SoftIRQ + t.Steal
}

// ErrUnavailable: the machine has no /proc/stat (not Linux) or it has no
// "cpu" line.
var ErrUnavailable = errors.New("cpustat: CPU times unavailable")

// Read returns the machine's CPU times now.
func Read() (Times, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Times{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return Parse(b)
}

// Parse reads the "cpu" line (the sum over CPUs) of a /proc/stat text.
// Fields past steal (guest times, already counted in user and nice) are
// ignored; a kernel that has no steal field gives 0 for it.
func Parse(stat []byte) (Times, error) {
	sc := bufio.NewScanner(bytes.NewReader(stat))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		if len(f) < 5 {
			return Times{}, fmt.Errorf("%w: the cpu line has %d fields, want at least 4 counters", ErrUnavailable, len(f)-1)
		}
		var v [8]uint64
		for i := 0; i < len(v) && i+1 < len(f); i++ {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return Times{}, fmt.Errorf("%w: cpu field %d %q: %v", ErrUnavailable, i+1, f[i+1], err)
			}
			v[i] = n
		}
		return Times{User: v[0], Nice: v[1], System: v[2], Idle: v[3], IOWait: v[4], IRQ: v[5], SoftIRQ: v[6], Steal: v[7]}, nil
	}
	return Times{}, fmt.Errorf("%w: no cpu line", ErrUnavailable)
}

// Share is what the CPUs did between two readings, as fractions of their
// wall time (all CPUs together).
type Share struct {
	Busy  float64 // user, nice, system, irq, softirq
	Steal float64 // ready to run, but the host ran something else
	Idle  float64 // idle and iowait
}

// Between is the share of each use of the CPUs from a to b. A pair with no
// time between them (or b before a) gives the zero Share.
func Between(a, b Times) Share {
	if b.Total() <= a.Total() {
		return Share{}
	}
	tot := float64(b.Total() - a.Total())
	d := func(x, y uint64) float64 {
		if y < x {
			return 0
		}
		return float64(y-x) / tot
	}
	return Share{
		Busy:  d(a.User+a.Nice+a.System+a.IRQ+a.SoftIRQ, b.User+b.Nice+b.System+b.IRQ+b.SoftIRQ),
		Steal: d(a.Steal, b.Steal),
		Idle:  d(a.Idle+a.IOWait, b.Idle+b.IOWait),
	}
}

// Meter measures the share of CPU time the host took between Start and
// Stop; a machine without /proc/stat gives ok false.
type Meter struct {
	start Times
	ok    bool
}

// Start begins a measurement.
func Start() Meter {
	t, err := Read()
	return Meter{start: t, ok: err == nil}
}

// Stop ends it: the shares since Start, and whether they could be read.
func (m Meter) Stop() (Share, bool) {
	if !m.ok {
		return Share{}, false
	}
	t, err := Read()
	if err != nil {
		return Share{}, false
	}
	return Between(m.start, t), true
}

// String is a share for a line of figures: "steal 21% (busy 55%)".
func (s Share) String() string {
	return fmt.Sprintf("steal %.0f%% (busy %.0f%%)", 100*s.Steal, 100*s.Busy)
}

// ProcessCPU is the CPU time this process has used so far, user and
// system, all of its threads together (C threads such as libzmq's I/O
// threads included): the difference of two readings is what the process
// spent between them, whatever the host took meanwhile.
func ProcessCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("cpustat: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
