package zmq

import (
	"context"
	"errors"
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

// ipv6OnlyHost picks out the peer endpoints whose host name resolves to
// IPv6 addresses only, and newDealer sets ZMQ_IPV6 for them: without it
// libzmq resolves the name as IPv4 only and never connects. A name with
// an IPv4 address, one that does not resolve, an address and another
// transport are left as they were. (Checked to fail: with newDealer
// testing ipv6Endpoint alone, the socket for v6only.test has no
// ZMQ_IPV6.)
func TestIPv6OnlyHostGetsIPv6(t *testing.T) {
	names := map[string][]net.IP{
		"v6only.test": {net.ParseIP("::1"), net.ParseIP("fd00::2")},
		"dual.test":   {net.ParseIP("::1"), net.ParseIP("127.0.0.1")},
		"v4.test":     {net.ParseIP("127.0.0.1")},
	}
	old := lookupIP
	lookupIP = func(_ context.Context, host string) ([]net.IP, error) {
		if ips, ok := names[host]; ok {
			return ips, nil
		}
		return nil, errors.New("no such host")
	}
	forgetHostAnswers()
	t.Cleanup(func() { lookupIP = old; forgetHostAnswers() })
	for ep, want := range map[string]bool{
		"tcp://v6only.test:5712":          true,
		"tcp://dual.test:5712":            false,
		"tcp://v4.test:5712":              false,
		"tcp://missing.test:5712":         false,
		"tcp://127.0.0.1:5712":            false,
		"tcp://[::1]:5712":                false, // ipv6Endpoint's
		"tcp://127.0.0.1:0;v6only.test:1": false,
		"ipc:///run/v6only.test:1":        false,
	} {
		if got := ipv6OnlyHost(ep); got != want {
			t.Errorf("ipv6OnlyHost(%s) = %v, want %v", ep, got, want)
		}
	}
	l := listen(t, pid("gen", 0), Config{Insecure: true}).link
	for ep, want := range map[string]bool{"tcp://v6only.test:5712": true, "tcp://v4.test:5712": false, "tcp://dual.test:5712": false} {
		sock, err := l.newDealer(pid("ctx", 0), ep, "", 4, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sock.GetIpv6()
		closeSocket(sock)
		if err != nil || got != want {
			t.Errorf("dealer to %s: ZMQ_IPV6 %v (%v), want %v", ep, got, err, want)
		}
	}
}

// ipv6OnlyLoopbackName is a host name this host resolves to ::1 alone
// (as /etc/hosts often maps ip6-localhost), or "" when it has none.
func ipv6OnlyLoopbackName() string {
	for _, name := range []string{"ip6-localhost", "ip6-loopback", "localhost6", "localhost6.localdomain6"} {
		ips, err := net.DefaultResolver.LookupIP(context.Background(), "ip", name)
		if err != nil || len(ips) == 0 {
			continue
		}
		only := true
		for _, ip := range ips {
			only = only && ip.Equal(net.IPv6loopback)
		}
		if only {
			return name
		}
	}
	return ""
}

// A peer endpoint whose host name resolves to ::1 only connects: frames
// and heartbeats flow. Before, libzmq resolved the name as IPv4 only,
// found nothing and retried for ever (PeerState: nothing accepts
// connections there). It needs such a name in this host's resolver
// (ip6-localhost in /etc/hosts, say) and an IPv6 loopback, and skips
// without them. (Checked to fail, in a mount namespace with such a
// name: with newDealer testing ipv6Endpoint alone, the Cancel never
// arrives.)
func TestIPv6OnlyHostNameConnects(t *testing.T) {
	needLoopback6(t)
	name := ipv6OnlyLoopbackName()
	if name == "" {
		t.Skip("no host name here resolves to ::1 alone (no ip6-localhost in /etc/hosts): untested")
	}
	const hb = 100 * time.Millisecond
	a := listen(t, pid("ctx", 0), Config{Insecure: true, Bind: "tcp://[::1]:0", HeartbeatInterval: hb})
	b := listen(t, pid("gen", 0), Config{Insecure: true, HeartbeatInterval: hb})
	ep := a.link.Endpoint()
	byName := "tcp://" + name + ep[strings.LastIndex(ep, ":"):]
	if err := b.link.AddPeer(a.id, byName); err != nil {
		t.Fatal(err)
	}
	conn, err := b.link.Dial(a.id)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Send(&messages.Cancel{RequestID: "r", Epoch: 1, From: b.id, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the Cancel to "+byName, func() bool { return len(a.in.from(b.id)) == 1 })
	waitFor(t, patience, "the heartbeat connection to "+byName+" to be up", peerStateIs(b.link, a.id, ConnUp, ""))
}

func forgetHostAnswers() {
	v6Hosts.mu.Lock()
	v6Hosts.m = nil
	v6Hosts.mu.Unlock()
}

// ipv6OnlyHost looks a name up once per hostAnswerTTL: the heartbeat
// goroutine makes its sockets one after another, and a slow resolver
// would otherwise hold every beat for up to dialLookupWait per socket. A
// name's answer older than the TTL is looked up again.
func TestIPv6OnlyHostAnswerKept(t *testing.T) {
	lookups := map[string]int{}
	old := lookupIP
	lookupIP = func(_ context.Context, host string) ([]net.IP, error) {
		lookups[host]++
		if host == "v6only.test" {
			return []net.IP{net.ParseIP("::1")}, nil
		}
		return nil, errors.New("no such host")
	}
	forgetHostAnswers()
	t.Cleanup(func() { lookupIP = old; forgetHostAnswers() })
	for range 3 {
		if !ipv6OnlyHost("tcp://v6only.test:5712") {
			t.Fatal("v6only.test: want IPv6 only")
		}
		if ipv6OnlyHost("tcp://missing.test:5712") {
			t.Fatal("missing.test: want false")
		}
	}
	if lookups["v6only.test"] != 1 || lookups["missing.test"] != 1 {
		t.Fatalf("lookups %v, want one of each name", lookups)
	}
	v6Hosts.mu.Lock()
	e := v6Hosts.m["v6only.test"]
	e.at = e.at.Add(-hostAnswerTTL)
	v6Hosts.m["v6only.test"] = e
	v6Hosts.mu.Unlock()
	ipv6OnlyHost("tcp://v6only.test:5712")
	if lookups["v6only.test"] != 2 {
		t.Fatalf("an answer older than %v was not looked up again: lookups %v", hostAnswerTTL, lookups)
	}
}
