package twoproc

import (
	"bufio"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/proc"
)

// TestMisaddressedAfterContextRestart: the context process X is killed
// (SIGKILL, no goodbye) and restarted as Y on the same endpoint while the
// generation process still holds X's Hello as live (two minutes of missed
// heartbeats). gen's RequestData goes out addressed to X and reaches Y;
// Y drops it (addressed to an earlier incarnation, counted stale) and
// answers Misaddressed; gen addresses the request to Y and sends it again,
// and every request ends READY from Y, nothing quarantined.
//
// The order is forced, not raced for:
//   - gen pauses before each request (Options.Pause), and the test kills
//     X as soon as X's first Send is open (its metrics): X has said
//     Hello to gen, and no RequestData left gen for it (the pause is the
//     margin for that kill, not a wait for it). X never mapped gen's pool,
//     so its exit (pidfd) takes nothing down on gen's side;
//   - gen's socket file is renamed away before Y starts, so nothing of
//     Y's reaches gen — not its Hello (gen can only address the request
//     to X), nor its answer — until Y's metrics say it dropped a
//     RequestData (stale): then the file is put back, and Y's answer goes
//     out as its connection to gen comes up. Y's heartbeat interval is
//     long: its WaitPeers names a peer it heard but cannot reach after 3
//     intervals.
//
// gen's Conn to the context endpoint is dialled after the kill, so it says
// Hello to Y before its RequestData (the listener's delivery of one on a
// reconnected connection before Hello is not what this covers: on one
// host a request served by X ties X's exit to gen's pool, which takes X
// down at once).
//
// Checked: it fails (TIMED_OUT, blocks quarantined) with the context
// side's answer disabled (txParent.onMisaddressed), and without the
// Misaddressed in control/zmq's terminal(), which dropped that answer
// on Y's Conn to gen, not up yet.
func TestMisaddressedAfterContextRestart(t *testing.T) {
	g, c := options(t, 2, 0)
	for _, o := range []*proc.Options{&g, &c} {
		o.Concurrency, o.Workers = 1, 1
		o.Heartbeat, o.HeartbeatMisses = time.Second, 120
		o.Timeout = time.Minute
		o.ProofWait = time.Minute
	}
	g.Pause = 5 * time.Second
	c.MetricsAddr = freeAddr(t)
	gen := spawn(t, "gen", g)
	x := spawn(t, "ctx", c)
	// X's first Send is open: its WaitPeers returned, its connection to
	// gen (which carried its Hello first) is up, and gen pauses before
	// its first Receive.
	poll(t, "X to start its requests", func() bool { return metric(c.MetricsAddr, "kvxfer_sessions{", `side="tx"`) > 0 })
	_ = x.cmd.Process.Kill()
	_, _ = x.wait(t, time.Minute)

	sock := strings.TrimPrefix(g.Bind, "ipc://")
	if err := os.Rename(sock, sock+".away"); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := os.Rename(sock+".away", sock); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	yo := c
	yo.Heartbeat = 20 * time.Second
	yo.MetricsAddr = freeAddr(t)
	y := spawn(t, "ctx", yo)
	defer func() { _ = y.cmd.Process.Kill(); _, _ = y.wait(t, time.Minute) }()
	poll(t, "Y to drop a RequestData addressed to X", func() bool {
		return metric(yo.MetricsAddr, "kvxfer_frames_rejected_total{", `reason="stale"`) > 0
	})
	restore()
	gr, gerr := gen.wait(t, 3*time.Minute)
	t.Logf("gen: %+v (%v)", gr, gerr)
	if gerr != nil || gr.OK != 2 || gr.Failed != 0 || gr.QuarantinedBlocks != 0 || gr.LeakedBlocks != 0 ||
		gr.Mismatches != 0 || gr.BytesVerified != gr.Bytes || gr.PeerDown {
		t.Fatalf("the requests addressed to the killed context process and answered Misaddressed by its successor did not end READY from it: %+v (exit: %v)", gr, gerr)
	}
}

// poll waits, for at most two minutes, until ok.
func poll(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within two minutes", what)
		}
		time.Sleep(20 * time.Millisecond) // polling
	}
}

// freeAddr is a free TCP host:port on the loopback.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// metric sums the samples of the metrics served at addr whose line starts
// with prefix and has label (0 while they cannot be read).
func metric(addr, prefix, label string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) || !strings.Contains(line, label) {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			v, _ := strconv.ParseFloat(line[i+1:], 64)
			sum += v
		}
	}
	return sum
}
