package twoproc

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control/zmq"
	"github.com/kvxfer/kvxfer/internal/proc"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// craftedUCXAddress is a well-formed kvxfer ucx agent address ("UCA2",
// two 32-byte public keys, the worker address's length, the worker
// address, a CRC-32C of all before) wrapping random bytes where the UCP worker
// address should be: what an attacker holding an authorized key sent.
func craftedUCXAddress(seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	worker := make([]byte, 64+rng.IntN(128))
	for i := range worker {
		worker[i] = byte(rng.Uint32())
	}
	pub := make([]byte, 64)
	for i := range pub {
		pub[i] = byte(rng.Uint32())
	}
	b := append([]byte("UCA2"), pub...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(worker)))
	b = append(b, worker...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// TestCraftedHelloDoesNotCrashContext (issue 15 item 1): a peer holding
// the generation side's authorized key says Hello as gen/0 with a
// well-formed agent address wrapping random UCP worker bytes, and asks
// for req-0. Before the UCX address validator, kvxfer ctx aborted with
// SIGABRT inside ucp_ep_create (address.c: Assertion '*addr_version ==
// UCP_OBJECT_VERSION_V2' failed). Now the context process refuses that
// peer's address (req-0 fails with a bad-address error naming it), keeps
// running, and finishes the honest generation process's requests.
func TestCraftedHelloDoesNotCrashContext(t *testing.T) {
	if !ucx.Available {
		t.Skip("this build has no UCX")
	}
	g, c := options(t, 4, 0)
	g, c = on(ucx.Backend, g, c)
	ctx := spawn(t, "ctx", c)

	ctxID := messages.PeerID{Instance: "ctx", Rank: 0}
	self := messages.PeerID{Instance: "gen", Rank: 0}
	link, err := zmq.New(zmq.Config{Bind: g.Bind, Peers: map[messages.PeerID]string{ctxID: g.PeerEndpoint},
		Curve: zmq.Curve{Secret: g.SecretKey, AllowedPeers: []string{g.PeerPublicKey},
			PeerServerKeys: map[messages.PeerID]string{ctxID: g.PeerPublicKey}}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := kvcache.Preset(g.Model)
	if err != nil {
		t.Fatal(err)
	}
	l = l.WithTokensPerBlock(g.TokensPerBlock)
	shape, err := l.Shape(kvcache.Parallel{TP: 1, PP: 1}, kvcache.Rank{})
	if err != nil {
		t.Fatal(err)
	}
	hello := &messages.Hello{From: self, Backend: ucx.Backend, AgentAddr: craftedUCXAddress(1),
		Region: messages.RemoteRegion{Key: []byte("not-an-rkey"), Len: g.PoolBytes}, LayoutHash: l.Hash(),
		Parallel: messages.Parallel{TP: 1, PP: 1}, Model: l.Name,
		Pools: []messages.PoolGeometry{{BlockBytes: shape.BlockBytes(l, 0), Blocks: 64}}}
	got := make(chan *messages.Result, 16)
	lis, err := link.Listen(hello, func(f messages.Frame) {
		if r, ok := f.(*messages.Result); ok {
			select {
			case got <- r:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := link.Dial(ctxID)
	if err != nil {
		t.Fatal(err)
	}
	prompt := proc.Prompts(c)[0]
	blocks := make([]int32, l.BlocksFor(prompt))
	for i := range blocks {
		blocks[i] = int32(i)
	}
	rd := &messages.RequestData{RequestID: proc.RequestID(0), Epoch: 1, From: self, GenParallel: messages.Parallel{TP: 1, PP: 1},
		PromptLen: int32(prompt), Groups: []messages.GroupDest{{Blocks: blocks}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := conn.Send(rd)
		if err == nil {
			break
		}
		if !errors.Is(err, zmq.ErrQueueFull) || time.Now().After(deadline) {
			t.Fatalf("sending the crafted request: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // poll with a deadline: the connection comes up
	}
	select {
	case r := <-got:
		if r.RequestID != proc.RequestID(0) || r.Status != messages.StatusFailed || !strings.Contains(r.Error, "bad peer address") {
			t.Fatalf("the context process answered %+v, want FAILED naming the bad address", r)
		}
		t.Logf("refused: %s", r.Error)
	case <-time.After(30 * time.Second):
		t.Fatal("no answer to the crafted request within 30s")
	}
	_ = conn.Close()
	_ = lis.Close()
	_ = link.Close()

	gen := spawn(t, "gen", g)
	cr, _ := ctx.wait(t, 2*time.Minute)
	gr, _ := gen.wait(t, 2*time.Minute)
	t.Logf("ctx %+v\ngen %+v", cr, gr)
	if cr.Requests != 4 || cr.OK != 3 || cr.Failed != 1 || cr.LeakedBlocks != 0 {
		t.Fatalf("ctx report %+v: want the crafted request failed and the 3 others done", cr)
	}
	if gr.OK != 3 || gr.LeakedBlocks != 0 || gr.Mismatches != 0 || gr.BytesVerified != gr.Bytes {
		t.Fatalf("gen report %+v", gr)
	}
}
