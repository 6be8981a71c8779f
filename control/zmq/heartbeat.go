package zmq

import (
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/messages"
)

// beatSock is the heartbeat goroutine's DEALER to one peer.
type beatSock struct {
	sock      *zmq4.Socket
	endpoint  string
	serverKey string
	info      *peerInfo
	helloInc  uint64
	needHello bool
}

// beater is the state of the heartbeat goroutine, which alone touches its
// sockets.
type beater struct {
	l     *Link
	self  messages.PeerID
	hello []byte
	socks map[messages.PeerID]*beatSock
	// failed remembers peers whose socket could not be made, to log once.
	failed map[messages.PeerID]bool
	seq    uint64
}

// beat is the heartbeat goroutine: every interval it (re)connects to the
// directory's peers and sends each a Heartbeat, preceded by the link's
// Hello on a new socket, when the peer has a new incarnation, and every
// HeartbeatMisses beats.
func (l *Link) beat(stop <-chan struct{}, self messages.PeerID, hello []byte) {
	defer l.wg.Done()
	b := &beater{l: l, self: self, hello: hello, socks: map[messages.PeerID]*beatSock{}, failed: map[messages.PeerID]bool{}}
	defer b.closeAll()
	t := time.NewTicker(l.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		b.refresh()
		b.send()
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// refresh makes a socket for every directory peer with an endpoint, and
// remakes one whose endpoint or server key changed.
func (b *beater) refresh() {
	type want struct {
		endpoint, serverKey string
		info                *peerInfo
	}
	wants := map[messages.PeerID]want{}
	b.l.mu.Lock()
	for id, info := range b.l.peers {
		if id != b.self && info.endpoint != "" {
			wants[id] = want{info.endpoint, info.serverKey, info}
		}
	}
	b.l.mu.Unlock()
	for id, w := range wants {
		old := b.socks[id]
		if old != nil && old.endpoint == w.endpoint && old.serverKey == w.serverKey {
			continue
		}
		if old != nil {
			closeSocket(old.sock)
			delete(b.socks, id)
		}
		sock, err := b.l.newDealer(id, w.endpoint, w.serverKey, b.l.cfg.HeartbeatMisses+2, false)
		if err != nil {
			if !b.failed[id] {
				b.failed[id] = true
				b.l.log.Warn().Err(err).Stringer("peer", id).Msg("control/zmq: cannot heartbeat peer")
			}
			continue
		}
		delete(b.failed, id)
		b.socks[id] = &beatSock{sock: sock, endpoint: w.endpoint, serverKey: w.serverKey, info: w.info, needHello: true}
	}
}

// send sends one round of heartbeats. A full queue (peer unreachable)
// drops the beat: the peer will see silence, which is the truth.
func (b *beater) send() {
	b.seq++
	beat, err := encode(&messages.Heartbeat{From: b.self, Seq: b.seq})
	if err != nil {
		b.l.log.Error().Err(err).Msg("control/zmq: encoding a heartbeat")
		return
	}
	periodic := b.seq%uint64(b.l.cfg.HeartbeatMisses) == 0
	for _, s := range b.socks {
		inc := s.info.incarnation.Load()
		if s.needHello || inc != s.helloInc || periodic {
			if _, err := s.sock.SendBytes(b.hello, zmq4.DONTWAIT); err != nil {
				continue
			}
			s.needHello, s.helloInc = false, inc
		}
		_, _ = s.sock.SendBytes(beat, zmq4.DONTWAIT)
	}
}

func (b *beater) closeAll() {
	for id, s := range b.socks {
		closeSocket(s.sock)
		delete(b.socks, id)
	}
}
