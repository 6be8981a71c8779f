package capi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control/zmq"
	quotepkg "github.com/kvxfer/kvxfer/internal/quote"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
)

// OpenNode opens a node (package node: control link with CURVE, data plane,
// pool memory peers can write, heartbeats) from its JSON config
// (nodeConfig) and returns it as an engine handle: every engine call works
// on it, and Close closes the node.
//
// An error quotes at most the first 64 bytes of a long config value
// (clipConfig): node's own messages name some whole (discovery file
// names, the parallelism with its stages).
func OpenNode(configJSON string) (*Engine, uint64, error) {
	e, h, err := openNode(configJSON)
	return e, h, clipConfig(err, configJSON)
}

func openNode(configJSON string) (*Engine, uint64, error) {
	if configJSON == "" {
		return nil, 0, errorf(ErrConfig, "node config JSON is empty")
	}
	cfg, err := nodeConfig(configJSON)
	if err != nil {
		return nil, 0, err
	}
	if err := fillFromEnv(&cfg.Workers, &cfg.Backend); err != nil {
		return nil, 0, err
	}
	// The engine's callbacks under way may read READY blocks of the
	// node's pool: they end before the node's Close lets the memory go.
	var opened atomic.Pointer[Engine]
	cfg.BeforeMemoryGoes = func(ctx context.Context, engineErr error) {
		if e := opened.Load(); e != nil {
			e.endCallbacks(ctx, engineErr)
		}
	}
	n, err := node.Open(context.Background(), cfg)
	if err != nil {
		return nil, 0, nodeError(err)
	}
	e := newEngine(n.Engine(), n, cfg.Instance)
	opened.Store(e)
	return e, e.h, nil
}

// nodeError is the error of an open (OpenNode's, Open's): one that wraps
// no sentinel is a resource the open could not get, the caller's config.
func nodeError(err error) error {
	if Code(err) == ErrInternal { // not a sentinel: a resource Open could not get (a port, a file)
		return &Error{Code: ErrConfig, Err: err}
	}
	return err
}

// Node is the engine's node, nil for an in-process engine.
func (e *Engine) Node() *node.Node { return e.node }

func (e *Engine) needNode(fn string) error {
	if e.node == nil {
		return errorf(ErrInvalidArgument, "%s: engine %d is an in-process engine (kvxfer_engine_open), not a node", fn, e.h)
	}
	return nil
}

// Endpoint is the node's bound control endpoint (a tcp port 0 resolved).
func (e *Engine) Endpoint() (string, error) {
	if err := e.needNode("kvxfer_node_endpoint"); err != nil {
		return "", err
	}
	return e.node.Endpoint(), nil
}

// PublicKey is the node's CURVE public key (Z85), "" when insecure.
func (e *Engine) PublicKey() (string, error) {
	if err := e.needNode("kvxfer_node_public_key"); err != nil {
		return "", err
	}
	return e.node.PublicKey(), nil
}

// WaitPeers waits up to timeout for every configured peer to say Hello:
// ErrTimeout after it, ErrClosed at once when the engine is closed or
// Close starts meanwhile. A refused handshake or a mismatched peer is
// named with its own status even when the timeout ended the wait that
// followed it (WaitPeers gives the peer a few heartbeats to learn of the
// refusal, within the timeout): a caller that waits in short slices, as
// the Python package does, must see it, not TIMEOUT after TIMEOUT.
func (e *Engine) WaitPeers(timeout time.Duration) error {
	if err := e.needNode("kvxfer_node_wait_peers"); err != nil {
		return err
	}
	if err := e.open(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()
	if err := e.node.WaitPeers(ctx); err != nil {
		if e.ctx.Err() != nil {
			return &Error{Code: ErrClosed, Err: fmt.Errorf("engine %d closed while waiting for peers: %w", e.h, err)}
		}
		if ctx.Err() != nil && !errors.Is(err, node.ErrHandshake) && !errors.Is(err, kvxfer.ErrMismatch) {
			return &Error{Code: ErrTimeout, Err: err}
		}
		return err
	}
	return nil
}

// Keygen returns a new CURVE keypair (Z85, 40 characters each).
func Keygen() (public, secret string, err error) {
	public, secret, err = zmq.GenerateKeys()
	if err != nil {
		return "", "", errorf(ErrInternal, "CURVE keypair: %v", err)
	}
	return public, secret, nil
}

// nodeConfig reads a node's JSON config: node.ParseConfig's keys, plus two
// of kvxfer_engine_open's, which node's JSON lacks:
//
//   - "layout": the layout object (Layout), instead of "model";
//   - "memory" with "layers": the framework's own tensors by address, the
//     object kvxfer_engine_open takes (Memory), which becomes the node's
//     CallerMemory (no pool of its own). Without "layers", "memory" is
//     node's own {kind, num_blocks}: the tensors laid out in its pool.
//   - "pool_address": the caller's pool of pool_bytes bytes (host memory),
//     in kvxfer's block layout, as kvxfer_engine_open's pool argument: the
//     node's CallerMemory with no descriptors.
//   - "pool_device" (with "pool_address") and "memory"'s "device": the
//     CUDA ordinal of that memory, which then is GPU memory
//     (kvcache.ExternalDeviceRegion over the same span; node's Validate
//     and Open say which backends can use it). On backend cudaipc the
//     node's "device" defaults to that ordinal (the ranks of an instance
//     share one config, each on its own GPU); a "device" given and
//     different is refused at Open, naming both.
//
// Every error is ErrConfig naming the key.
func nodeConfig(js string) (node.Config, error) {
	if err := checkUTF8("node config JSON", js); err != nil {
		return node.Config{}, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(js), &top); err != nil {
		// Not one JSON object: node's parser names what is wrong.
		cfg, err := node.ParseConfig([]byte(js))
		if err == nil {
			err = errorf(ErrConfig, "node config JSON %s: not one object", quote(js))
		}
		return cfg, &Error{Code: ErrConfig, Err: err}
	}
	var layout *Layout
	var mem *Memory
	if raw, ok := top["layout"]; ok {
		layout = new(Layout)
		if err := strictJSON(raw, layout); err != nil {
			return node.Config{}, errorf(ErrConfig, "layout: %v", err)
		}
		delete(top, "layout")
	}
	if raw, ok := top["memory"]; ok {
		var keys map[string]json.RawMessage
		if json.Unmarshal(raw, &keys) == nil && keys["layers"] != nil {
			mem = new(Memory)
			if err := strictJSON(raw, mem); err != nil {
				return node.Config{}, errorf(ErrConfig, "memory: %v", err)
			}
			delete(top, "memory")
		} else if d, ok := keys["device"]; ok {
			return node.Config{}, errorf(ErrConfig, "memory.device = %s without memory.layers: device is the CUDA ordinal of the framework's tensors given by address (layers); a node's own pool ({kind, num_blocks}) is host memory",
				quotepkg.JSONValue(d))
		}
	}
	poolDev, poolOnDevice, err := cudaOrdinal("pool_device", top["pool_device"])
	if err != nil {
		return node.Config{}, err
	}
	if raw, ok := top["pool_device"]; ok {
		if _, ok := top["pool_address"]; !ok {
			return node.Config{}, errorf(ErrConfig, "pool_device = %s without pool_address: pool_device is the CUDA ordinal of the caller's pool at pool_address", quotepkg.JSONValue(raw))
		}
		delete(top, "pool_device")
	}
	var poolAddr uint64
	if raw, ok := top["pool_address"]; ok {
		if err := json.Unmarshal(raw, &poolAddr); err != nil || poolAddr == 0 {
			return node.Config{}, errorf(ErrConfig, "pool_address = %s: want the address of the caller's pool, a nonzero integer", quotepkg.JSONValue(raw))
		}
		if _, ok := top["memory"]; ok || mem != nil {
			return node.Config{}, errorf(ErrConfig, "pool_address and memory: give one (pool_address is the framework's pool in kvxfer's block layout, memory its tensors)")
		}
		delete(top, "pool_address")
	}
	rest, err := json.Marshal(top)
	if err != nil {
		return node.Config{}, errorf(ErrInternal, "node config: %v", err)
	}
	cfg, err := node.DecodeConfig(rest)
	if err != nil {
		return cfg, &Error{Code: ErrConfig, Err: err}
	}
	if layout != nil {
		if cfg.Model != "" {
			return cfg, errorf(ErrConfig, "layout and model = %s: give one", quote(cfg.Model))
		}
		cfg.Layout = layout.kv()
	}
	if err := cfg.Validate(); err != nil {
		return cfg, &Error{Code: ErrConfig, Err: err}
	}
	if mem != nil {
		par := kvcache.Parallel{TP: cfg.Parallel.TP, PP: cfg.Parallel.PP, Stages: cfg.Parallel.Stages}
		if par == (kvcache.Parallel{}) {
			par = kvcache.Parallel{TP: 1, PP: 1}
		}
		kc := kvxfer.Config{Model: cfg.Model, Layout: cfg.Layout, TokensPerBlock: cfg.TokensPerBlock, Parallel: par,
			Rank: kvcache.Rank{TP: cfg.Rank.TP, PP: cfg.Rank.PP}}
		if err := mem.describe(&kc); err != nil {
			return cfg, err
		}
		cfg.CallerMemory = &node.CallerMemory{Region: kc.Region, Memory: kc.Memory}
	}
	if poolAddr != 0 {
		if cfg.PoolBytes == 0 {
			return cfg, errorf(ErrConfig, "pool_address = %#x without pool_bytes: give the pool's length", poolAddr)
		}
		var r *kvcache.Region
		if poolOnDevice {
			r, err = kvcache.ExternalDeviceRegion(uintptr(poolAddr), cfg.PoolBytes, poolDev)
		} else {
			// The caller's (C) address, never a Go pointer (as Memory.describe).
			if err := HostAddress("pool_address", poolAddr); err != nil {
				return cfg, err
			}
			r, err = kvcache.ExternalHostRegion(*(*unsafe.Pointer)(unsafe.Pointer(&poolAddr)), cfg.PoolBytes)
		}
		if err != nil {
			return cfg, errorf(ErrInvalidArgument, "pool_address = %#x, pool_bytes = %d: %v", poolAddr, cfg.PoolBytes, err)
		}
		cfg.CallerMemory = &node.CallerMemory{Region: r}
	}
	// A node on cudaipc runs on the GPU of its memory unless "device" says
	// otherwise (the node then refuses the mismatch, naming both): the
	// ranks of one instance share their config, each on its own GPU.
	if m := cfg.CallerMemory; m != nil && m.Region.Kind == kvcache.DeviceMem && cfg.Backend == cudaipc.Backend {
		if _, given := top["device"]; !given {
			cfg.Device = m.Region.Device
		}
	}
	return cfg, nil
}

// strictJSON decodes raw into v, refusing unknown keys.
func strictJSON(raw json.RawMessage, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	return quotepkg.JSON(d.Decode(v))
}
