package rdmatest

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
)

// testOutOfRange: a batch with a segment outside either region is refused at
// Post with a *SegmentError naming that segment (ErrOutOfRange), before any
// byte is written; Done is never called.
func testOutOfRange(t *testing.T, e *env) {
	const n = 64 << 10
	src, dst := e.src(n, 13), e.dst(n, 14)
	ep := e.connect()
	before := bytes.Clone(dst.bytes)
	ok := kvcache.Segment{Src: 0, Dst: 0, Len: 16}
	cases := []struct {
		name string
		segs []kvcache.Segment
		bad  int
	}{
		{"destination end past region", []kvcache.Segment{ok, {Src: 0, Dst: n - 8, Len: 16}}, 1},
		{"destination offset past region", []kvcache.Segment{ok, ok, {Src: 0, Dst: n + 1, Len: 0}}, 2},
		{"source end past region", []kvcache.Segment{{Src: n - 1, Dst: 0, Len: 2}}, 0},
		{"source offset overflows", []kvcache.Segment{ok, {Src: math.MaxUint64 - 3, Dst: 0, Len: 8}}, 1},
		{"length overflows", []kvcache.Segment{{Src: 8, Dst: 8, Len: math.MaxUint64}}, 0},
	}
	for _, c := range cases {
		err := ep.Post(rdma.Batch{Src: src.reg, Dst: dst.reg.Remote(), Segments: c.segs, Done: e.refused(c.name)})
		var se *rdma.SegmentError
		switch {
		case !errors.As(err, &se):
			t.Errorf("%s: Post = %v, want a *rdma.SegmentError", c.name, err)
		case se.Index != c.bad || se.Segment != c.segs[c.bad]:
			t.Errorf("%s: error names segment %d %+v, want %d %+v", c.name, se.Index, se.Segment, c.bad, c.segs[c.bad])
		}
		mustFail(t, c.name, err, rdma.ErrOutOfRange)
	}
	e.noStray(ep)
	if d := diff(dst.bytes, before, nil); d != "" {
		t.Errorf("refused batches wrote: %s", d)
	}
	if err := e.post(ep, src, dst, []kvcache.Segment{ok}); err != nil {
		t.Errorf("a good batch after the refusals: %v", err)
	}
}

// testBadKey: a destination key that is malformed, altered in any byte,
// truncated, extended, of another agent, or of a revoked registration is
// refused at Post (ErrBadKey); the new key of a re-registration works.
func testBadKey(t *testing.T, e *env) {
	const n = 64 << 10
	src, dst := e.src(n, 15), e.dst(n, 16)
	ep := e.connect()
	before := bytes.Clone(dst.bytes)
	segs := []kvcache.Segment{{Src: 0, Dst: 0, Len: 64}}
	rr := dst.reg.Remote()
	try := func(what string, key []byte) error {
		return ep.Post(rdma.Batch{Src: src.reg, Dst: rdma.RemoteRegion{Key: key, Len: rr.Len}, Segments: segs, Done: e.refused(what)})
	}

	mustFail(t, "nil key", try("nil key", nil), rdma.ErrBadKey)
	mustFail(t, "garbage key", try("garbage key", []byte("garbage")), rdma.ErrBadKey)
	mustFail(t, "truncated key", try("truncated key", rr.Key[:len(rr.Key)-1]), rdma.ErrBadKey)
	mustFail(t, "extended key", try("extended key", append(bytes.Clone(rr.Key), 0)), rdma.ErrBadKey)
	for i := range rr.Key {
		k := bytes.Clone(rr.Key)
		k[i] ^= 0x01
		what := fmt.Sprintf("key with byte %d flipped", i)
		mustFail(t, what, try(what, k), rdma.ErrBadKey)
	}
	own := e.src(n, 17) // a sender-side registration: its key is not the peer's
	mustFail(t, "key of another agent", try("key of another agent", own.reg.Remote().Key), rdma.ErrBadKey)
	if err := ep.Post(rdma.Batch{Src: src.reg, Dst: rdma.RemoteRegion{Key: rr.Key, Len: rr.Len + 1}, Segments: segs, Done: e.refused("wrong length")}); err == nil {
		t.Errorf("Post with a RemoteRegion one byte longer than the region: accepted, want refused")
	}

	// Revoked: deregister, then the old key is stale.
	if err := e.p.Receiver.Deregister(dst.reg); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	mustFail(t, "key of a deregistered region", try("stale key", rr.Key), rdma.ErrBadKey)
	reg2, err := e.p.Receiver.Register(dst.reg.Region())
	if err != nil {
		t.Fatalf("re-Register: %v", err)
	}
	mustFail(t, "old key after re-registration", try("stale key after re-registration", rr.Key), rdma.ErrBadKey)
	e.noStray(ep)
	if d := diff(dst.bytes, before, nil); d != "" {
		t.Errorf("refused batches wrote: %s", d)
	}
	if err := e.post(ep, src, side{reg: reg2, bytes: dst.bytes}, segs); err != nil {
		t.Errorf("post with the new key: %v", err)
	}
	apply(before, src.bytes, segs)
	if d := diff(dst.bytes, before, segs); d != "" {
		t.Errorf("post with the new key: %s", d)
	}
}

// testUnregistered: a source that is nil, of another agent or deregistered
// is refused (ErrUnregistered); so is deregistering twice or through another
// agent.
func testUnregistered(t *testing.T, e *env) {
	const n = 64 << 10
	src, dst := e.src(n, 18), e.dst(n, 19)
	ep := e.connect()
	segs := []kvcache.Segment{{Src: 0, Dst: 0, Len: 64}}
	post := func(what string, reg rdma.Registration) error {
		return ep.Post(rdma.Batch{Src: reg, Dst: dst.reg.Remote(), Segments: segs, Done: e.refused(what)})
	}
	mustFail(t, "nil source", post("nil source", nil), rdma.ErrUnregistered)
	mustFail(t, "source of another agent", post("source of another agent", dst.reg), rdma.ErrUnregistered)
	mustFail(t, "Deregister through another agent", e.p.Sender.Deregister(dst.reg), rdma.ErrUnregistered)
	if err := e.p.Sender.Deregister(src.reg); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	mustFail(t, "deregistered source", post("deregistered source", src.reg), rdma.ErrUnregistered)
	mustFail(t, "second Deregister", e.p.Sender.Deregister(src.reg), rdma.ErrUnregistered)
	e.noStray(ep)
}

// testBadAddress: Connect refuses malformed addresses (ErrBadAddress).
func testBadAddress(t *testing.T, e *env) {
	good := e.p.Receiver.Address()
	for _, addr := range [][]byte{nil, []byte("garbage"), append(bytes.Clone(good), 'x'), good[:len(good)-1]} {
		ep, err := e.p.Sender.Connect(addr)
		if err == nil {
			ep.Close()
		}
		mustFail(t, fmt.Sprintf("Connect(%q)", addr), err, rdma.ErrBadAddress)
	}
}

// testRegisterDevice: device memory, which the host cannot copy, is refused.
func testRegisterDevice(t *testing.T, e *env) {
	r, err := kvcache.ExternalDeviceRegion(0x1000, 4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []rdma.Agent{e.p.Sender, e.p.Receiver} {
		if reg, err := a.Register(r); err == nil {
			t.Errorf("%s: Register(device region) = %v, want an error", a.Backend(), reg)
		}
	}
	if _, err := e.p.Sender.Register(nil); err == nil {
		t.Errorf("Register(nil): accepted, want an error")
	}
}

// testSourceRegistration: a region registered with rdma.RegisterSource
// is a source like any other (its bytes arrive intact); where the agent
// implements rdma.SourceRegisterer, its Remote has no key and a batch
// naming it as a destination is refused at Post (ErrBadKey) without
// touching it, Done never called.
func testSourceRegistration(t *testing.T, e *env) {
	const n = 64 << 10
	dst := e.dst(n, 31)
	r, err := e.p.NewSrc(n)
	if err != nil {
		t.Fatalf("NewSrc(%d): %v", n, err)
	}
	t.Cleanup(e.closeAgents)
	reg, err := rdma.RegisterSource(e.p.Sender, r)
	if err != nil {
		t.Fatalf("sender RegisterSource(%d bytes): %v", n, err)
	}
	src := side{reg: reg, bytes: r.Bytes()}
	Pattern(src.bytes, 32)
	ep := e.connect()
	segs := []kvcache.Segment{{Src: 0, Dst: 4096, Len: 8192}, {Src: n - 100, Dst: 0, Len: 100}}
	model := bytes.Clone(dst.bytes)
	apply(model, src.bytes, segs)
	if err := e.post(ep, src, dst, segs); err != nil {
		t.Fatalf("a batch from a source registration: %v", err)
	}
	if d := diff(dst.bytes, model, segs); d != "" {
		t.Errorf("a batch from a source registration: %s", d)
	}
	if _, ok := e.p.Receiver.(rdma.SourceRegisterer); !ok {
		return
	}
	dr, err := e.p.NewDst(n)
	if err != nil {
		t.Fatalf("NewDst(%d): %v", n, err)
	}
	t.Cleanup(e.closeAgents)
	dreg, err := rdma.RegisterSource(e.p.Receiver, dr)
	if err != nil {
		t.Fatalf("receiver RegisterSource(%d bytes): %v", n, err)
	}
	if k := dreg.Remote().Key; len(k) != 0 {
		t.Errorf("a source registration's Remote names a %d-byte key, want none", len(k))
	}
	before := bytes.Clone(dr.Bytes())
	err = ep.Post(rdma.Batch{Src: src.reg, Dst: dreg.Remote(), Segments: []kvcache.Segment{{Len: 64}}, Done: e.refused("into a source registration")})
	mustFail(t, "a batch into a source registration", err, rdma.ErrBadKey)
	e.noStray(ep)
	if !bytes.Equal(dr.Bytes(), before) {
		t.Errorf("a refused batch into a source registration wrote into it")
	}
}
