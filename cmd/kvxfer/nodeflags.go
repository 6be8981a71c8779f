package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/internal/config"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
)

// renamed is an error of the node's or the engine's, reworded to name the
// flag (or the setting: flag, variable or YAML key) the user gave instead
// of the node's config field; it unwraps to the original, so that
// errors.Is(err, node.ErrConfig) still holds.
type renamed struct {
	msg string
	err error
}

func (e *renamed) Error() string { return e.msg }
func (e *renamed) Unwrap() error { return e.err }

// nodeSettings are the node's config fields ctx and gen fill from a common
// setting (a flag, KVXFER_ variable or YAML key: Settings.Invalid names
// whichever gave it).
var nodeSettings = map[string]string{
	"model":            config.Model,
	"pool_bytes":       config.Pool,
	"tokens_per_block": config.TokensPerBlock,
	"workers":          config.Workers,
	"backend":          config.Backend,
	"transfer_timeout": config.Timeout,
	"metrics_addr":     config.MetricsAddr,
}

// nodeFlags are the node's config fields ctx and gen fill from a flag of
// their own.
var nodeFlags = map[string]string{
	"instance":                "--instance",
	"peers[0].instance":       "--peer",
	"peers[0].endpoint":       "--peer-endpoint",
	"bind":                    "--bind",
	"device":                  "--device",
	"discovery":               "--discovery",
	"cluster":                 "--cluster",
	"discovery_ttl":           "--discovery-ttl",
	"discovery_ca":            "--discovery-ca",
	"discovery_cert":          "--discovery-cert",
	"discovery_key":           "--discovery-key",
	"discovery_user":          "--discovery-user",
	"discovery_password_file": "--discovery-password-file",
	"heartbeat_interval":      "--heartbeat",
	"heartbeat_misses":        "--heartbeat-misses",
	"writer_lease":            "--writer-lease",
}

// metricsAddrErr starts the engine's error for a metrics address it could
// not serve on (kvxfer.Start's, inside the node's).
const metricsAddrErr = "kvxfer: MetricsAddr: "

// nameFlags rewords a role's startup error that names a node config field
// ("node: bad config: pool_bytes = 1: holds no block: …"), the engine's
// config field ("kvxfer: MetricsAddr: …") or the node's bind endpoint
// ("node: gen/0: bind: control/zmq: endpoint in use: …") to name the flag
// or setting the user gave ("--pool = \"1\": holds no block: …", "--bind:
// control/zmq: endpoint in use: …"). Any other error, and one of a field
// no flag sets, is returned as it is.
func (f *roleFlags) nameFlags(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if _, rest, ok := strings.Cut(msg, metricsAddrErr); ok && f.settings != nil {
		return &renamed{msg: f.settings.Invalid(config.MetricsAddr, rest).Error(), err: err}
	}
	if why, ok := bindErr(msg); ok && (errors.Is(err, zmq.ErrEndpointInUse) || errors.Is(err, zmq.ErrConfig)) {
		return &renamed{msg: "--bind: " + why, err: err}
	}
	rest, ok := strings.CutPrefix(msg, node.ErrConfig.Error()+": ")
	if !ok || !errors.Is(err, node.ErrConfig) {
		return err
	}
	field, value, ok := strings.Cut(rest, " = ")
	if !ok {
		return err
	}
	if key, ok := nodeSettings[field]; ok && f.settings != nil {
		// The value as the node prints it, then the reason: the setting's
		// own error quotes the value as the user gave it.
		if _, why, ok := strings.Cut(value, ": "); ok {
			return &renamed{msg: f.settings.Invalid(key, why).Error(), err: err}
		}
	}
	if p, ok := map[string]struct {
		tp, pp string
		n      node.Parallel
	}{"parallel": {"--tp", "--pp", f.o.Parallel}, "peers[0].parallel": {"--peer-tp", "--peer-pp", f.o.PeerParallel}}[field]; ok {
		if _, why, ok := strings.Cut(value, ": "); ok {
			return &renamed{msg: fmt.Sprintf("%s = %d, %s = %d: %s", p.tp, p.n.TP, p.pp, p.n.PP, why), err: err}
		}
	}
	if flag, ok := nodeFlags[field]; ok {
		return &renamed{msg: flag + " = " + value, err: err}
	}
	return err
}

// bindErr is the reason of node.Open's refusal of its bind endpoint
// (zmq.CheckBindFree's error, before the pool is allocated): msg is
// "node: <instance/rank>: bind: <why>".
func bindErr(msg string) (why string, ok bool) {
	rest, ok := strings.CutPrefix(msg, "node: ")
	if !ok {
		return "", false
	}
	if _, rest, ok = strings.Cut(rest, ": "); !ok {
		return "", false
	}
	return strings.CutPrefix(rest, "bind: ")
}

// checkTokensPerBlock refuses a --tokens-per-block (or its variable or
// YAML key) the model's layout cannot take, naming it: the node refuses
// it as its parallel field's error ("parallel = {TP:1 PP:1}: kvcache: bad
// layout: TokensPerBlock = …"). An unknown model is named elsewhere.
func checkTokensPerBlock(s *config.Settings) error {
	if s.TokensPerBlock <= 0 {
		return nil
	}
	l, err := kvcache.Preset(s.Model)
	if err != nil {
		return nil
	}
	if err := l.WithTokensPerBlock(s.TokensPerBlock).Validate(); err != nil {
		return s.Invalid(config.TokensPerBlock, err.Error())
	}
	return nil
}
