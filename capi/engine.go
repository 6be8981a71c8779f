package capi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/kvxfer/kvxfer"
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/cuda"
	quotepkg "github.com/kvxfer/kvxfer/internal/quote"
	"github.com/kvxfer/kvxfer/kvcache"
	"github.com/kvxfer/kvxfer/node"
)

// Event is one finished request (kvxfer_event).
type Event struct {
	Request  uint64
	Outcome  int32
	Error    Status
	Bytes    uint64
	UserData uint64
}

// Engine is an open engine and the requests and fences it owns.
type Engine struct {
	h   uint64
	eng *kvxfer.Engine
	// layout and shape are the engine's, copied once (its accessors copy
	// at every call, and the chunk path reads them).
	layout   kvcache.Layout
	shape    kvcache.Shape
	node     *node.Node // set when opened by OpenNode: Close closes it
	instance string
	// pool is the pool Open allocated for the engine (no caller memory):
	// Close unmaps it only once every callback has returned, and only
	// when the engine drained (a callback may read its READY blocks; a
	// write may land after a close that did not drain).
	pool *kvcache.Region

	// opening is held shared by Send and Receive from their closed check
	// until their watcher is registered, and exclusively by Close while it
	// marks the engine closed: no watcher is added once Close waits.
	opening sync.RWMutex

	// ctx is cancelled when Close starts: a WaitPeers under way returns.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	events []Event
	wake   chan struct{} // closed and replaced when an event is queued, and when Close starts
	notify func(Event)   // set: events go here instead of the queue
	// stopped (and stop closed): Close is past the drain; watchers end
	// without posting anything more. Set by endCallbacks, which a second
	// call finds set and returns.
	stopped  bool
	stop     chan struct{}
	requests map[uint64]*Request
	fences   map[uint64]*fence
	watchers sync.WaitGroup
}

// newEngine wraps eng (and n, when opened by OpenNode) and gives it a
// handle.
func newEngine(eng *kvxfer.Engine, n *node.Node, instance string) *Engine {
	if instance == "" {
		instance = kvxfer.DefaultInstance
	}
	e := &Engine{eng: eng, node: n, instance: instance, wake: make(chan struct{}), stop: make(chan struct{}),
		requests: make(map[uint64]*Request), fences: make(map[uint64]*fence), layout: eng.Layout(), shape: eng.Shape()}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.h = put(e)
	return e
}

// noDeviceMemory is why Open refuses GPU memory and what to do instead.
const noDeviceMemory = "the in-process engine (kvxfer_engine_open, loopback data plane) copies with the CPU and cannot read or write GPU memory: " +
	"open a node (kvxfer_node_open) over backend \"ucx\" with a UCX built with CUDA, or \"cudaipc\" between processes of one host, with"

// Open starts an engine from a JSON config. pool, when not nil, is the
// caller's memory of poolBytes bytes, which must outlive the engine.
// An error quotes at most the first 64 bytes of a long config value
// (clipConfig).
func Open(configJSON string, pool unsafe.Pointer, poolBytes uint64) (*Engine, uint64, error) {
	e, h, err := openEngine(configJSON, pool, poolBytes)
	return e, h, clipConfig(err, configJSON)
}

func openEngine(configJSON string, pool unsafe.Pointer, poolBytes uint64) (*Engine, uint64, error) {
	c, err := ParseConfig(configJSON)
	if err != nil {
		return nil, 0, err
	}
	kc, err := c.engineConfig()
	if err != nil {
		return nil, 0, err
	}
	if _, onDevice, err := cudaOrdinal("pool_device", c.PoolDevice); err != nil {
		return nil, 0, err
	} else if onDevice { // absent or null: host memory, as kvxfer_node_open reads it
		return nil, 0, errorf(ErrConfig, "pool_device = %s: %s (pool_address with pool_device)", quotepkg.JSONValue(c.PoolDevice), noDeviceMemory)
	}
	if c.Memory != nil {
		if pool != nil || poolBytes != 0 || c.PoolBytes != 0 {
			return nil, 0, errorf(ErrConfig, "memory is set: pass no pool and no pool_bytes (the memory is the framework's tensors)")
		}
		if err := c.Memory.describe(&kc); err != nil {
			return nil, 0, err
		}
		// The loopback data plane memmoves between regions: a device
		// region never reaches it.
		if r := kc.Region; r.Kind != kvcache.HostMem {
			return nil, 0, errorf(ErrConfig, "memory.device = %d: %s (the same memory object)", r.Device, noDeviceMemory)
		}
	} else if pool != nil {
		if c.PoolBytes != 0 && c.PoolBytes != poolBytes {
			return nil, 0, errorf(ErrConfig, "pool_bytes = %d in the config but the pool passed is %d bytes", c.PoolBytes, poolBytes)
		}
		r, err := kvcache.ExternalHostRegion(pool, poolBytes)
		if err != nil {
			return nil, 0, errorf(ErrInvalidArgument, "pool %p of %d bytes: %v", pool, poolBytes, err)
		}
		kc.Region, kc.PoolBytes = r, poolBytes
	} else if poolBytes != 0 {
		// No pool: the engine allocates one of poolBytes, and a config
		// that says another size is refused as with a pool, not
		// overridden one way or the other.
		if c.PoolBytes != 0 && c.PoolBytes != poolBytes {
			return nil, 0, errorf(ErrConfig, "pool_bytes = %d in the config but %d passed (no pool: the engine allocates one of that size): give one, or the same",
				c.PoolBytes, poolBytes)
		}
		kc.PoolBytes = poolBytes
	}
	// The engine's own pool is allocated here, not by the engine, which
	// would unmap it inside its Close, before the callbacks under way (and
	// the drained events' ones) have returned. A length the engine refuses
	// is left for it to name.
	var own *kvcache.Region
	if n := cmp.Or(kc.PoolBytes, kvxfer.DefaultPoolBytes); kc.Region == nil && n <= kvcache.MaxHostRegion {
		r, err := kvcache.NewHostRegion(n)
		if err != nil {
			return nil, 0, errorf(ErrConfig, "pool of %d bytes: %v", n, err)
		}
		own, kc.Region, kc.PoolBytes = r, r, n
	}
	eng, err := kvxfer.Start(context.Background(), kc)
	if err != nil {
		if own != nil {
			_ = own.Close() // nothing was started over it
		}
		// As OpenNode's: a resource the open could not get (an instance
		// name another engine of the process listens as, a metrics_addr
		// in use) is the caller's config, not a bug in kvxfer.
		if errors.Is(err, control.ErrDuplicate) {
			if kc.Instance == "" {
				kc.Instance = kvxfer.DefaultInstance
			}
			return nil, 0, errorf(ErrConfig, "instance %s rank %v is already open in this process (%v): engines of one process find each other by instance name and rank; give this one another instance (or rank), or close the other first",
				quote(kc.Instance), kc.Rank, err)
		}
		return nil, 0, nodeError(err)
	}
	e := newEngine(eng, nil, kc.Instance)
	e.pool = own
	return e, e.h, nil
}

// LookupEngine returns the engine of handle h.
func LookupEngine(h uint64) (*Engine, error) { return lookup[*Engine](h, "engine") }

// Inner is the kvxfer engine.
func (e *Engine) Inner() *kvxfer.Engine { return e.eng }

// Handle is the engine's handle.
func (e *Engine) Handle() uint64 { return e.h }

// Close fails every unfired fence, wakes every Poll and WaitPeers under
// way (they return ErrClosed), closes the engine (waiting up to timeout
// for the drain) and releases every handle the engine owns. Once it
// returns, whatever the outcome, no event is posted any more and no
// watcher of the engine's is left: a drained close first delivers every
// request's event to the callback, if one is set; to a poller, the events
// queued are Poll's until Close returns, and go with the handles then
// (kvxfer_poll, include/kvxfer.h). One that timed out (ErrTimeout)
// delivers nothing more. Memory the caller registered must
// then stay valid for good: requests that did not drain may still be
// written by their peers.
func (e *Engine) Close(timeout time.Duration) error {
	e.opening.Lock()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		e.opening.Unlock()
		return errorf(ErrClosed, "engine %d: already closing", e.h)
	}
	e.closed = true
	fences := e.fences
	e.fences = map[uint64]*fence{}
	close(e.wake) // blocked Polls return
	e.wake = make(chan struct{})
	e.mu.Unlock()
	e.opening.Unlock()
	e.cancel() // a WaitPeers returns
	for h, f := range fences {
		drop(h)
		f.mf.Fire(fmt.Errorf("%w: engine %d closed before fence %d fired", ErrEngineClosed, e.h, h))
	}
	e.mu.Lock()
	reqs := make([]*Request, 0, len(e.requests))
	for _, r := range e.requests {
		reqs = append(reqs, r)
	}
	e.mu.Unlock()
	for _, r := range reqs { // stop querying the caller's CUDA events
		r.releaseEvents(fmt.Errorf("%w: engine %d closed", ErrEngineClosed, e.h))
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var err error
	if e.node != nil {
		// The node calls endCallbacks itself once its engine closed,
		// before its pool memory goes (nodeConfig's BeforeMemoryGoes); a
		// close that failed before that point leaves it to us.
		err = e.node.Close(ctx)
	} else {
		err = e.eng.Close(ctx)
	}
	switch {
	case err != nil && ctx.Err() != nil:
		err = &Error{Code: ErrTimeout, Err: fmt.Errorf("engine %d: close after %v: %w", e.h, timeout, err)}
	case errors.Is(err, actors.ErrUndrained):
		// Drained, but with destination blocks a suspected writer may
		// still write: the caller's memory must stay, as after a timeout.
		err = &Error{Code: ErrTimeout, Err: fmt.Errorf("engine %d: close: %w", e.h, err)}
	}
	e.endCallbacks(ctx, err)
	e.mu.Lock()
	for h := range e.requests {
		drop(h)
	}
	e.requests = map[uint64]*Request{}
	e.events = nil
	e.mu.Unlock()
	// No callback runs any more: the pool Open allocated goes, unless the
	// close left writes that may still land (then it stays, leaked).
	if err == nil && e.pool != nil {
		if perr := e.pool.Close(); perr != nil {
			err = errorf(ErrInternal, "engine %d: close: unmapping its pool: %v", e.h, perr)
		}
	}
	drop(e.h)
	return err
}

// endCallbacks ends the request watchers once the engine closed (err: its
// close's error): after a drained close each posts its event first (its
// callback runs), the others end posting nothing; a callback under way is
// waited for. Called before the pool memory can go: by the node
// (Config.BeforeMemoryGoes) for an engine it opened, then by Close, whose
// call finds stopped set and returns. The two never overlap: Close calls
// it after the node's Close returned, and node.Close runs once (a
// concurrent call waits for the first).
func (e *Engine) endCallbacks(ctx context.Context, err error) {
	e.mu.Lock()
	done := e.stopped
	e.mu.Unlock()
	if done {
		return
	}
	if err == nil {
		// Every outcome is decided and each drained request's blocks
		// released: each watcher posts its event at once. Bounded all the
		// same (by the close's time left, and at least a second, so that
		// a close with no time left still delivers what drained): a
		// watcher that would wait for good ends at e.stop below.
		wait := time.Second
		if d, ok := ctx.Deadline(); ok && time.Until(d) > wait {
			wait = time.Until(d)
		}
		posted := make(chan struct{})
		go func() { e.watchers.Wait(); close(posted) }()
		t := time.NewTimer(wait)
		select {
		case <-posted:
		case <-t.C:
		}
		t.Stop()
	}
	// The watchers of requests that did not drain would wait for good (the
	// engine's actors are gone): they end now, posting nothing; one in the
	// middle of a callback is waited for.
	e.mu.Lock()
	e.stopped = true
	close(e.stop)
	e.mu.Unlock()
	e.watchers.Wait()
}

// SetNotify sends every later event to f (on a goroutine of the engine)
// instead of the poll queue; nil goes back to the queue. Close waits for
// every f under way: f must not close its own engine (it would wait for
// itself; kvxfer_engine_close refuses that call from its C callback).
func (e *Engine) SetNotify(f func(Event)) {
	e.mu.Lock()
	e.notify = f
	e.mu.Unlock()
}

// Poll moves up to len(out) queued events into out; with wait > 0 it waits
// up to wait for the first one. It returns 0 at once when the engine is
// closing and no event is left (PollErr says so).
func (e *Engine) Poll(out []Event, wait time.Duration) int {
	n, _ := e.PollErr(out, wait)
	return n
}

// PollErr is Poll with an ErrClosed error when it returns no event because
// the engine is closed or closing: a Poll blocked when Close starts
// returns at once, with the events still queued first.
func (e *Engine) PollErr(out []Event, wait time.Duration) (int, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		e.mu.Lock()
		n := copy(out, e.events)
		if n > 0 {
			e.events = append(e.events[:0], e.events[n:]...)
		}
		wake := e.wake
		closed := e.closed
		e.mu.Unlock()
		switch {
		case n > 0:
			return n, nil
		case closed:
			return 0, errorf(ErrClosed, "engine %d is closed or closing: no event is left", e.h)
		case wait <= 0 || len(out) == 0:
			return 0, nil
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-wake:
		case <-timer.C:
			wait = 0
		}
	}
}

// r, the event's request, reports its outcome to the caller from here on
// (Request.Outcome), at the moment its event becomes visible: never
// before, so that Release cannot succeed before the event exists (and the
// event then name a released handle); not after, so that a callback or
// a poller may release it at once.
func (e *Engine) post(ev Event, r *Request) {
	e.mu.Lock()
	r.mu.Lock()
	r.posted = true
	r.mu.Unlock()
	if e.stopped { // Close is done: nothing more is delivered
		e.mu.Unlock()
		return
	}
	if f := e.notify; f != nil {
		e.mu.Unlock()
		f(ev)
		return
	}
	e.events = append(e.events, ev)
	close(e.wake)
	e.wake = make(chan struct{})
	e.mu.Unlock()
}

// AllocBlocks allocates n blocks of group g from the engine's pool.
func (e *Engine) AllocBlocks(g, n int) ([]kvcache.BlockID, error) {
	if err := e.checkGroup(g); err != nil {
		return nil, err
	}
	counts := make([]int, e.eng.Pools().Groups())
	counts[g] = n
	ids, err := e.eng.Pools().Alloc(counts)
	if err != nil {
		return nil, fmt.Errorf("engine %d: %d blocks of group %d: %w", e.h, n, g, err)
	}
	return ids[g], nil
}

// FreeBlocks frees blocks of group g.
func (e *Engine) FreeBlocks(g int, ids []kvcache.BlockID) error {
	if err := e.checkGroup(g); err != nil {
		return err
	}
	b := make([][]kvcache.BlockID, e.eng.Pools().Groups())
	b[g] = ids
	if err := e.eng.Pools().Free(b); err != nil {
		return fmt.Errorf("engine %d group %d: %w", e.h, g, err)
	}
	return nil
}

// UsedBlocks is the number of blocks of group g in use.
func (e *Engine) UsedBlocks(g int) (int, error) {
	if err := e.checkGroup(g); err != nil {
		return 0, err
	}
	s := e.eng.Pools().Stats()[g]
	return s.Total - s.Free, nil
}

func (e *Engine) checkGroup(g int) error {
	if n := e.eng.Pools().Groups(); g < 0 || g >= n {
		return errorf(ErrInvalidArgument, "engine %d: layer group %d outside [0,%d)", e.h, g, n)
	}
	return nil
}

// Info is what the engine rank holds (kvxfer_engine_info).
type Info struct {
	Groups, TokensPerBlock, KVHeads, HeadDim, DTypeBytes, Parts int
	PoolBase                                                    uintptr
	PoolBytes, BytesPerToken                                    uint64
	// PoolDevice is the CUDA ordinal of the pool's memory, -1 for host
	// memory: on a GPU, PoolBase is a device pointer the CPU cannot read.
	PoolDevice int
}

// Info describes the engine.
func (e *Engine) Info() Info {
	l, s := e.layout, e.shape
	var perTok uint64
	for g := range l.Groups {
		perTok += uint64(len(s.Layers[g]) * l.Parts() * s.Heads() * l.TokenBytes())
	}
	r := e.eng.Region()
	dev := -1
	if r.Kind == kvcache.DeviceMem {
		dev = r.Device
	}
	return Info{Groups: len(l.Groups), TokensPerBlock: l.TokensPerBlock, KVHeads: s.Heads(), HeadDim: l.HeadDim,
		DTypeBytes: l.DTypeBytes, Parts: l.Parts(), PoolBase: r.Base, PoolBytes: r.Len, BytesPerToken: perTok,
		PoolDevice: dev}
}

// GroupInfo is one layer group's pool (kvxfer_group_info).
type GroupInfo struct {
	Offset, BlockBytes uint64
	Blocks, Layers     int
	Window             int
}

// Group describes layer group g's pool.
func (e *Engine) Group(g int) (GroupInfo, error) {
	if err := e.checkGroup(g); err != nil {
		return GroupInfo{}, err
	}
	geom := e.eng.Pools().Geometry(g)
	return GroupInfo{Offset: geom.Offset, BlockBytes: geom.BlockBytes, Blocks: geom.Blocks,
		Layers: len(e.shape.Layers[g]), Window: e.layout.Groups[g].Window}, nil
}

// SendRequest is kvxfer_send_request.
type SendRequest struct {
	kvxfer.SendRequest
	UserData uint64
}

// ReceiveRequest is kvxfer_receive_request.
type ReceiveRequest struct {
	kvxfer.ReceiveRequest
	// Firsts[g] is the global block the caller's run Blocks[g] starts at
	// (kvxfer_block_run.first). Receive refuses a non-empty run whose
	// first is not its group's first needed block (NeededRange): READY
	// would hand its ids back holding other global blocks than the caller
	// thinks. Nil: not checked.
	Firsts   []int
	UserData uint64
}

// Send opens the context side of a request.
func (e *Engine) Send(req SendRequest) (*Request, uint64, error) {
	e.opening.RLock()
	defer e.opening.RUnlock()
	if err := e.open(); err != nil {
		return nil, 0, err
	}
	if err := e.checkID("send", req.ID); err != nil {
		return nil, 0, err
	}
	tx, err := e.eng.Send(context.Background(), req.SendRequest)
	if err != nil {
		return nil, 0, fmt.Errorf("engine %d: send %s: %w", e.h, quote(req.ID), clip(err, req.ID, req.Generation))
	}
	r := &Request{e: e, id: req.ID, tx: tx, userData: req.UserData, tpb: e.layout.TokensPerBlock}
	return r, e.adopt(r, tx.Done(), nil), nil
}

// Receive opens the generation side of a request.
func (e *Engine) Receive(req ReceiveRequest) (*Request, uint64, error) {
	e.opening.RLock()
	defer e.opening.RUnlock()
	if err := e.open(); err != nil {
		return nil, 0, err
	}
	if err := e.checkID("receive", req.ID); err != nil {
		return nil, 0, err
	}
	if err := e.checkFirsts(req); err != nil {
		return nil, 0, err
	}
	if err := e.checkContextStages(req); err != nil {
		return nil, 0, err
	}
	var rx *kvxfer.RxHandle
	var err error
	if e.node != nil && req.Context == e.instance {
		// The engine refuses it too (kvxfer.Engine.Receive), but a node
		// first looks for the writers among its peers, and would name
		// its own rank as "not a peer".
		return nil, 0, fmt.Errorf("engine %d: receive %s: %w: Context %s is this engine itself (this node's own instance): a request receives from another instance's context ranks; name that one",
			e.h, quote(req.ID), kvxfer.ErrBadRequest, quote(req.Context))
	}
	if e.node != nil {
		rx, err = e.node.Receive(context.Background(), req.ReceiveRequest) // checks the writers are peers
	} else {
		rx, err = e.eng.Receive(context.Background(), req.ReceiveRequest)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("engine %d: receive %s: %w", e.h, quote(req.ID),
			clip(err, req.ID, req.Context, req.ContextParallel.Stages))
	}
	r := &Request{e: e, id: req.ID, rx: rx, userData: req.UserData, promptLen: req.PromptLen,
		prefix: append([]int(nil), req.PrefixHitBlocks...), callerBlocks: req.Blocks != nil}
	return r, e.adopt(r, rx.Done(), rx.Released()), nil
}

// checkID refuses a request id that is not UTF-8 (ErrBadRequest, naming
// it): every frame between nodes that names the request would fail to
// encode (proto3 strings are UTF-8), and both sides would wait for the
// transfer deadline. The C ABI copies the caller's bytes as they are.
func (e *Engine) checkID(op, id string) error {
	if !utf8.ValidString(id) {
		return errorf(ErrBadRequest, "engine %d: %s %s: request id is not valid UTF-8 (frames between nodes carry it as a UTF-8 string)",
			e.h, op, quote(id))
	}
	return nil
}

// checkFirsts refuses a destination run that starts at another global
// block than its group's needed range (ErrInvalidArgument, naming the
// group, the run's first and the expected one). An empty run is not
// checked, nor a group the layout lacks (the engine names the count).
func (e *Engine) checkFirsts(req ReceiveRequest) error {
	l := e.layout
	for g, first := range req.Firsts {
		if g >= len(req.Blocks) || len(req.Blocks[g]) == 0 || g >= len(l.Groups) {
			continue
		}
		want, end := e.NeededRange(req.PromptLen, g, req.PrefixHitBlocks)
		if first != want {
			attn := "full attention"
			if w := l.Groups[g].Window; w > 0 {
				attn = fmt.Sprintf("a window of %d tokens", w)
			}
			return errorf(ErrInvalidArgument, "engine %d: receive %s: blocks[%d].first = %d, want %d: layer group %d "+
				"receives global blocks [%d, %d) of a prompt of %d tokens (%s, %d prefix-hit blocks)",
				e.h, quote(req.ID), g, first, want, g, want, end, req.PromptLen, attn, prefixHit(req.PrefixHitBlocks, g))
		}
	}
	return nil
}

// checkContextStages refuses a context split (ContextParallel.Stages,
// kvxfer_receive_stages' context_pp_stages) that is no list of
// ContextParallel.PP layer counts adding up to the layout's layers
// (ErrInvalidArgument, naming the value): the caller's argument, not a
// parallelism the model cannot take. "" (the default split) is not checked.
func (e *Engine) checkContextStages(req ReceiveRequest) error {
	cp := req.ContextParallel
	if cp.Stages == "" {
		return nil
	}
	bad := func(format string, args ...any) error {
		return errorf(ErrInvalidArgument, "engine %d: receive %s: context_pp_stages %s: %s", e.h, quote(req.ID),
			quote(cp.Stages), fmt.Sprintf(format, args...))
	}
	counts, err := kvcache.ParseStages(cp.Stages)
	if err != nil {
		return bad("%v", err)
	}
	if len(counts) != cp.PP {
		return bad("%d stages, the context's PP (context_pp) is %d: give one layer count per stage", len(counts), cp.PP)
	}
	sum := 0
	for _, n := range counts {
		sum += n
	}
	if layers := e.layout.Layers; sum != layers {
		return bad("%d layers in all, the model has %d", sum, layers)
	}
	return nil
}

// NeededRange is the global blocks [first, end) that layer group g
// receives for a prompt of promptLen tokens with prefix hits prefix (per
// group, may be short): kvcache.NeededRange with the group's window.
func (e *Engine) NeededRange(promptLen, g int, prefix []int) (first, end int) {
	l := e.layout
	return kvcache.NeededRange(promptLen, l.Groups[g].Window, l.TokensPerBlock, prefixHit(prefix, g))
}

// prefixHit is prefix[g], 0 past its end.
func prefixHit(prefix []int, g int) int {
	if g < len(prefix) {
		return prefix[g]
	}
	return 0
}

func (e *Engine) open() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errorf(ErrClosed, "engine %d is closed", e.h)
	}
	return nil
}

// adopt gives r a handle and watches for its outcome (and, for the
// generation side, the release of its blocks) to post its event.
func (e *Engine) adopt(r *Request, done <-chan kvxfer.Outcome, released <-chan struct{}) uint64 {
	r.h = put(r)
	e.mu.Lock()
	e.requests[r.h] = r
	e.mu.Unlock()
	e.watchers.Add(1)
	go func() {
		defer e.watchers.Done()
		var o kvxfer.Outcome
		select {
		case o = <-done:
		case <-e.stop: // a close that did not drain: the outcome may never come
			select {
			case o = <-done: // it had come: recorded (no event is posted after close)
			default:
				r.releaseEvents(fmt.Errorf("%w: engine %d closed", ErrEngineClosed, e.h))
				return
			}
		}
		if released != nil {
			select {
			case <-released:
			case <-e.stop:
				select {
				case <-released:
				default: // its blocks stay quarantined: no event says they are free
					r.releaseEvents(fmt.Errorf("%w: engine %d closed", ErrEngineClosed, e.h))
					return
				}
			}
		}
		r.mu.Lock()
		r.out = &o
		events := r.events
		r.events = nil
		r.mu.Unlock()
		for _, f := range events { // before the event: the caller may then destroy them
			f.Release(fmt.Errorf("request %d (%s) finished: %s", r.h, quote(r.id), o.Status))
		}
		ev := Event{Request: r.h, Outcome: outcomeCode(o.Status), Bytes: o.Bytes, UserData: r.userData}
		if o.Err != nil {
			ev.Error = Code(o.Err)
		}
		e.post(ev, r)
	}()
	return r.h
}

// Request is one request's handle.
type Request struct {
	e        *Engine
	h        uint64
	id       string
	tx       *kvxfer.TxHandle
	rx       *kvxfer.RxHandle
	userData uint64
	tpb      int
	// promptLen and prefix (PrefixHitBlocks) place a READY outcome's blocks.
	promptLen int
	prefix    []int

	mu  sync.Mutex
	out *kvxfer.Outcome
	// posted: the request's event was posted (Engine.post); until then it
	// has not finished for the caller, whatever out says.
	posted bool
	freed  bool // FreeBlocks ran
	// callerBlocks: a receive into the caller's own blocks
	// (ReceiveRequest.Blocks): FreeBlocks does not free them.
	callerBlocks bool
	// events are the fences over the caller's CUDA events (ChunkCUDA), all
	// released once the request finished, before its event is posted.
	events []*cuda.BorrowedFence
	// eventsReleased: releaseEvents ran (the engine closing): a fence
	// added later is released at once, not left for nobody to release.
	eventsReleased bool
}

// releaseEvents stops watching the request's CUDA events, failing those
// not yet complete with why.
func (r *Request) releaseEvents(why error) {
	r.mu.Lock()
	events := r.events
	r.events = nil
	r.eventsReleased = true
	r.mu.Unlock()
	for _, f := range events {
		f.Release(why)
	}
}

// LookupRequest returns the request of handle h.
func LookupRequest(h uint64) (*Request, error) { return lookup[*Request](h, "request") }

// fence is a chunk's fence, fired by FenceReady or FenceFail.
type fence struct {
	e  *Engine
	mf *kvxfer.ManualFence
}

// Chunk hands over tokens [start, end) from the source blocks runs (one per
// layer group). withFence: the chunk waits for FenceReady on the returned
// fence handle; otherwise its KV is taken as written.
func (r *Request) Chunk(start, end int, last bool, runs []kvcache.BlockRun, withFence bool) (uint64, error) {
	return r.ChunkLayers(start, end, last, kvcache.LayerPart{}, runs, withFence)
}

// ChunkLayers is Chunk for the layers part of the chunk (global layers
// [Lo, Hi) of Of, the model's layer count; the zero LayerPart is every
// layer), as kvxfer.TxHandle.Chunk takes them: a chunk's parts in layer
// order from layer 0, each with the same chunk and source blocks, the
// part reaching layer Of completing it. Each part has its own fence. A
// part out of that order, or with bad layers, is refused with
// ErrBadChunk naming the layers, and nothing of it is taken.
func (r *Request) ChunkLayers(start, end int, last bool, part kvcache.LayerPart, runs []kvcache.BlockRun, withFence bool) (uint64, error) {
	c, err := r.chunkOf(start, end, last, part)
	if err != nil {
		return 0, err
	}
	if !withFence {
		if err := r.tx.Chunk(c, runs, nil); err != nil {
			return 0, clip(err, r.id)
		}
		return 0, nil
	}
	f := &fence{e: r.e, mf: &kvxfer.ManualFence{}}
	if err := r.tx.Chunk(c, runs, f.mf); err != nil {
		return 0, clip(err, r.id)
	}
	h := put(f)
	r.e.mu.Lock()
	if r.e.closed { // Close already failed the fences it knew of
		r.e.mu.Unlock()
		drop(h)
		f.mf.Fire(fmt.Errorf("%w: engine %d closed", ErrEngineClosed, r.e.h))
		return 0, errorf(ErrClosed, "engine %d is closed", r.e.h)
	}
	r.e.fences[h] = f
	r.e.mu.Unlock()
	return h, nil
}

// chunkOf is the chunk (or layer part) [start, end) of a send, refused
// before anything is taken when the request is a receive, the range is
// negative or the layers are not a part of this model (ErrBadChunk, from
// kvcache.LayerPart.Check; the rest of the order is TxHandle.Chunk's).
func (r *Request) chunkOf(start, end int, last bool, part kvcache.LayerPart) (kvcache.Chunk, error) {
	if r.tx == nil {
		return kvcache.Chunk{}, errorf(ErrInvalidArgument, "request %d (%s) is a receive: chunks go to a send", r.h, quote(r.id))
	}
	if start < 0 || end < start {
		return kvcache.Chunk{}, errorf(ErrBadChunk, "request %d (%s): chunk [%d,%d) is empty or negative", r.h, quote(r.id), start, end)
	}
	if err := part.Check(r.e.layout.Layers); err != nil {
		return kvcache.Chunk{}, fmt.Errorf("request %d (%s) chunk [%d,%d): %w", r.h, quote(r.id), start, end, err)
	}
	return kvcache.Chunk{Start: start, End: end, FirstBlock: start / r.tpb, Last: last, Layers: part}, nil
}

// ChunkCUDA hands over tokens [start, end) from the source blocks runs
// behind the caller's CUDA event cuEvent (a CUevent or cudaEvent_t of
// device's primary context, recorded after the writes): the chunk is sent
// once the event completed; a failed query fails it, and the request, with
// ErrFence. kvxfer only queries the event (never records or destroys it),
// and stops before the request's event is posted or Close returns: the
// caller keeps the event alive and does not record it again until then.
// Without a CUDA driver it returns ErrUnsupported naming the missing
// driver; a zero handle or a device that does not exist is
// ErrInvalidArgument. A refused chunk watches nothing.
func (r *Request) ChunkCUDA(start, end int, last bool, runs []kvcache.BlockRun, cuEvent uint64, device int) error {
	return r.ChunkLayersCUDA(start, end, last, kvcache.LayerPart{}, runs, cuEvent, device)
}

// ChunkLayersCUDA is ChunkCUDA for a layer part of the chunk, in the
// order ChunkLayers takes them; bad layers are refused before the driver
// or the event is touched.
func (r *Request) ChunkLayersCUDA(start, end int, last bool, part kvcache.LayerPart, runs []kvcache.BlockRun, cuEvent uint64, device int) error {
	if r.tx == nil {
		return errorf(ErrInvalidArgument, "request %d (%s) is a receive: chunks go to a send", r.h, quote(r.id))
	}
	if cuEvent == 0 {
		return errorf(ErrInvalidArgument, "request %d (%s): cu_event is 0: pass the CUevent handle of an event recorded after the chunk's writes (a torch.cuda.Event has one once recorded)", r.h, quote(r.id))
	}
	if device < 0 {
		return errorf(ErrInvalidArgument, "request %d (%s): CUDA device %d is negative", r.h, quote(r.id), device)
	}
	c, err := r.chunkOf(start, end, last, part)
	if err != nil {
		return err
	}
	if err := cuda.Init(); err != nil {
		return &Error{Code: ErrUnsupported, Err: fmt.Errorf("request %d (%s): a chunk behind CUDA event %#x needs the CUDA driver, and there is none usable: %w", r.h, quote(r.id), cuEvent, err)}
	}
	f, err := cuda.WatchEvent(device, uintptr(cuEvent), nil)
	if err != nil {
		code := ErrFence
		if errors.Is(err, cuda.ErrNoDevice) || errors.Is(err, cuda.ErrBadHandle) {
			code = ErrInvalidArgument
		}
		return &Error{Code: code, Err: fmt.Errorf("request %d (%s): CUDA event %#x of device %d: %w", r.h, quote(r.id), cuEvent, device, err)}
	}
	if err := r.tx.Chunk(c, runs, cudaFence{f, r.h}); err != nil {
		f.Release(err)
		return clip(err, r.id)
	}
	r.mu.Lock()
	if r.out != nil || r.eventsReleased { // finished or closed meanwhile: the others were released
		r.mu.Unlock()
		f.Release(fmt.Errorf("request %d (%s) finished or its engine closed", r.h, quote(r.id)))
		return nil
	}
	r.events = append(r.events, f)
	r.mu.Unlock()
	return nil
}

// cudaFence is a BorrowedFence as the engine sees it: a failure is
// ErrFenceFailed (KVXFER_ERR_FENCE), with the driver's reason.
type cudaFence struct {
	f   *cuda.BorrowedFence
	req uint64
}

func (c cudaFence) OnReady(fn func(error)) {
	c.f.OnReady(func(err error) {
		if err != nil {
			err = fmt.Errorf("%w: request %d: CUDA event %#x: %w", ErrFenceFailed, c.req, c.f.Event(), err)
		}
		fn(err)
	})
}

// FenceReady fires fence h: its chunk's KV is written. FenceFail fails it
// (and its request) with reason. Either releases the handle.
func FenceReady(h uint64) error { return fireFence(h, nil) }

// FenceFail fails fence h with reason.
func FenceFail(h uint64, reason string) error {
	return fireFence(h, fmt.Errorf("%w: fence %d: %s", ErrFenceFailed, h, reason))
}

func fireFence(h uint64, err error) error {
	f, lerr := lookup[*fence](h, "fence")
	if lerr != nil {
		return lerr
	}
	f.e.mu.Lock()
	_, live := f.e.fences[h]
	delete(f.e.fences, h)
	f.e.mu.Unlock()
	if !live {
		return errorf(ErrBadHandle, "fence handle %d: already fired", h)
	}
	drop(h)
	f.mf.Fire(err)
	return nil
}

// Cancel cancels the request; a no-op once it finished.
func (r *Request) Cancel() {
	if r.tx != nil {
		r.tx.Cancel()
	} else {
		r.rx.Cancel()
	}
}

// Outcome is the request's outcome, or an ErrNotFinished error before its
// event.
func (r *Request) Outcome() (kvxfer.Outcome, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out == nil || !r.posted {
		return kvxfer.Outcome{}, errorf(ErrNotFinished, "request %d (%s) has not finished", r.h, quote(r.id))
	}
	return *r.out, nil
}

// Payload is a READY outcome's payload (the context side's); any other
// outcome has none and is refused, as Blocks refuses it.
func (r *Request) Payload() ([]byte, error) {
	o, err := r.Outcome()
	if err != nil {
		return nil, err
	}
	if o.Status != kvxfer.StatusReady {
		return nil, errorf(ErrInvalidArgument, "request %d (%s) is %s, not READY: it has no payload", r.h, quote(r.id), o.Status)
	}
	return o.Payload, nil
}

// Blocks are a READY outcome's destination blocks of group g and the global
// index of the first.
func (r *Request) Blocks(g int) ([]kvcache.BlockID, int, error) {
	o, err := r.Outcome()
	if err != nil {
		return nil, 0, err
	}
	if o.Status != kvxfer.StatusReady {
		return nil, 0, errorf(ErrInvalidArgument, "request %d (%s) is %s, not READY: it has no blocks", r.h, quote(r.id), o.Status)
	}
	if err := r.e.checkGroup(g); err != nil {
		return nil, 0, err
	}
	var ids []kvcache.BlockID
	if g < len(o.Blocks) {
		ids = o.Blocks[g]
	}
	first, _ := r.e.NeededRange(r.promptLen, g, r.prefix)
	return ids, first, nil
}

// SetPayload sets a send's payload (kvxfer.TxHandle.SetPayload): refused
// for a receive, after the last chunk, and over messages.MaxPayload.
func (r *Request) SetPayload(p []byte) error {
	if r.tx == nil {
		return errorf(ErrInvalidArgument, "request %d (%s) is a receive: a payload is the send's", r.h, quote(r.id))
	}
	if err := r.tx.SetPayload(p); err != nil {
		return fmt.Errorf("request %d (%s): %w", r.h, quote(r.id), clip(err, r.id))
	}
	return nil
}

// FreeBlocks frees a READY outcome's destination blocks into the engine's
// pool (blocks kvxfer allocated: not the framework's own), once. A receive
// into the caller's own blocks is refused: they are the caller's to free,
// and freeing them here would let the next allocation hand them out while
// the caller still reads them.
func (r *Request) FreeBlocks() error {
	o, err := r.Outcome()
	if err != nil {
		return err
	}
	if o.Status != kvxfer.StatusReady {
		return errorf(ErrInvalidArgument, "request %d (%s) is %s, not READY: it has no blocks", r.h, quote(r.id), o.Status)
	}
	if r.callerBlocks {
		return errorf(ErrInvalidArgument, "request %d (%s) received into the caller's own blocks (the receive's blocks): "+
			"kvxfer allocated none to free; the caller frees its blocks itself (kvxfer_blocks_free)", r.h, quote(r.id))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.freed {
		return errorf(ErrInvalidArgument, "request %d (%s): its blocks are already freed", r.h, quote(r.id))
	}
	if err := r.e.eng.FreeBlocks(o.Blocks); err != nil {
		return fmt.Errorf("request %d (%s): %w", r.h, quote(r.id), clip(err, r.id))
	}
	r.freed = true
	return nil
}

// Release frees the handle of a finished request.
func (r *Request) Release() error {
	if _, err := r.Outcome(); err != nil {
		return err
	}
	r.e.mu.Lock()
	delete(r.e.requests, r.h)
	r.e.mu.Unlock()
	drop(r.h)
	return nil
}

// ErrorMessage is the outcome's error message, "" on success.
func (r *Request) ErrorMessage() (string, error) {
	o, err := r.Outcome()
	if err != nil {
		return "", err
	}
	if o.Err == nil {
		return "", nil
	}
	return o.Err.Error(), nil
}
