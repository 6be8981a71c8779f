package shm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/rdmatest"
	"github.com/kvxfer/kvxfer/rdma/shm"
)

// testBlock is the revocation unit of these tests: 16 pages.
var testBlock = uint64(16 * os.Getpagesize())

// newRevocable makes a revocable region of view blocks plus spare blocks,
// closed at cleanup, with its file's path.
func newRevocable(t testing.TB, view, spare int) (*shm.RevocableRegion, string) {
	t.Helper()
	name := fmt.Sprintf("kvxfer-test-revocable-%d-%d", os.Getpid(), time.Now().UnixNano())
	r, err := shm.NewRevocableRegion(uint64(view)*testBlock, shm.RevocableOptions{Name: name, Block: testBlock, Spare: uint64(spare) * testBlock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("revocable region Close: %v", err)
		}
	})
	return r, filepath.Join(shm.Dir(), name)
}

// fileMapping maps the whole region file, as a writer holds it; data is
// what follows the header page (file data offsets).
func fileMapping(t testing.TB, path string) (data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	return mem[4096:]
}

// writer is an shm agent of this process with an endpoint to the
// receiver and a registered source: it maps the region file on first use,
// as a writer of another process does.
type writer struct {
	a   *shm.Agent
	ep  rdma.Endpoint
	src rdma.Registration
	buf []byte
	dst rdma.RemoteRegion
}

func newWriter(t *testing.T, receiver *shm.Agent, dst rdma.RemoteRegion, n uint64) *writer {
	t.Helper()
	w := &writer{a: shm.New(), dst: dst}
	t.Cleanup(func() { w.a.Close() })
	src, _ := kvcache.NewHostRegion(n)
	var err error
	if w.src, err = w.a.Register(src); err != nil {
		t.Fatal(err)
	}
	w.buf = src.Bytes()
	if w.ep, err = w.a.Connect(receiver.Address()); err != nil {
		t.Fatal(err)
	}
	return w
}

// write copies w.buf's segments into the region and waits for Done.
func (w *writer) write(t *testing.T, segs []kvcache.Segment) {
	t.Helper()
	done := make(chan error, 1)
	if err := w.ep.Post(rdma.Batch{Src: w.src, Dst: w.dst, Segments: segs, Done: func(err error) { done <- err }}); err != nil {
		t.Fatalf("Post(%v): %v", segs, err)
	}
	if err := rdmatest.Recv(t, done, "Done"); err != nil {
		t.Fatalf("batch %v: %v", segs, err)
	}
}

// TestRevokeHidesStaleWriter: after Revoke, a writer that still writes at
// the block's old file offset (through an endpoint's mapping, and through a
// plain second mapping of the file) lands in the file — it is not stopped —
// but the receiver's view of the block does not change; a writer sent the
// translated offset is seen by the receiver; other blocks are untouched.
func TestRevokeHidesStaleWriter(t *testing.T) {
	const view, spare = 4, 2
	rr, path := newRevocable(t, view, spare)
	receiver := shm.New()
	defer receiver.Close()
	reg, err := receiver.Register(rr.Region())
	if err != nil {
		t.Fatal(err)
	}
	remote := reg.Remote()
	if want := uint64(view+spare) * testBlock; remote.Len != want {
		t.Fatalf("Remote().Len = %d, want the file's data length %d (writers address spare blocks too)", remote.Len, want)
	}
	viewBytes := rr.Region().Bytes()
	blk := func(i int) []byte { return viewBytes[uint64(i)*testBlock : uint64(i+1)*testBlock] }
	stale := fileMapping(t, path)

	w := newWriter(t, receiver, remote, testBlock)
	rdmatest.Pattern(w.buf, 1)
	off1 := testBlock // view block 1
	before, err := rr.FileOffset(off1)
	if err != nil || before != off1 {
		t.Fatalf("FileOffset(%d) before any revoke = %d, %v; want the same offset", off1, before, err)
	}
	w.write(t, []kvcache.Segment{{Dst: before, Len: testBlock}})
	if !bytes.Equal(blk(1), w.buf) {
		t.Fatal("the writer's block did not reach the view before the revoke")
	}
	others := [][]byte{bytes.Clone(blk(0)), bytes.Clone(blk(2)), bytes.Clone(blk(3))}

	v, err := rr.Revoke(off1, testBlock)
	if err != nil {
		t.Fatal(err)
	}
	after, err := rr.FileOffset(off1 + 5)
	if err != nil {
		t.Fatal(err)
	}
	if after-5 == before || after-5 < uint64(view)*testBlock {
		t.Fatalf("FileOffset after revoke = %d, want a spare block's offset (≥ %d), not the old %d", after, uint64(view)*testBlock, before)
	}
	if got := v.FileOffsets(); !reflect.DeepEqual(got, []uint64{before}) || v.Off() != off1 || v.Len() != testBlock {
		t.Errorf("revocation of [%d, +%d) quarantines %v, want [%d]", v.Off(), v.Len(), got, before)
	}
	if free, quar := rr.Spare(); free != spare-1 || quar != 1 {
		t.Errorf("Spare() = %d free, %d quarantined; want %d, 1", free, quar, spare-1)
	}
	shown := bytes.Clone(blk(1))
	if bytes.Equal(shown, w.buf) {
		t.Fatal("the revoked block still shows the old pages")
	}

	// The stale writer goes on at the old offset: its endpoint's mapping,
	// then a plain mapping of the file.
	rdmatest.Pattern(w.buf, 2)
	w.write(t, []kvcache.Segment{{Dst: before, Len: testBlock}})
	copy(stale[before:before+testBlock/2], bytes.Repeat([]byte{0xA5}, int(testBlock/2)))
	if !bytes.Equal(stale[before+testBlock/2:before+testBlock], w.buf[testBlock/2:]) {
		t.Fatal("the stale write did not land in the file (the test would prove nothing)")
	}
	if !bytes.Equal(blk(1), shown) {
		t.Errorf("a stale write at file offset %d changed the receiver's view of the revoked block", before)
	}

	// A new writer, told the translated offset, is seen.
	rdmatest.Pattern(w.buf, 3)
	segs, err := rr.Translate([]kvcache.Segment{{Src: 0, Dst: off1, Len: testBlock}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []kvcache.Segment{{Src: 0, Dst: after - 5, Len: testBlock}}; !reflect.DeepEqual(segs, want) {
		t.Fatalf("Translate = %v, want %v", segs, want)
	}
	w.write(t, segs)
	if i := rdmatest.FirstDiff(blk(1), w.buf); i >= 0 {
		t.Errorf("a write at the translated offset: view byte %d differs", i)
	}
	for j, i := range []int{0, 2, 3} {
		if !bytes.Equal(blk(i), others[j]) {
			t.Errorf("block %d changed", i)
		}
	}

	if err := rr.ReleaseRevoked(v); err != nil {
		t.Fatal(err)
	}
	if free, quar := rr.Spare(); free != spare || quar != 0 {
		t.Errorf("Spare() after release = %d free, %d quarantined; want %d, 0", free, quar, spare)
	}
	if err := rr.ReleaseRevoked(v); !errors.Is(err, shm.ErrBadRange) || !strings.Contains(err.Error(), "already released") {
		t.Errorf("second ReleaseRevoked: %v, want ErrBadRange (already released)", err)
	}
	if free, _ := rr.Spare(); free != spare {
		t.Errorf("a refused second release changed the reserve: %d free, want %d", free, spare)
	}
	if err := receiver.Deregister(reg); err != nil {
		t.Fatal(err)
	}
}

// TestRevokeSpareReserve: a revoke larger than the free reserve fails with
// ErrNoSpare and changes nothing; release gives the capacity back.
func TestRevokeSpareReserve(t *testing.T) {
	rr, _ := newRevocable(t, 4, 2)
	if _, err := rr.Revoke(0, 3*testBlock); !errors.Is(err, shm.ErrNoSpare) || !strings.Contains(err.Error(), "3 blocks wanted, 2 spare free") {
		t.Fatalf("Revoke of 3 blocks with 2 spare: %v, want ErrNoSpare naming the counts", err)
	}
	for i := uint64(0); i < 4; i++ {
		if off, _ := rr.FileOffset(i * testBlock); off != i*testBlock {
			t.Errorf("a failed revoke moved block %d to %d", i, off)
		}
	}
	if free, quar := rr.Spare(); free != 2 || quar != 0 {
		t.Errorf("Spare() after a failed revoke = %d, %d; want 2, 0", free, quar)
	}
	v1, err := rr.Revoke(2*testBlock, 2*testBlock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rr.Revoke(0, testBlock); !errors.Is(err, shm.ErrNoSpare) {
		t.Fatalf("Revoke with the reserve used up: %v, want ErrNoSpare", err)
	}
	if err := rr.ReleaseRevoked(v1); err != nil {
		t.Fatal(err)
	}
	v2, err := rr.Revoke(0, 2*testBlock)
	if err != nil {
		t.Fatalf("Revoke after release: %v", err)
	}
	// The released blocks (the old file blocks 2, 3) are the reserve now.
	if got, want := v2.FileOffsets(), []uint64{0, testBlock}; !reflect.DeepEqual(got, want) {
		t.Errorf("quarantined %v, want %v", got, want)
	}
	for i, want := range []uint64{2, 3, 4, 5} {
		if off, _ := rr.FileOffset(uint64(i) * testBlock); off != want*testBlock {
			t.Errorf("block %d at file block %d, want %d", i, off/testBlock, want)
		}
	}
}

// TestRevokeKeepsEveryBlockWritable: after revocations that scatter the
// view over the file (runs that are not contiguous), a pattern written
// through Translate — and through a writer-side Indirection — reads back
// whole in the view.
func TestRevokeKeepsEveryBlockWritable(t *testing.T) {
	const view = 6
	rr, _ := newRevocable(t, view, 4)
	receiver := shm.New()
	defer receiver.Close()
	reg, err := receiver.Register(rr.Region())
	if err != nil {
		t.Fatal(err)
	}
	defer receiver.Deregister(reg)
	n := uint64(view) * testBlock
	w := newWriter(t, receiver, reg.Remote(), n)

	a, err := rr.Revoke(testBlock, testBlock) // block 1 → spare 6
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rr.Revoke(3*testBlock, testBlock); err != nil { // block 3 → spare 7
		t.Fatal(err)
	}
	if err := rr.ReleaseRevoked(a); err != nil { // file block 1 free again
		t.Fatal(err)
	}
	if _, err := rr.Revoke(4*testBlock, 2*testBlock); err != nil { // blocks 4, 5 → spare 8, 9
		t.Fatal(err)
	}
	if _, err := rr.Revoke(0, testBlock); err != nil { // block 0 → file block 1
		t.Fatal(err)
	}
	for seed, translate := range map[uint64]func([]kvcache.Segment) ([]kvcache.Segment, error){
		4: rr.Translate,
		5: func(segs []kvcache.Segment) ([]kvcache.Segment, error) {
			ix, err := rr.Indirection(0, n)
			if err != nil {
				return nil, err
			}
			return ix.Translate(segs)
		},
	} {
		rdmatest.Pattern(w.buf, seed)
		segs, err := translate(rdmatest.ShuffledSegments(n))
		if err != nil {
			t.Fatal(err)
		}
		w.write(t, segs)
		if i := rdmatest.FirstDiff(rr.Region().Bytes(), w.buf); i >= 0 {
			t.Fatalf("seed %d: view byte %d (block %d) differs after writing through the table", seed, i, uint64(i)/testBlock)
		}
	}
}

// TestRevokeRefusesBadRanges: every bad argument is an ErrBadRange naming
// the offending values; nothing changes.
func TestRevokeRefusesBadRanges(t *testing.T) {
	rr, _ := newRevocable(t, 4, 4)
	b := testBlock
	for _, c := range []struct {
		off, n uint64
		want   string
	}{
		{1, b, fmt.Sprintf("[1, +%d)", b)},
		{0, b + 1, fmt.Sprintf("[0, +%d)", b+1)},
		{0, 0, "[0, +0)"},
		{4 * b, b, "outside the"},
		{3 * b, 2 * b, "outside the"},
		{math.MaxUint64 - b + 1, b, "outside the"},
	} {
		if v, err := rr.Revoke(c.off, c.n); !errors.Is(err, shm.ErrBadRange) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Revoke(%d, %d) = %v, %v; want ErrBadRange naming %q", c.off, c.n, v, err, c.want)
		}
	}
	if free, quar := rr.Spare(); free != 4 || quar != 0 {
		t.Errorf("refused revokes changed the reserve: %d, %d", free, quar)
	}
	if _, err := rr.FileOffset(4 * b); !errors.Is(err, shm.ErrBadRange) {
		t.Errorf("FileOffset past the end: %v, want ErrBadRange", err)
	}
	if _, err := rr.Indirection(3*b, b+1); !errors.Is(err, shm.ErrBadRange) {
		t.Errorf("Indirection past the end: %v, want ErrBadRange", err)
	}
	if _, err := rr.Translate([]kvcache.Segment{{Dst: 3 * b, Len: b + 1}}); !errors.Is(err, shm.ErrBadRange) || !strings.Contains(err.Error(), "segment 0") {
		t.Errorf("Translate past the end: %v, want ErrBadRange naming segment 0", err)
	}
	other, _ := newRevocable(t, 1, 1)
	v, err := other.Revoke(0, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := rr.ReleaseRevoked(v); !errors.Is(err, shm.ErrBadRange) {
		t.Errorf("ReleaseRevoked of another region's revocation: %v, want ErrBadRange", err)
	}
	page := uint64(os.Getpagesize())
	for _, c := range []struct {
		n    uint64
		o    shm.RevocableOptions
		want string
	}{
		{b, shm.RevocableOptions{Block: page + 1}, fmt.Sprintf("block %d bytes", page+1)},
		{b, shm.RevocableOptions{}, "block 0 bytes"},
		{b + page, shm.RevocableOptions{Block: b}, fmt.Sprintf("length %d", b+page)},
		{b, shm.RevocableOptions{Block: b, Spare: page}, fmt.Sprintf("spare %d", page)},
	} {
		if r, err := shm.NewRevocableRegion(c.n, c.o); !errors.Is(err, shm.ErrBadRange) || !strings.Contains(err.Error(), c.want) {
			if err == nil {
				r.Close()
			}
			t.Errorf("NewRevocableRegion(%d, %+v): %v, want ErrBadRange naming %q", c.n, c.o, err, c.want)
		}
	}
}

func TestIndirectionTranslate(t *testing.T) {
	const b = 100 // Translate itself needs no page alignment
	ix := shm.Indirection{Block: b, First: 2, Files: []uint64{500, 600, 0, 900}}
	for _, c := range []struct {
		in, want []kvcache.Segment
	}{
		{[]kvcache.Segment{{Src: 7, Dst: 210, Len: 20}}, []kvcache.Segment{{Src: 7, Dst: 510, Len: 20}}},
		// Blocks 2 and 3 are consecutive in the file: one segment.
		{[]kvcache.Segment{{Src: 0, Dst: 250, Len: 100}}, []kvcache.Segment{{Src: 0, Dst: 550, Len: 100}}},
		// 3 → 4 is not: split at the boundary; 4 → 5 neither.
		{[]kvcache.Segment{{Src: 1000, Dst: 390, Len: 120}},
			[]kvcache.Segment{{Src: 1000, Dst: 690, Len: 10}, {Src: 1010, Dst: 0, Len: 100}, {Src: 1110, Dst: 900, Len: 10}}},
		// Empty segments are dropped; two input segments are never merged.
		{[]kvcache.Segment{{Dst: 200, Len: 0}, {Src: 0, Dst: 200, Len: 10}, {Src: 10, Dst: 210, Len: 10}},
			[]kvcache.Segment{{Src: 0, Dst: 500, Len: 10}, {Src: 10, Dst: 510, Len: 10}}},
	} {
		got, err := ix.Translate(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("Translate(%v) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, s := range []kvcache.Segment{{Dst: 199, Len: 1}, {Dst: 590, Len: 20}, {Dst: math.MaxUint64, Len: 2}} {
		if _, err := ix.Translate([]kvcache.Segment{s}); !errors.Is(err, shm.ErrBadRange) {
			t.Errorf("Translate(%v): %v, want ErrBadRange", s, err)
		}
	}
	if _, err := (shm.Indirection{}).Translate([]kvcache.Segment{{Len: 1}}); !errors.Is(err, shm.ErrBadRange) {
		t.Errorf("Translate with block 0: %v, want ErrBadRange", err)
	}
}

// TestIndirectionTranslateRefusesAnOverflowingTable: an Indirection is what
// a receiver sends its writers, so its fields come from a peer. A table
// whose view range [First*Block, (First+len(Files))*Block) does not fit in
// 64 bits is refused with ErrBadRange; before, First*Block wrapped to a
// small range that the segment check let through, and the table lookup
// panicked with an index out of range.
func TestIndirectionTranslateRefusesAnOverflowingTable(t *testing.T) {
	for _, ix := range []shm.Indirection{
		{Block: 4096, First: 1 << 52, Files: []uint64{0}},      // First*Block wraps to 0
		{Block: 4096, First: 1<<52 - 1, Files: []uint64{0, 0}}, // the end wraps to 0
		{Block: 1 << 63, First: 2, Files: []uint64{0}},
	} {
		var got []kvcache.Segment
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			got, err = ix.Translate([]kvcache.Segment{{Src: 0, Dst: 0, Len: 1}})
		}()
		if !errors.Is(err, shm.ErrBadRange) {
			t.Errorf("Translate with table %+v: %v, %v; want ErrBadRange", ix, got, err)
		}
	}
}

// TestIndirectionTranslateRefusesAFileOffsetPast2to64: the file offsets
// of an Indirection come from a peer too. An entry whose block's bytes
// pass 2^64 is no offset of any file: Translate refuses it with
// ErrBadRange naming the segment. Before, the offset plus the segment's
// place in its block wrapped to a small file offset that Post's range
// check let through, and the bytes landed at the start of the file, in
// another block.
func TestIndirectionTranslateRefusesAFileOffsetPast2to64(t *testing.T) {
	for _, c := range []struct {
		ix  shm.Indirection
		seg kvcache.Segment
	}{
		// The segment's first byte wraps to file offset 99.
		{shm.Indirection{Block: 4096, Files: []uint64{math.MaxUint64 - 100}}, kvcache.Segment{Src: 0, Dst: 200, Len: 10}},
		// The block's last byte is at 2^64.
		{shm.Indirection{Block: 4096, First: 1, Files: []uint64{0, math.MaxUint64 - 4095}}, kvcache.Segment{Src: 0, Dst: 8192, Len: 4096}},
	} {
		got, err := c.ix.Translate([]kvcache.Segment{{Src: 0, Dst: c.ix.First * c.ix.Block, Len: 8}, c.seg})
		if !errors.Is(err, shm.ErrBadRange) || !strings.Contains(err.Error(), "segment 1") {
			t.Errorf("Translate(%v) with table %+v: %v, %v; want ErrBadRange naming segment 1", c.seg, c.ix, got, err)
		}
	}
}

// ---- Across processes: a writer stopped mid-copy resumes after a revoke ----

const (
	staleChildEnv  = "KVXFER_SHM_STALE_WRITER"
	staleReady     = "KVXFER-SHM STALE-WRITER READY"
	staleCounterAt = 0 // the counter word's offset in the block
)

// TestStaleWriterChild maps the region file the parent names and copies
// into file block 0 without pause: a counter word, then the block's other
// bytes, again and again, until its stdin closes.
func TestStaleWriterChild(t *testing.T) {
	path := os.Getenv(staleChildEnv)
	if path == "" {
		t.Skip("runs only as TestRevokeStopsAStoppedWriter's child")
	}
	data := fileMapping(t, path)
	var stop atomic.Bool
	go func() {
		os.Stdin.Read(make([]byte, 1)) // EOF when the parent is done
		stop.Store(true)
	}()
	fill := make([]byte, testBlock)
	fmt.Println(staleReady)
	word := (*atomic.Uint64)(unsafe.Pointer(&data[staleCounterAt]))
	for i := uint64(1); !stop.Load(); i++ {
		binary.LittleEndian.PutUint64(fill[:8], i)
		copy(data[8:testBlock], fill[8:]) // the memcpy a SIGSTOP can cut
		word.Store(i)
	}
}

// TestRevokeStopsAStoppedWriter: a writer of another process copies into a
// block without pause; the parent stops it (SIGSTOP), revokes the block,
// and resumes it. The resumed writer goes on writing the old file block —
// the parent watches its counter advance there — while the receiver's view
// of the block does not change; a fresh write at the translated offset is
// seen.
func TestRevokeStopsAStoppedWriter(t *testing.T) {
	if os.Getenv(staleChildEnv) != "" {
		t.Skip("parent only")
	}
	rr, path := newRevocable(t, 2, 1)
	child := rdmatest.StartChild(t, "TestStaleWriterChild", staleChildEnv+"="+path)
	child.Expect(t, staleReady)
	file := fileMapping(t, path)
	counter := (*atomic.Uint64)(unsafe.Pointer(&file[staleCounterAt]))
	view := rr.Region().Bytes()[:testBlock]
	viewCounter := (*atomic.Uint64)(unsafe.Pointer(&view[staleCounterAt]))

	// The view shows the writer's copies before the revoke.
	waitFor(t, "the writer's copies in the view", func() bool { return viewCounter.Load() > 100 })

	p := child.Process()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	v, err := rr.Revoke(0, testBlock)
	if err != nil {
		p.Signal(syscall.SIGCONT)
		t.Fatal(err)
	}
	shown := bytes.Clone(view)
	at := counter.Load()
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the resumed writer's copies in the old file block", func() bool { return counter.Load() > at+1000 })
	if i := rdmatest.FirstDiff(view, shown); i >= 0 {
		t.Errorf("the resumed writer changed the revoked view at byte %d (counter %d → %d)", i, at, counter.Load())
	}
	foff, err := rr.FileOffset(0)
	if err != nil {
		t.Fatal(err)
	}
	fresh := bytes.Repeat([]byte{0x5A}, int(testBlock))
	copy(file[foff:foff+testBlock], fresh)
	if !bytes.Equal(view, fresh) {
		t.Error("a write at the translated offset is not seen in the view")
	}
	child.Wait(t) // stdin closed: the writer stops; its exit is the proof
	if err := rr.ReleaseRevoked(v); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds, failing t after rdmatest.WaitLimit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(rdmatest.WaitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, rdmatest.WaitLimit)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestRevokerRemap: the kvcache.Revoker view of a region: nothing to remap
// before a revoke; after one, exactly the revoked blocks' runs, merged
// where their file offsets are consecutive, clipped to the range asked;
// the release closure returns the spare.
func TestRevokerRemap(t *testing.T) {
	page := uint64(os.Getpagesize())
	rr, err := shm.NewRevocableRegion(256*page, shm.RevocableOptions{Block: page, Spare: 8 * page})
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	rv := rr.Revoker()
	if got := rv.Remap(nil, 0, 256*page); len(got) != 0 {
		t.Fatalf("remap before any revoke: %v", got)
	}
	release, err := rv.Revoke(130*page, 3*page)
	if err != nil {
		t.Fatal(err)
	}
	got := rv.Remap(nil, 0, 256*page)
	if len(got) != 1 || got[0].View != 130*page || got[0].Len != 3*page || got[0].File < 256*page {
		t.Fatalf("remap after revoking blocks 130..132: %+v", got)
	}
	if clip := rv.Remap(nil, 131*page+10, page); len(clip) != 1 || clip[0].View != 131*page+10 ||
		clip[0].File != got[0].File+page+10 || clip[0].Len != page {
		t.Fatalf("clipped remap: %+v (whole: %+v)", clip, got)
	}
	if none := rv.Remap(nil, 0, 130*page); len(none) != 0 {
		t.Fatalf("remap of untouched blocks: %+v", none)
	}
	if free, quar := rr.Spare(); free != 5 || quar != 3 {
		t.Fatalf("spare free %d quarantined %d, want 5 and 3", free, quar)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if free, quar := rr.Spare(); free != 8 || quar != 0 {
		t.Fatalf("after release: spare free %d quarantined %d, want 8 and 0", free, quar)
	}
}

// TestRevokerRemapOfARangePast2To64: a range whose end off+n passes 2^64
// reaches to the region's end, as one that ends past the region does;
// before, off+n wrapped below off and Remap named no run at all, so the
// writers of a revoked block in it would have been sent no remap and
// written into its quarantined file block.
func TestRevokerRemapOfARangePast2To64(t *testing.T) {
	page := uint64(os.Getpagesize())
	rr, err := shm.NewRevocableRegion(4*page, shm.RevocableOptions{Block: page, Spare: page})
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	rv := rr.Revoker()
	release, err := rv.Revoke(2*page, page)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	want := rv.Remap(nil, page, 3*page)
	if len(want) != 1 || want[0].View != 2*page {
		t.Fatalf("remap of blocks 1..3 after revoking block 2: %+v", want)
	}
	if got := rv.Remap(nil, page, math.MaxUint64); !reflect.DeepEqual(got, want) {
		t.Fatalf("Remap(%d, 2^64-1) = %+v, want %+v (as for the range to the region's end)", page, got, want)
	}
}

// TestRevocableUnlinkKeepsTheMapping: a revocable region's Unlink removes
// its file's name and keeps its view mapped; Close still succeeds.
func TestRevocableUnlinkKeepsTheMapping(t *testing.T) {
	r, path := newRevocable(t, 2, 1)
	if err := r.Unlink(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("region file after Unlink: %v, want it gone", err)
	}
	b := r.Region().Bytes()
	b[len(b)-1] = 9 // still mapped
}
