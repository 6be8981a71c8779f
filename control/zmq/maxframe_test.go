package zmq

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// Two links with different frame limits: ctx/0's listener takes frames of
// at most messages.MinFrameLimit bytes (4096), gen/0's the default. ctx/0's Hello says its limit,
// so gen/0 refuses a RequestData larger than that at Send
// (ErrFrameTooLarge), naming the request, the frame's size and both
// limits, instead of sending what ctx/0's listener drops (counted
// oversize, unseen by the sender: the request would wait for its
// deadline). The connection stays usable: the next, small frame arrives,
// and ctx/0 rejected nothing.
//
// Without the limit in Hello, Send takes the frame (gen/0's own limit
// allows it) and ctx/0 counts it rejected oversize.
func TestPeerFrameLimitRefusedAtSend(t *testing.T) {
	const limit = messages.MinFrameLimit
	ctx := listen(t, pid("ctx", 0), Config{Insecure: true, MaxFrameBytes: limit})
	gen := listen(t, pid("gen", 0), Config{Insecure: true})
	conn := dialAfterHello(t, ctx, gen)
	if h, _ := gen.link.Hello(ctx.id); h.MaxFrameBytes != limit {
		t.Fatalf("ctx/0's Hello says MaxFrameBytes %d, want %d", h.MaxFrameBytes, limit)
	}
	big := requestData(gen.id, 1)
	blocks := make([]int32, 3000)
	for i := range blocks {
		blocks[i] = int32(1000 + i) // two bytes each on the wire
	}
	big.Groups = []messages.GroupDest{{Blocks: blocks}}
	size := len(mustEncodeFrame(t, big))
	if size <= limit || size > DefaultMaxFrameBytes {
		t.Fatalf("test frame of %d bytes: want one past ctx/0's limit %d only", size, limit)
	}
	var err error
	waitFor(t, patience, "Send taken or refused for good", func() bool {
		err = conn.Send(big)
		return !errors.Is(err, ErrQueueFull)
	})
	want := fmt.Sprintf(`send *messages.RequestData of request "req-1" to ctx/0: %d bytes exceeds the peer's MaxFrameBytes %d (its Hello; ours is %d)`,
		size, limit, DefaultMaxFrameBytes)
	if !errors.Is(err, ErrFrameTooLarge) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Send of a %d-byte RequestData to a peer whose limit is %d: %v (oversize rejections at the peer: %d)\nwant ErrFrameTooLarge: …%s",
			size, limit, err, ctx.link.Stats().Rejected[RejectOversize], want)
	}

	small := requestData(gen.id, 2)
	waitFor(t, patience, "small frame taken", func() bool {
		err = conn.Send(small)
		return !errors.Is(err, ErrQueueFull)
	})
	if err != nil {
		t.Fatalf("the small frame after the refused one: %v", err)
	}
	waitFor(t, patience, "small frame delivered", func() bool { return ctx.in.len() > 0 })
	if got := ctx.in.snapshot(); len(got) != 1 || got[0].Request() != "req-2" {
		t.Fatalf("ctx/0 got %v, want only req-2", got)
	}
	if r := ctx.link.Rejected(); r != 0 {
		t.Fatalf("ctx/0 rejected %d frames: %v", r, ctx.link.Stats().Rejected)
	}
}

func mustEncodeFrame(t *testing.T, f messages.Frame) []byte {
	t.Helper()
	b, err := messages.Encode(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A Hello past the limit the peer's Hello said is dropped there
// (oversize), and so, for want of a Hello, is every frame after it
// (no_hello): gen/0, whose Hello is larger than ctx/0's limit, refuses
// each frame to ctx/0 at Send, naming its Hello's size and the limit,
// instead of sending it to be dropped. (The Hello itself, said at Dial
// and by heartbeats, still goes, and ctx/0 names it oversize.)
//
// Without the check, Send takes the frame and ctx/0 rejects the Hello
// and the frame.
func TestPeerFrameLimitBelowOurHello(t *testing.T) {
	const limit = messages.MinFrameLimit
	ctx := listen(t, pid("ctx", 0), Config{Insecure: true, MaxFrameBytes: limit})
	in := &inbox{}
	genLink, err := New(Config{Insecure: true, Bind: "tcp://127.0.0.1:0", HeartbeatInterval: -1, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { genLink.Close() })
	hello := helloOf(pid("gen", 0), "1")
	hello.AgentAddr = make([]byte, 4096) // the longest an address may be: the Hello is past 4096
	if _, err := genLink.Listen(hello, in.deliver); err != nil {
		t.Fatal(err)
	}
	gen := &node{id: pid("gen", 0), link: genLink, in: in}
	conn := dialAfterHello(t, ctx, gen)
	waitFor(t, patience, "Send taken or refused for good", func() bool {
		err = conn.Send(requestData(gen.id, 1))
		return !errors.Is(err, ErrQueueFull)
	})
	want := fmt.Sprintf(`send *messages.RequestData of request "req-1" to ctx/0: our Hello of %d bytes exceeds the peer's MaxFrameBytes %d (its Hello): it takes no frame of ours`,
		len(mustEncodeFrame(t, withMaxFrame(hello, DefaultMaxFrameBytes))), limit)
	if !errors.Is(err, ErrFrameTooLarge) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Send to a peer whose limit is below our Hello: %v (rejections at the peer: %v)\nwant ErrFrameTooLarge: …%s",
			err, ctx.link.Stats().Rejected, want)
	}
	// The Hello Dial said is dropped there, named with its size and
	// ctx/0's limit (oversize).
	waitFor(t, patience, "gen/0's Hello rejected oversize at ctx/0", func() bool {
		return ctx.link.Stats().Rejected[RejectOversize] > 0
	})
}

// dialAfterHello introduces ctx and gen to each other, has ctx dial gen
// (as a context rank does to answer it: its Conn says Hello first), waits
// for that Hello at gen, and returns gen's Conn to ctx. Both Conns close
// with the test.
func dialAfterHello(t *testing.T, ctx, gen *node) control.Conn {
	t.Helper()
	introduce(t, ctx, gen)
	introduce(t, gen, ctx)
	back, err := ctx.link.Dial(gen.id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { back.Close() })
	waitFor(t, patience, "ctx/0's Hello at gen/0", func() bool {
		_, err := gen.link.Hello(ctx.id)
		return err == nil
	})
	conn, err := gen.link.Dial(ctx.id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// withMaxFrame is h as Listen sends it: saying the listener's limit.
func withMaxFrame(h *messages.Hello, limit int) *messages.Hello {
	c := *h
	c.MaxFrameBytes = uint64(limit)
	return &c
}
