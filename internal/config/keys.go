package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Key is one setting: its name is also its flag (--NAME) and its YAML key;
// its environment variable is Env.
type Key struct {
	Name string
	Env  string
	// Type is what the flag's help shows after the flag ("int", "size").
	Type string
	// Default is the value when no source sets one and the command gives
	// no default of its own ("" leaves the setting unset).
	Default string
	// DefaultDoc is the default as the documentation states it, when it
	// differs by command.
	DefaultDoc string
	Usage      string
	// apply parses raw into s and returns why it is invalid ("" when it
	// is valid).
	apply func(s *Settings, raw string) string
}

// Backends are the data-plane names the backend key accepts; a command
// narrows them (kvxfer ctx needs a cross-process one; only kvxfer ctx and
// gen run cudaipc).
var Backends = []string{"loopback", "shm", "ucx", "cudaipc"}

// LogLevels are the names the log-level key accepts.
var LogLevels = []string{"trace", "debug", "info", "warn", "error", "disabled"}

// Names of the keys, for Loader.Load and AddFlags.
const (
	Model          = "model"
	Pool           = "pool"
	TokensPerBlock = "tokens-per-block"
	Workers        = "workers"
	Backend        = "backend"
	Timeout        = "timeout"
	LogLevel       = "log-level"
	MetricsAddr    = "metrics-addr"
	// CurveIdentities binds CURVE public keys to what each may speak for.
	CurveIdentities = "curve-identities"
)

// ConfigEnv names the YAML file when --config is not given.
const ConfigEnv = "KVXFER_CONFIG"

// Keys are every key, in documentation order.
var Keys = []Key{
	{Name: Model, Env: "KVXFER_MODEL", Type: "name", Default: "Llama-3.1-8B",
		Usage: "model preset (" + strings.Join(kvcache.Presets(), ", ") + ")",
		apply: func(s *Settings, raw string) string {
			l, err := kvcache.Preset(raw)
			if err != nil {
				return "unknown model (known: " + strings.Join(kvcache.Presets(), ", ") + ")"
			}
			s.Model = l.Name
			return ""
		}},
	{Name: Pool, Env: "KVXFER_POOL", Type: "size",
		DefaultDoc: "demo: 2GiB; ctx, gen: 1GiB; bench: sized to the scenario",
		Usage:      "each engine's block pool size (4096, 64KiB, 1.5GiB; a decimal rounds down to whole bytes)",
		apply: func(s *Settings, raw string) string {
			n, why := parseSize(raw)
			s.Pool = n
			return why
		}},
	{Name: TokensPerBlock, Env: "KVXFER_TOKENS_PER_BLOCK", Type: "int",
		DefaultDoc: fmt.Sprintf("the preset's (%d); bench small, fragmented: 16", kvcache.DefaultTokensPerBlock),
		Usage:      "tokens per KV block, overriding the preset's",
		apply: func(s *Settings, raw string) string {
			n, why := positiveInt(raw)
			s.TokensPerBlock = n
			return why
		}},
	{Name: Workers, Env: "KVXFER_WORKERS", Type: "int", Default: "4",
		Usage: fmt.Sprintf("sender workers per engine (1 to %d)", kvxfer.MaxWorkers),
		apply: func(s *Settings, raw string) string {
			n, why := positiveInt(raw)
			if why == "" && n > kvxfer.MaxWorkers {
				return fmt.Sprintf("at most %d (kvxfer.MaxWorkers)", kvxfer.MaxWorkers)
			}
			s.Workers = n
			return why
		}},
	{Name: Backend, Env: "KVXFER_BACKEND", Type: "name",
		DefaultDoc: "demo, bench: loopback; ctx, gen, bench raw: shm",
		Usage:      "data plane: " + strings.Join(Backends, ", ") + " (each command says which it runs)",
		apply: func(s *Settings, raw string) string {
			for _, b := range Backends {
				if raw == b {
					s.Backend = raw
					return ""
				}
			}
			return "unknown backend (known: " + strings.Join(Backends, ", ") + ")"
		}},
	{Name: Timeout, Env: "KVXFER_TIMEOUT", Type: "duration",
		DefaultDoc: "demo: 5m; ctx, gen, bench: 1m",
		Usage:      "per-request transfer timeout (30s, 5m)",
		apply: func(s *Settings, raw string) string {
			d, err := time.ParseDuration(raw)
			switch {
			case err != nil:
				return "not a duration such as 30s or 5m"
			case d <= 0:
				return "must be positive"
			}
			s.Timeout = d
			return ""
		}},
	{Name: LogLevel, Env: "KVXFER_LOG_LEVEL", Type: "level", Default: "info",
		Usage: "log level: " + strings.Join(LogLevels, ", "),
		apply: func(s *Settings, raw string) string {
			for _, name := range LogLevels {
				if strings.EqualFold(raw, name) {
					s.LogLevel, _ = zerolog.ParseLevel(name)
					return ""
				}
			}
			return "unknown level (want " + strings.Join(LogLevels, ", ") + ")"
		}},
	{Name: MetricsAddr, Env: "KVXFER_METRICS_ADDR", Type: "host:port",
		DefaultDoc: "none (no metrics)",
		Usage:      "serve Prometheus metrics on http://HOST:PORT/metrics (port 0 picks a free one)",
		apply: func(s *Settings, raw string) string {
			host, port, err := net.SplitHostPort(raw)
			if err != nil {
				return "not a host:port such as 127.0.0.1:9464"
			}
			if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
				return "port " + strconv.Quote(port) + " is not a number from 0 to 65535"
			}
			_ = host // empty: every interface
			s.MetricsAddr = raw
			return ""
		}},
	{Name: CurveIdentities, Env: "KVXFER_CURVE_IDENTITIES", Type: "list",
		DefaultDoc: "none (each peer key is bound to that peer only)",
		Usage:      "CURVE public keys and what each may speak for: INSTANCE[/RANKS]=KEY, separated by ';' (gen/0-3=KEY; ctx=KEY2; no ranks: every rank)",
		apply: func(s *Settings, raw string) string {
			ids, why := parseIdentities(raw)
			s.CurveIdentities = ids
			return why
		}},
}

// KeyNamed returns the key called name.
func KeyNamed(name string) (Key, bool) {
	for _, k := range Keys {
		if k.Name == name {
			return k, true
		}
	}
	return Key{}, false
}

func keyByEnv(env string) (Key, bool) {
	for _, k := range Keys {
		if k.Env == env {
			return k, true
		}
	}
	return Key{}, false
}

func positiveInt(raw string) (int, string) {
	n, err := strconv.Atoi(strings.TrimSpace(raw))
	switch {
	case err != nil:
		return 0, "not an integer"
	case n < 1:
		return 0, "must be at least 1"
	}
	return n, ""
}
