package twoproc

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	zmq4 "github.com/pebbe/zmq4"
)

// The bare-zmq baseline of BenchmarkControlRoundTrip: a ROUTER in a child
// process echoes each 128-byte frame a DEALER in this process sends, one
// in flight, over the same transports the engine uses. No protobuf, no
// actors, no data plane: what the engine's round trip is measured against.

const (
	echoRole     = "zmqecho"
	echoEndpoint = "KVXFER_TEST_ECHO_ENDPOINT"
	echoSecret   = "KVXFER_TEST_ECHO_SECRET" // empty: no CURVE
	// pingRole is the DEALER side as a child process (for the pinned
	// runs): pingArgs holds "n pause server-public-key" (the key "-" for
	// no CURVE); it prints each round trip's nanoseconds, one JSON array.
	pingRole = "zmqping"
	pingArgs = "KVXFER_TEST_PING_ARGS"
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
	go func() { // the parent closes stdin when done
		_, _ = os.Stdin.Read(make([]byte, 1))
		os.Exit(0)
	}()
	fmt.Println("ready")
	for {
		msg, err := r.RecvMessageBytes(0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			return 1
		}
		if _, err := r.SendMessage(msg); err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			return 1
		}
	}
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
// child of its own on CPU 0 (see pinnedCPUs), as the engine's pinned runs.
func bareRoundTrips(b *testing.B, transport string, curve bool, n int, pause time.Duration, pinned bool) []time.Duration {
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
		out, err := ping(ep, srvPub, n, pause)
		if err != nil {
			b.Fatal(err)
		}
		return out
	}
	p := spawnOn(b, []string{roleEnv + "=" + pingRole, echoEndpoint + "=" + ep,
		pingArgs + "=" + fmt.Sprintf("%d %d %s", n, pause, srvPub)}, 0)
	defer p.stop()
	done := time.After(2 * time.Minute)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				b.Fatal("ping process ended without its round trips")
			}
			var ns []int64
			if !strings.HasPrefix(l, "[") || json.Unmarshal([]byte(l), &ns) != nil {
				continue
			}
			out := make([]time.Duration, len(ns))
			for i, v := range ns {
				out[i] = time.Duration(v)
			}
			return out
		case <-done:
			b.Fatal("ping process: no round trips within 2 minutes")
		}
	}
}

// ping is the DEALER side: n round trips of a 128-byte frame to the echo
// ROUTER at ep (CURVE with its public key srvPub unless "-"), each after
// idling pause, after 200 unmeasured.
func ping(ep, srvPub string, n int, pause time.Duration) ([]time.Duration, error) {
	d, err := zmq4.NewSocket(zmq4.DEALER)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if srvPub != "-" {
		pub, sec, err := zmq4.NewCurveKeypair()
		if err != nil {
			return nil, err
		}
		for _, e := range []error{d.SetCurveServerkey(srvPub), d.SetCurvePublickey(pub), d.SetCurveSecretkey(sec)} {
			if e != nil {
				return nil, e
			}
		}
	}
	if err := d.SetLinger(0); err != nil {
		return nil, err
	}
	if err := d.Connect(ep); err != nil {
		return nil, err
	}
	frame := make([]byte, 128)
	out := make([]time.Duration, 0, n)
	for i := -200; i < n; i++ {
		if pause > 0 {
			time.Sleep(pause)
		}
		t0 := time.Now()
		if _, err := d.SendBytes(frame, 0); err != nil {
			return nil, err
		}
		got, err := d.RecvBytes(0)
		if err != nil {
			return nil, err
		}
		if len(got) != len(frame) {
			return nil, fmt.Errorf("echo: %d bytes back, sent %d", len(got), len(frame))
		}
		if i >= 0 {
			out = append(out, time.Since(t0))
		}
	}
	return out, nil
}

// runPing is the ping child: ping as pingArgs says, then print the round
// trips' nanoseconds as one JSON array.
func runPing() int {
	var (
		n      int
		pause  time.Duration
		srvPub string
	)
	if _, err := fmt.Sscan(os.Getenv(pingArgs), &n, &pause, &srvPub); err != nil {
		fmt.Fprintln(os.Stderr, "ping: bad", pingArgs+":", err)
		return 2
	}
	out, err := ping(os.Getenv(echoEndpoint), srvPub, n, pause)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ping:", err)
		return 1
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
