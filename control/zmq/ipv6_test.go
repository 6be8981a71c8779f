package zmq

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/messages"
)

// needLoopback6 skips a test on a host without an IPv6 loopback (::1 not
// configured, or IPv6 disabled): nothing can bind there.
func needLoopback6(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("this host has no IPv6 loopback to bind (%v): IPv6 endpoints untested", err)
	}
	_ = ln.Close()
}

// Two links bound on tcp://[::1] exchange frames both ways, insecure and
// with CURVE: libzmq takes IPv6 only on a socket with ZMQ_IPV6 set, and
// without it the bind failed ("no such device") and so did a connect.
func TestIPv6Endpoint(t *testing.T) {
	needLoopback6(t)
	for _, secure := range []bool{false, true} {
		name := "insecure"
		if secure {
			name = "curve"
		}
		t.Run(name, func(t *testing.T) {
			const hb = 100 * time.Millisecond
			cfgA := Config{Insecure: true, Bind: "tcp://[::1]:0", HeartbeatInterval: hb}
			cfgB := cfgA
			if secure {
				ka, kb := newKeys(t), newKeys(t)
				cfgA = Config{Bind: "tcp://[::1]:0", HeartbeatInterval: hb, Curve: Curve{Secret: ka.secret, Identities: []Identity{{PublicKey: kb.public, Instance: "gen"}}}}
				cfgB = Config{Bind: "tcp://[::1]:0", HeartbeatInterval: hb, Curve: Curve{Secret: kb.secret, Identities: []Identity{{PublicKey: ka.public, Instance: "ctx"}}}}
			}
			a := listen(t, pid("ctx", 0), cfgA)
			b := listen(t, pid("gen", 0), cfgB)
			if ep := a.link.Endpoint(); !strings.HasPrefix(ep, "tcp://[::1]:") {
				t.Fatalf("bound %s, want tcp://[::1]:PORT", ep)
			}
			introduce(t, b, a)
			introduce(t, a, b)
			for _, p := range []struct{ from, to *node }{{b, a}, {a, b}} {
				conn, err := p.from.link.Dial(p.to.id)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				if err := conn.Send(&messages.Cancel{RequestID: "r", Epoch: 1, From: p.from.id, Reason: "test"}); err != nil {
					t.Fatal(err)
				}
				waitFor(t, patience, "the Cancel from "+p.from.id.String()+" over IPv6", func() bool { return len(p.to.in.from(p.from.id)) == 1 })
				waitFor(t, patience, p.from.id.String()+"'s heartbeat connection over IPv6 to be up", peerStateIs(p.from.link, p.to.id, ConnUp, ""))
			}
		})
	}
}
