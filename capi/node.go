package capi

import (
	"context"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/node"
)

// OpenNode opens a node (package node: control link with CURVE, data plane,
// pool memory peers can write, heartbeats) from its JSON config
// (node.ParseConfig) and returns it as an engine handle: every engine call
// works on it, and Close closes the node.
func OpenNode(configJSON string) (*Engine, uint64, error) {
	if configJSON == "" {
		return nil, 0, errorf(ErrConfig, "node config JSON is empty")
	}
	cfg, err := node.ParseConfig([]byte(configJSON))
	if err != nil {
		return nil, 0, &Error{Code: ErrConfig, Err: err}
	}
	if err := fillFromEnv(&cfg.Workers, &cfg.Backend); err != nil {
		return nil, 0, err
	}
	n, err := node.Open(context.Background(), cfg)
	if err != nil {
		return nil, 0, nodeError(err)
	}
	e := newEngine(n.Engine(), n, cfg.Instance)
	return e, e.h, nil
}

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
// Close starts meanwhile.
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
		if ctx.Err() != nil {
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
