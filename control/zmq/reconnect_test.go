package zmq

import (
	"path/filepath"
	"testing"
	"time"
)

// Every DEALER the link makes (Conns and heartbeat sockets, both from
// newDealer) backs off between reconnects to a peer that is gone: libzmq
// retries every ZMQ_RECONNECT_IVL (100 ms) forever unless
// ZMQ_RECONNECT_IVL_MAX is set, so before, each worker's Conn and each
// heartbeat socket to a dead peer's endpoint reconnected ten times a
// second for as long as it was held (a reconnect storm on a restarted
// host).
func TestDealersBackOffBetweenReconnects(t *testing.T) {
	ivl, most := ghostDealerReconnect(t, Config{Insecure: true})
	if most != reconnectIvlMax || most <= ivl {
		t.Fatalf("Conn's DEALER: ZMQ_RECONNECT_IVL %v, ZMQ_RECONNECT_IVL_MAX %v; want a maximum of %v above the interval (exponential backoff)",
			ivl, most, reconnectIvlMax)
	}
}

// ghostDealerReconnect dials, from a link of cfg, a peer nobody serves and
// returns its Conn's ZMQ_RECONNECT_IVL and ZMQ_RECONNECT_IVL_MAX.
func ghostDealerReconnect(t *testing.T, cfg Config) (ivl, most time.Duration) {
	t.Helper()
	dir := t.TempDir()
	b := listen(t, pid("gen", 0), cfg)
	ghost := pid("ctx", 9)
	if err := b.link.AddPeer(ghost, "ipc://"+filepath.Join(dir, "nobody.sock")); err != nil {
		t.Fatal(err)
	}
	conn, err := b.link.Dial(ghost)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := conn.(*Conn)
	c.mu.Lock()
	ivl, err1 := c.sock.GetReconnectIvl()
	most, err2 := c.sock.GetReconnectIvlMax()
	c.mu.Unlock()
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	return ivl, most
}

// With heartbeats faster than a second the backoff stops at the heartbeat
// interval: a peer that starts late is reached within a beat, well before
// node.WaitPeers gives up on a connection still down three beats after
// the peer's Hello (with a 1 s bound, a pair beating every 200 ms failed
// every request when one side started late).
func TestDealersBackOffNoLongerThanABeat(t *testing.T) {
	if _, most := ghostDealerReconnect(t, Config{Insecure: true, HeartbeatInterval: 200 * time.Millisecond}); most != 200*time.Millisecond {
		t.Fatalf("ZMQ_RECONNECT_IVL_MAX %v with a 200ms heartbeat, want 200ms", most)
	}
}
