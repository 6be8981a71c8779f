package zmq

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/control"
	"github.com/kvxfer/kvxfer/messages"
	zmq4 "github.com/pebbe/zmq4"
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
		if got := ipv6OnlyHost(ep, nil); got != want {
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
// name's answer older than the TTL is looked up again, in the background
// (TestIPv6OnlyHostRefreshInBackground).
func TestIPv6OnlyHostAnswerKept(t *testing.T) {
	var mu sync.Mutex
	lookups := map[string]int{}
	old := lookupIP
	lookupIP = func(_ context.Context, host string) ([]net.IP, error) {
		mu.Lock()
		defer mu.Unlock()
		lookups[host]++
		if host == "v6only.test" {
			return []net.IP{net.ParseIP("::1")}, nil
		}
		return nil, errors.New("no such host")
	}
	forgetHostAnswers()
	t.Cleanup(func() { lookupIP = old; forgetHostAnswers() })
	count := func(host string) int {
		mu.Lock()
		defer mu.Unlock()
		return lookups[host]
	}
	for range 3 {
		if !ipv6OnlyHost("tcp://v6only.test:5712", nil) {
			t.Fatal("v6only.test: want IPv6 only")
		}
		if ipv6OnlyHost("tcp://missing.test:5712", nil) {
			t.Fatal("missing.test: want false")
		}
	}
	if count("v6only.test") != 1 || count("missing.test") != 1 {
		t.Fatalf("lookups %v, want one of each name", lookups)
	}
	ageHostAnswer("v6only.test", hostAnswerTTL, 0)
	var wg sync.WaitGroup
	goroutine := func(f func(context.Context)) bool {
		wg.Add(1)
		go func() { defer wg.Done(); f(context.Background()) }()
		return true
	}
	if !ipv6OnlyHost("tcp://v6only.test:5712", goroutine) {
		t.Fatal("v6only.test, kept answer: want IPv6 only")
	}
	wg.Wait()
	if count("v6only.test") != 2 {
		t.Fatalf("an answer older than %v was not looked up again: lookups %v", hostAnswerTTL, lookups)
	}
}

// ageHostAnswer makes host's kept answer look older: checked (the last
// lookup) by checked, at (the last that answered) by at.
func ageHostAnswer(host string, checked, at time.Duration) {
	v6Hosts.mu.Lock()
	defer v6Hosts.mu.Unlock()
	e := v6Hosts.m[host]
	e.checked = e.checked.Add(-checked)
	e.at = e.at.Add(-at)
}

// hostAnswerOf is host's kept answer and whether a lookup refreshes it.
func hostAnswerOf(host string) (v6only, refreshing bool) {
	v6Hosts.mu.Lock()
	defer v6Hosts.mu.Unlock()
	e := v6Hosts.m[host]
	return e.v6only, e.refreshing
}

// Once a name has an answer, a Dial does not wait for its lookup again: a
// Dial runs in a sender worker's Receive, and its mailbox waited up to
// dialLookupWait for a name's lookup every hostAnswerTTL. An answer past
// its TTL is served at once and looked up again in the background, one
// lookup at a time; the new answer is used once it comes, a failed
// lookup keeps the old answer until hostAnswerMaxAge, and Close stops a
// lookup under way and waits for it. (Checked to fail: with the lookup
// run in the Dial again, as before, the Dial after the TTL waits for the
// blocked lookup; with a failed lookup replacing the answer, the kept
// IPv6 answer is lost; without the max age, an answer that old is
// served.)
func TestIPv6OnlyHostRefreshInBackground(t *testing.T) {
	// A name this host resolves at once (libzmq does when it connects;
	// a name it must ask DNS for holds the context's end up to seconds),
	// which the test's resolver answers for ipv6OnlyHost.
	const name, ep = "localhost", "tcp://localhost:5712"
	var (
		mu     sync.Mutex
		calls  int
		answer []net.IP
		fail   error
		gate   chan struct{} // not nil: a lookup waits for it to close
		quit   bool          // a waiting lookup also ends with its context
	)
	v4, v6 := []net.IP{net.ParseIP("127.0.0.1")}, []net.IP{net.ParseIP("::1")}
	set := func(ips []net.IP, err error, g chan struct{}, q bool) {
		mu.Lock()
		defer mu.Unlock()
		answer, fail, gate, quit = ips, err, g, q
	}
	lookups := func() int {
		mu.Lock()
		defer mu.Unlock()
		return calls
	}
	old := lookupIP
	lookupIP = func(ctx context.Context, host string) ([]net.IP, error) {
		if host != name {
			return nil, errors.New("no such host")
		}
		mu.Lock()
		calls++
		ips, err, g, q := answer, fail, gate, quit
		mu.Unlock()
		if g != nil {
			if q {
				select {
				case <-g:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			} else {
				<-g // the resolver ignores the dial's deadline: only the test ends this lookup
			}
		}
		return ips, err
	}
	forgetHostAnswers()
	t.Cleanup(func() { lookupIP = old; forgetHostAnswers() })

	var (
		conns   []control.Conn // closed after the link: nothing waits for their Hellos to leave
		connsMu sync.Mutex
		dials   sync.WaitGroup
	)
	t.Cleanup(func() {
		dials.Wait()
		connsMu.Lock()
		defer connsMu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	l := listen(t, pid("ctx", 0), Config{Insecure: true}).link
	peer := pid("gen", 0)
	if err := l.AddPeer(peer, ep); err != nil {
		t.Fatal(err)
	}
	dialed := func() chan error {
		done := make(chan error, 1)
		dials.Add(1)
		go func() {
			defer dials.Done()
			c, err := l.Dial(peer)
			if err == nil {
				connsMu.Lock()
				conns = append(conns, c)
				connsMu.Unlock()
			}
			done <- err
		}()
		return done
	}
	ipv6 := func() bool {
		sock, err := l.newDealer(peer, ep, "", 4, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer closeSocket(sock)
		on, err := sock.GetIpv6()
		if err != nil {
			t.Fatal(err)
		}
		return on
	}

	// The first lookup: the Dial waits for it (and gets IPv4 only).
	set(v4, nil, nil, false)
	if err := <-dialed(); err != nil {
		t.Fatal(err)
	}
	if lookups() != 1 || ipv6() {
		t.Fatalf("first Dial: %d lookups, IPv6 %v; want 1 lookup, no IPv6", lookups(), ipv6())
	}

	// Past the TTL, the name now IPv6 only and its resolver stuck: Dials
	// take the kept answer at once while one lookup waits.
	stuck := make(chan struct{})
	release := sync.OnceFunc(func() { close(stuck) })
	t.Cleanup(release) // before the link's Close: nothing left waiting
	set(v6, nil, stuck, false)
	ageHostAnswer(name, hostAnswerTTL, hostAnswerTTL)
	done := dialed()
	waitFor(t, patience, "the lookup after the TTL to start", func() bool { return lookups() == 2 })
	for i := range 3 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(patience):
			t.Fatalf("Dial %d after the TTL waits for the stuck lookup of %s", i, name)
		}
		if ipv6() {
			t.Fatal("the kept answer (IPv4) was not used while the lookup waits")
		}
		done = dialed()
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	release()
	waitFor(t, patience, "the new answer (IPv6 only) to be used", ipv6)
	if n := lookups(); n != 2 {
		t.Fatalf("%d lookups, want 2: one at a time per name", n)
	}

	// A failed lookup keeps the answer...
	set(nil, errors.New("resolver down"), nil, false)
	ageHostAnswer(name, hostAnswerTTL, hostAnswerTTL)
	if !ipv6() {
		t.Fatal("the kept answer (IPv6 only) was not used past its TTL")
	}
	waitFor(t, patience, "the failed lookup to end", func() bool {
		_, refreshing := hostAnswerOf(name)
		return lookups() == 3 && !refreshing
	})
	if !ipv6() {
		t.Fatal("a failed lookup lost the kept answer (IPv6 only)")
	}
	// ... until it is hostAnswerMaxAge old: then the name is looked up
	// as a new one (no address: left as it was, IPv4).
	ageHostAnswer(name, hostAnswerTTL, hostAnswerMaxAge)
	if ipv6() {
		t.Fatalf("an answer %v old was served", hostAnswerMaxAge)
	}
	if n := lookups(); n != 4 {
		t.Fatalf("%d lookups, want 4", n)
	}

	// Close stops a lookup under way, and waits for it.
	set(v6, nil, make(chan struct{}), true)
	ageHostAnswer(name, hostAnswerTTL, 0)
	if err := <-dialed(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the lookup to start", func() bool { return lookups() == 5 })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if v6only, refreshing := hostAnswerOf(name); v6only || refreshing {
		t.Fatalf("after Close: answer IPv6 %v, lookup under way %v; want the kept answer (IPv4), none", v6only, refreshing)
	}
	ageHostAnswer(name, hostAnswerTTL, 0)
	if ipv6OnlyHost(ep, l.goLookup) || lookups() != 5 {
		t.Fatalf("a closed link started a lookup (%d)", lookups())
	}
}

// TestUnresolvedPeerHostNamed: a peer endpoint whose host name does not
// resolve fails its connection attempts as a refused one does (libzmq
// reports EVENT_CONNECT_RETRIED for both); the peer's state names the
// name, not a process that may well be running, while a name that
// resolves keeps the refused connection's reason.
func TestUnresolvedPeerHostNamed(t *testing.T) {
	old := lookupIP
	lookupIP = func(_ context.Context, host string) ([]net.IP, error) {
		if host == "v4.test" {
			return []net.IP{net.ParseIP("127.0.0.1")}, nil
		}
		return nil, errors.New("no such host")
	}
	forgetHostAnswers()
	t.Cleanup(func() { lookupIP = old; forgetHostAnswers() })
	for ep, want := range map[string]string{
		"tcp://misspelt.test:5712": `host name "misspelt.test" has no address`,
		"tcp://v4.test:5712":       refusedReason,
		"tcp://127.0.0.1:5712":     refusedReason,
		"ipc://missing.sock":       refusedReason,
	} {
		ipv6OnlyHost(ep, nil) // as Dial looks the name up
		w := connWatch{state: PeerState{Conn: ConnConnecting, Endpoint: ep}}
		w.step(zmq4.EVENT_CONNECT_RETRIED, 0, time.Now())
		if w.state.Cause != CauseRefused || !strings.Contains(w.state.Reason, want) {
			t.Errorf("%s: cause %v reason %q, want %v with %q", ep, w.state.Cause, w.state.Reason, CauseRefused, want)
		}
	}
}
