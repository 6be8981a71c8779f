package node_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/internal/testlog"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
)

// beat is the tests' heartbeat interval: startup mistakes must be named
// within 3 of them. It is generous so that a loaded machine has room.
const beat = 500 * time.Millisecond

// patience bounds waits for things that have no heartbeat bound (a whole
// transfer).
const patience = 30 * time.Second

// tiny is a small layout: 2 layers, 2 KV heads (splittable over TP2).
func tiny() *kvcache.Layout {
	return &kvcache.Layout{Name: "tiny", Layers: 2, KVHeads: 2, HeadDim: 8, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(2)}
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond) // poll with a deadline
	}
}

// within3Beats polls cond for at most 3 heartbeat intervals.
func within3Beats(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitFor(t, 3*beat, what, cond)
}

// logged gives c a logger into a new testlog.Buffer (and the test log).
func logged(t testing.TB, c *node.Config) *testlog.Buffer {
	b := &testlog.Buffer{}
	l := zerolog.New(zerolog.MultiLevelWriter(b, zerolog.NewTestWriter(t))).Level(zerolog.InfoLevel)
	c.Logger = &l
	return b
}

// keys is one CURVE keypair.
type keys struct{ public, secret string }

func newKeys(t testing.TB) keys {
	t.Helper()
	pub, sec, err := zmq.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	return keys{pub, sec}
}

// pair is the configs of a context and a generation node that name each
// other, over ipc endpoints in a temporary directory, with CURVE.
func pair(t testing.TB, backend string) (ctxCfg, genCfg node.Config) {
	t.Helper()
	dir := t.TempDir()
	ck, gk := newKeys(t), newKeys(t)
	ctxEP, genEP := "ipc://"+filepath.Join(dir, "ctx.sock"), "ipc://"+filepath.Join(dir, "gen.sock")
	base := node.Config{Layout: tiny(), PoolBytes: 1 << 20, Workers: 2, Backend: backend,
		HeartbeatInterval: node.Duration(beat), TransferTimeout: node.Duration(patience)}
	ctxCfg, genCfg = base, base
	ctxCfg.Instance, ctxCfg.Bind, ctxCfg.SecretKey = "ctx", ctxEP, ck.secret
	ctxCfg.Peers = []node.Peer{{Instance: "gen", Endpoint: genEP, PublicKey: gk.public}}
	genCfg.Instance, genCfg.Bind, genCfg.SecretKey = "gen", genEP, gk.secret
	genCfg.Peers = []node.Peer{{Instance: "ctx", Endpoint: ctxEP, PublicKey: ck.public}}
	return ctxCfg, genCfg
}

// insecure turns c's CURVE off, and drops the keys pair gave it (a node
// refuses keys it would ignore).
func insecure(c *node.Config) {
	c.Insecure, c.SecretKey = true, ""
	for i := range c.Peers {
		c.Peers[i].PublicKey = ""
	}
}

// open opens a node and closes it when the test ends.
func open(t testing.TB, c node.Config) *node.Node {
	t.Helper()
	n, err := node.Open(context.Background(), c)
	if err != nil {
		t.Fatalf("Open(%s): %v", c.Instance, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Errorf("Close(%s): %v", c.Instance, err)
		}
	})
	return n
}

// patternFunc is the byte at offset i of block blk of group g of a
// request.
type patternFunc func(req string, g, blk, i int) byte

// pattern differs byte by byte (same layout on both sides).
func pattern(req string, g, blk, i int) byte {
	return byte(len(req)*31 + g*131 + blk*17 + i)
}

// blockPattern is one nonzero value per block: what several writers
// (tensor-parallel ranks, each writing its heads) leave in one block.
func blockPattern(req string, g, blk, _ int) byte {
	return byte(g*131+blk*17)%255 + 1
}

// send hands a whole prompt over as one chunk from fresh source blocks
// filled with the request's pattern, waits for the outcome and frees the
// source blocks.
func send(e *kvxfer.Engine, req kvxfer.SendRequest, pat patternFunc) error {
	l := e.Layout()
	counts := make([]int, len(l.Groups))
	for g := range counts {
		if len(e.Shape().Layers[g]) > 0 {
			counts[g] = l.BlocksFor(req.PromptLen)
		}
	}
	src, err := e.Pools().Alloc(counts)
	if err != nil {
		return err
	}
	defer e.Pools().Free(src) //nolint:errcheck // Done fired: every pin dropped
	tx, err := e.Send(context.Background(), req)
	if err != nil {
		return err
	}
	c := kvcache.Chunk{Start: 0, End: req.PromptLen, Last: true}
	fence := &kvxfer.ManualFence{}
	if err := tx.Chunk(c, c.Runs(l.TokensPerBlock, src), fence); err != nil {
		fence.Fire(err)
		return err
	}
	for g := range src {
		for b, id := range src[g] {
			blk := e.Block(g, id)
			for i := range blk {
				blk[i] = pat(req.ID, g, b, i)
			}
		}
	}
	fence.Fire(nil)
	o := <-tx.Done()
	if !o.OK {
		return fmt.Errorf("%s: %s: %v", req.ID, o.Status, o.Err)
	}
	return nil
}

// verify counts the bytes of READY blocks that hold the request's
// pattern; it fails at the first that does not.
func verify(e *kvxfer.Engine, req string, blocks [][]kvcache.BlockID, pat patternFunc) (uint64, error) {
	var n uint64
	for g := range blocks {
		for b, id := range blocks[g] {
			blk := e.Block(g, id)
			for i := range blk {
				if blk[i] != pat(req, g, b, i) {
					return n, fmt.Errorf("%s: group %d block %d byte %d = %#x, want %#x", req, g, b, i, blk[i], pat(req, g, b, i))
				}
			}
			n += uint64(len(blk))
		}
	}
	return n, nil
}
