// Package proc runs kvxfer's two roles as separate OS processes: a context
// process that prefills (simulated) and pushes chunks, and a generation
// process that receives and verifies every byte. They talk over the ZeroMQ
// control link (CURVE unless insecure) and write over the shared-memory or
// the ucx backend. `kvxfer ctx`, `kvxfer gen` and `kvxfer demo --processes 2` are
// thin wrappers; the two-process tests re-execute the test binary into
// these roles.
package proc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/internal/demo"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// Options configures one role process.
type Options struct {
	// Instance names this process's engine; Peer names the other's.
	Instance, Peer string
	// Bind is this process's ROUTER endpoint; PeerEndpoint the other's.
	Bind, PeerEndpoint string
	// SecretKey is this process's CURVE secret key and PeerPublicKey the
	// peer's public key (Z85); both empty only with Insecure.
	SecretKey, PeerPublicKey string
	Insecure                 bool
	// Identities binds more CURVE keys to the instances (and ranks) they
	// may speak for (zmq.Curve.Identities); the peer's key is bound to the
	// peer already.
	Identities []zmq.Identity

	// Backend is the data plane both processes use: shm (also when empty)
	// or ucx. Both must use the same.
	Backend string

	Model string
	// Layout, when set, overrides Model.
	Layout         *kvcache.Layout
	TokensPerBlock int
	PoolBytes      uint64
	Workers        int

	Requests, MinTokens, MaxTokens, ChunkTokens int
	Compute                                     time.Duration
	Concurrency                                 int
	Seed                                        uint64

	Heartbeat       time.Duration
	HeartbeatMisses int
	Timeout         time.Duration
	// TracePath, when set, records this process's engine to a trace file
	// (kvxfer.Config.TracePath).
	TracePath string
	// MetricsAddr, when set, serves the engine's Prometheus metrics
	// (kvxfer.Config.MetricsAddr); the bound address is logged.
	MetricsAddr string
	Log         zerolog.Logger `json:"-"`
	// Progress, when set, gets a line "ready <request>" (gen) or "done
	// <request>" (ctx) as each request completes.
	Progress io.Writer `json:"-"`
}

// Report is what a role prints (one JSON object) when it ends.
type Report struct {
	Role          string  `json:"role"`
	Requests      int     `json:"requests"`
	OK            int     `json:"ok"`
	Failed        int     `json:"failed"`
	Bytes         uint64  `json:"bytes"`
	BytesVerified uint64  `json:"bytes_verified"`
	Mismatches    int     `json:"mismatches"`
	LeakedBlocks  int     `json:"leaked_blocks"`
	PeerDown      bool    `json:"peer_down"`
	Seconds       float64 `json:"seconds"`
	// LatencyP50Us and LatencyP99Us (gen): Receive → READY per request.
	LatencyP50Us float64 `json:"latency_p50_us,omitempty"`
	LatencyP99Us float64 `json:"latency_p99_us,omitempty"`
	FirstError   string  `json:"first_error,omitempty"`
	// Errors lists the first failures, one line each (request: status:
	// cause), up to maxReportErrors.
	Errors []string `json:"errors,omitempty"`
}

const maxReportErrors = 8

// failed records one failed request in the report.
func (r *Report) failed(err error) {
	r.Failed++
	if r.FirstError == "" {
		r.FirstError = err.Error()
	}
	if len(r.Errors) < maxReportErrors {
		r.Errors = append(r.Errors, err.Error())
	}
}

// Prompts is the request list both roles derive from the seed.
func Prompts(o Options) []int {
	rng := rand.New(rand.NewPCG(o.Seed, 0x70726f63))
	out := make([]int, o.Requests)
	for i := range out {
		out[i] = o.MinTokens + rng.IntN(o.MaxTokens-o.MinTokens+1)
	}
	return out
}

// RequestID names request i.
func RequestID(i int) string { return fmt.Sprintf("req-%d", i) }

func (o Options) validate() error {
	if o.Requests < 1 || o.MinTokens < 1 || o.MaxTokens < o.MinTokens || o.Concurrency < 1 {
		return fmt.Errorf("proc: requests %d, tokens %d..%d, concurrency %d", o.Requests, o.MinTokens, o.MaxTokens, o.Concurrency)
	}
	switch o.Backend {
	case "", shm.Backend, ucx.Backend:
	default:
		return fmt.Errorf("proc: backend %q: want %s or %s", o.Backend, shm.Backend, ucx.Backend)
	}
	if !o.Insecure && (o.SecretKey == "" || o.PeerPublicKey == "") {
		return fmt.Errorf("proc: CURVE needs a secret key and the peer's public key (or --insecure)")
	}
	return nil
}

// node is one process's engine and link.
type node struct {
	eng     *kvxfer.Engine
	link    *zmq.Link
	closers []io.Closer
	down    chan struct{}
	once    sync.Once
	stop    chan struct{} // closed by close: stops watchPeer
	watch   sync.WaitGroup
}

// newAgent is the backend's agent for this process.
func newAgent(o Options) (rdma.Agent, error) {
	if o.Backend == ucx.Backend {
		a, err := ucx.New()
		if err != nil {
			return nil, fmt.Errorf("%w (backend ucx; --backend shm runs without UCX)", err)
		}
		return a, nil
	}
	return shm.New(), nil
}

// newPool is the generation process's pool memory: a shared-memory file
// the context process maps (shm), or memory UCX allocated, which its
// shared-memory and RDMA transports write with one copy (ucx).
func newPool(o Options, agent rdma.Agent) (*kvcache.Region, io.Closer, error) {
	if a, ok := agent.(*ucx.Agent); ok {
		return a.Alloc(o.PoolBytes)
	}
	return shm.NewRegion(regionName(o.Instance, os.Getpid()), o.PoolBytes)
}

// start starts this process's engine on agent (which the node then owns)
// and region (nil: the engine allocates its pool).
func start(ctx context.Context, o Options, agent rdma.Agent, region *kvcache.Region) (*node, error) {
	n := &node{down: make(chan struct{})}
	peer := messages.PeerID{Instance: o.Peer, Rank: 0}
	zc := zmq.Config{Bind: o.Bind, Peers: map[messages.PeerID]string{peer: o.PeerEndpoint},
		Insecure: o.Insecure, Logger: o.Log, HeartbeatInterval: o.Heartbeat, HeartbeatMisses: o.HeartbeatMisses}
	if !o.Insecure {
		zc.Curve = zmq.Curve{Secret: o.SecretKey, AllowedPeers: []string{o.PeerPublicKey},
			PeerServerKeys: map[messages.PeerID]string{peer: o.PeerPublicKey}, Identities: o.Identities}
	}
	var engp atomic.Pointer[kvxfer.Engine]
	zc.OnPeerDown = func(p messages.PeerID) {
		if e := engp.Load(); e != nil {
			e.PeerDown(p)
		}
		if p == peer {
			n.once.Do(func() { close(n.down) })
		}
	}
	link, err := zmq.New(zc)
	if err != nil {
		_ = agent.Close()
		return nil, err
	}
	n.link = link
	eng, err := kvxfer.Start(ctx, kvxfer.Config{Instance: o.Instance, Model: o.Model, Layout: o.Layout, TokensPerBlock: o.TokensPerBlock,
		PoolBytes: o.PoolBytes, Region: region, Workers: o.Workers, Agent: agent, Link: link,
		TransferTimeout: o.Timeout, DrainGrace: time.Second, Logger: &o.Log, TracePath: o.TracePath, MetricsAddr: o.MetricsAddr})
	if err != nil {
		_ = link.Close()
		_ = agent.Close()
		return nil, err
	}
	if a := eng.MetricsAddr(); a != "" {
		o.Log.Info().Str("url", "http://"+a+"/metrics").Msg("metrics")
	}
	n.eng = eng
	engp.Store(eng)
	n.closers = append(n.closers, agent)
	n.stop = make(chan struct{})
	n.watch.Add(1)
	go n.watchPeer(peer, o)
	return n, nil
}

// watchPeer logs, once, when the peer's Hello arrives: that it is there,
// or that it serves another model (naming both), so a deployment mistake
// shows at startup rather than as failed requests.
func (n *node) watchPeer(peer messages.PeerID, o Options) {
	defer n.watch.Done()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if h, err := n.link.Hello(peer); err == nil {
			if err := n.eng.CheckPeer(h); err != nil {
				o.Log.Error().Err(err).Msg("peer serves another model: every request with it will fail")
			} else {
				o.Log.Info().Str("peer", peer.String()).Str("model", h.Model).Msg("peer said Hello")
			}
			return
		}
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
	}
}

func (n *node) close() error {
	close(n.stop)
	n.watch.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := n.eng.Close(ctx)
	for _, c := range n.closers {
		err = errors.Join(err, c.Close())
	}
	return errors.Join(err, n.link.Close())
}

// RunGen is the generation role: receive every request, verify every byte,
// free, and report.
func RunGen(ctx context.Context, o Options, out io.Writer) (Report, error) {
	rep := Report{Role: "gen", Requests: o.Requests}
	if err := o.validate(); err != nil {
		return rep, err
	}
	if n, err := SweepStale(o.Instance); err != nil {
		o.Log.Warn().Err(err).Msg("sweeping stale pool files")
	} else if n > 0 {
		o.Log.Info().Int("files", n).Msg("removed pool files of dead generation processes")
	}
	agent, err := newAgent(o)
	if err != nil {
		return rep, err
	}
	region, rc, err := newPool(o, agent)
	if err != nil {
		_ = agent.Close()
		return rep, err
	}
	n, err := start(ctx, o, agent, region)
	if err != nil {
		_ = rc.Close()
		return rep, err
	}
	n.closers = append(n.closers, rc)
	t0 := time.Now()
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		rep.failed(err)
		mu.Unlock()
	}
	// Say where we wait, then wait (up to the transfer timeout) for the
	// context process's Hello: a peer that is not running, speaks with
	// another key or serves another model is named now, once, instead of
	// by every request at its deadline.
	peer := messages.PeerID{Instance: o.Peer, Rank: 0}
	o.Log.Info().Str("listening", n.link.Endpoint()).Str("peer", peer.String()).Str("peer_endpoint", o.PeerEndpoint).
		Msg("waiting for the context process")
	if err := waitPeer(ctx, n, peer, o); err != nil {
		o.Log.Error().Err(err).Msg("context process")
		for i := range Prompts(o) {
			fail(fmt.Errorf("%s: %w", RequestID(i), err))
		}
		return finish(n, rep, t0, out)
	}
	sem := make(chan struct{}, o.Concurrency)
	var wg sync.WaitGroup
	l := n.eng.Layout()
	var lat []time.Duration
	// Requests are opened in index order on both sides, so both pools
	// are allocated in one global order: the oldest unfinished request
	// always holds blocks on both sides and completes, and a full pool
	// cannot deadlock the pair (a serving router does the same by
	// admitting a request to prefill only once decode can take it).
	for i, pl := range Prompts(o) {
		sem <- struct{}{}
		select {
		case <-n.down:
			fail(fmt.Errorf("%s: context peer is down", RequestID(i)))
			<-sem
			continue
		default:
		}
		t := time.Now()
		h, err := n.eng.Receive(ctx, kvxfer.ReceiveRequest{ID: RequestID(i), PromptLen: pl, Context: o.Peer})
		if err != nil {
			fail(err)
			<-sem
			continue
		}
		wg.Add(1)
		go func(i, pl int) {
			defer func() { <-sem; wg.Done() }()
			res := <-h.Done()
			d := time.Since(t)
			if !res.OK {
				fail(fmt.Errorf("%s: %s: %v", RequestID(i), res.Status, res.Err))
				return
			}
			var verified uint64
			bad := 0
			for g, grp := range l.Groups {
				first, _ := kvcache.NeededRange(pl, grp.Window, l.TokensPerBlock, 0)
				geom := n.eng.Pools().Geometry(g)
				for bi, id := range res.Blocks[g] {
					off := geom.Offset + uint64(id)*geom.BlockBytes
					b := n.eng.Region().Bytes()[off : off+geom.BlockBytes]
					if demo.CheckBlock(b, i, g, first+bi) {
						verified += uint64(len(b))
					} else {
						bad++
					}
				}
			}
			err = n.eng.FreeBlocks(res.Blocks)
			mu.Lock()
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "ready %s\n", RequestID(i))
			}
			lat = append(lat, d)
			rep.OK++
			rep.Bytes += res.Bytes
			rep.BytesVerified += verified
			rep.Mismatches += bad
			mu.Unlock()
			if err != nil {
				fail(err)
			}
		}(i, pl)
	}
	wg.Wait()
	select {
	case <-n.down:
		rep.PeerDown = true
	default:
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		rep.LatencyP50Us = float64(lat[len(lat)/2].Nanoseconds()) / 1e3
		rep.LatencyP99Us = float64(lat[len(lat)*99/100].Nanoseconds()) / 1e3
	}
	return finish(n, rep, t0, out)
}

// RunCtx is the context role: prefill every request (simulated compute,
// pattern-filled KV), hand each chunk over with a fence as it completes,
// and report. If the generation peer goes down, outstanding requests are
// cancelled (they can no longer complete).
func RunCtx(ctx context.Context, o Options, out io.Writer) (Report, error) {
	rep := Report{Role: "ctx", Requests: o.Requests}
	if err := o.validate(); err != nil {
		return rep, err
	}
	agent, err := newAgent(o)
	if err != nil {
		return rep, err
	}
	n, err := start(ctx, o, agent, nil)
	if err != nil {
		return rep, err
	}
	t0 := time.Now()
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		rep.failed(err)
		mu.Unlock()
	}
	l := n.eng.Layout()
	sem := make(chan struct{}, o.Concurrency)
	var wg sync.WaitGroup
	for i, pl := range Prompts(o) {
		sem <- struct{}{}
		// Source blocks in index order (see RunGen).
		counts := make([]int, len(l.Groups))
		for g := range counts {
			counts[g] = l.BlocksFor(pl)
		}
		src, err := n.eng.Pools().AllocWait(ctx, counts)
		if err != nil {
			fail(err)
			<-sem
			continue
		}
		wg.Add(1)
		go func(i, pl int) {
			defer func() { <-sem; wg.Done() }()
			if err := ctxRequest(ctx, o, n, l, i, pl, src); err != nil {
				fail(err)
				return
			}
			mu.Lock()
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "done %s\n", RequestID(i))
			}
			rep.OK++
			mu.Unlock()
		}(i, pl)
	}
	wg.Wait()
	select {
	case <-n.down:
		rep.PeerDown = true
	default:
	}
	return finish(n, rep, t0, out)
}

func ctxRequest(ctx context.Context, o Options, n *node, l kvcache.Layout, i, pl int, src [][]kvcache.BlockID) error {
	tx, err := n.eng.Send(ctx, kvxfer.SendRequest{ID: RequestID(i), PromptLen: pl})
	if err != nil {
		_ = n.eng.Pools().Free(src)
		return err
	}
	chunks, err := kvcache.Chunks(pl, o.ChunkTokens, l.TokensPerBlock)
	if err != nil {
		tx.Cancel()
		<-tx.Done()
		_ = n.eng.Pools().Free(src)
		return err
	}
	region := n.eng.Region().Bytes()
	for _, c := range chunks {
		f := &kvxfer.ManualFence{}
		if err := tx.Chunk(c, c.Runs(l.TokensPerBlock, src), f); err != nil {
			f.Fire(err)
			break
		}
		t := time.Now()
		b0, b1 := c.Blocks(l.TokensPerBlock)
		for g := range l.Groups {
			geom := n.eng.Pools().Geometry(g)
			for b := b0; b < b1; b++ {
				off := geom.Offset + uint64(src[g][b])*geom.BlockBytes
				demo.FillBlock(region[off:off+geom.BlockBytes], i, g, b)
			}
		}
		if rest := o.Compute - time.Since(t); rest > 0 {
			time.Sleep(rest) // simulated prefill compute
		}
		f.Fire(nil)
		select {
		case <-n.down:
			tx.Cancel()
		default:
		}
	}
	var res kvxfer.Outcome
	select {
	case res = <-tx.Done():
	case <-n.down:
		tx.Cancel()
		res = <-tx.Done()
	}
	// Done fires only after every pin dropped: the source blocks are ours.
	if err := n.eng.Pools().Free(src); err != nil {
		return err
	}
	if !res.OK {
		return fmt.Errorf("%s: %s: %v", RequestID(i), res.Status, res.Err)
	}
	return nil
}

// errPeerSilent: the peer process said nothing within the wait.
var errPeerSilent = errors.New("proc: peer said nothing")

// waitPeer waits until peer's Hello arrives (polling with the transfer
// timeout as deadline) and checks it serves the same layout.
func waitPeer(ctx context.Context, n *node, peer messages.PeerID, o Options) error {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = kvxfer.DefaultTransferTimeout
	}
	deadline := time.Now().Add(timeout)
	for {
		h, err := n.link.Hello(peer)
		if err == nil {
			return n.eng.CheckPeer(h)
		}
		// A handshake the peer refused (a wrong key, one side insecure)
		// will not heal by waiting: name it now.
		if st, err := n.link.PeerState(peer); err == nil && st.Conn == zmq.ConnHandshakeFailed {
			return fmt.Errorf("%s at %s: %w", peer, o.PeerEndpoint, st.Err())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			how := "is it running, and do both sides use the same CURVE keys (or both --insecure)?"
			return fmt.Errorf("%w: %s at %s within %v: %s", errPeerSilent, peer, o.PeerEndpoint, timeout, how)
		}
		time.Sleep(10 * time.Millisecond) // poll with a deadline
	}
}

func finish(n *node, rep Report, t0 time.Time, out io.Writer) (Report, error) {
	rep.Seconds = time.Since(t0).Seconds()
	// A failed request's handle fires at its logical outcome; its pages
	// are released when its writers are quiescent. Close waits for every
	// session to drain, so what is still used after it is a leak.
	err := n.close()
	rep.LeakedBlocks = n.eng.Pools().Used()
	if out != nil {
		b, _ := json.Marshal(rep)
		fmt.Fprintln(out, string(b))
	}
	return rep, err
}
