package zmq

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	zmq4 "github.com/pebbe/zmq4"
	"github.com/rs/zerolog"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultHeartbeatInterval = time.Second
	DefaultHeartbeatMisses   = 3
	DefaultSendHWM           = 1000
	// DefaultTerminalBacklog is how many terminal frames (Result, Cancel,
	// CancelAck) each Conn holds back for a peer whose send queue is full
	// before it refuses one: room for one FAILED result of a few thousand
	// sessions at once, at most about 20 MiB for frames of the largest
	// size (a FAILED result is a few hundred bytes).
	DefaultTerminalBacklog = 4096
	// DefaultMaxFrameBytes admits the largest frame messages can encode.
	DefaultMaxFrameBytes = messages.MaxFrameBytes
)

// oversizeSlack is how far past MaxFrameBytes a message may go and still be
// read (and rejected, counted) by the listener; libzmq drops the connection
// of a peer announcing a longer one (ZMQ_MAXMSGSIZE), before allocating it.
const oversizeSlack = 64 << 10

// Config configures a Link. Zero fields take the defaults above.
type Config struct {
	// Bind is the ROUTER's endpoint ("tcp://127.0.0.1:0", "ipc:///run/x").
	// A tcp port 0 (or *) picks a free port; Endpoint reports the real one.
	Bind string
	// Peers is the static directory: each peer's ROUTER endpoint. AddPeer
	// adds more.
	Peers map[messages.PeerID]string
	// Curve holds the keys; ignored when Insecure.
	Curve Curve
	// Insecure turns CURVE off (NULL mechanism, no ZAP): demo runs only.
	Insecure bool
	// Logger receives warnings (insecure mode, rejected frames, refused
	// handshakes). The zero Logger discards.
	Logger zerolog.Logger
	// HeartbeatInterval is the period of heartbeats (default 1s). A
	// negative interval turns heartbeats and liveness tracking off.
	HeartbeatInterval time.Duration
	// HeartbeatMisses is how many intervals of silence make a peer down
	// (default 3).
	HeartbeatMisses int
	// OnPeerDown is called, on the listener goroutine, when a peer that
	// said Hello falls silent; it must not block. Optional.
	OnPeerDown func(messages.PeerID)
	// OnPeerGoodbye is called, on the listener goroutine, when a peer
	// that said Hello and is alive says goodbye (its link closes
	// gracefully: a Heartbeat with Leaving) on a connection bound to it,
	// for the incarnation the directory holds for it (inc; a Hello that
	// named none gets no goodbye taken): the peer is down from then on,
	// as after missed heartbeats, without waiting for them. Liveness, not
	// proof: its writes may still land. reason is why the peer closed
	// when its goodbye said (messages.Heartbeat.Reason: it exits on an
	// error it found, and is not coming back), "" when it said none (a
	// graceful stop, an older peer: it may restart). It must not block.
	// Optional: when nil, OnPeerDown is called instead.
	OnPeerGoodbye func(peer messages.PeerID, inc uint64, reason string)
	// OnPeerDrained is called, on the listener goroutine, when a goodbye
	// that passed every check a goodbye passes (OnPeerGoodbye's, or one
	// of an incarnation already down or out of the cluster, which calls
	// no OnPeerGoodbye) says drained (messages.Heartbeat.Drained: the
	// sender's link owner said its engine drained every write it
	// started, Link.MarkDrained): proof that incarnation inc of peer
	// writes no more, as a Result is for one request. It comes after
	// OnPeerGoodbye (or OnPeerDown) for the same goodbye, and may come
	// more than once for one incarnation. It must not block for long.
	// Optional.
	OnPeerDrained func(peer messages.PeerID, inc uint64)
	// OnHello is called, on the listener goroutine, with a peer's Hello
	// when it is the peer's first or names another incarnation or process
	// than the peer's Hello before (not for the periodic repeats, nor for
	// the same Hello on another connection of the peer); it must not
	// block. Optional.
	OnHello func(*messages.Hello)
	// OnPeerAlive is called, on the listener goroutine, when a frame or
	// heartbeat of a peer that said Hello arrives, at most once per
	// HeartbeatInterval per peer (the writer lease's renewal:
	// Engine.PeerAlive); not for the frames of an incarnation RemovePeer
	// forgot. It must not block. Optional.
	OnPeerAlive func(messages.PeerID)
	// OnFrame is called, on the listener goroutine, with each frame other
	// than Hello and Heartbeat of a peer that said Hello, after its checks
	// and before it is delivered; it must not block. Optional.
	OnFrame func(messages.Frame)
	// MaxFrameBytes bounds one incoming frame (default and maximum
	// messages.MaxFrameBytes; at least messages.MinFrameLimit, within
	// which every frame that ends a request fits). The link's Hello says it
	// (Hello.MaxFrameBytes), and a peer's Conn refuses a larger frame to
	// this link at Send (ErrFrameTooLarge, naming both limits); a link
	// refuses one larger than its own limit too.
	MaxFrameBytes int
	// SendHWM is each Conn's send queue in frames (default 1000); past it
	// Send refuses a RequestData with ErrQueueFull. Terminal frames
	// (Result, Cancel, CancelAck, Misaddressed) are never refused for it: they wait in
	// the Conn's terminal backlog.
	SendHWM int
	// TerminalBacklog bounds each Conn's terminal backlog in frames
	// (default DefaultTerminalBacklog): terminal frames that found the
	// send queue full wait there, in order, and are sent as soon as the
	// queue has room. Past it (a peer unreachable for long) Send returns
	// ErrTerminalBacklogFull (an ErrQueueFull) for terminal frames too:
	// the frame is not sent, now or later. Size it to the sessions a
	// peer can have at once.
	TerminalBacklog int
	// Clock tells the listener the time (default time.Now).
	Clock func() time.Time
	// wallClock: Clock is time.Now (set by normalize), so the listener may
	// sleep until the next liveness deadline instead of polling.
	wallClock bool
}

// Curve holds a link's CURVE keys, all Z85 (40 characters).
type Curve struct {
	// Public and Secret are the link's keypair: its ROUTER's server key and
	// its DEALERs' client key. Public may be empty (derived from Secret).
	Public, Secret string
	// AllowedPeers are client public keys the ROUTER admits at the
	// handshake. Admission is not identity: a connection's frames must
	// name a sender its key is bound to, by Identities or by being that
	// sender's server key in PeerServerKeys (a link's one keypair is both
	// its server and its client key). A key bound to nothing is admitted
	// but every frame on it is rejected (reason identity).
	AllowedPeers []string
	// Identities bind client keys to the instance (and ranks) each may
	// speak for; their keys are admitted too. AddIdentity adds more.
	Identities []Identity
	// PeerServerKeys is each peer's server public key, which a DEALER
	// needs to connect; each also binds that key to that peer's PeerID.
	// SetPeerServerKey adds more.
	PeerServerKeys map[messages.PeerID]string
}

// Errors of package zmq; see also control.ErrClosed, control.ErrDuplicate
// and control.ErrPeerGone, which it wraps where they apply.
var (
	ErrConfig             = errors.New("control/zmq: bad config")
	ErrNotListening       = errors.New("control/zmq: not listening")
	ErrQueueFull    error = &sentinel{"control/zmq: send queue full", control.ErrQueueFull}
	// ErrTerminalBacklogFull: Send refused a terminal frame (Result,
	// Cancel, CancelAck, Misaddressed) because the Conn's terminal
	// backlog is full. It wraps ErrQueueFull (keep the Conn: closing it
	// drops its backlog), but unlike a refused RequestData nothing sends
	// the frame later: the request it answers must be ended knowingly.
	ErrTerminalBacklogFull error = &sentinel{"control/zmq: terminal backlog full", ErrQueueFull}
	// ErrTerminalDropped: terminal frames that Send had accepted into a
	// Conn's backlog were dropped unsent (the Conn or the Link closed
	// before the peer took them, or the socket failed). Conn.Close
	// returns it, naming the peer and the count; so does Send once the
	// socket failed.
	ErrTerminalDropped error = &sentinel{"control/zmq: terminal frames dropped unsent", control.ErrFramesDropped}
	// ErrFrameTooLarge: Send refused a frame past MaxFrameBytes (a
	// control.ErrFrameRefused: the Conn stays usable).
	ErrFrameTooLarge error = &sentinel{"control/zmq: frame too large", control.ErrFrameRefused}
	ErrNoServerKey         = errors.New("control/zmq: no CURVE server key for peer")
	// ErrEndpointInUse: Listen found its ipc:// path held by a live
	// process (libzmq would silently take the path over).
	ErrEndpointInUse = errors.New("control/zmq: endpoint in use")
	// ErrHandshakeFailed: the handshake with a peer failed (PeerState.Err).
	ErrHandshakeFailed = errors.New("control/zmq: handshake failed")
	// ErrNoHeartbeats: PeerState needs heartbeats (HeartbeatInterval ≥ 0).
	ErrNoHeartbeats = errors.New("control/zmq: heartbeats are off")
	// ErrPeerClosed is wrapped, beside control.ErrPeerGone, by Hello's
	// error for a peer down because it said goodbye (its link closed
	// gracefully), not because it fell silent; its text follows the
	// peer's name ("ctx/0 closed (it said goodbye)").
	ErrPeerClosed = errors.New("closed (it said goodbye)")
)

// sentinel is an error of this package that is also one of package
// control's (errors.Is matches both).
type sentinel struct {
	msg  string
	base error
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.base }

// GenerateKeys returns a new CURVE keypair in Z85 (for `kvxfer keygen`).
func GenerateKeys() (public, secret string, err error) {
	if !zmq4.HasCurve() {
		return "", "", fmt.Errorf("%w: libzmq was built without CURVE", ErrConfig)
	}
	return zmq4.NewCurveKeypair()
}

// z85Alphabet is ZeroMQ's Z85 character set (RFC 32).
const z85Alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

// checkKey reports whether key is a Z85 CURVE key (40 characters).
func checkKey(what, key string) error {
	if err := keyProblem(key); err != "" {
		return fmt.Errorf("%w: %s: %s", ErrConfig, what, err)
	}
	return nil
}

// CheckKey reports whether key is a Z85 CURVE key (40 characters), as
// `kvxfer keygen` writes; the error wraps ErrConfig and says what is
// wrong with it, so that a configuration can name the field at once
// instead of the link refusing it when it starts.
func CheckKey(key string) error {
	if err := keyProblem(key); err != "" {
		return fmt.Errorf("%w: %s", ErrConfig, err)
	}
	return nil
}

// keyProblem is what is wrong with key as a Z85 CURVE key, "" if nothing.
func keyProblem(key string) string {
	if len(key) != 40 {
		return fmt.Sprintf("CURVE key of %d characters, want 40 (Z85)", len(key))
	}
	for i := 0; i < len(key); i++ {
		if !strings.ContainsRune(z85Alphabet, rune(key[i])) {
			return fmt.Sprintf("character %q at %d is not Z85", key[i], i)
		}
	}
	return ""
}

// normalize validates c and fills in defaults.
func (c Config) normalize() (Config, error) {
	if err := CheckEndpoint(c.Bind); err != nil {
		return c, fmt.Errorf("%w (Bind)", err)
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.HeartbeatMisses <= 0 {
		c.HeartbeatMisses = DefaultHeartbeatMisses
	}
	if c.MaxFrameBytes == 0 {
		c.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if c.MaxFrameBytes < messages.MinFrameLimit || c.MaxFrameBytes > messages.MaxFrameBytes {
		return c, fmt.Errorf("%w: MaxFrameBytes %d, want %d..%d (below %d the frames that end a request would not fit)",
			ErrConfig, c.MaxFrameBytes, messages.MinFrameLimit, messages.MaxFrameBytes, messages.MinFrameLimit)
	}
	if c.SendHWM <= 0 {
		c.SendHWM = DefaultSendHWM
	}
	if c.TerminalBacklog <= 0 {
		c.TerminalBacklog = DefaultTerminalBacklog
	}
	if c.Clock == nil {
		c.Clock, c.wallClock = time.Now, true
	}
	peers := make(map[messages.PeerID]string, len(c.Peers))
	for id, ep := range c.Peers {
		if err := CheckPeerEndpoint(ep); err != nil {
			return c, fmt.Errorf("%w (peer %s)", err, id)
		}
		peers[id] = ep
	}
	c.Peers = peers
	if c.Insecure {
		c.Curve = Curve{}
		return c, nil
	}
	if !zmq4.HasCurve() {
		return c, fmt.Errorf("%w: libzmq was built without CURVE (use Insecure for demos)", ErrConfig)
	}
	if err := checkKey("secret key", c.Curve.Secret); err != nil {
		return c, err
	}
	pub, err := zmq4.AuthCurvePublic(c.Curve.Secret)
	if err != nil {
		return c, fmt.Errorf("%w: deriving the public key: %v", ErrConfig, err)
	}
	if c.Curve.Public != "" && c.Curve.Public != pub {
		return c, fmt.Errorf("%w: public key %s does not match the secret key", ErrConfig, c.Curve.Public)
	}
	c.Curve.Public = pub
	allowed := make([]string, 0, len(c.Curve.AllowedPeers))
	for i, k := range c.Curve.AllowedPeers {
		if err := checkKey(fmt.Sprintf("allowed peer %d", i), k); err != nil {
			return c, err
		}
		allowed = append(allowed, k)
	}
	c.Curve.AllowedPeers = allowed
	idents := make([]Identity, 0, len(c.Curve.Identities))
	for i, id := range c.Curve.Identities {
		if err := id.check(fmt.Sprintf("identity %d", i)); err != nil {
			return c, err
		}
		id.Ranks = slices.Clone(id.Ranks)
		idents = append(idents, id)
	}
	c.Curve.Identities = idents
	keys := make(map[messages.PeerID]string, len(c.Curve.PeerServerKeys))
	for id, k := range c.Curve.PeerServerKeys {
		if err := checkKey("server key of "+id.String(), k); err != nil {
			return c, err
		}
		keys[id] = k
	}
	c.Curve.PeerServerKeys = keys
	return c, nil
}

// heartbeats reports whether heartbeats and liveness tracking are on.
func (c *Config) heartbeats() bool { return c.HeartbeatInterval > 0 }

// pollInterval is how long the listener waits in one poll when its clock
// is injected (listener.tick): short enough to expire peers promptly on
// the clock a test moves.
func (c *Config) pollInterval() time.Duration {
	d := 50 * time.Millisecond
	if c.heartbeats() && c.HeartbeatInterval/2 < d {
		d = c.HeartbeatInterval / 2
	}
	if d < time.Millisecond {
		d = time.Millisecond
	}
	return d
}
