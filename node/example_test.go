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
	"github.com/kvxfer/kvxfer/node"
)

// exampleChildEnv carries the context process's JSON config: TestMain runs
// runExampleContext instead of the tests when it is set.
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
	// A CURVE keypair per side (`kvxfer keygen` writes them to files;
	// key_file and public_key_file read those).
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
	defer child.Wait() //nolint:errcheck // its exit status is checked below

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gen, err := node.Open(ctx, node.Config{Instance: "gen", Model: "Llama-3.1-8B", PoolBytes: 16 << 20,
		Bind: genEP, SecretKey: genSec,
		Peers: []node.Peer{{Instance: "ctx", Endpoint: ctxEP, PublicKey: ctxPub}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer gen.Close(context.Background())      //nolint:errcheck
	if err := gen.WaitPeers(ctx); err != nil { // names a missing or misconfigured peer
		fmt.Println(err)
		return
	}
	// kvxfer allocates the destination blocks here; a framework that owns
	// its blocks passes them in ReceiveRequest.Blocks.
	rx, err := gen.Engine().Receive(ctx, kvxfer.ReceiveRequest{ID: "req-0", PromptLen: 40, Context: "ctx"})
	if err != nil {
		fmt.Println(err)
		return
	}
	o := <-rx.Done()
	if !o.OK {
		fmt.Println(o.Status, o.Err)
		return
	}
	n, err := verify(gen.Engine(), "req-0", o.Blocks, pattern)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = gen.Engine().FreeBlocks(o.Blocks)
	if err := child.Wait(); err != nil {
		fmt.Println("context process:", err)
		return
	}
	fmt.Printf("req-0 %s: %d MiB, every byte as the context process wrote it\n", o.Status, n>>20)
	// Output: req-0 READY: 8 MiB, every byte as the context process wrote it
}

// runExampleContext is the example's context process: open a node from
// the JSON config, wait for the generation node, prefill (here: fill the
// source blocks with a pattern) and send, then close.
func runExampleContext(cfgJSON string) int {
	cfg, err := node.ParseConfig([]byte(cfgJSON))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := node.Open(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer n.Close(context.Background()) //nolint:errcheck
	if err := n.WaitPeers(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := send(n.Engine(), kvxfer.SendRequest{ID: "req-0", PromptLen: 40}, pattern); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
