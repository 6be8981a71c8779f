package capi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"time"
	"unicode/utf8"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/internal/gcfloor"
	quotepkg "github.com/kvxfer/kvxfer/internal/quote"
	"github.com/kvxfer/kvxfer/kvcache"
)

// Config is an engine's JSON config (kvxfer_engine_open). Zero values take
// kvxfer.Config's defaults.
type Config struct {
	Instance       string  `json:"instance"`
	Model          string  `json:"model"`
	Layout         *Layout `json:"layout"`
	TokensPerBlock int     `json:"tokens_per_block"`
	TP             int     `json:"tp"`
	PP             int     `json:"pp"`
	// PPStages is each pipeline stage's layer count, comma-separated,
	// when the framework splits the layers otherwise than kvxfer's
	// default (kvcache.Parallel.Stages).
	PPStages          string `json:"pp_stages"`
	RankTP            int    `json:"rank_tp"`
	RankPP            int    `json:"rank_pp"`
	PoolBytes         uint64 `json:"pool_bytes"`
	Workers           int    `json:"workers"`
	TransferTimeoutMs int64  `json:"transfer_timeout_ms"`
	DrainGraceMs      int64  `json:"drain_grace_ms"`
	Backend           string `json:"backend"`
	MetricsAddr       string `json:"metrics_addr"`
	// Memory, when set, is the framework's KV memory (Memory); the engine
	// then takes no pool.
	Memory *Memory `json:"memory"`
	// PoolDevice is node's "pool_device" key, here only to be refused by
	// name (Open): the engine's pool is host memory.
	PoolDevice json.RawMessage `json:"pool_device"`
}

// Layout is kvcache.Layout in JSON.
type Layout struct {
	Name           string  `json:"name"`
	Layers         int     `json:"layers"`
	KVHeads        int     `json:"kv_heads"`
	HeadDim        int     `json:"head_dim"`
	DTypeBytes     int     `json:"dtype_bytes"`
	TokensPerBlock int     `json:"tokens_per_block"`
	MLA            bool    `json:"mla"`
	Groups         []Group `json:"groups"`
}

// Group is kvcache.LayerGroup in JSON; no groups means one full-attention
// group of every layer.
type Group struct {
	Name   string `json:"name"`
	Layers []int  `json:"layers"`
	Window int    `json:"window"`
}

// kv is l as a kvcache.Layout.
func (l *Layout) kv() *kvcache.Layout {
	k := kvcache.Layout{Name: l.Name, Layers: l.Layers, KVHeads: l.KVHeads, HeadDim: l.HeadDim,
		DTypeBytes: l.DTypeBytes, TokensPerBlock: l.TokensPerBlock, MLA: l.MLA}
	if len(l.Groups) == 0 && l.Layers >= 0 && l.Layers <= kvcache.MaxLayers {
		// Layers outside [0, MaxLayers] are left to the layout's check
		// (naming them, before it looks at the groups), not built into a
		// group: a negative count is a negative slice capacity (a panic),
		// a huge one gigabytes of layer indices (the runtime's fatal out
		// of memory, which ends the caller's process).
		k.Groups = kvcache.FullAttention(l.Layers)
	}
	for _, g := range l.Groups {
		k.Groups = append(k.Groups, kvcache.LayerGroup{Name: g.Name, Layers: g.Layers, Window: g.Window})
	}
	return &k
}

// ParseConfig decodes a JSON config strictly: an unknown key, a value of
// the wrong type or trailing data is an error naming it.
func ParseConfig(js string) (Config, error) {
	var c Config
	if js == "" {
		return c, errorf(ErrConfig, "config JSON is empty")
	}
	if err := checkUTF8("config JSON", js); err != nil {
		return c, err
	}
	d := json.NewDecoder(bytes.NewReader([]byte(js)))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		return c, errorf(ErrConfig, "config JSON %s: %v", quote(js), quotepkg.JSON(err))
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return c, errorf(ErrConfig, "config JSON %s: data after the object", quote(js))
	}
	return c, nil
}

// checkUTF8 refuses a config (what names it) that is not UTF-8, naming
// the first bad byte: encoding/json would replace each bad byte with
// U+FFFD and so rename what the caller named ("instance":"ctx-\xff" an
// engine "ctx-\uFFFD", which a request naming the instance as the caller
// spells it never finds).
func checkUTF8(what, js string) error {
	if utf8.ValidString(js) {
		return nil
	}
	i := 0
	for i < len(js) {
		r, n := utf8.DecodeRuneInString(js[i:])
		if r == utf8.RuneError && n == 1 {
			break
		}
		i += n
	}
	return errorf(ErrConfig, "%s is not valid UTF-8: byte %d (%#x) of %s", what, i, js[i], quote(js))
}

// fillFromEnv sets *workers and *backend from KVXFER_WORKERS and
// KVXFER_BACKEND where they are unset (0, ""): a value the JSON gives wins,
// as a flag does over a variable on the CLI (docs/configuration.md). An
// empty variable counts as unset; a bad one is named, even where the JSON
// overrides it, as the CLI checks every source.
//
// It also sets the Go collector's heap floor (internal/gcfloor; GOGC or
// KVXFER_GC_FLOOR=off keep the runtime's default): the Go runtime inside
// libkvxfer is kvxfer's alone, so its heap is kvxfer's few MB, and a
// collection every few hundred requests would be the control path's tail.
func fillFromEnv(workers *int, backend *string) error {
	if _, err := gcfloor.FromEnv(); err != nil {
		return &Error{Code: ErrConfig, Err: err}
	}
	gcfloor.Warm()
	env, err := (kvxfer.Config{}).WithEnv()
	if err != nil {
		return &Error{Code: ErrConfig, Err: err}
	}
	if v := os.Getenv("KVXFER_WORKERS"); v != "" && env.Workers < 1 {
		return errorf(ErrConfig, "KVXFER_WORKERS = %s: must be ≥ 1", quote(v))
	}
	if *workers == 0 {
		*workers = env.Workers
	}
	if *backend == "" {
		*backend = env.Backend
	}
	return nil
}

// engineConfig is c as a kvxfer.Config.
func (c Config) engineConfig() (kvxfer.Config, error) {
	// A time.Duration holds about 292 years; more milliseconds would wrap
	// (a "practically infinite" timeout becoming a few µs, or 0: the
	// default).
	const maxMs = int64(math.MaxInt64 / int64(time.Millisecond))
	for _, f := range []struct {
		name string
		ms   int64
	}{{"transfer_timeout_ms", c.TransferTimeoutMs}, {"drain_grace_ms", c.DrainGraceMs}} {
		if f.ms < 0 || f.ms > maxMs {
			return kvxfer.Config{}, errorf(ErrConfig, "%s = %d: must be in [0, %d] (0: the default)", f.name, f.ms, maxMs)
		}
	}
	if c.TokensPerBlock < 0 {
		return kvxfer.Config{}, errorf(ErrConfig, "tokens_per_block = %d: must be ≥ 0 (0: the layout's)", c.TokensPerBlock)
	}
	kc := kvxfer.Config{
		Instance: c.Instance, Model: c.Model, TokensPerBlock: c.TokensPerBlock,
		Parallel: kvcache.Parallel{TP: c.TP, PP: c.PP, Stages: c.PPStages}, Rank: kvcache.Rank{TP: c.RankTP, PP: c.RankPP},
		PoolBytes: c.PoolBytes, Workers: c.Workers, Backend: c.Backend, MetricsAddr: c.MetricsAddr,
		TransferTimeout: time.Duration(c.TransferTimeoutMs) * time.Millisecond,
		DrainGrace:      time.Duration(c.DrainGraceMs) * time.Millisecond,
	}
	if err := fillFromEnv(&kc.Workers, &kc.Backend); err != nil {
		return kc, err
	}
	if c.Layout != nil {
		if c.Model != "" { // as kvxfer_node_open: one of them would be ignored
			return kc, errorf(ErrConfig, "layout and model = %s: give one", quote(c.Model))
		}
		kc.Layout = c.Layout.kv()
	}
	if kc.Parallel.TP == 0 && kc.Parallel.PP != 0 {
		kc.Parallel.TP = 1
	}
	if kc.Parallel.PP == 0 && kc.Parallel.TP != 0 {
		kc.Parallel.PP = 1
	}
	return kc, nil
}
