package rdmabench

import (
	"fmt"
	"slices"
	"time"
)

// Config sets how Measure samples.
type Config struct {
	// Rounds is how many times the backend and the copy alternate
	// (default 5).
	Rounds int
	// MinBytes is the least each sample moves (default 256 MiB); a sample
	// is at least one operation.
	MinBytes uint64
	// Peer, when set, is the command of a receiver process (see
	// NewPeerRig); otherwise the receiver is in this process.
	Peer []string
	// Pause, when set, idles the rig that long before each backend sample,
	// so that the sample is a burst after a pause (threads asleep, as
	// between a serving process's requests) rather than part of a stream.
	Pause time.Duration
}

// Result is one shape's measurement: medians over the rounds.
type Result struct {
	Backend   string `json:"backend"`
	SizeBytes uint64 `json:"size_bytes"`
	Segments  int    `json:"segments"`
	// Slots is the shape's Slots where above 1: the operations rotated over
	// that many distinct source and destination places.
	Slots           int     `json:"slots,omitempty"`
	BytesPerSec     float64 `json:"bytes_per_sec"`
	CopyBytesPerSec float64 `json:"copy_bytes_per_sec"`
	// Ratio is BytesPerSec / CopyBytesPerSec.
	Ratio          float64 `json:"ratio"`
	SegmentsPerSec float64 `json:"segments_per_sec"`
	Rounds         int     `json:"rounds"`
	OpsPerSample   int     `json:"ops_per_sample"`
	// PeerProcess: the receiver was another process.
	PeerProcess bool `json:"peer_process,omitempty"`
	// PauseSeconds is Config.Pause: how long the rig idled before each
	// backend sample.
	PauseSeconds float64 `json:"pause_seconds,omitempty"`
}

// SlotsFor is how many slots of shape s's operation span at least span
// bytes (at least one): the Slots of a rig whose bytes must not stay in a
// cache.
func SlotsFor(s Shape, span uint64) int {
	op := max(s.Bytes(), 1)
	return int(max(1, min((span+op-1)/op, 1<<30)))
}

// Measure builds a rig for backend and shape s, warms it, then alternates a
// backend sample and a copy sample cfg.Rounds times, and reports the median
// rate of each. It checks the bytes landed.
func Measure(backend string, s Shape, cfg Config) (Result, error) {
	if cfg.Rounds <= 0 {
		cfg.Rounds = 5
	}
	if cfg.MinBytes == 0 {
		cfg.MinBytes = 256 << 20
	}
	var r *Rig
	var err error
	if cfg.Peer != nil {
		r, err = NewPeerRig(backend, s, cfg.Peer)
	} else {
		r, err = NewRig(backend, s)
	}
	if err != nil {
		return Result{}, err
	}
	defer r.Close()

	opBytes := s.Bytes()
	ops := int(max(1, (cfg.MinBytes+opBytes-1)/opBytes))
	// Warm up: fault every page in, start the goroutines.
	if err := r.Run(min(ops, r.Window())); err != nil {
		return Result{}, fmt.Errorf("rdmabench: %s warm-up: %w", backend, err)
	}
	r.Copy(1)

	rates := make([]float64, 0, cfg.Rounds)
	copyRates := make([]float64, 0, cfg.Rounds)
	for range cfg.Rounds {
		if cfg.Pause > 0 {
			time.Sleep(cfg.Pause)
		}
		start := time.Now()
		if err := r.Run(ops); err != nil {
			return Result{}, fmt.Errorf("rdmabench: %s: %w", backend, err)
		}
		rates = append(rates, rate(ops, opBytes, time.Since(start)))
		start = time.Now()
		r.Copy(ops)
		copyRates = append(copyRates, rate(ops, opBytes, time.Since(start)))
	}
	// The check's own round, untimed, over scribbled destinations: the
	// warm-up wrote every slot with the bytes each operation writes, so
	// a check of the timed rounds' slots would pass had they moved
	// nothing (a review's mutation). Scribbling before a timed round
	// would time its writes into freshly written memory instead.
	r.Scribble()
	if err := r.Run(ops); err != nil {
		return Result{}, fmt.Errorf("rdmabench: %s: verifying round: %w", backend, err)
	}
	r.Copy(ops)
	if err := r.Verify(); err != nil {
		return Result{}, err
	}
	res := Result{
		Backend:         backend,
		SizeBytes:       s.SegmentBytes,
		Segments:        s.Segments,
		Slots:           s.Slots,
		BytesPerSec:     Median(rates),
		CopyBytesPerSec: Median(copyRates),
		Rounds:          cfg.Rounds,
		OpsPerSample:    ops,
		PeerProcess:     cfg.Peer != nil,
		PauseSeconds:    cfg.Pause.Seconds(),
	}
	res.Ratio = res.BytesPerSec / res.CopyBytesPerSec
	res.SegmentsPerSec = res.BytesPerSec / float64(s.SegmentBytes)
	return res, nil
}

func rate(ops int, opBytes uint64, d time.Duration) float64 {
	return float64(ops) * float64(opBytes) / max(d.Seconds(), 1e-9)
}

// Median is the median of xs (the mean of the middle two for an even
// count; 0 for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}
