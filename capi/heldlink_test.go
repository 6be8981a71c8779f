package capi

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/messages"
)

// heldLink is an in-process control link whose frames to one instance
// (to) can be held back (held), as a writer that cannot answer: stopped,
// partitioned (to then hears nothing of the others: Hello). atOther counts the RequestData the other engines got.
type heldLink struct {
	*control.MemLink
	to      string
	held    atomic.Bool
	atOther atomic.Int64
	mu      sync.Mutex
	backlog []func()
}

func (l *heldLink) Listen(self *messages.Hello, deliver func(messages.Frame)) (control.Listener, error) {
	if self.From.Instance != l.to {
		return l.MemLink.Listen(self, func(f messages.Frame) {
			if _, ok := f.(*messages.RequestData); ok {
				l.atOther.Add(1)
			}
			deliver(f)
		})
	}
	return l.MemLink.Listen(self, func(f messages.Frame) {
		if l.held.Load() {
			l.mu.Lock()
			l.backlog = append(l.backlog, func() { deliver(f) })
			l.mu.Unlock()
			return
		}
		deliver(f)
	})
}

// Hello fails for the other instances' peers while frames to to are
// held: to hears nothing of them, their heartbeats included (a zmq link's
// Hello fails for a peer down), as of a writer partitioned or stopped.
func (l *heldLink) Hello(peer messages.PeerID) (*messages.Hello, error) {
	if l.held.Load() && peer.Instance != l.to {
		return nil, fmt.Errorf("%w: %s missed its heartbeats (heldLink)", control.ErrPeerGone, peer)
	}
	return l.MemLink.Hello(peer)
}

// heldPair opens a context engine and a generation engine (instances
// ctx and gen) on one heldLink holding frames to gen, wrapped as C ABI
// engines; the context one is closed when the test ends.
func heldPair(t *testing.T, ctx, gen string) (p, d *Engine, link *heldLink) {
	t.Helper()
	link = &heldLink{MemLink: control.NewMemLink(), to: gen}
	l := kvcache.Layout{Name: "tiny", Layers: 2, KVHeads: 2, HeadDim: 4, DTypeBytes: 2, TokensPerBlock: 16,
		Groups: kvcache.FullAttention(2)}
	start := func(inst string) *Engine {
		e, err := kvxfer.Start(context.Background(), kvxfer.Config{Instance: inst, Layout: &l, PoolBytes: 65536, Workers: 2,
			Link: link, TransferTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return newEngine(e, nil, inst)
	}
	p, d = start(ctx), start(gen)
	t.Cleanup(func() { link.held.Store(false); _ = p.Close(5 * time.Second) })
	return p, d, link
}

// waitRequestData polls (with a deadline) until the context engine got n
// RequestData.
func (l *heldLink) waitRequestData(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.atOther.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d RequestData at the context side after 10 s, want %d", l.atOther.Load(), n)
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
}
