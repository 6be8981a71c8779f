package twoproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/internal/cpustat"
)

// The bare-zmq baseline of BenchmarkControlRoundTrip: a ROUTER in a child
// process echoes each 128-byte frame a DEALER in this process sends, one
// in flight, over the same transports the engine uses. No protobuf, no
// actors, no data plane: what the engine's round trip is measured against.
//
// The engine's link has a connection per direction (each side's DEALER to
// the other's bound ROUTER); the "2conn" variant does the same: the echo
// answers through a DEALER of its own connected to a ROUTER the pinging
// side binds, so that the baseline crosses the same sockets and TCP
// connections per round trip as the engine, without the engine.
const (
	echoRole     = "zmqecho"
	echoEndpoint = "KVXFER_TEST_ECHO_ENDPOINT"
	echoSecret   = "KVXFER_TEST_ECHO_SECRET" // empty: no CURVE
	// echoReplyTo, when set ("endpoint server-public-key", the key "-"
	// for no CURVE), has the echo answer through a DEALER connected there
	// instead of on its ROUTER (the 2conn variant).
	echoReplyTo = "KVXFER_TEST_ECHO_REPLY_TO"
	// pingRole is the DEALER side as a child process (for the pinned
	// runs): pingArgs holds "n pause server-public-key reply-endpoint
	// reply-secret-key" (a key "-" for no CURVE, the endpoint "-" for
	// answers on the DEALER); it prints each round trip's nanoseconds,
	// one JSON array.
	pingRole = "zmqping"
	pingArgs = "KVXFER_TEST_PING_ARGS"
	// echoWorkUs, when set, has the echo do that many µs of Go work
	// between each frame in and its answer out (echoWork: "spin", "alloc",
	// "hop" — a goroutine hand-off — or "all", the default: allocations
	// and hand-offs, as the engine's steps do): the bare baseline with a
	// known amount of in-process work, to calibrate what the engine's own
	// work costs a round trip (BENCHMARKS.md, "What in-process work costs
	// the round trip").
	echoWorkUs = "KVXFER_TEST_ECHO_WORK_US"
	echoWork   = "KVXFER_TEST_ECHO_WORK"
)

// runEcho is the child: bind a ROUTER, say "ready", echo until stdin closes.
func runEcho() int {
	r, err := zmq4.NewSocket(zmq4.ROUTER)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		return 1
	}
	defer r.Close()
	if sec := os.Getenv(echoSecret); sec != "" {
		if err := r.SetCurveServer(1); err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			return 1
		}
		if err := r.SetCurveSecretkey(sec); err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			return 1
		}
	}
	if err := r.SetLinger(0); err != nil {
		return 1
	}
	if err := r.Bind(os.Getenv(echoEndpoint)); err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		return 1
	}
	// echoed and cpu0: the messages answered, and the process's CPU time
	// at the first (after the handshake); printed at the end as "cpu <ns
	// spent since> <messages>" for the benchmark's CPU per round trip.
	var echoed atomic.Int64
	var cpu0 atomic.Int64
	go func() { // the parent closes stdin when done
		_, _ = os.Stdin.Read(make([]byte, 1))
		if n, c := echoed.Load(), cpu0.Load(); n > 0 && c > 0 {
			if now, err := cpustat.ProcessCPU(); err == nil {
				fmt.Printf("cpu %d %d\n", now.Nanoseconds()-c, n)
			}
		}
		os.Exit(0)
	}()
	var back *zmq4.Socket // 2conn: the answers' DEALER
	if to := os.Getenv(echoReplyTo); to != "" {
		var ep, pub string
		if _, err := fmt.Sscan(to, &ep, &pub); err != nil {
			fmt.Fprintln(os.Stderr, "echo: bad", echoReplyTo+":", err)
			return 2
		}
		d, err := dealerTo(ep, pub)
		if err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			return 1
		}
		defer d.Close()
		back = d
	}
	work := newEchoWork()
	fmt.Println("ready")
	for {
		msg, err := r.RecvMessageBytes(0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			return 1
		}
		if cpu0.Load() == 0 {
			if c, err := cpustat.ProcessCPU(); err == nil {
				cpu0.Store(max(c.Nanoseconds(), 1))
			}
		}
		work.do()
		if back != nil {
			_, err = back.SendBytes(msg[len(msg)-1], 0)
		} else {
			_, err = r.SendMessage(msg)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			return 1
		}
		echoed.Add(1)
	}
}

// echoWorker is the echo's in-process work (echoWorkUs); zero: none.
type echoWorker struct {
	d          time.Duration
	spin       bool
	alloc, hop bool
	sink       [][]byte
	to, back   chan struct{}
	x          int
}

func newEchoWork() *echoWorker {
	us, _ := strconv.Atoi(os.Getenv(echoWorkUs))
	w := &echoWorker{d: time.Duration(us) * time.Microsecond}
	switch os.Getenv(echoWork) {
	case "spin":
		w.spin = true
	case "alloc":
		w.alloc = true
	case "hop":
		w.hop = true
	default:
		w.alloc, w.hop = true, true
	}
	if w.d > 0 && w.hop {
		w.to, w.back = make(chan struct{}), make(chan struct{})
		go func() {
			for range w.to {
				w.back <- struct{}{}
			}
		}()
	}
	return w
}

// do works for w.d of wall time.
func (w *echoWorker) do() {
	for t0 := time.Now(); w.d > 0 && time.Since(t0) < w.d; {
		if w.alloc {
			for i := 0; i < 16; i++ {
				w.sink = append(w.sink, make([]byte, 64+i*8))
			}
			if len(w.sink) > 4096 {
				w.sink = w.sink[:0]
			}
		}
		if w.hop {
			w.to <- struct{}{}
			<-w.back
		}
		if w.spin {
			for i := 0; i < 100; i++ {
				w.x += i * w.x
			}
		}
	}
}

// dealerTo is a DEALER connected to ep, a CURVE client of the server key
// srvPub unless it is "-".
func dealerTo(ep, srvPub string) (*zmq4.Socket, error) {
	d, err := zmq4.NewSocket(zmq4.DEALER)
	if err != nil {
		return nil, err
	}
	if srvPub != "-" {
		pub, sec, err := zmq4.NewCurveKeypair()
		if err == nil {
			err = errors.Join(d.SetCurveServerkey(srvPub), d.SetCurvePublickey(pub), d.SetCurveSecretkey(sec))
		}
		if err != nil {
			d.Close()
			return nil, err
		}
	}
	if err := errors.Join(d.SetLinger(0), d.Connect(ep)); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// routerAt is a ROUTER bound at ep, a CURVE server with the secret key sec
// unless it is "-".
func routerAt(ep, sec string) (*zmq4.Socket, error) {
	r, err := zmq4.NewSocket(zmq4.ROUTER)
	if err != nil {
		return nil, err
	}
	if sec != "-" {
		if err := errors.Join(r.SetCurveServer(1), r.SetCurveSecretkey(sec)); err != nil {
			r.Close()
			return nil, err
		}
	}
	if err := errors.Join(r.SetLinger(0), r.Bind(ep)); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// freeTCP returns a tcp endpoint on 127.0.0.1 whose port was free a moment
// ago.
func freeTCP(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "tcp://" + l.Addr().String()
}

// bareRoundTrips runs n 128-byte round trips against an echo child, each
// after idling pause, and returns each one's duration (after 200
// unmeasured). pinned: the echo child runs on CPU 1 and the DEALER in a
// child of its own on CPU 0 (see pinnedCPUs), as the engine's pinned runs,
// and cpuUs is the two processes' CPU time per round trip in µs (-1 when
// not pinned, where the DEALER shares this process, or not known).
// twoConn: the answers come back over a second connection (echoReplyTo).
func bareRoundTrips(b *testing.B, transport string, curve bool, n int, pause time.Duration, pinned, twoConn bool) (rt []time.Duration, cpuUs float64) {
	b.Helper()
	ep := freeTCP(b)
	if transport == "ipc" {
		ep = "ipc://" + filepath.Join(b.TempDir(), "echo.sock")
	}
	env := []string{roleEnv + "=" + echoRole, echoEndpoint + "=" + ep}
	srvPub := "-"
	if curve {
		pub, sec, err := zmq4.NewCurveKeypair()
		if err != nil {
			b.Fatal(err)
		}
		srvPub = pub
		env = append(env, echoSecret+"="+sec)
	}
	back := replyPath{ep: "-", pub: "-", sec: "-"}
	if twoConn {
		back.ep = freeTCP(b)
		if transport == "ipc" {
			back.ep = "ipc://" + filepath.Join(b.TempDir(), "back.sock")
		}
		if curve {
			var err error
			if back.pub, back.sec, err = zmq4.NewCurveKeypair(); err != nil {
				b.Fatal(err)
			}
		}
		env = append(env, echoReplyTo+"="+back.ep+" "+back.pub)
	}
	c := spawnOn(b, env, cpuIf(pinned, 1))
	defer c.stop()
	deadline := time.After(30 * time.Second)
	for ready := false; !ready; {
		select {
		case l, ok := <-c.lines:
			if !ok {
				b.Fatal("echo process ended before ready")
			}
			ready = strings.HasPrefix(l, "ready")
		case <-deadline:
			b.Fatal("echo process not ready within 30 s")
		}
	}
	if !pinned {
		out, _, err := ping(ep, srvPub, n, pause, back)
		if err != nil {
			b.Fatal(err)
		}
		return out, -1
	}
	p := spawnOn(b, []string{roleEnv + "=" + pingRole, echoEndpoint + "=" + ep,
		pingArgs + "=" + fmt.Sprintf("%d %d %s %s %s", n, pause, srvPub, back.ep, back.sec)}, 0)
	defer p.stop()
	done := time.After(2 * time.Minute)
	pingCPU := -1.0
	for rt == nil {
		select {
		case l, ok := <-p.lines:
			if !ok {
				b.Fatal("ping process ended without its round trips")
			}
			var ns []int64
			if v, ok := strings.CutPrefix(l, "cpu "); ok {
				if c, err := strconv.ParseInt(v, 10, 64); err == nil && c > 0 {
					pingCPU = float64(c) / 1e3
				}
			}
			if !strings.HasPrefix(l, "[") || json.Unmarshal([]byte(l), &ns) != nil {
				continue
			}
			rt = make([]time.Duration, len(ns))
			for i, v := range ns {
				rt[i] = time.Duration(v)
			}
		case <-done:
			b.Fatal("ping process: no round trips within 2 minutes")
		}
	}
	// The echo prints its CPU time and the messages it answered as it
	// ends: "cpu <ns> <messages>".
	c.stop()
	echoCPU := -1.0
	for l := range c.lines {
		var ns, msgs int64
		if _, err := fmt.Sscanf(l, "cpu %d %d", &ns, &msgs); err == nil && ns > 0 && msgs > 0 {
			echoCPU = float64(ns) / float64(msgs) / 1e3
		}
	}
	if pingCPU < 0 || echoCPU < 0 {
		return rt, -1
	}
	return rt, pingCPU + echoCPU
}

// replyPath is where the 2conn variant's answers come back: the ROUTER
// the pinging side binds at ep (a CURVE server with the keys pub and sec,
// "-" for none), or, with ep "-", the DEALER's own connection.
type replyPath struct{ ep, pub, sec string }

// ping is the DEALER side: n round trips of a 128-byte frame to the echo
// ROUTER at ep (CURVE with its public key srvPub unless "-"), each after
// idling pause, after 200 unmeasured; the answers come on the DEALER or,
// when back.ep is not "-", on a ROUTER bound there. cpu is this process's
// CPU time per round trip over all n+200 (0 where it cannot be read).
func ping(ep, srvPub string, n int, pause time.Duration, back replyPath) (rt []time.Duration, cpu time.Duration, err error) {
	d, err := dealerTo(ep, srvPub)
	if err != nil {
		return nil, 0, err
	}
	defer d.Close()
	recv := func() ([]byte, error) { return d.RecvBytes(0) }
	if back.ep != "-" {
		r, err := routerAt(back.ep, back.sec)
		if err != nil {
			return nil, 0, err
		}
		defer r.Close()
		recv = func() ([]byte, error) {
			msg, err := r.RecvMessageBytes(0)
			if err != nil {
				return nil, err
			}
			return msg[len(msg)-1], nil
		}
	}
	frame := make([]byte, 128)
	out := make([]time.Duration, 0, n)
	cpu0, cpuErr := cpustat.ProcessCPU()
	for i := -200; i < n; i++ {
		if pause > 0 {
			time.Sleep(pause)
		}
		t0 := time.Now()
		if _, err := d.SendBytes(frame, 0); err != nil {
			return nil, 0, err
		}
		got, err := recv()
		if err != nil {
			return nil, 0, err
		}
		if len(got) != len(frame) {
			return nil, 0, fmt.Errorf("echo: %d bytes back, sent %d", len(got), len(frame))
		}
		if i >= 0 {
			out = append(out, time.Since(t0))
		}
	}
	if cpu1, err := cpustat.ProcessCPU(); err == nil && cpuErr == nil {
		cpu = (cpu1 - cpu0) / time.Duration(n+200)
	}
	return out, cpu, nil
}

// runPing is the ping child: ping as pingArgs says, then print the round
// trips' nanoseconds as one JSON array.
func runPing() int {
	var (
		n      int
		pause  time.Duration
		srvPub string
		back   replyPath
	)
	if _, err := fmt.Sscan(os.Getenv(pingArgs), &n, &pause, &srvPub, &back.ep, &back.sec); err != nil {
		fmt.Fprintln(os.Stderr, "ping: bad", pingArgs+":", err)
		return 2
	}
	out, cpu, err := ping(os.Getenv(echoEndpoint), srvPub, n, pause, back)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ping:", err)
		return 1
	}
	if cpu > 0 {
		fmt.Printf("cpu %d\n", cpu.Nanoseconds()) // per round trip
	}
	ns := make([]int64, len(out))
	for i, d := range out {
		ns[i] = d.Nanoseconds()
	}
	b, _ := json.Marshal(ns)
	fmt.Println(string(b))
	return 0
}

func percentile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

func sum(ds []time.Duration) time.Duration {
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s
}
