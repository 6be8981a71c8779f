package actors

import (
	"strings"

	"github.com/rs/zerolog"
)

// warn returns a warning event about peer of a kind, or nil (zerolog's
// disabled event: every call on it is a no-op) when the engine's throttle
// holds it back. A hostile or unreachable peer cannot flood the log; what
// is held back is counted into the next line let through ("held_back"),
// and every event is still counted by the metrics.
func (env *shellEnv) warn(peer, kind string) *zerolog.Event {
	ok, held := env.throttle.Allow(env.clock.Now(), peer, kind)
	if !ok {
		return nil
	}
	ev := env.log.Warn()
	if held > 0 {
		ev = ev.Int("held_back", held)
	}
	return ev
}

// logEffect writes a step's Log effect; warnings go through the throttle,
// keyed by their kind (the message without the request id: "tx session
// FAILED"), so that a burst of failed requests logs a few lines and a count.
func (env *shellEnv) logEffect(e Log) {
	var ev *zerolog.Event
	switch e.Level {
	case "warn":
		ev = env.warn("", logKind(e.Msg))
	case "error":
		ev = env.log.Error()
	case "debug":
		ev = env.log.Debug()
	default:
		ev = env.log.Info()
	}
	ev.Err(e.Err).Msg(e.Msg)
}

// logKind is a log message's kind: its first two words and its last.
func logKind(msg string) string {
	f := strings.Fields(msg)
	if len(f) <= 3 {
		return msg
	}
	return f[0] + " " + f[1] + " " + f[len(f)-1]
}
