package metrics

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric name.
const Namespace = "kvxfer"

// Values of the side label.
const (
	SideTx = "tx" // the context (sending) side
	SideRx = "rx" // the generation (receiving) side
)

// Buckets of the two histograms, in seconds.
var (
	// TransferBuckets spans a small request on shared memory (100 µs) to
	// one that runs into a deadline (60 s).
	TransferBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	// ChunkWriteBuckets spans one small write (10 µs) to a write queued
	// behind a slow backend (10 s).
	ChunkWriteBuckets = []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10}
)

// Set is one engine's metrics, registered in a registry of its own (never
// the process-wide default one), every series labelled engine=<name>. The
// vectors are exported so that an engine can pre-resolve its label
// children once; their label values are documented in doc.go.
type Set struct {
	engine string
	reg    *prometheus.Registry
	// rejects publishes FramesRejected and the sources added to it.
	rejects *rejectCollector
	wrap    prometheus.Registerer // reg, adding the engine label

	// BytesTransferred (side): bytes written and proven landed (tx), or
	// reported written by the writers' Results (rx).
	BytesTransferred *prometheus.CounterVec
	// TransferDuration (side, outcome): Send → Done (tx), Receive → the
	// outcome (rx).
	TransferDuration *prometheus.HistogramVec
	// ChunkWriteLatency: a chunk handed over → one of its ops BACKEND_DONE.
	ChunkWriteLatency prometheus.Histogram
	// Ops (state): ops of live tx sessions by state.
	Ops *prometheus.GaugeVec
	// OpsInDoubt: Ops{state="IN_DOUBT"}, for alerting.
	OpsInDoubt prometheus.Gauge
	// Sessions (side, state): live sessions by state.
	Sessions *prometheus.GaugeVec
	// Failures (side, reason): sessions that ended without success.
	Failures *prometheus.CounterVec
	// FramesRejected (reason): control frames dropped or refused.
	FramesRejected *prometheus.CounterVec
	// HeartbeatMisses (peer): peers the control plane declared down
	// (count them with PeerDown, which bounds the series).
	HeartbeatMisses *prometheus.CounterVec

	peersMu sync.Mutex
	peers   map[string]struct{} // HeartbeatMisses' peer values (PeerDown)
}

// MaxPeerSeries bounds the peer label's values of HeartbeatMisses: peers
// past it are counted under OtherPeer. A peer's name is its to choose (one
// name per pod or restart, or any name at all on an insecure link), and
// the link forgets the names of peers long down (its directory is
// bounded); a series per name ever declared down would grow the registry
// and every scrape for the engine's life.
const MaxPeerSeries = 256

// OtherPeer is the peer label of HeartbeatMisses for the peers past
// MaxPeerSeries.
const OtherPeer = "other"

// PeerDown counts peer ("instance/rank") declared down by the control
// plane, under its own label while fewer than MaxPeerSeries peers have
// one, else under OtherPeer.
func (s *Set) PeerDown(peer string) {
	s.peersMu.Lock()
	if _, ok := s.peers[peer]; !ok {
		if len(s.peers) < MaxPeerSeries {
			if s.peers == nil {
				s.peers = map[string]struct{}{}
			}
			s.peers[peer] = struct{}{}
		} else {
			peer = OtherPeer
		}
	}
	s.peersMu.Unlock()
	s.HeartbeatMisses.WithLabelValues(peer).Inc()
}

// New makes the metric set of engine (its "instance/rank") in a fresh
// registry.
func New(engine string) *Set {
	reg := prometheus.NewRegistry()
	s := &Set{engine: engine, reg: reg,
		wrap: prometheus.WrapRegistererWith(prometheus.Labels{"engine": engine}, reg)}
	s.BytesTransferred = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace,
		Name: "bytes_transferred_total", Help: "KV-cache bytes transferred, by side (tx: written and landed; rx: reported by the writers)."},
		[]string{"side"})
	s.TransferDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace,
		Name: "transfer_duration_seconds", Help: "Request duration, by side and outcome (tx: Send to Done; rx: Receive to the outcome).",
		Buckets: TransferBuckets}, []string{"side", "outcome"})
	s.ChunkWriteLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace,
		Name: "chunk_write_latency_seconds", Help: "From a chunk handed over to one of its ops BACKEND_DONE (successful writes only).",
		Buckets: ChunkWriteBuckets})
	s.Ops = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace,
		Name: "ops", Help: "Ops of live tx sessions, by state."}, []string{"state"})
	s.OpsInDoubt = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace,
		Name: "ops_in_doubt", Help: "Ops whose outcome is unknown until their endpoint is flushed or closed."})
	s.Sessions = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace,
		Name: "sessions", Help: "Live sessions by side and state (a terminal state: decided, still draining)."},
		[]string{"side", "state"})
	s.Failures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace,
		Name: "failures_total", Help: "Requests that ended without success, by side and reason."},
		[]string{"side", "reason"})
	s.FramesRejected = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace,
		Name: "frames_rejected_total", Help: "Control frames rejected or dropped, by reason; stale: too late to act on (for a request finished or unknown here, of an earlier incarnation, a duplicate or another epoch), the frames kvxfer.Stats.FramesStale counts."}, []string{"reason"})
	s.HeartbeatMisses = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace,
		Name: "heartbeat_misses_total", Help: "Peers the control plane declared down (missed heartbeats), by peer."},
		[]string{"peer"})
	s.rejects = &rejectCollector{vec: s.FramesRejected}
	s.wrap.MustRegister(s.BytesTransferred, s.TransferDuration, s.ChunkWriteLatency, s.Ops, s.OpsInDoubt,
		s.Sessions, s.Failures, s.rejects, s.HeartbeatMisses)
	return s
}

// AddRejectSource adds counts kept elsewhere (the control link's refusals,
// by reason; counts only grow) to kvxfer_frames_rejected_total: each scrape
// adds what each reason grew by since the last.
func (s *Set) AddRejectSource(f func() map[string]int64) {
	s.rejects.mu.Lock()
	defer s.rejects.mu.Unlock()
	s.rejects.srcs = append(s.rejects.srcs, rejectSource{read: f, last: map[string]int64{}})
}

// rejectCollector is FramesRejected plus the sources it syncs at Collect.
type rejectCollector struct {
	vec  *prometheus.CounterVec
	mu   sync.Mutex
	srcs []rejectSource
}

type rejectSource struct {
	read func() map[string]int64
	last map[string]int64
}

func (c *rejectCollector) Describe(ch chan<- *prometheus.Desc) { c.vec.Describe(ch) }

func (c *rejectCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	for _, src := range c.srcs {
		for reason, n := range src.read() {
			if d := n - src.last[reason]; d > 0 {
				c.vec.WithLabelValues(reason).Add(float64(d))
			}
			src.last[reason] = n
		}
	}
	c.mu.Unlock()
	c.vec.Collect(ch)
}

// Engine is the engine label's value.
func (s *Set) Engine() string { return s.engine }

// Registry is the set's registry, for an embedder who gathers it into its
// own exposition (or registers more collectors, such as the Go runtime's).
func (s *Set) Registry() *prometheus.Registry { return s.reg }

// Handler serves the set in the Prometheus text (or negotiated) format.
func (s *Set) Handler() http.Handler { return Handler(s.reg) }

// CounterFunc registers the counter Namespace_name whose value f reads at
// each scrape: a monotonically increasing count kept elsewhere costs
// nothing between scrapes.
func (s *Set) CounterFunc(name, help string, f func() float64) error {
	return s.wrap.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, f))
}

// CounterFuncs registers the counter Namespace_name with one series per
// value of label, values[i] read from f(i) at each scrape: CounterFunc
// for a count kept elsewhere by a label known when the engine starts.
func (s *Set) CounterFuncs(name, help, label string, values []string, f func(i int) float64) error {
	for i, v := range values {
		if err := s.wrap.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help,
			ConstLabels: prometheus.Labels{label: v}}, func() float64 { return f(i) })); err != nil {
			return err
		}
	}
	return nil
}

// GaugeFunc registers the gauge Namespace_name whose value f reads at each
// scrape.
func (s *Set) GaugeFunc(name, help string, f func() float64) error {
	return s.wrap.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, f))
}

// Quarantine registers kvxfer_quarantined_bytes (the bytes of destination
// blocks held in quarantine: their request failed while a writer had given
// no proof that its writes are over) and kvxfer_quarantine_limit_bytes
// (the bound past which new requests wait), both sampled from f at scrape.
func (s *Set) Quarantine(bytes, limit func() float64) error {
	if err := s.wrap.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "quarantined_bytes",
		Help: "Bytes of destination blocks in quarantine (request failed without proof that its writers stopped); sampled at scrape."}, bytes)); err != nil {
		return err
	}
	return s.wrap.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "quarantine_limit_bytes",
		Help: "Quarantined bytes past which new requests wait for destination blocks."}, limit))
}

// Handler serves the union of gatherers — for example the sets of several
// engines of one process on one port (their engine labels keep the series
// apart).
func Handler(gs ...prometheus.Gatherer) http.Handler {
	var g prometheus.Gatherer = prometheus.Gatherers(gs)
	if len(gs) == 1 {
		g = gs[0]
	}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
