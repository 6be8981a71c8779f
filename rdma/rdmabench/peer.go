package rdmabench

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// A Rig with a peer process (Config.Peer) has its receiver in another
// process, as a generation server is, and as ucx_perftest runs its server.
// The peer is started with PeerEnv set to
// "<backend>/<segment bytes>/<segments>/<slots>" (without "/<slots>": one
// slot) and must call ServePeer with it. They talk in lines:
//
//	peer:   READY <address hex> <key hex> <len>
//	rig:    VERIFY <slots>     peer: VERIFIED | MISMATCH <slot> <segment>
//
// VERIFY n checks the first n slots (without n: all of them). The peer
// deregisters, closes its agent and returns when its stdin closes.
const PeerEnv = "KVXFER_RDMABENCH_PEER"

// peerBackends are the backends whose receiver can live in another process.
var peerBackends = []string{shm.Backend, ucx.Backend}

// peerTimeout bounds every wait for the peer process.
const peerTimeout = 30 * time.Second

// ServePeer runs the receiver of a Rig in this process: spec is PeerEnv's
// value; it prints READY on out, answers VERIFY, and returns once in ends.
func ServePeer(spec string, in io.Reader, out io.Writer) (err error) {
	backend, s, err := parsePeerSpec(spec)
	if err != nil {
		return err
	}
	var a rdma.Agent
	var region *kvcache.Region
	var closer io.Closer
	switch backend {
	case shm.Backend:
		a = shm.New()
		region, closer, err = shm.NewRegion("", s.SpanBytes())
	case ucx.Backend:
		var u *ucx.Agent
		if u, err = ucx.New(); err != nil {
			return err
		}
		a = u
		region, closer, err = u.Alloc(s.SpanBytes())
	}
	defer func() { err = errors.Join(err, a.Close()) }()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closer.Close()) }()
	reg, err := a.Register(region)
	if err != nil {
		return err
	}
	rr := reg.Remote()
	if _, err := fmt.Fprintf(out, "READY %s %s %d\n", hex.EncodeToString(a.Address()), hex.EncodeToString(rr.Key), rr.Len); err != nil {
		return err
	}
	src := make([]byte, s.SpanBytes())
	fill(src)
	slots := slotLayouts(s)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		n, err := parseVerify(sc.Text(), len(slots))
		if err != nil {
			return err
		}
		answer := "VERIFIED"
		if k, i := firstMismatch(region.Bytes(), src, slots[:n]); k >= 0 {
			answer = fmt.Sprintf("MISMATCH %d %d", k, i)
		}
		if _, err := fmt.Fprintln(out, answer); err != nil {
			return err
		}
	}
	return errors.Join(sc.Err(), a.Deregister(reg))
}

// parseVerify is a VERIFY request's slot count: "VERIFY n" with 1 <= n <=
// slots, or "VERIFY" for all of them.
func parseVerify(line string, slots int) (int, error) {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "VERIFY" || len(f) > 2 {
		return 0, fmt.Errorf("rdmabench peer: unknown request %q", line)
	}
	if len(f) == 1 {
		return slots, nil
	}
	n, err := strconv.Atoi(f[1])
	if err != nil || n < 1 || n > slots {
		return 0, fmt.Errorf("rdmabench peer: request %q: want VERIFY and a slot count from 1 to %d", line, slots)
	}
	return n, nil
}

func parsePeerSpec(spec string) (string, Shape, error) {
	f := strings.Split(spec, "/")
	if len(f) != 3 && len(f) != 4 {
		return "", Shape{}, fmt.Errorf("rdmabench: peer spec %q: want <backend>/<segment bytes>/<segments>[/<slots>]", spec)
	}
	size, err1 := strconv.ParseUint(f[1], 10, 64)
	n, err2 := strconv.Atoi(f[2])
	slots, err3 := 1, error(nil)
	if len(f) == 4 {
		slots, err3 = strconv.Atoi(f[3])
	}
	switch {
	case !slices.Contains(peerBackends, f[0]):
		return "", Shape{}, fmt.Errorf("rdmabench: peer spec %q: backend %q has no peer process (want one of %s)", spec, f[0], quoted(peerBackends))
	case err1 != nil || err2 != nil || size == 0 || n < 1:
		return "", Shape{}, fmt.Errorf("rdmabench: peer spec %q: want at least one segment of at least one byte", spec)
	case err3 != nil || slots < 1:
		return "", Shape{}, fmt.Errorf("rdmabench: peer spec %q: want at least one slot", spec)
	}
	return f[0], Shape{SegmentBytes: size, Segments: n, Slots: slots}, nil
}

// firstMismatch is the first slot and segment of slots whose destination
// bytes differ from its source bytes, or -1, -1.
func firstMismatch(dst, src []byte, slots [][]kvcache.Segment) (slot, segment int) {
	for k, segs := range slots {
		for i, s := range segs {
			if !bytes.Equal(dst[s.Dst:s.Dst+s.Len], src[s.Src:s.Src+s.Len]) {
				return k, i
			}
		}
	}
	return -1, -1
}

// peer is a Rig's receiver process.
type peer struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr bytes.Buffer // read once the process has exited
	exited chan error
}

// startPeer starts argv as the receiver of backend and shape s, and reads
// its READY line: its address and the destination.
func startPeer(argv []string, backend string, s Shape) (p *peer, addr []byte, dst rdma.RemoteRegion, err error) {
	if !slices.Contains(peerBackends, backend) {
		return nil, nil, dst, fmt.Errorf("rdmabench: backend %q has no peer process (want one of %s)", backend, quoted(peerBackends))
	}
	if len(argv) == 0 {
		return nil, nil, dst, fmt.Errorf("rdmabench: empty peer command")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s/%d/%d/%d", PeerEnv, backend, s.SegmentBytes, s.Segments, s.SlotCount()))
	p = &peer{cmd: cmd, lines: make(chan string, 4), exited: make(chan error, 1)}
	cmd.Stderr = &p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, nil, dst, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, dst, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, dst, fmt.Errorf("rdmabench: start peer %q: %w", argv[0], err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.exited <- cmd.Wait() // after stdout is read: Wait closes it
	}()
	defer func() {
		if err != nil {
			err = errors.Join(err, p.close())
		}
	}()
	line, err := p.expect("READY ")
	if err != nil {
		return nil, nil, dst, err
	}
	f := strings.Fields(line)
	if len(f) != 4 {
		return nil, nil, dst, fmt.Errorf("rdmabench: peer: bad READY line %q", line)
	}
	addr, err1 := hex.DecodeString(f[1])
	key, err2 := hex.DecodeString(f[2])
	n, err3 := strconv.ParseUint(f[3], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, nil, dst, fmt.Errorf("rdmabench: peer: bad READY line %q: %w", line, err)
	}
	return p, addr, rdma.RemoteRegion{Key: key, Len: n}, nil
}

// expect returns the peer's next line, which must start with prefix.
func (p *peer) expect(prefix string) (string, error) {
	timer := time.NewTimer(peerTimeout)
	defer timer.Stop()
	select {
	case line, ok := <-p.lines:
		if !ok {
			return "", fmt.Errorf("rdmabench: peer exited before %q", prefix)
		}
		if !strings.HasPrefix(line, prefix) {
			return "", fmt.Errorf("rdmabench: peer said %q, want %q…", line, prefix)
		}
		return line, nil
	case <-timer.C:
		return "", fmt.Errorf("rdmabench: no %q from the peer within %v", prefix, peerTimeout)
	}
}

// verify asks the peer to check its destination's first slots slots.
func (p *peer) verify(slots int) error {
	if _, err := fmt.Fprintf(p.stdin, "VERIFY %d\n", slots); err != nil {
		return fmt.Errorf("rdmabench: peer: %w", err)
	}
	line, err := p.expect("")
	if err != nil {
		return err
	}
	if line != "VERIFIED" {
		return fmt.Errorf("rdmabench: peer: %s", line)
	}
	return nil
}

// close ends the peer (its stdin closes) and waits for it, killing it
// after peerTimeout.
func (p *peer) close() error {
	p.stdin.Close()
	timer := time.NewTimer(peerTimeout)
	defer timer.Stop()
	lines, killed := p.lines, false
	for {
		select {
		case _, ok := <-lines: // keep the reader going until EOF
			if !ok {
				lines = nil
			}
		case err := <-p.exited:
			switch {
			case killed:
				return fmt.Errorf("rdmabench: peer did not exit within %v of its stdin closing", peerTimeout)
			case err != nil:
				return fmt.Errorf("rdmabench: peer: %w; stderr:\n%s", err, p.stderr.String())
			}
			return nil
		case <-timer.C:
			p.cmd.Process.Kill()
			killed = true
		}
	}
}
