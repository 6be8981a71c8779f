package actors

import (
	"time"

	"github.com/rs/zerolog"
)

// logSampler rate-limits warnings per (peer, kind): the first of a kind
// for a peer is logged, then at most one per period, carrying how many were
// suppressed since the last. A hostile or unreachable peer cannot flood the
// log; every event is still counted by the caller's metrics. It is owned by
// one actor (no lock). The table is bounded: past maxKeys it forgets
// everything and starts again, which at worst logs a few lines more.
type logSampler struct {
	period time.Duration
	clock  func() time.Time
	last   map[sampleKey]*sampleState
}

type sampleKey struct{ peer, kind string }

type sampleState struct {
	at         time.Time
	suppressed int
}

const (
	logSamplePeriod = 5 * time.Second
	logSampleKeys   = 4096
)

func newLogSampler(clock func() time.Time) *logSampler {
	return &logSampler{period: logSamplePeriod, clock: clock, last: map[sampleKey]*sampleState{}}
}

// event returns the event to log for (peer, kind) at level warn, or nil
// (zerolog's disabled event, on which every call is a no-op) when it is
// suppressed.
func (l *logSampler) event(log zerolog.Logger, peer, kind string) *zerolog.Event {
	now := l.clock()
	k := sampleKey{peer, kind}
	st := l.last[k]
	if st != nil && now.Sub(st.at) < l.period {
		st.suppressed++
		return nil
	}
	if st == nil {
		if len(l.last) >= logSampleKeys {
			clear(l.last)
		}
		st = &sampleState{}
		l.last[k] = st
	}
	ev := log.Warn()
	if st.suppressed > 0 {
		ev = ev.Int("suppressed", st.suppressed)
	}
	st.at, st.suppressed = now, 0
	return ev
}
