package zmq

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	zmq4 "github.com/pebbe/zmq4"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// maxConns bounds the connections (routing ids) a listener binds. A
// variable for tests.
var maxConns = 16384

// maxConnsPerIdentity bounds the connections a listener binds for one
// identity (connOwner): one CURVE key, or, insecure, one PeerID. Without
// it one authenticated peer saying Hello on maxConns connections held
// every binding, and every other peer's new connection was refused.
//
// A rank opens one connection to a listener per sender worker that sends
// to it (at most kvxfer.MaxWorkers, 1024; 4 by default) and one heartbeat
// socket, and a new one for each redial (a worker restart, the listener
// seen down); a key shared by an instance's ranks opens that for each.
// A quarter of maxConns (4096) is about four times what a rank at
// MaxWorkers keeps open (1025), or room for 819 ranks of one key at the
// default workers, and leaves three quarters of the table to the others.
// A variable for tests.
var maxConnsPerIdentity = maxConns / 4

// maxPeers bounds the directory (PeerIDs learned from Hellos); when it is
// full, a new peer's Hello takes the place of a peer that only a Hello put
// there and that missed its heartbeats (forgetDownPeerLocked). A variable
// for tests.
var maxPeers = 4096

// zapDomain is the ZAP domain of every link's ROUTER; each link has its
// own context and so its own ZAP handler.
const zapDomain = "kvxfer"

// Link is a control.Link over ZeroMQ. Its methods are safe for concurrent
// use; each Conn it dials belongs to one goroutine at a time.
type Link struct {
	cfg  Config
	log  zerolog.Logger
	zctx *zmq4.Context

	stats    counters
	throttle *control.Throttle // per (peer, kind) warnings
	idents   atomic.Pointer[identities]
	closing  atomic.Bool
	// drained: the link's owner said its engine's writes are over
	// (MarkDrained): the goodbye Close sends says so.
	drained atomic.Bool
	// byeReason: why the link's owner closes it (SetGoodbyeReason), for
	// the goodbye Close sends; nil: none given.
	byeReason atomic.Pointer[string]
	done      chan struct{} // closed by Close: Conns' backlogs stop flushing
	// anonForeign is the protocol version, not ours, of the last frame
	// that came on a connection without a CURVE key (insecure); 0: none.
	anonForeign atomic.Uint32
	// misnamed is the last Hello refused because its CURVE key may not
	// speak for the sender it claimed (MisnamedHello).
	misnamed atomic.Pointer[misnamedHello]
	// beating is how many peers the heartbeat goroutine holds a socket
	// for (Beating).
	beating atomic.Int64
	// connMons numbers the inproc addresses of Conns' socket monitors.
	connMons atomic.Uint64
	// goneNow is the set of departed incarnations (departedLocked), as of
	// the latest change of what departedLocked reads (rebuildGoneLocked):
	// the listener reads it for every frame without taking mu. nil: none.
	goneNow atomic.Pointer[goneSet]

	mu       sync.Mutex
	peers    map[messages.PeerID]*peerInfo
	allowed  map[string]bool       // CURVE client keys the ZAP handler admits
	explicit map[string][]Identity // Curve.Identities and AddIdentity, by key; copied on write
	foreign  map[string]uint32     // the protocol version an admitted CURVE key speaks, when not ours
	// departed are CURVE keys that may still speak for peers the
	// directory forgot or rebound to another key, oldest first
	// (RemovePeer, SetPeerServerKey).
	departed []departedKey
	// gone are the peer incarnations RemovePeer forgot, by name, oldest
	// first: their Hellos put nothing back in the directory
	// (RejectDeparted) unless a re-add lets them back (readdLocked).
	// goneN counts them (at most maxPeers); goneSeq orders removals.
	gone      map[messages.PeerID][]goneIncarnation
	goneN     int
	goneSeq   uint64
	self      *messages.Hello
	selfHello []byte // self, encoded once
	// listening is the Hello of the Listen under way or done (nil: none,
	// or it failed): a second Listen is refused while the first probes
	// its ipc path without the lock.
	listening *messages.Hello
	endpoint  string
	// boundFile is the ipc:// socket file Listen bound (nil: none, or not
	// ipc): stopListening removes it, if it is still that file.
	boundFile *ipcFile
	stop      chan struct{} // closed to stop the listener and heartbeats
	waits     []*sockWait   // the listener's, the ZAP handler's (nil when insecure) and the listener monitor's (nil when none), interrupted at stop
	stopped   bool
	closed    bool
	refs      int // the link itself plus each open Conn; the context ends at 0
	wg        sync.WaitGroup

	// lookups are the background lookups of peers' host names
	// (goLookup), cancelled (stopLookups) and waited for by Close.
	lookups     sync.WaitGroup
	stopLookups context.CancelFunc
	lookupCtx   context.Context

	// byes are the heartbeat sockets to connected peers that the heartbeat
	// goroutine left as it stopped, for Close to say goodbye on (under mu).
	byes *goodbyes
}

// peerInfo is one directory entry. Fields are guarded by Link.mu except
// incarnation, which Conns read without the lock.
type peerInfo struct {
	endpoint  string
	serverKey string
	hello     *messages.Hello
	helloAt   time.Time // when hello came (the listener's clock)
	// replaced are the incarnations whose Hellos were last replaced by
	// another's, newest first (listener's twin check).
	replaced [4]uint64
	key      string // CURVE key the PeerID is bound to, while alive
	down     bool
	// left: the peer is down for its goodbye (ErrPeerClosed), not for
	// missed heartbeats; leftWhy: the reason that goodbye gave ("" none).
	left    bool
	leftWhy string
	// conn is the heartbeat connection's state, connErr why it could not
	// be made; both written by the heartbeat goroutine (PeerState).
	conn    PeerState
	connErr error
	// incarnation counts connections on which the peer said Hello; a Conn
	// repeats its own Hello when it changes (the peer may have restarted).
	incarnation atomic.Uint64
	// maxFrame is the frame limit the peer's latest Hello said
	// (Hello.PeerFrameLimit; 0: no Hello yet): Conns read it without the
	// lock and refuse a larger frame (ErrFrameTooLarge).
	maxFrame atomic.Int64
	// redials counts Redial calls: the heartbeat goroutine remakes the
	// peer's socket when it changes.
	redials uint64
	// removed: the directory dropped this entry (RemovePeer, or the full
	// directory's forgetting); a Conn dialled with it then follows the
	// name's entry made since, if any (Conn.followLocked).
	removed atomic.Bool
	// moves counts the changes of endpoint (AddPeer of another one): a
	// Conn dialled before dials the new endpoint before its next frame
	// (Conn.followEndpointLocked).
	moves atomic.Uint64
}

var _ control.Link = (*Link)(nil)

// New validates cfg and returns a Link that has not started listening.
func New(cfg Config) (*Link, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	zctx, err := zmq4.NewContext()
	if err != nil {
		return nil, fmt.Errorf("control/zmq: new context: %w", err)
	}
	l := &Link{
		cfg:      cfg,
		log:      cfg.Logger,
		throttle: control.NewThrottle(0, 0, 0),
		zctx:     zctx,
		done:     make(chan struct{}),
		peers:    map[messages.PeerID]*peerInfo{},
		allowed:  map[string]bool{},
		explicit: map[string][]Identity{},
		refs:     1,
	}
	l.lookupCtx, l.stopLookups = context.WithCancel(context.Background())
	for id, ep := range cfg.Peers {
		l.peerLocked(id).endpoint = ep
	}
	for id, k := range cfg.Curve.PeerServerKeys {
		l.peerLocked(id).serverKey = k
	}
	for _, k := range cfg.Curve.AllowedPeers {
		l.allowed[k] = true
	}
	for _, id := range cfg.Curve.Identities {
		l.explicit[id.PublicKey] = append(l.explicit[id.PublicKey], id)
		l.allowed[id.PublicKey] = true
	}
	l.rebuildIdentitiesLocked()
	for _, k := range cfg.Curve.AllowedPeers {
		if !l.idents.Load().bound(k) {
			l.log.Warn().Str("key", k).
				Msg("control/zmq: allowed CURVE key is bound to no identity (Curve.Identities, PeerServerKeys): its frames are rejected until AddIdentity or SetPeerServerKey binds it")
		}
	}
	if cfg.Insecure {
		l.log.Warn().Str("bind", cfg.Bind).
			Msg("control/zmq: INSECURE control plane: no CURVE authentication or encryption; any host that reaches the endpoint can speak for any peer")
	}
	return l, nil
}

// peerLocked returns id's directory entry, creating it. Callers hold l.mu.
func (l *Link) peerLocked(id messages.PeerID) *peerInfo {
	p := l.peers[id]
	if p == nil {
		p = &peerInfo{}
		l.peers[id] = p
	}
	return p
}

// AddPeer adds (or moves) a peer's ROUTER endpoint to the directory. The
// heartbeat goroutine starts beating it within one interval. An
// incarnation of the peer that RemovePeer forgot may say Hello again,
// unless it spoke with another CURVE key than the peer's server key
// (departedLocked).
func (l *Link) AddPeer(id messages.PeerID, endpoint string) error {
	if err := CheckPeerEndpoint(endpoint); err != nil {
		return fmt.Errorf("%w (peer %s)", err, id)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("%w: add peer %s", control.ErrClosed, id)
	}
	if info := l.peerLocked(id); info.endpoint != endpoint {
		info.endpoint = endpoint
		info.moves.Add(1)
	}
	l.readdLocked(id)
	return nil
}

// SetPeerServerKey records a peer's CURVE server public key (Z85). As
// AddPeer, it adds the peer again after a RemovePeer: an incarnation
// RemovePeer forgot that spoke with key may say Hello again; one that
// spoke with another key may not (departedLocked).
func (l *Link) SetPeerServerKey(id messages.PeerID, key string) error {
	if err := checkKey("server key of "+id.String(), key); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	info := l.peerLocked(id)
	if old := info.serverKey; old != "" && old != key {
		// A new incarnation with another key: the name is no longer
		// bound to the old key (the listener accepts the new key's Hello
		// at once), which may still speak for it (its last frames).
		l.departLocked(old, id)
		if info.key == old {
			info.key = ""
		}
	}
	info.serverKey = key
	l.readdLocked(id)
	l.rebuildIdentitiesLocked()
	return nil
}

// Redial makes the heartbeat goroutine close its socket to peer and dial
// it again at its next beat, with a new handshake, and each Conn to peer
// whose handshake failed for good (a refused key, a protocol error) dial
// again too, keeping what it queued (Conn.redialLocked). libzmq does not
// retry a session the peer refused at authentication (ZAP), so a peer
// that admitted this link's key only after refusing it (a registry that
// told one side of the other first) is reached again this way. From the
// call on, PeerState says Connecting until the new connection reports:
// what the old one said (up, say, to a previous incarnation of the peer
// at the same endpoint) is no longer news. It is an error for a peer without an
// endpoint in the directory.
func (l *Link) Redial(peer messages.PeerID) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	info := l.peers[peer]
	if info == nil || info.endpoint == "" {
		return fmt.Errorf("%w: redial %s: no endpoint in the directory", control.ErrPeerGone, peer)
	}
	info.redials++
	info.conn = PeerState{Conn: ConnConnecting, Endpoint: info.endpoint, Since: l.cfg.Clock()}
	return nil
}

// AllowKey admits one more CURVE client public key (Z85) at the ROUTER,
// for handshakes from now on; its frames are accepted only for the
// identities it is bound to (AddIdentity, SetPeerServerKey). A DEALER
// refused earlier does not retry (libzmq ends a session that failed
// authentication): the peer must dial again (its heartbeat socket and
// Conns do once this link says Hello on a new connection to it, or at
// its Redial).
func (l *Link) AllowKey(public string) error {
	if err := checkKey("allowed peer", public); err != nil {
		return err
	}
	l.mu.Lock()
	l.allowed[public] = true
	l.mu.Unlock()
	return nil
}

func (l *Link) keyAllowed(public string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.allowed[public]
}

// Endpoint is the ROUTER's bound endpoint with the real port ("" before
// Listen).
func (l *Link) Endpoint() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.endpoint
}

// PublicKey is the link's CURVE public key ("" when insecure): what peers
// put in AllowedPeers and PeerServerKeys.
func (l *Link) PublicKey() string { return l.cfg.Curve.Public }

// Listen implements control.Link: it binds the ROUTER, starts the listener
// goroutine and, unless heartbeats are off, the heartbeat goroutine. A
// Link listens once; closing the Listener stops both goroutines.
func (l *Link) Listen(self *messages.Hello, deliver func(messages.Frame)) (control.Listener, error) {
	if self == nil || deliver == nil {
		return nil, fmt.Errorf("%w: Listen needs a Hello and a deliver func", ErrConfig)
	}
	// The Hello says this listener's frame limit, so that peers refuse a
	// larger frame at send, naming it, instead of sending what the
	// listener drops (oversize).
	own := *self
	own.MaxFrameBytes = uint64(l.cfg.MaxFrameBytes)
	self = &own
	hello, err := encode(self)
	if err != nil {
		return nil, fmt.Errorf("control/zmq: listen as %s: %w", self.From, err)
	}
	if len(hello) > l.cfg.MaxFrameBytes {
		return nil, fmt.Errorf("%w: listen as %s: Hello of %d bytes exceeds MaxFrameBytes %d",
			ErrFrameTooLarge, self.From, len(hello), l.cfg.MaxFrameBytes)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: listen as %s", control.ErrClosed, self.From)
	}
	if l.listening != nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: %s (as %s)", control.ErrDuplicate, self.From, l.listening.From)
	}
	l.listening = self
	l.mu.Unlock()
	// An ipc path in use is probed for up to ipcInUseWait: not under the
	// lock, which every other call of the link takes. listening keeps a
	// second Listen out meanwhile; a Close meanwhile is seen below, before
	// anything is bound.
	err = ipcFreeToListen(l.cfg.Bind)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.listening = nil
		return nil, err
	}
	if l.closed {
		l.listening = nil
		return nil, fmt.Errorf("%w: listen as %s", control.ErrClosed, self.From)
	}
	router, zap, mon, endpoint, err := l.bind()
	if err != nil {
		l.listening = nil
		return nil, err
	}
	rw, zw, err := sockWaits(router, zap)
	if err != nil {
		closeWatched(router, mon)
		closeSocket(router)
		closeSocket(zap)
		l.listening = nil
		return nil, fmt.Errorf("control/zmq: listen as %s: %w", self.From, err)
	}
	var mw *sockWait
	if mon != nil {
		if mw, err = newSockWait(mon); err != nil {
			l.log.Warn().Err(err).Msg("control/zmq: cannot wait on the listener's monitor; FailedHandshakes stays 0")
			closeWatched(router, mon)
			mon = nil
		}
	}
	l.self, l.selfHello, l.endpoint = self, hello, endpoint
	l.boundFile = boundIPCFile(endpoint)
	l.stop = make(chan struct{})
	l.waits = []*sockWait{rw, zw, mw}
	s := &listener{
		l:       l,
		router:  router,
		zap:     zap,
		mon:     mon,
		secure:  zap != nil,
		deliver: deliver,
		self:    self.From,
		selfInc: self.Incarnation,
		conns:   map[string]*binding{},
		live:    newLiveness(l.liveTimeout()),
	}
	l.wg.Add(1)
	go s.serve(l.stop, rw, zw, mw)
	if l.cfg.heartbeats() {
		l.wg.Add(1)
		go l.beat(l.stop, self.From, hello)
	}
	return listenerHandle{l}, nil
}

// ipcFreeToListen is checkIPCFree, Listen's check of its ipc:// path (a
// variable, so that a test can hold Listen there).
var ipcFreeToListen = checkIPCFree

// sockWaits makes the netpoller waits of the ROUTER and, when secure, of
// the ZAP handler (zw nil when zap is).
func sockWaits(router, zap *zmq4.Socket) (rw, zw *sockWait, err error) {
	if rw, err = newSockWait(router); err != nil {
		return nil, nil, err
	}
	if zap != nil {
		if zw, err = newSockWait(zap); err != nil {
			rw.close()
			return nil, nil, err
		}
	}
	return rw, zw, nil
}

func (l *Link) liveTimeout() time.Duration {
	if !l.cfg.heartbeats() {
		return 0
	}
	return l.cfg.HeartbeatInterval * time.Duration(l.cfg.HeartbeatMisses)
}

// bind makes the ZAP handler (unless insecure), the ROUTER and, unless
// it cannot be set up (logged), the PAIR its socket monitor reports the
// failed handshakes of the connections it accepts on (mon,
// listenerWatchedEvents). All go to the listener goroutine, which alone
// uses and closes them. Listen checked an ipc:// path first
// (ipcFreeToListen).
func (l *Link) bind() (router, zap, mon *zmq4.Socket, endpoint string, err error) {
	fail := func(what string, e error) (*zmq4.Socket, *zmq4.Socket, *zmq4.Socket, string, error) {
		closeWatched(router, mon)
		closeSocket(router)
		closeSocket(zap)
		return nil, nil, nil, "", fmt.Errorf("control/zmq: listen on %s: %s: %w", l.cfg.Bind, what, e)
	}
	if !l.cfg.Insecure {
		// The ZAP handler must be bound before the ROUTER accepts a
		// handshake: libzmq admits CURVE clients when no handler is there.
		if zap, err = l.zctx.NewSocket(zmq4.REP); err != nil {
			return fail("ZAP socket", err)
		}
		if err = zap.SetLinger(0); err != nil {
			return fail("ZAP linger", err)
		}
		if err = zap.Bind("inproc://zeromq.zap.01"); err != nil {
			return fail("ZAP bind", err)
		}
	}
	if router, err = l.zctx.NewSocket(zmq4.ROUTER); err != nil {
		return fail("ROUTER socket", err)
	}
	if err = router.SetLinger(0); err != nil {
		return fail("linger", err)
	}
	if err = router.SetMaxmsgsize(int64(l.cfg.MaxFrameBytes + oversizeSlack)); err != nil {
		return fail("max message size", err)
	}
	// The listener sends only probes (probeDead): a send to a connection
	// that is gone fails (EHOSTUNREACH) instead of being dropped, and a
	// live one queues few of them.
	if err = router.SetRouterMandatory(1); err != nil {
		return fail("router mandatory", err)
	}
	if err = router.SetSndhwm(probeHWM); err != nil {
		return fail("send HWM", err)
	}
	if ipv6Endpoint(l.cfg.Bind) {
		if err = router.SetIpv6(true); err != nil {
			return fail("IPv6", err)
		}
	}
	if !l.cfg.Insecure {
		if err = router.SetCurveServer(1); err != nil {
			return fail("CURVE server", err)
		}
		if err = router.SetCurveSecretkey(l.cfg.Curve.Secret); err != nil {
			return fail("CURVE secret key", err)
		}
		if err = router.SetZapDomain(zapDomain); err != nil {
			return fail("ZAP domain", err)
		}
	}
	// Before Bind, so that no connection's handshake goes unwatched.
	if mon, err = l.watchSocket(router, "inproc://kvxfer.monitor.listener", listenerWatchedEvents); err != nil {
		l.log.Warn().Err(err).Msg("control/zmq: cannot watch the listener's handshakes; FailedHandshakes stays 0")
		mon, err = nil, nil
	}
	if err = router.Bind(l.cfg.Bind); err != nil {
		return fail("bind", err)
	}
	if endpoint, err = router.GetLastEndpoint(); err != nil {
		return fail("last endpoint", err)
	}
	return router, zap, mon, endpoint, nil
}

// listenerWatchedEvents are the socket-monitor events of the ROUTER that
// FailedHandshakes counts: handshakes of the connections it accepted that
// failed before the ZAP handler judged a key (those it refuses are
// Refused).
const listenerWatchedEvents = zmq4.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq4.EVENT_HANDSHAKE_FAILED_NO_DETAIL

// closeWatched stops sock's socket monitor and closes mon, the PAIR
// connected to it (nil: none), leaving sock open: the monitor stops
// before its PAIR closes.
func closeWatched(sock, mon *zmq4.Socket) {
	if mon == nil {
		return
	}
	_ = sock.Monitor("", 0)
	closeSocket(mon)
}

// Dial implements control.Link: a new DEALER to peer's ROUTER, which says
// the link's Hello first. The link must be listening (Dial sends its Hello).
func (l *Link) Dial(peer messages.PeerID) (control.Conn, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: dial %s", control.ErrClosed, peer)
	}
	if l.selfHello == nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: dial %s: Listen first (a Conn starts with the link's Hello)", ErrNotListening, peer)
	}
	info := l.peers[peer]
	if info == nil || info.endpoint == "" {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: dial %s: no endpoint in the directory", control.ErrPeerGone, peer)
	}
	endpoint, serverKey, hello, redials := info.endpoint, info.serverKey, l.selfHello, info.redials
	l.refs++
	l.mu.Unlock()

	c := &Conn{l: l, peer: peer, info: info, helloInc: info.incarnation.Load(), stop: make(chan struct{}), moves: info.moves.Load()}
	if err := c.dialLocked(endpoint, serverKey, redials); err != nil { // c is not shared yet
		l.release()
		return nil, err
	}
	// The connection is usually not up yet (the socket queues only on a
	// connection that completed its handshake): then the Hello waits in
	// the backlog, first, until it is.
	if err := c.sayHello(hello); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// newDealer makes a DEALER connected to a peer's ROUTER: a random routing
// id (kept across reconnects), reconnects that back off (reconnectIvlMax),
// CURVE client unless insecure, and a receive
// side that holds one tiny message (a ROUTER sends only empty probes on
// it, probeDead, which nothing reads).
//
// immediate (ZMQ_IMMEDIATE) queues frames only on a connection that has
// completed its handshake (CURVE included): a frame the socket takes has a
// live, authenticated peer behind it, and one it refuses (EAGAIN) never
// leaves this process. Conns use it, so that a RequestData refused while
// the peer is not up (not running, a wrong key, a typo in its endpoint) is
// known not to have reached it — the generation side may then free the
// request's pages at its deadline — rather than waiting in a queue to be
// delivered after the pages were reused. Heartbeat sockets do not: their
// Hello must go out as soon as the peer is up.
//
// prepare, when not nil, runs on the socket just before it connects (the
// heartbeat goroutine attaches a socket monitor there, so that no event of
// the connection is missed).
func (l *Link) newDealer(peer messages.PeerID, endpoint, serverKey string, hwm int, immediate bool, prepare func(*zmq4.Socket) error) (*zmq4.Socket, error) {
	if !l.cfg.Insecure && serverKey == "" {
		return nil, fmt.Errorf("%w: %s", ErrNoServerKey, peer)
	}
	s, err := l.zctx.NewSocket(zmq4.DEALER)
	if err != nil {
		return nil, fmt.Errorf("control/zmq: dial %s: %w", peer, err)
	}
	set := func(what string, e error) {
		if e != nil && err == nil {
			err = fmt.Errorf("control/zmq: dial %s at %s: %s: %w", peer, endpoint, what, e)
		}
	}
	set("linger", s.SetLinger(0))
	set("send HWM", s.SetSndhwm(hwm))
	set("receive HWM", s.SetRcvhwm(1))
	set("max message size", s.SetMaxmsgsize(64<<10))
	set("routing id", s.SetIdentity(routingID()))
	set("immediate", s.SetImmediate(immediate))
	set("reconnect backoff", s.SetReconnectIvlMax(l.cfg.reconnectMax()))
	if ipv6Endpoint(endpoint) || ipv6OnlyHost(endpoint, l.goLookup) {
		set("IPv6", s.SetIpv6(true))
	}
	if !l.cfg.Insecure {
		set("CURVE server key", s.SetCurveServerkey(serverKey))
		set("CURVE public key", s.SetCurvePublickey(l.cfg.Curve.Public))
		set("CURVE secret key", s.SetCurveSecretkey(l.cfg.Curve.Secret))
	}
	if prepare != nil && err == nil {
		err = prepare(s)
	}
	set("connect", s.Connect(endpoint))
	if err != nil {
		closeSocket(s)
		return nil, err
	}
	return s, nil
}

// goLookup runs f in a goroutine of the link's (ipv6OnlyHost's background
// lookups), with a context that Close cancels before it waits for f to
// return; once the link is closed it runs nothing and returns false.
func (l *Link) goLookup(f func(ctx context.Context)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.lookups.Add(1)
	go func() {
		defer l.lookups.Done()
		f(l.lookupCtx)
	}()
	return true
}

// reconnectIvlMax bounds the exponential backoff of a DEALER's reconnects
// (ZMQ_RECONNECT_IVL_MAX): after each failed attempt libzmq doubles its
// wait, from ZMQ_RECONNECT_IVL (100 ms) up to this, and starts from the
// interval again once connected. Without it libzmq retries every 100 ms
// for as long as the peer is gone, from every Conn and heartbeat socket
// of every process that knows the peer; with it a peer back at its
// endpoint is reached within about a second, as a heartbeat interval.
const reconnectIvlMax = time.Second

// reconnectMax is the DEALERs' reconnect backoff bound: reconnectIvlMax,
// or the heartbeat interval when that is shorter. A peer that comes up
// after a few failed attempts is then reached within a beat, well within
// the waitHintBeats beats after its Hello that node.WaitPeers gives our
// connection before it names the endpoint as wrong (a fixed second failed
// every request of a pair whose heartbeat was 200 ms and whose other side
// started late).
func (c *Config) reconnectMax() time.Duration {
	if c.heartbeats() && c.HeartbeatInterval < reconnectIvlMax {
		return c.HeartbeatInterval
	}
	return reconnectIvlMax
}

// routingID is a DEALER's random routing id: 16 bytes, the first non-zero
// (ZeroMQ reserves ids starting with a zero byte).
func routingID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[0] = 'k'
	return string(b[:])
}

func closeSocket(s *zmq4.Socket) {
	if s == nil {
		return
	}
	_ = s.SetLinger(0)
	_ = s.Close()
}

// SaysAgent reports whether a peer's latest Hello in the directory
// carries the data-plane agent address addr: an agent this link's
// authenticated peers vouch for (ucx.WithAdmission). It takes the link's
// lock for a walk of the directory (at most 4,096 peers).
func (l *Link) SaysAgent(addr []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, info := range l.peers {
		if info.hello != nil && bytes.Equal(info.hello.AgentAddr, addr) {
			return true
		}
	}
	return false
}

// Hello implements control.Link: the latest Hello peer said, while it is
// alive; control.ErrPeerGone when unknown or down (wrapping ErrPeerClosed
// too when it is down for its goodbye, and naming the reason that goodbye
// gave, if any: ClosedReason). When a CURVE key that
// may speak for peer sent frames of another protocol version, the error
// also wraps messages.ErrVersion and names that version.
func (l *Link) Hello(peer messages.PeerID) (*messages.Hello, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.self != nil && peer == l.self.From {
		return l.self, nil
	}
	info := l.peers[peer]
	var err error
	switch {
	case info == nil || info.hello == nil:
		err = fmt.Errorf("%w: %s has not said Hello", control.ErrPeerGone, peer)
	case info.down && info.left && info.leftWhy != "":
		err = fmt.Errorf("%w: %s %w as it exited on an error: %s", control.ErrPeerGone, peer, ErrPeerClosed, info.leftWhy)
	case info.down && info.left:
		err = fmt.Errorf("%w: %s %w", control.ErrPeerGone, peer, ErrPeerClosed)
	case info.down:
		err = fmt.Errorf("%w: %s missed %d heartbeats", control.ErrPeerGone, peer, l.cfg.HeartbeatMisses)
	default:
		return info.hello, nil
	}
	if ov := l.otherVersionLocked(peer); ov != nil {
		err = fmt.Errorf("%w: its frames are of %w", err, ov)
	}
	return nil, err
}

// ClosedHello is the last Hello of peer when it is down for its goodbye
// (it closed on purpose), and whether it is: what a caller that looked too
// late judges it by (it may have closed because it found this link's
// engine incompatible, before this one looked at its Hello).
func (l *Link) ClosedHello(peer messages.PeerID) (*messages.Hello, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	info := l.peers[peer]
	if info == nil || info.hello == nil || !info.down || !info.left {
		return nil, false
	}
	return info.hello, true
}

// ClosedReason is the reason peer's goodbye gave (messages.Heartbeat.Reason:
// the error it exits on) while it is down for that goodbye; "" when it
// gave none (it may be restarting), or is not down for a goodbye.
func (l *Link) ClosedReason(peer messages.PeerID) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if info := l.peers[peer]; info != nil && info.down && info.left {
		return info.leftWhy
	}
	return ""
}

// otherVersionLocked is the protocol version peer's frames were written
// in, when a CURVE key that may speak for it sent frames of another
// version than ours; else nil. Callers hold l.mu.
func (l *Link) otherVersionLocked(peer messages.PeerID) *PeerVersionError {
	for key, v := range l.foreign {
		if l.keyPermits(key, peer) {
			return &PeerVersionError{Key: key, Version: v}
		}
	}
	return nil
}

// OtherVersionUnnamed is the protocol version, other than ours, of the
// last frame that came on a connection without a CURVE key (an insecure
// link), or 0 when none did. Such frames cannot be tied to a peer (nothing
// authenticates whose they are), so Hello cannot name them; a caller that
// waits for a silent peer can say that a peer of another version may be
// why.
func (l *Link) OtherVersionUnnamed() uint32 { return l.anonForeign.Load() }

// misnamedHello is a Hello refused for the sender it claimed.
type misnamedHello struct {
	claimed messages.PeerID
	key     string
	at      time.Time // wall clock
}

// MisnamedHello reports whether a Hello came, at since or later, with a
// CURVE key that may speak for peer while claiming another sender its key
// still may not speak for, and which: the peer runs under another
// instance name (or rank) than this side expects of it, a mistake a user
// makes (--peer decode for a peer started as gen) that would otherwise
// look like silence. An older refusal (a peer since restarted under the
// right name), or one whose key has since been bound to the name it
// claimed (an etcd record learned after the Hello), does not count.
func (l *Link) MisnamedHello(peer messages.PeerID, since time.Time) (claimed messages.PeerID, ok bool) {
	m := l.misnamed.Load()
	if m == nil || m.at.Before(since) || m.claimed == peer || !l.keyPermits(m.key, peer) || l.keyPermits(m.key, m.claimed) {
		return messages.PeerID{}, false
	}
	return m.claimed, true
}

// PeerVersionError is wrapped by Hello's error for a peer whose CURVE key
// sent frames of another control protocol version than this build's
// (messages.Version); it wraps a *messages.VersionError of that version
// (so messages.ErrVersion).
type PeerVersionError struct {
	Key     string // the CURVE key the frames came with
	Version uint32 // the version they were written in
}

func (e *PeerVersionError) Error() string {
	return fmt.Sprintf("control protocol version %d (CURVE key %s), this engine speaks %d", e.Version, e.Key, messages.Version)
}
func (e *PeerVersionError) Unwrap() error { return &messages.VersionError{Got: e.Version} }

// MarkDrained tells the link that the goodbye its Close sends may say
// that this incarnation's writes are over (messages.Heartbeat.Drained: a
// drained goodbye, which a peer takes as proof that none of them can land
// any more). Call it only when that is so: the engine that writes under
// the link's Hello has stopped taking the frames that start writes (its
// listener is closed) and every write it ever started is over, none in
// doubt (kvxfer.Engine.WritesOver after its Close). Without it (the
// default) the goodbye proves nothing. Once Close began it changes
// nothing.
func (l *Link) MarkDrained() { l.drained.Store(true) }

// SetGoodbyeReason gives the goodbye Close sends a reason
// (messages.Heartbeat.Reason): why the link's owner closes, when it exits
// on an error it found, so that its peers name it and stop waiting for
// it instead of taking the close for a restart (Config.OnPeerGoodbye).
// reason is made to fit (messages.GoodbyeReason); "" gives none, as by
// default. Once Close began it changes nothing. Given before the
// listener closes (Listen's Closer, or Close), it also makes Close wait,
// at most 1 to 2 s (goodbyeWait), for the heartbeat connections to peers
// it heard from (that said Hello on this link) that are not up yet
// (connecting, or down and reconnecting; not one whose handshake failed)
// to come up, and says the Hello and then the goodbye on each: a mistake
// found at startup is often found before the connection to the peer
// that made it is up. A peer never heard from (most often a static peer
// that never started) is not waited for: it is not waiting for us (one
// that starts meanwhile learns the close from missed heartbeats). Given
// later, only the connections up as the listener closed hear it.
func (l *Link) SetGoodbyeReason(reason string) {
	if reason = messages.GoodbyeReason(reason); reason == "" {
		l.byeReason.Store(nil)
		return
	}
	l.byeReason.Store(&reason)
}

// Close stops the listener and heartbeat goroutines (their sockets close
// with linger 0) and removes the ipc:// socket file Listen bound, if it is
// still the one bound (libzmq leaves it behind; a path the link did not
// bind is never removed). The zmq context ends once every Conn is closed
// too. It says goodbye to the peers whose heartbeat connection is up
// (and, with a reason, waits for those that are not: SetGoodbyeReason).
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.closing.Store(true)
	close(l.done)
	l.mu.Unlock()
	l.stopLookups()
	l.lookups.Wait() // no goLookup starts one now: closed is set
	l.stopListening()
	l.sayGoodbye()
	l.release()
	return nil
}

// stopListening stops the goroutines Listen started and waits for them.
func (l *Link) stopListening() {
	l.mu.Lock()
	stop := l.stop
	first := stop != nil && !l.stopped
	l.stopped = true
	waits := l.waits
	l.mu.Unlock()
	if first {
		close(stop)
		for _, w := range waits { // after stop: a woken loop sees it
			w.interrupt()
		}
	}
	l.wg.Wait()
	if first {
		l.mu.Lock()
		f := l.boundFile
		l.boundFile = nil
		l.mu.Unlock()
		f.remove(l.log)
	}
}

// ipcFile is a socket file this link bound: its path and what it was
// when bound (device and inode), so that a file put there since is left.
type ipcFile struct {
	path string
	fi   os.FileInfo
}

// boundIPCFile is the socket file endpoint (the ROUTER's last endpoint,
// just bound) names; nil when it is not ipc://, an abstract socket, or
// not a socket file.
func boundIPCFile(endpoint string) *ipcFile {
	path, ok := strings.CutPrefix(endpoint, "ipc://")
	if !ok || path == "" || strings.HasPrefix(path, "@") {
		return nil
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		return nil
	}
	return &ipcFile{path: path, fi: fi}
}

// remove unlinks the file if it is still the socket bound (libzmq leaves
// it behind), never a file another process put at the path since.
func (f *ipcFile) remove(log zerolog.Logger) {
	if f == nil {
		return
	}
	fi, err := os.Lstat(f.path)
	if err != nil || !os.SameFile(fi, f.fi) {
		return // gone, or another's now
	}
	if err := os.Remove(f.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Warn().Err(err).Str("path", f.path).Msg("control/zmq: removing the ipc socket file this link bound")
	}
}

// release drops one reference to the zmq context and terminates it at zero.
func (l *Link) release() {
	l.mu.Lock()
	l.refs--
	last := l.refs == 0
	l.mu.Unlock()
	if last {
		if err := l.zctx.Term(); err != nil {
			l.log.Warn().Err(err).Msg("control/zmq: terminating the zmq context")
		}
	}
}

type listenerHandle struct{ l *Link }

// Close stops the listener and heartbeat goroutines.
func (h listenerHandle) Close() error {
	h.l.stopListening()
	return nil
}
