package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
)

// exampleChildEnv carries the context process's JSON config: TestMain
// runs runExampleContext instead of the tests when it is set.
const exampleChildEnv = "KVXFER_NODE_EXAMPLE_CTX"

// Two OS processes: this one is the generation (decode) side; it starts
// the context (prefill) side as a second process (this test binary again,
// its node config as JSON in the environment), receives one request's KV
// cache from it and checks every byte.
func Example() {
	dir, err := os.MkdirTemp("", "kvxfer-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	// A CURVE keypair per side (`kvxfer keygen` writes them to files,
	// which key_file and public_key_file name).
	genPub, genSec, _ := zmq.GenerateKeys()
	ctxPub, ctxSec, _ := zmq.GenerateKeys()
	genEP, ctxEP := "ipc://"+filepath.Join(dir, "gen.sock"), "ipc://"+filepath.Join(dir, "ctx.sock")

	ctxCfg := node.Config{Instance: "ctx", Model: "Llama-3.1-8B", PoolBytes: 16 << 20,
		Bind: ctxEP, SecretKey: ctxSec,
		Peers: []node.Peer{{Instance: "gen", Endpoint: genEP, PublicKey: genPub}}}
	js, _ := json.Marshal(ctxCfg)
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), exampleChildEnv+"="+string(js))
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer child.Wait() //nolint:errcheck // checked below on the path that matters

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gen, err := node.Open(ctx, node.Config{Instance: "gen", Model: "Llama-3.1-8B", PoolBytes: 16 << 20,
		Bind: genEP, SecretKey: genSec,
		Peers: []node.Peer{{Instance: "ctx", Endpoint: ctxEP, PublicKey: ctxPub}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer gen.Close(context.Background()) //nolint:errcheck
	// WaitPeers names a peer that is missing, holds the wrong key or
	// serves another model, instead of letting requests time out.
	if err := gen.WaitPeers(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// kvxfer's pool picks the destination blocks here; a framework that
	// owns its blocks passes them in ReceiveRequest.Blocks. Node.Receive
	// is Engine().Receive that names a writer it has no peer for at once.
	eng := gen.Engine()
	rx, err := gen.Receive(ctx, kvxfer.ReceiveRequest{ID: "req-0", PromptLen: 40, Context: "ctx"})
	if err != nil {
		fmt.Println(err)
		return
	}
	o := <-rx.Done()
	if !o.OK {
		fmt.Println(o.Status, o.Err)
		return
	}
	var good uint64
	for g := range o.Blocks {
		for b, id := range o.Blocks[g] {
			for i, v := range eng.Block(g, id) {
				if v == examplePattern(g, b, i) {
					good++
				}
			}
		}
	}
	_ = eng.FreeBlocks(o.Blocks) // READY: the blocks are the framework's again
	if err := child.Wait(); err != nil {
		fmt.Println("context process:", err)
		return
	}
	fmt.Printf("req-0 %s: %d of %d bytes as the context process wrote them\n", o.Status, good, o.Bytes)
	// Output: req-0 READY: 8388608 of 8388608 bytes as the context process wrote them
}

// examplePattern is what the context process writes at byte i of the
// b-th block of layer group g.
func examplePattern(g, b, i int) byte { return byte(g*131 + b*17 + i) }

// runExampleContext is the example's context process: open a node from
// the JSON config, wait for the generation node, prefill (here: fill the
// source blocks with a pattern) and hand the chunk over behind a fence,
// then close.
func runExampleContext(cfgJSON string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "context process:", err)
		return 1
	}
	cfg, err := node.ParseConfig([]byte(cfgJSON))
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := node.Open(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	defer n.Close(context.Background()) //nolint:errcheck
	if err := n.WaitPeers(ctx); err != nil {
		return fail(err)
	}
	eng := n.Engine()
	l := eng.Layout()
	const promptLen = 40
	// Source blocks: from kvxfer's pool here; a framework names its own.
	counts := make([]int, len(l.Groups))
	for g := range counts {
		counts[g] = l.BlocksFor(promptLen)
	}
	src, err := eng.Pools().Alloc(counts)
	if err != nil {
		return fail(err)
	}
	tx, err := eng.Send(ctx, kvxfer.SendRequest{ID: "req-0", PromptLen: promptLen})
	if err != nil {
		return fail(err)
	}
	// One chunk, the whole prompt. The fence fires when the KV is written
	// (on a GPU: a CUDA event after the prefill kernel).
	chunk := kvcache.Chunk{Start: 0, End: promptLen, Last: true}
	fence := &kvxfer.ManualFence{}
	if err := tx.Chunk(chunk, chunk.Runs(l.TokensPerBlock, src), fence); err != nil {
		fence.Fire(err)
		return fail(err)
	}
	for g := range src {
		for b, id := range src[g] {
			blk := eng.Block(g, id)
			for i := range blk {
				blk[i] = examplePattern(g, b, i)
			}
		}
	}
	fence.Fire(nil)
	o := <-tx.Done() // every pin dropped: the source blocks are ours again
	_ = eng.Pools().Free(src)
	if !o.OK {
		return fail(fmt.Errorf("%s: %v", o.Status, o.Err))
	}
	return 0
}
