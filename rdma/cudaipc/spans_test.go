package cudaipc_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/cudaipc"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
)

// spansChildEnv makes the test binary, re-executed, act as
// TestSpansCrossProcess's receiver.
const spansChildEnv = "KVXFER_CUDAIPC_SPANS_CHILD"

// spanAllocs are the sizes of the receiver's allocations, in allocation
// order; the even ones hold the region's tensors, the odd ones lie
// between them (another tensor of the framework's, not registered).
var spanAllocs = []uint64{192 << 10, 64 << 10, 128<<10 + 777, 64 << 10, 256 << 10}

// spanHead and spanTail are the bytes of each used allocation left out of
// its span: its entry in the key starts and ends inside the allocation.
const spanHead, spanTail = 512, 256

// tensors allocates spanAllocs on d, each filled with pattern(size,
// 10+i), and returns them with the region spanning the used ones (lowest
// to end of highest) and the used spans, relative to the region.
func tensors(t *testing.T, d *cuda.Device) ([]*cuda.Memory, *kvcache.Region, []cudaipc.Span) {
	t.Helper()
	var ms []*cuda.Memory
	for i, n := range spanAllocs {
		ms = append(ms, devMem(t, d, n, byte(10+i)))
	}
	lo, hi := ^uintptr(0), uintptr(0)
	for i := 0; i < len(ms); i += 2 {
		lo = min(lo, uintptr(ms[i].Ptr()))
		hi = max(hi, uintptr(ms[i].Ptr())+uintptr(ms[i].Len()))
	}
	r, err := kvcache.ExternalDeviceRegion(lo, uint64(hi-lo), 0)
	if err != nil {
		t.Fatal(err)
	}
	var spans []cudaipc.Span
	for i := 0; i < len(ms); i += 2 {
		off := uint64(uintptr(ms[i].Ptr()) - lo)
		// Two spans per allocation (K and V of a tensor), the second
		// first: RegisterSpans sorts and merges them.
		half := ms[i].Len() / 2
		spans = append(spans, cudaipc.Span{Off: off + half, Len: ms[i].Len() - half - spanTail},
			cudaipc.Span{Off: off + spanHead, Len: half - spanHead})
	}
	return ms, r, spans
}

// packed is where the writer's source holds each entry's bytes: entries
// (ascending) back to back, so that the source is as large as the bytes
// written, whatever the distances the driver put between the
// allocations; total is their sum.
func packed(entries []cudaipc.Span) (at []uint64, total uint64) {
	for _, e := range entries {
		at = append(at, total)
		total += e.Len
	}
	return at, total
}

// wantTensors is what the receiver's allocations hold once every byte of
// every entry (allocs) was written from a source holding pattern(total,
// seed) packed (packed); with written false, what they held before.
func wantTensors(ms []*cuda.Memory, allocs []cudaipc.Allocation, seed byte, written bool) [][]byte {
	var entries []cudaipc.Span
	for _, al := range allocs {
		entries = append(entries, cudaipc.Span{Off: al.Off, Len: al.Len})
	}
	at, total := packed(entries)
	src := pattern(int(total), seed)
	var out [][]byte
	for i, m := range ms {
		w := pattern(int(m.Len()), byte(10+i))
		for k, al := range allocs {
			if written && al.Base == m.Ptr() {
				copy(w[al.AllocOff:al.AllocOff+al.Len], src[at[k]:at[k]+al.Len])
			}
		}
		out = append(out, w)
	}
	return out
}

// sourceOver registers, with a, a source region of n bytes (the
// destination's length: segment offsets are checked against it) of which
// only the first total bytes are memory, an allocation filled with
// pattern(total, seed): the rest is never read (Post refuses a segment
// that reads outside the span).
func sourceOver(t *testing.T, d *cuda.Device, a *cudaipc.Agent, n, total uint64, seed byte) rdma.Registration {
	t.Helper()
	sm := devMem(t, d, total, seed)
	r, err := kvcache.ExternalDeviceRegion(uintptr(sm.Ptr()), max(n, total), 0)
	if err != nil {
		t.Fatal(err)
	}
	src, err := a.RegisterSpans(r, []cudaipc.Span{{Off: 0, Len: total}})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// checkTensors compares each allocation with want and names the first
// difference.
func checkTensors(t *testing.T, d *cuda.Device, ms []*cuda.Memory, want [][]byte) string {
	for i, m := range ms {
		if j := rdmatest.FirstDiff(read(t, d, m.Ptr(), m.Len()), want[i]); j >= 0 {
			return fmt.Sprintf("allocation %d byte %d", i, j)
		}
	}
	return ""
}

const spansReady = "KVXFER-CUDAIPC-SPANS READY "

// TestSpansCrossProcessChild is the receiver of TestSpansCrossProcess; it
// does nothing unless re-executed by it. Its protocol, one line each way:
//
//	child:  READY <address> <key hex> <len> <off>:<len>,…   (the key's allocations)
//	parent: PRISTINE            child: PRISTINE ok | PRISTINE <difference>
//	parent: DEREGISTER          child: DEREGISTER busy|ok|<error>
//	parent: VERIFY <seed>       child: VERIFIED | MISMATCH <difference>
func TestSpansCrossProcessChild(t *testing.T) {
	if os.Getenv(spansChildEnv) == "" {
		t.Skip("runs only as TestSpansCrossProcess's child")
	}
	d := gpu(t)
	ms, r, spans := tensors(t, d)
	a := agent(t)
	defer a.Close() // before the memory is freed
	allocs, err := a.Allocations(r, spans)
	if err != nil {
		t.Fatal(err)
	}
	if len(allocs) != 3 {
		t.Fatalf("%d allocations, want 3: %+v", len(allocs), allocs)
	}
	reg, err := a.RegisterSpans(r, spans)
	if err != nil {
		t.Fatal(err)
	}
	var es []string
	for _, al := range allocs {
		es = append(es, fmt.Sprintf("%d:%d", al.Off, al.Len))
	}
	rr := reg.Remote()
	fmt.Printf("%s%s %s %d %s\n", spansReady, a.Address(), hex.EncodeToString(rr.Key), rr.Len, strings.Join(es, ","))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "PRISTINE":
			if diff := checkTensors(t, d, ms, wantTensors(ms, allocs, 0, false)); diff != "" {
				fmt.Println("PRISTINE", diff)
			} else {
				fmt.Println("PRISTINE ok")
			}
		case "DEREGISTER":
			switch err := a.Deregister(reg); {
			case errors.Is(err, rdma.ErrRegionBusy):
				fmt.Println("DEREGISTER busy")
			case err == nil:
				fmt.Println("DEREGISTER ok")
			default:
				fmt.Println("DEREGISTER", err)
			}
		case "VERIFY":
			seed, _ := strconv.ParseUint(arg, 10, 8)
			if err := a.Deregister(reg); err != nil {
				fmt.Println("MISMATCH deregister:", err)
				return
			}
			if diff := checkTensors(t, d, ms, wantTensors(ms, allocs, byte(seed), true)); diff != "" {
				fmt.Println("MISMATCH", diff)
				return
			}
			fmt.Println("VERIFIED")
			return
		}
	}
}

// TestSpansCrossProcess: a receiver process registers a region over three
// separate allocations (with other allocations and bytes outside its
// spans between them) with RegisterSpans; this process maps each through
// its IPC handle from the key's table and writes every byte of every
// allocation's entry, in shuffled batches. Before that, segments that
// straddle two allocations or fall into a gap, a batch with one of them
// behind a good segment, and forged keys (too many allocations,
// overlapping entries, an entry past its handle's allocation, an entry
// past the region, a handle that opens nothing, two entries of one
// allocation, a table that is not the key's) are refused by Post, with
// nothing written, no mapping leaked and this process still alive. While
// a batch is pending the receiver's Deregister is refused as busy; once
// flushed, the receiver finds every byte of its allocations as written
// and every byte outside the spans as it was.
func TestSpansCrossProcess(t *testing.T) {
	requireGPU(t)
	base := cudaipc.ImportRefs()
	child := rdmatest.StartChild(t, "TestSpansCrossProcessChild", spansChildEnv+"=1")
	f := strings.Fields(strings.TrimPrefix(child.Expect(t, spansReady), spansReady))
	if len(f) != 4 {
		t.Fatalf("bad READY line %q", f)
	}
	key, _ := hex.DecodeString(f[1])
	n, _ := strconv.ParseUint(f[2], 10, 64)
	dst := rdma.RemoteRegion{Key: key, Len: n}
	var entries []cudaipc.Span
	for e := range strings.SplitSeq(f[3], ",") {
		o, l, _ := strings.Cut(e, ":")
		off, _ := strconv.ParseUint(o, 10, 64)
		ln, _ := strconv.ParseUint(l, 10, 64)
		entries = append(entries, cudaipc.Span{Off: off, Len: ln})
	}
	if len(entries) != 3 {
		t.Fatalf("%d allocations in the key, want 3", len(entries))
	}
	for i := 1; i < len(entries); i++ {
		if entries[i].Off <= entries[i-1].Off+entries[i-1].Len {
			t.Fatalf("entries %v: no gap between %d and %d", entries, i-1, i)
		}
	}

	d := gpu(t)
	const seed = 9
	at, total := packed(entries)
	a := agent(t)
	src := sourceOver(t, d, a, n, total, seed)
	ep, err := a.Connect([]byte(f[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	noDone := func(error) { t.Error("Done of a refused post") }

	// Segments that do not lie in one allocation: refused whole.
	e0, e1 := entries[0], entries[1]
	end0 := e0.Off + e0.Len
	for _, c := range []struct {
		name string
		segs []kvcache.Segment
	}{
		{"straddling two allocations", []kvcache.Segment{{Src: 0, Dst: end0 - 10, Len: e1.Off + 10 - (end0 - 10)}}},
		{"running off an allocation into a gap", []kvcache.Segment{{Src: 0, Dst: end0 - 10, Len: 20}}},
		{"in a gap", []kvcache.Segment{{Src: 0, Dst: end0, Len: 1}}},
		{"before the first allocation's entry", []kvcache.Segment{{Src: 0, Dst: e0.Off - 1, Len: 1}}},
		{"in a gap behind a good segment", []kvcache.Segment{{Src: 0, Dst: e0.Off, Len: 100}, {Src: 0, Dst: end0 + 1, Len: 4}}},
	} {
		err := ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: c.segs, Done: noDone})
		var se *rdma.SegmentError
		if !errors.As(err, &se) || !errors.Is(err, rdma.ErrOutOfRange) || se.Index != len(c.segs)-1 || !strings.Contains(err.Error(), "destination") {
			t.Errorf("segment %s: Post = %v, want a *rdma.SegmentError for segment %d's destination wrapping ErrOutOfRange", c.name, err, len(c.segs)-1)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
	refs := cudaipc.ImportRefs() // the real key's mappings
	if refs != base+len(entries) {
		t.Errorf("%d mappings of the receiver's allocations, want %d", refs-base, len(entries))
	}

	// Forged keys: refused before any copy.
	forged := []struct {
		name  string
		edit  func([]cudaipc.ForgedEntry) []cudaipc.ForgedEntry
		stale bool
		want  string
	}{
		{"overlapping entries", func(es []cudaipc.ForgedEntry) []cudaipc.ForgedEntry {
			es[1].Off = es[0].Off + es[0].Len - 1
			return es
		}, false, "overlap"},
		{"an entry past its handle's allocation", func(es []cudaipc.ForgedEntry) []cudaipc.ForgedEntry {
			es[2].AllocOff += 1 << 20
			return es
		}, false, "passes the end of its allocation"},
		{"an entry longer than its allocation", func(es []cudaipc.ForgedEntry) []cudaipc.ForgedEntry {
			es[0].Len = es[1].Off - es[0].Off // the whole gap, past the allocation's end
			return es
		}, false, "passes the end of its allocation"},
		{"an offset past the region", func(es []cudaipc.ForgedEntry) []cudaipc.ForgedEntry {
			es[2].Off = n - es[2].Len + 1
			return es
		}, false, "pass the end of the"},
		{"a handle that opens nothing", func(es []cudaipc.ForgedEntry) []cudaipc.ForgedEntry {
			for i := range es[1].Handle {
				es[1].Handle[i] = byte(i * 7)
			}
			return es
		}, false, "allocation 1 of 3"},
		{"two entries of one allocation", func(es []cudaipc.ForgedEntry) []cudaipc.ForgedEntry {
			es[1].Handle = es[0].Handle
			return es
		}, false, "one IPC handle"},
		{"a table that is not the key's", func(es []cudaipc.ForgedEntry) []cudaipc.ForgedEntry {
			es[0].Len++
			return es
		}, true, "digest"},
	}
	post := func(key []byte) error {
		return ep.Post(rdma.Batch{Src: src, Dst: rdma.RemoteRegion{Key: key, Len: n},
			Segments: []kvcache.Segment{{Src: 0, Dst: e0.Off, Len: 64}}, Done: noDone})
	}
	if err := post(cudaipc.ForgeCount(key, cudaipc.MaxAllocations+1)); !errors.Is(err, rdma.ErrBadKey) || !strings.Contains(err.Error(), "4097 allocations, want 1..4096") {
		t.Errorf("a key claiming 4097 allocations: Post = %v, want ErrBadKey naming the count", err)
	} else {
		t.Logf("too many allocations: %v", err)
	}
	for _, c := range forged {
		fk, remove, err := cudaipc.ForgeKey(key, c.edit, c.stale)
		if err != nil {
			t.Fatal(err)
		}
		err = post(fk)
		if !errors.Is(err, rdma.ErrBadKey) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("forged key with %s: Post = %v, want ErrBadKey saying %q", c.name, err, c.want)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
		if err := remove(); err != nil {
			t.Error(err)
		}
		if got := cudaipc.ImportRefs(); got != refs {
			t.Errorf("forged key with %s: %d mappings left, want %d", c.name, got-base, refs-base)
		}
	}
	flushed := make(chan error, 1)
	ep.Flush(func(err error) { flushed <- err })
	if err := wait(t, flushed, "Flush"); err != nil {
		t.Fatal(err)
	}
	child.Send(t, "PRISTINE")
	if got := child.Expect(t, "PRISTINE "); got != "PRISTINE ok" {
		t.Fatalf("the receiver's memory after the refused posts: %s", got)
	}

	// Every byte of every entry, in shuffled batches; the first batch
	// blocks in its Done so the second stays pending behind it.
	const chunk = 24 << 10
	var segs []kvcache.Segment
	for k, e := range entries {
		for off := e.Off; off < e.Off+e.Len; off += chunk {
			l := min(chunk, e.Off+e.Len-off)
			segs = append(segs, kvcache.Segment{Src: at[k] + off - e.Off, Dst: off, Len: l})
		}
	}
	for i := range segs { // a fixed shuffle
		j := (i * 7919) % len(segs)
		segs[i], segs[j] = segs[j], segs[i]
	}
	entered, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(unblock) }) }
	defer release()
	if err := ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: segs[:1], Done: func(err error) {
		if err != nil {
			t.Errorf("batch A: %v", err)
		}
		close(entered)
		<-unblock
	}}); err != nil {
		t.Fatal(err)
	}
	<-entered
	failed := make(chan error, 2)
	if err := ep.Post(rdma.Batch{Src: src, Dst: dst, Segments: segs[1:], Done: func(err error) {
		if err != nil {
			failed <- err
		}
	}}); err != nil {
		t.Fatal(err)
	}
	// The same key, republished unchanged by ForgeKey, works: the
	// refusals above are the checks', not the forgery's.
	same, remove, err := cudaipc.ForgeKey(key, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	last := segs[len(segs)-1]
	if err := ep.Post(rdma.Batch{Src: src, Dst: rdma.RemoteRegion{Key: same, Len: n}, Segments: []kvcache.Segment{last}, Done: func(err error) {
		if err != nil {
			failed <- err
		}
	}}); err != nil {
		t.Fatalf("the key republished unchanged: %v", err)
	}
	child.Send(t, "DEREGISTER")
	if got := child.Expect(t, "DEREGISTER "); got != "DEREGISTER busy" {
		t.Errorf("receiver's Deregister with a batch pending: %q, want busy", got)
	}
	release()
	ep.Flush(func(err error) { flushed <- err })
	if err := wait(t, flushed, "Flush"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		t.Fatalf("a batch: %v", err)
	default:
	}
	child.Send(t, fmt.Sprintf("VERIFY %d", seed))
	if got := child.Expect(t, ""); got != "VERIFIED" {
		t.Fatalf("receiver: %s", got)
	}
	child.Wait(t)
	if err := ep.Close(); err != nil {
		t.Fatal(err)
	}
	if got := cudaipc.ImportRefs(); got != base {
		t.Errorf("%d mappings left after Close", got-base)
	}
}

// TestRegisterSpans: in one process (the receiver's allocations reached
// by address), a region over three allocations is written in every byte
// of its spans and nowhere else; a span running past its allocation, one
// outside the region and one in no allocation are refused by name with a
// *cudaipc.SpanError naming the span's index.
func TestRegisterSpans(t *testing.T) {
	d := gpu(t)
	ms, r, spans := tensors(t, d)
	const seed = 5
	s, rcv := agent(t), agent(t)
	allocs, err := rcv.Allocations(r, spans)
	if err != nil {
		t.Fatal(err)
	}
	var entries []cudaipc.Span
	for _, al := range allocs {
		entries = append(entries, cudaipc.Span{Off: al.Off, Len: al.Len})
	}
	at, total := packed(entries)
	src := sourceOver(t, d, s, r.Len, total, seed)
	dst, err := rcv.RegisterSpans(r, spans)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := s.Connect(rcv.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	// Each span, from where its entry's bytes are packed in the source;
	// the spans cover their entries whole.
	var segs []kvcache.Segment
	for _, sp := range spans {
		for k, e := range entries {
			if sp.Off >= e.Off && sp.Off < e.Off+e.Len {
				segs = append(segs, kvcache.Segment{Src: at[k] + sp.Off - e.Off, Dst: sp.Off, Len: sp.Len})
			}
		}
	}
	if len(segs) != len(spans) {
		t.Fatalf("%d of %d spans in the allocations' entries", len(segs), len(spans))
	}
	done := make(chan error, 1)
	if err := ep.Post(rdma.Batch{Src: src, Dst: dst.Remote(), Segments: segs, Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, done, "Done"); err != nil {
		t.Fatal(err)
	}
	// A segment across the entries, gaps included, is refused.
	if err := ep.Post(rdma.Batch{Src: src, Dst: dst.Remote(), Segments: []kvcache.Segment{{Src: 0, Dst: 0, Len: r.Len}},
		Done: func(error) { t.Error("Done of a refused post") }}); !errors.Is(err, rdma.ErrOutOfRange) {
		t.Errorf("a segment over the whole region: %v, want ErrOutOfRange", err)
	}
	if diff := checkTensors(t, d, ms, wantTensors(ms, allocs, seed, true)); diff != "" {
		t.Fatalf("the receiver's allocations differ from the model at %s", diff)
	}
	if err := rcv.Deregister(dst); err != nil {
		t.Fatal(err)
	}

	// The used allocation at the lowest address: a span from inside it
	// past its end still lies in the region.
	low := ms[0]
	for i := 2; i < len(ms); i += 2 {
		if ms[i].Ptr() < low.Ptr() {
			low = ms[i]
		}
	}
	lowOff := uint64(uintptr(low.Ptr()) - r.Base)
	for _, c := range []struct {
		name  string
		spans []cudaipc.Span
		index int
		want  string
	}{
		{"a span past its allocation", append(slices.Clone(spans), cudaipc.Span{Off: lowOff + 100, Len: low.Len()}), len(spans), "run past the CUDA allocation"},
		{"a span outside the region", []cudaipc.Span{spans[0], {Off: r.Len - 10, Len: 11}}, 1, "outside the"},
		{"no span", []cudaipc.Span{{Off: 0, Len: 0}}, -1, "no span"},
	} {
		_, err := rcv.RegisterSpans(r, c.spans)
		var se *cudaipc.SpanError
		switch {
		case !errors.Is(err, kvcache.ErrBadRegion) || !strings.Contains(err.Error(), c.want):
			t.Errorf("RegisterSpans with %s: %v, want ErrBadRegion saying %q", c.name, err, c.want)
		case c.index >= 0 && (!errors.As(err, &se) || se.Index != c.index):
			t.Errorf("RegisterSpans with %s: %v, want a SpanError of span %d", c.name, err, c.index)
		default:
			t.Logf("%s: %v", c.name, err)
		}
	}
	// A span in no allocation: where allocation 3 was, once freed (it lies
	// between two used allocations where the driver allocates in order,
	// as the fake and the real one do).
	var gap *cudaipc.Span
	if y := uintptr(ms[3].Ptr()); y > r.Base && y < r.Base+uintptr(r.Len) {
		if err := ms[3].Free(); err != nil {
			t.Fatal(err)
		}
		gap = &cudaipc.Span{Off: uint64(y - r.Base), Len: 1}
	}
	if gap == nil {
		t.Log("allocation 3 lies outside the region here: the refusal of a span in no allocation is not checked")
	} else {
		_, err := rcv.RegisterSpans(r, []cudaipc.Span{spans[0], *gap})
		var se *cudaipc.SpanError
		if !errors.As(err, &se) || se.Index != 1 || !strings.Contains(err.Error(), "no cuMemAlloc allocation") {
			t.Errorf("RegisterSpans with a span in no allocation: %v, want a SpanError of span 1 saying so", err)
		} else {
			t.Logf("a span in no allocation: %v", err)
		}
	}
	if got := read(t, d, ms[1].Ptr(), ms[1].Len()); !bytes.Equal(got, pattern(int(ms[1].Len()), 11)) {
		t.Error("the allocation between the spans changed")
	}
}
