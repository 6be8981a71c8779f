package cpustat

import (
	"bytes"
	"errors"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

const stat = `cpu  1794987 0 273571 8011776 7417 0 16926 128105 0 0
cpu0 897740 0 136058 4005584 4837 0 8137 63941 0 0
intr 1 2 3
`

func TestParse(t *testing.T) {
	got, err := Parse([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	want := Times{User: 1794987, System: 273571, Idle: 8011776, IOWait: 7417, SoftIRQ: 16926, Steal: 128105}
	if got != want {
		t.Fatalf("Parse: %+v, want %+v", got, want)
	}
	// An old kernel without the steal field.
	got, err = Parse([]byte("cpu 10 0 5 100 1 0 0\n"))
	if err != nil || got.Steal != 0 || got.Total() != 116 {
		t.Fatalf("no steal field: %+v %v", got, err)
	}
	for name, in := range map[string]string{
		"no cpu line": "cpu0 1 2 3 4\n",
		"short line":  "cpu 1 2\n",
		"not numbers": "cpu 1 2 x 4\n",
	} {
		if _, err := Parse([]byte(in)); !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: err %v, want ErrUnavailable", name, err)
		}
	}
}

func TestBetween(t *testing.T) {
	a := Times{User: 100, System: 50, Idle: 800, Steal: 50}
	b := Times{User: 160, System: 70, Idle: 880, Steal: 90} // +60 +20 +80 +40 = 200 ticks
	s := Between(a, b)
	near := func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
	if !near(s.Busy, 0.4) || !near(s.Steal, 0.2) || !near(s.Idle, 0.4) {
		t.Fatalf("Between: %+v, want busy 0.4 steal 0.2 idle 0.4", s)
	}
	if s.String() != "steal 20% (busy 40%)" {
		t.Fatalf("String: %q", s.String())
	}
	if z := Between(b, a); z != (Share{}) {
		t.Fatalf("readings out of order: %+v, want zero", z)
	}
	if z := Between(a, a); z != (Share{}) {
		t.Fatalf("no time between: %+v, want zero", z)
	}
}

func TestMeterReadsThisMachine(t *testing.T) {
	m := Start()
	if !m.ok {
		t.Skip("no /proc/stat here")
	}
	s, ok := m.Stop()
	if !ok {
		t.Fatal("Stop could not read /proc/stat that Start read")
	}
	if s.Busy < 0 || s.Steal < 0 || s.Idle < 0 || s.Busy+s.Steal+s.Idle > 1+1e-9 {
		t.Fatalf("shares out of range: %+v", s)
	}
}

// TestProcessCPU: the process's CPU time grows while it works, and agrees
// with the kernel's own count for the process in /proc/self/stat.
func TestProcessCPU(t *testing.T) {
	ticks := func() uint64 { // utime + stime, in clock ticks (USER_HZ, 100 on Linux)
		b, err := os.ReadFile("/proc/self/stat")
		if err != nil {
			t.Skip("no /proc/self/stat here")
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		u, err1 := strconv.ParseUint(f[11], 10, 64)
		s, err2 := strconv.ParseUint(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("/proc/self/stat: %q %q", f[11], f[12])
		}
		return u + s
	}
	k0 := ticks()
	c0, err := ProcessCPU()
	if err != nil {
		t.Fatal(err)
	}
	// Work until the kernel has counted 20 ticks (200 ms) more, with a
	// deadline in case the reading never moves.
	deadline := time.Now().Add(time.Minute)
	x := uint64(1)
	for ticks() < k0+20 {
		for i := 0; i < 100000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
		if time.Now().After(deadline) {
			t.Fatal("the process's CPU time did not grow by 200 ms within a minute of work")
		}
	}
	c1, err := ProcessCPU()
	k1 := ticks()
	if err != nil {
		t.Fatal(err)
	}
	got, want := c1-c0, time.Duration(k1-k0)*10*time.Millisecond
	if got < want-30*time.Millisecond || got > want+30*time.Millisecond {
		t.Fatalf("ProcessCPU advanced %v while /proc/self/stat counted %v (x %d)", got, want, x)
	}
}
