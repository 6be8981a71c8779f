package rdmabench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/rdma"
	"github.com/kvxfer/kvxfer/rdma/loopback"
	"github.com/kvxfer/kvxfer/rdma/shm"
	"github.com/kvxfer/kvxfer/rdma/ucx"
)

// Copy is the pseudo-backend whose Run is Go's copy.
const Copy = "copy"

// Backends are the backends a Rig can run besides Copy (ucx where the
// binary has it).
func Backends() []string {
	if ucx.Available {
		return []string{loopback.Backend, shm.Backend, ucx.Backend}
	}
	return []string{loopback.Backend, shm.Backend}
}

// Shape is what one operation moves: Segments segments of SegmentBytes
// each, and over how much memory a rig's operations rotate.
type Shape struct {
	SegmentBytes uint64
	Segments     int
	// Slots is how many distinct places of one operation's size the rig's
	// source and destination hold: operation i reads slot i%Slots of the
	// source and writes slot i%Slots of the destination. 0 or 1: every
	// operation reuses the same bytes, which then stay in a CPU cache when
	// they fit one; enough slots to span more than any cache measure the
	// rate over memory, as a request's distinct pages see it.
	Slots int
}

// Bytes is the size of one operation.
func (s Shape) Bytes() uint64 { return s.SegmentBytes * uint64(s.Segments) }

// SlotCount is Slots, at least 1.
func (s Shape) SlotCount() int { return max(1, s.Slots) }

// SpanBytes is what the rig's source (and its destination) holds: Bytes()
// for each slot.
func (s Shape) SpanBytes() uint64 { return s.Bytes() * uint64(s.SlotCount()) }

// A Rig keeps WindowFor(shape) operations in flight: at least MinWindow,
// and enough for WindowBytes, up to MaxWindow. Every operation completes
// remotely (flushed) before its Done, so over a transport whose
// completions lag the wire by milliseconds (TCP: the acknowledgement
// comes after the peer has drained its socket) the bytes in flight bound
// the rate: at 64 KiB, 256 operations (16 MiB) held TCP over loopback to
// 1.05 GB/s and 1024 (64 MiB) gave 1.19 GB/s, where ucx_perftest, which
// counts local completions, keeps as much queued as UCX takes.
const (
	MinWindow   = 256
	MaxWindow   = 1024
	WindowBytes = 64 << 20
)

// WindowFor is how many operations of shape s a Rig keeps in flight.
func WindowFor(s Shape) int {
	return max(MinWindow, int(min(uint64(MaxWindow), WindowBytes/max(s.Bytes(), 1))))
}

// Rig is one backend's sender and receiver, connected, with regions for
// Shape.SlotCount() operations. Not safe for concurrent use.
type Rig struct {
	backend string
	shape   Shape
	// slots[k] is the segment list of an operation on slot k (see layout).
	slots [][]kvcache.Segment
	// posted and copied count the operations Run posted and Copy made: the
	// next of each goes to slot count % len(slots), and Verify checks the
	// slots written so far.
	posted, copied uint64
	// fromPosted and fromCopied are posted and copied at the last
	// Scribble: Verify checks the slots written since.
	fromPosted, fromCopied uint64

	// Go's copy between plain buffers, the baseline.
	copySrc, copyDst []byte

	sender, receiver rdma.Agent
	ep               rdma.Endpoint
	src              rdma.Registration
	dst              rdma.RemoteRegion
	dstBytes         []byte // the receiver's memory, for Verify
	dstCloser        io.Closer
	peer             *peer // the receiver's process, if not this one

	window int64 // WindowFor(shape)

	// Completion accounting, updated by Done on the backend's goroutine.
	inflight atomic.Int64
	// waitLimit is the limit the poster waits for in waitBelow, -1 when it
	// is not waiting: a completion wakes it only on reaching that limit.
	// Done runs on the backend's goroutine, so every wake-up (a goroutine
	// readied, a futex call to start a thread for it) is charged to the
	// backend and not to the copy baseline. Waking the poster at each
	// completion of a draining window, as the rig once did, cost shm about
	// a tenth of its rate at 1 MiB on two cores: a rig's own bookkeeping,
	// not the backend's. Once per wait keeps the comparison like-for-like.
	waitLimit atomic.Int64
	wake      chan struct{}
	failed    atomic.Pointer[error]
	done      func(error)
}

// newRig is a rig's buffers, before any agent.
func newRig(backend string, s Shape) (*Rig, error) {
	if err := CheckShape(backend, s); err != nil {
		return nil, err
	}
	n := s.SpanBytes()
	r := &Rig{backend: backend, shape: s, slots: slotLayouts(s), window: int64(WindowFor(s)), wake: make(chan struct{}, 1)}
	r.done = r.complete
	r.waitLimit.Store(-1)
	r.copySrc, r.copyDst = make([]byte, n), make([]byte, n)
	fill(r.copySrc)
	return r, nil
}

// NewRig builds a rig for backend (Copy, or one of Backends()).
func NewRig(backend string, s Shape) (r *Rig, err error) {
	if r, err = newRig(backend, s); err != nil {
		return nil, err
	}
	n := s.SpanBytes()
	switch backend {
	case Copy:
		return r, nil
	case loopback.Backend:
		net := loopback.NewNetwork()
		r.sender, r.receiver = loopback.New(loopback.WithNetwork(net)), loopback.New(loopback.WithNetwork(net))
	case shm.Backend:
		r.sender, r.receiver = shm.New(), shm.New()
	case ucx.Backend:
		if err := r.newUCX(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("rdmabench: unknown backend %q (want %s, %q)", backend, quoted(Backends()), Copy)
	}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()

	if err := r.registerSource(); err != nil {
		return nil, err
	}
	var dstRegion *kvcache.Region
	switch backend {
	case shm.Backend:
		dstRegion, r.dstCloser, err = shm.NewRegion("", n)
	case ucx.Backend:
		dstRegion, r.dstCloser, err = r.receiver.(*ucx.Agent).Alloc(n)
	default:
		// A mapping outside the Go heap: unmapped by Close.
		dstRegion, err = kvcache.NewHostRegion(n)
		if err == nil {
			r.dstCloser = dstRegion
		}
	}
	if err != nil {
		return nil, err
	}
	reg, err := r.receiver.Register(dstRegion)
	if err != nil {
		return nil, err
	}
	r.dst = reg.Remote()
	r.dstBytes = dstRegion.Bytes()
	if r.ep, err = r.sender.Connect(r.receiver.Address()); err != nil {
		return nil, err
	}
	return r, nil
}

// NewPeerRig builds a rig for backend (shm or ucx) whose receiver is
// another process: argv, which must call ServePeer (see PeerEnv).
func NewPeerRig(backend string, s Shape, argv []string) (r *Rig, err error) {
	if r, err = newRig(backend, s); err != nil {
		return nil, err
	}
	p, addr, dst, err := startPeer(argv, backend, s)
	if err != nil {
		return nil, err
	}
	r.peer, r.dst = p, dst
	defer func() {
		if err != nil {
			err = errors.Join(err, r.Close())
		}
	}()
	switch backend {
	case shm.Backend:
		r.sender = shm.New()
	case ucx.Backend:
		a, err := ucx.New()
		if err != nil {
			return nil, err
		}
		r.sender = a
	}
	if err := r.registerSource(); err != nil {
		return nil, err
	}
	if r.ep, err = r.sender.Connect(addr); err != nil {
		return nil, err
	}
	return r, nil
}

// registerSource registers the rig's source buffer with the sender.
func (r *Rig) registerSource() error {
	region, err := kvcache.HostBytesRegion(r.copySrc)
	if err != nil {
		return err
	}
	r.src, err = r.sender.Register(region)
	return err
}

// newUCX starts the ucx sender and receiver (UCX_* from the environment).
func (r *Rig) newUCX() error {
	s, err := ucx.New()
	if err != nil {
		return err
	}
	d, err := ucx.New()
	if err != nil {
		s.Close()
		return err
	}
	r.sender, r.receiver = s, d
	return nil
}

// slotLayouts is the segment list of an operation on each of s's slots:
// layout(s) moved by the slot's offset, k*s.Bytes(), in the source and in
// the destination.
func slotLayouts(s Shape) [][]kvcache.Segment {
	base := layout(s)
	slots := make([][]kvcache.Segment, s.SlotCount())
	for k := range slots {
		off := uint64(k) * s.Bytes()
		slots[k] = make([]kvcache.Segment, len(base))
		for i, g := range base {
			slots[k][i] = kvcache.Segment{Src: g.Src + off, Dst: g.Dst + off, Len: g.Len}
		}
	}
	return slots
}

// layout places segment i at source position i and destination position
// (i*7) mod k (in segments), so destinations are scattered but each is
// written once.
func layout(s Shape) []kvcache.Segment {
	segs := make([]kvcache.Segment, s.Segments)
	stride := 7
	for gcd(stride, s.Segments) != 1 {
		stride++
	}
	for i := range segs {
		segs[i] = kvcache.Segment{
			Src: uint64(i) * s.SegmentBytes,
			Dst: uint64(i*stride%s.Segments) * s.SegmentBytes,
			Len: s.SegmentBytes,
		}
	}
	return segs
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// fill writes a xorshift64 sequence over b, eight bytes a step: a rig's
// source spans up to hundreds of MiB, and a byte a step cost half a second
// at 256 MiB. A peer fills its copy of the source the same way.
func fill(b []byte) {
	x := uint64(88172645463325252)
	next := func() uint64 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return x
	}
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, next())
		b = b[8:]
	}
	for i, v := 0, next(); i < len(b); i++ {
		b[i] = byte(v >> (8 * i))
	}
}

func quoted(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return fmt.Sprint(q)
}

// Backend is the rig's backend.
func (r *Rig) Backend() string { return r.backend }

// Shape is the rig's operation.
func (r *Rig) Shape() Shape { return r.shape }

// Window is how many operations the rig keeps in flight.
func (r *Rig) Window() int { return int(r.window) }

// Run performs n operations through the rig's backend, at most Window() in
// flight, each on the next slot in turn, and returns once all completed:
// the first error, if any.
func (r *Rig) Run(n int) error {
	if r.backend == Copy {
		r.Copy(n)
		return nil
	}
	b := rdma.Batch{Src: r.src, Dst: r.dst, Done: r.done}
	k := uint64(len(r.slots))
	for range n {
		if r.inflight.Load() >= r.window {
			r.waitBelow(r.window / 2)
		}
		r.inflight.Add(1)
		b.Segments = r.slots[r.posted%k]
		r.posted++
		if err := r.ep.Post(b); err != nil {
			r.posted--
			r.inflight.Add(-1)
			r.waitBelow(0)
			return err
		}
	}
	r.waitBelow(0)
	if p := r.failed.Swap(nil); p != nil {
		return *p
	}
	return nil
}

// complete is every batch's Done.
func (r *Rig) complete(err error) {
	if err != nil {
		r.fail(err)
	}
	if n, limit := r.inflight.Add(-1), r.waitLimit.Load(); limit >= 0 && n <= limit {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// fail records the first error (out of line: taking err's address makes it
// escape, which would allocate on every call of complete).
func (r *Rig) fail(err error) { r.failed.CompareAndSwap(nil, &err) }

// waitBelow parks until at most limit operations are in flight.
func (r *Rig) waitBelow(limit int64) {
	for r.inflight.Load() > limit {
		r.waitLimit.Store(limit)
		if r.inflight.Load() > limit {
			<-r.wake
		}
		r.waitLimit.Store(-1)
	}
}

// Copy performs n operations with Go's copy between the rig's plain
// buffers, each on the next slot in turn.
func (r *Rig) Copy(n int) {
	src, dst := r.copySrc, r.copyDst
	k := uint64(len(r.slots))
	for range n {
		for _, s := range r.slots[r.copied%k] {
			copy(dst[s.Dst:s.Dst+s.Len], src[s.Src:s.Src+s.Len])
		}
		r.copied++
	}
}

// Scribble overwrites this process's destinations (the backend's and the
// copy baseline's) with bytes no source holds, so that Verify checks what
// the operations after it wrote: every operation writes the same source
// bytes to its slot, and a warm-up has written every slot, so without it
// timed rounds that moved nothing (or said done before the bytes landed)
// would verify. A receiver in another process is not scribbled: its
// Verify checks every slot written so far.
func (r *Rig) Scribble() {
	for _, dst := range [][]byte{r.dstBytes, r.copyDst} {
		for i := range dst {
			dst[i] = ^r.copySrc[i%len(r.copySrc)]
		}
	}
	r.fromPosted, r.fromCopied = r.posted, r.copied
}

// Verify checks, after Run, that the destination holds each segment's
// source bytes, in every slot an operation went to since the last
// Scribble (since the start without one; slot 0 before any).
func (r *Rig) Verify() error {
	ops, from := r.posted, r.fromPosted
	if r.backend == Copy {
		ops, from = r.copied, r.fromCopied
	}
	k := uint64(len(r.slots))
	if r.peer != nil {
		return r.peer.verify(int(max(1, min(ops, k))))
	}
	dst := r.dstBytes
	if r.backend == Copy {
		dst = r.copyDst
	}
	if ops == from {
		if ops > 0 {
			return fmt.Errorf("rdmabench: %s: nothing was written since the destination was scribbled", r.backend)
		}
		from, ops = 0, 1 // slot 0 before any operation
	}
	for n := uint64(0); n < min(ops-from, k); n++ {
		slot := (from + n) % k
		if j, i := firstMismatch(dst, r.copySrc, r.slots[slot:slot+1]); j >= 0 {
			return fmt.Errorf("rdmabench: %s: slot %d, segment %d %+v did not land", r.backend, slot, i, r.slots[slot][i])
		}
	}
	return nil
}

// Close releases the rig. Idempotent.
func (r *Rig) Close() error {
	var errs []error
	if r.ep != nil {
		errs = append(errs, r.ep.Close())
		r.ep = nil
	}
	for _, a := range []rdma.Agent{r.sender, r.receiver} {
		if a != nil {
			errs = append(errs, a.Close())
		}
	}
	r.sender, r.receiver = nil, nil
	if r.dstCloser != nil {
		errs = append(errs, r.dstCloser.Close())
		r.dstCloser = nil
	}
	if r.peer != nil {
		errs = append(errs, r.peer.close())
		r.peer = nil
	}
	return errors.Join(errs...)
}
