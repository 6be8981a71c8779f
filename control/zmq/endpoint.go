package zmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// transports are the ZeroMQ transports an endpoint may name.
var transports = []string{"tcp", "ipc", "inproc", "pgm", "epgm", "tipc", "vmci", "udp", "ws", "wss"}

// CheckEndpoint reports whether endpoint is a ZeroMQ endpoint to bind
// (TRANSPORT://ADDRESS). An endpoint without a transport ("127.0.0.1:5000",
// "/run/ctx.sock") is refused with the endpoint it probably meant; the
// error wraps ErrConfig.
func CheckEndpoint(endpoint string) error { return checkEndpoint(endpoint, false) }

// checkEndpoint is CheckEndpoint (dial false) and CheckPeerEndpoint.
func checkEndpoint(endpoint string, dial bool) error {
	if endpoint == "" {
		return fmt.Errorf("%w: empty endpoint", ErrConfig)
	}
	scheme, addr, ok := strings.Cut(endpoint, "://")
	if !ok {
		if form, meant := mistypedSeparator(endpoint); form != "" {
			return fmt.Errorf("%w: endpoint %q: the transport is followed by \"://\" (%s): did you mean %s?", ErrConfig, endpoint, form, meant)
		}
		return fmt.Errorf("%w: endpoint %q has no transport: did you mean %s?", ErrConfig, endpoint, suggestEndpoint(endpoint))
	}
	known := false
	for _, t := range transports {
		if scheme == t {
			known = true
			break
		}
	}
	switch {
	case !known:
		return fmt.Errorf("%w: endpoint %q: unknown transport %q (want tcp://HOST:PORT or ipc://PATH)", ErrConfig, endpoint, scheme)
	case addr == "":
		return fmt.Errorf("%w: endpoint %q has no address", ErrConfig, endpoint)
	case scheme == "tcp":
		return checkTCP(endpoint, addr, dial)
	case scheme == "ipc" && len(addr) > MaxIPCPath:
		return fmt.Errorf("%w: endpoint %q: the path is %d bytes, a unix socket's holds at most %d: use a shorter path (a directory nearer the root)", ErrConfig, endpoint, len(addr), MaxIPCPath)
	}
	return nil
}

// MaxIPCPath is the longest path of an ipc:// endpoint: a unix socket
// address holds 108 bytes, its terminating NUL included (Linux).
const MaxIPCPath = 107

// CheckPeerEndpoint is CheckEndpoint for an endpoint to connect to (a
// peer's): a tcp:// one must name a host and a port in 1..65535, not the
// wildcards a bind takes (`*`, port 0).
func CheckPeerEndpoint(endpoint string) error { return checkEndpoint(endpoint, true) }

// checkTCP checks the address of a tcp:// endpoint: HOST:PORT, where HOST
// is a name, an IPv4 address, an IPv6 address in brackets, an interface
// name or (to bind) `*`, and PORT is 1..65535 or (to bind) `*` or 0 (a port
// the system picks); a connect may name its source first,
// "SOURCE;HOST:PORT", the source with a bind's rules. dial refuses the
// wildcards.
func checkTCP(endpoint, addr string, dial bool) error {
	if src, dst, ok := strings.Cut(addr, ";"); ok {
		if err := checkHostPort(endpoint, src, false); err != nil {
			return err
		}
		addr = dst
	}
	return checkHostPort(endpoint, addr, dial)
}

func checkHostPort(endpoint, addr string, dial bool) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: endpoint %q: %s (want tcp://HOST:PORT)", ErrConfig, endpoint, fmt.Sprintf(format, args...))
	}
	i := strings.LastIndex(addr, ":")
	if i < 0 || strings.HasSuffix(addr, "]") {
		return bad("no port")
	}
	host, port := addr[:i], addr[i+1:]
	switch {
	case host == "":
		return bad("no host")
	case strings.HasPrefix(host, "[") != strings.HasSuffix(host, "]"):
		return bad("host %q: an IPv6 address goes in brackets, [ADDRESS]", host)
	case host == "[]":
		return bad("empty IPv6 address []")
	case strings.ContainsAny(host, " /?#;"):
		return bad("host %q is no host name, address or interface", host)
	case dial && host == "*":
		return bad("host `*` is a wildcard to bind, not a peer to connect to")
	case port == "":
		return bad("no port")
	case port == "*":
		if dial {
			return bad("port `*` is a wildcard to bind, not a peer's port")
		}
		return checkBindHost(endpoint, host)
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return bad("port %q is not a number", port)
		}
	}
	n, err := strconv.Atoi(port)
	switch {
	case err != nil || n > 65535:
		return bad("port %s is out of range (1..65535)", port)
	case n == 0 && dial:
		return bad("port 0 is no peer's port (1..65535)")
	}
	if !dial {
		return checkBindHost(endpoint, host)
	}
	return nil
}

// checkBindHost refuses a host name where a bind takes an address: libzmq
// binds `*`, an IP address or an interface name, and takes any other name
// for an interface ("localhost": bind fails with "no such device"). A host
// that is neither an address nor an interface here but resolves is named
// with its addresses; anything else is left to libzmq.
func checkBindHost(endpoint, host string) error {
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	addr, _, zoned := strings.Cut(h, "%") // fe80::1%eth0: an address and its interface
	if h == "*" || net.ParseIP(addr) != nil || zoned {
		return nil
	}
	if _, err := net.InterfaceByName(h); err == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, h)
	if err != nil || len(addrs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: endpoint %q: a bind takes an IP address, an interface name or `*`, and %q is a host name (no interface here): bind its address, e.g. tcp://%s",
		ErrConfig, endpoint, h, net.JoinHostPort(addrs[0], endpoint[strings.LastIndex(endpoint, ":")+1:]))
}

// ipv6Endpoint reports whether a tcp:// endpoint names an IPv6 address
// literal, [ADDRESS] (either side of a connect's SOURCE;HOST:PORT): libzmq
// binds and connects to one only on a socket with ZMQ_IPV6 set, and
// refuses it otherwise ("no such device"). The option is set for such an
// endpoint, and for a peer's host name with IPv6 addresses only
// (ipv6OnlyHost), alone, so that `*`, IPv4 addresses, interface names and
// other host names resolve as they always did (IPv4 only: with the
// option, a name such as localhost may resolve to ::1 where the peer
// bound 127.0.0.1).
func ipv6Endpoint(endpoint string) bool {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return false
	}
	for _, part := range strings.Split(addr, ";") {
		if i := strings.LastIndex(part, ":"); i > 0 && strings.ContainsAny(part[:i], "[:") {
			return true // [::1]:5000, or a bare ::1:5000 libzmq reads alike
		}
	}
	return false
}

// ipv6OnlyHost reports whether a tcp:// endpoint to connect to names a
// host (not an address) that resolves to IPv6 addresses only, such as a
// name mapped to ::1 alone: libzmq resolves a name on a socket without
// ZMQ_IPV6 as IPv4 only, finds no address, and retries for ever as if
// nothing listened there (PeerState: nothing accepts connections). With
// the option it asks for IPv6 addresses, and IPv4 ones mapped into IPv6
// should the name gain some later. A name with an IPv4 address,
// one that does not resolve (within dialLookupWait) and an endpoint with a
// SOURCE; part are left as they were: libzmq resolves them as before.
//
// The answer is kept for a name (v6Hosts) and only a name's first lookup
// waits (up to dialLookupWait): a Dial runs in a sender worker's Receive,
// and the heartbeat goroutine makes its sockets one after another. An
// answer older than hostAnswerTTL is still returned at once, and goroutine
// (nil: none) looks the name up again in the background, one lookup at a
// time per name; its answer is used from then on. A lookup that fails
// keeps the old answer, until it is hostAnswerMaxAge old (since the last
// lookup that answered): an answer that old is not served, and the name
// is looked up as a new one (the Dial waits).
func ipv6OnlyHost(endpoint string, goroutine func(func(context.Context)) bool) bool {
	host := connectHost(endpoint)
	if host == "" || strings.ContainsAny(host, "[]:%") || net.ParseIP(host) != nil {
		return false // an address (IPv6 ones are ipv6Endpoint's)
	}
	now := time.Now()
	v6Hosts.mu.Lock()
	e := v6Hosts.m[host]
	switch {
	case e == nil || now.Sub(e.at) >= hostAnswerMaxAge:
		// The first lookup (or one after an answer too old to serve).
	case now.Sub(e.checked) < hostAnswerTTL || e.refreshing || goroutine == nil:
		v6only := e.v6only
		v6Hosts.mu.Unlock()
		return v6only
	default:
		e.refreshing = true
		v6only := e.v6only
		v6Hosts.mu.Unlock()
		if !goroutine(func(ctx context.Context) { e.refresh(ctx, host) }) {
			v6Hosts.mu.Lock()
			e.refreshing = false // the link is closed: no refresh
			v6Hosts.mu.Unlock()
		}
		return v6only
	}
	v6Hosts.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), dialLookupWait)
	defer cancel()
	v6only, resolved := resolvesToIPv6Only(ctx, host) // not resolved: left as it was (false)
	now = time.Now()
	v6Hosts.mu.Lock()
	if v6Hosts.m == nil || len(v6Hosts.m) >= maxHostAnswers {
		v6Hosts.m = map[string]*hostAnswer{} // a bound: names are peers', few
	}
	v6Hosts.m[host] = &hostAnswer{v6only: v6only, resolved: resolved, at: now, checked: now}
	v6Hosts.mu.Unlock()
	return v6only
}

// refresh looks host up again for its kept answer e (e.refreshing set by
// the caller, cleared here). An answer replaces e's; a failed lookup
// (ctx done, the link closed, or no address) keeps it, and the next
// lookup is due hostAnswerTTL later.
func (e *hostAnswer) refresh(ctx context.Context, host string) {
	ctx, cancel := context.WithTimeout(ctx, dialLookupWait)
	defer cancel()
	v6only, ok := resolvesToIPv6Only(ctx, host)
	now := time.Now()
	v6Hosts.mu.Lock()
	defer v6Hosts.mu.Unlock()
	e.refreshing = false
	e.checked = now
	if ok {
		e.v6only, e.resolved, e.at = v6only, true, now
	}
}

// unresolvedHost is the host name of a tcp:// endpoint to connect to
// whose lookup (ipv6OnlyHost's, as the endpoint was dialled) found no
// address, or "": libzmq retries such a name as it retries a refused
// connection, and the peer's state then names the name, not a process
// that may be running.
func unresolvedHost(endpoint string) string {
	host := connectHost(endpoint)
	if host == "" {
		return ""
	}
	v6Hosts.mu.Lock()
	defer v6Hosts.mu.Unlock()
	if e := v6Hosts.m[host]; e != nil && !e.resolved {
		return host
	}
	return ""
}

// connectHost is the HOST of a tcp://HOST:PORT endpoint to connect to,
// or "" for another transport or an endpoint with a SOURCE; part.
func connectHost(endpoint string) string {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok || strings.Contains(addr, ";") {
		return ""
	}
	if i := strings.LastIndex(addr, ":"); i > 0 {
		return addr[:i]
	}
	return ""
}

// resolvesToIPv6Only looks host up (within ctx) and says whether it has
// addresses, all of them IPv6; ok is false when the lookup found none.
func resolvesToIPv6Only(ctx context.Context, host string) (v6only, ok bool) {
	ips, err := lookupIP(ctx, host)
	if err != nil || len(ips) == 0 {
		return false, false
	}
	for _, ip := range ips {
		if ip.To4() != nil {
			return false, true
		}
	}
	return true, true
}

// v6Hosts remembers ipv6OnlyHost's answer for a host name, so that a dial
// does not wait on a slow resolver (up to dialLookupWait) once the name
// has an answer. A refresh updates the entry it started from: one the map
// no longer holds (reset at maxHostAnswers, or the name looked up anew)
// is updated unseen. Background lookups are so at most one per name the
// map holds (maxHostAnswers), each within dialLookupWait.
var v6Hosts struct {
	mu sync.Mutex
	m  map[string]*hostAnswer
}

// hostAnswer is one name's answer; its fields are guarded by v6Hosts.mu.
type hostAnswer struct {
	v6only bool
	// resolved: a lookup of the name found an address (the first one,
	// or a refresh since; a failed refresh keeps what was found).
	resolved bool
	// at is when the name was last looked up with an answer (or first
	// looked up, answered or not); checked is when it was last looked up
	// at all (a refresh that failed included).
	at, checked time.Time
	refreshing  bool // a background lookup is under way
}

const (
	// hostAnswerTTL is how long an answer is used before the name is
	// looked up again (in the background).
	hostAnswerTTL = 30 * time.Second
	// hostAnswerMaxAge is how long, at most, an answer is served while
	// the lookups that should refresh it fail: a name whose resolver has
	// been failing that long is looked up as a new one.
	hostAnswerMaxAge = 10 * time.Minute
	maxHostAnswers   = 1024
)

// lookupIP resolves a peer's host name for ipv6OnlyHost (a variable, so
// that a test can resolve a name of its own).
var lookupIP = func(ctx context.Context, host string) ([]net.IP, error) {
	return net.DefaultResolver.LookupIP(ctx, "ip", host)
}

// dialLookupWait bounds each of ipv6OnlyHost's lookups of a peer's host
// name (a dial waits for a name's first).
const dialLookupWait = time.Second

// mistypedSeparator is, for an endpoint that names a transport with its
// "://" mistyped ("tcp//h:1", "tcp:h:1", "ipc:/run/x.sock"), that
// transport's form (ipc://PATH) and the endpoint it probably meant; ""
// for any other. An ipc path after a single slash is read as absolute,
// unless that puts the socket in the filesystem root ("ipc:/ctx.sock"),
// which is rarely meant: both readings are then offered, the working
// directory's first.
func mistypedSeparator(endpoint string) (form, meant string) {
	for _, t := range transports {
		rest, ok := strings.CutPrefix(endpoint, t)
		if !ok {
			continue
		}
		addr := strings.TrimLeft(rest, ":/")
		sep := rest[:len(rest)-len(addr)]
		if sep == "" || addr == "" {
			continue // "tcphost:1": a host name, not a transport
		}
		form = t + "://ADDRESS"
		switch t {
		case "tcp":
			form = "tcp://HOST:PORT"
		case "ipc":
			form = "ipc://PATH"
			if strings.Contains(sep, "/") {
				if !strings.Contains(addr, "/") {
					return form, fmt.Sprintf("ipc://%s (%s in the working directory) or ipc:///%s (%s in the filesystem root)", addr, addr, addr, "/"+addr)
				}
				addr = "/" + addr // "ipc:/run/x.sock": an absolute path
			}
		}
		return form, t + "://" + addr
	}
	return "", ""
}

// suggestEndpoint is what an endpoint without a transport (and without a
// mistyped one: mistypedSeparator) probably meant: a path is an ipc
// endpoint, anything else a tcp one.
func suggestEndpoint(endpoint string) string {
	if strings.HasPrefix(endpoint, "/") || strings.HasPrefix(endpoint, ".") || strings.HasSuffix(endpoint, ".sock") {
		return "ipc://" + endpoint
	}
	return "tcp://" + endpoint
}

// CheckBindFree reports, before anything is set up for it, whether
// Listen could bind endpoint now, so that a caller can name the mistake
// before it allocates what the bind would wait behind (a pool of many
// GiB takes seconds to map): an ipc:// path a live process accepts on is
// refused as Listen refuses it (ErrEndpointInUse, after the same wait),
// a tcp:// port another socket holds is refused (ErrEndpointInUse), and
// so is a tcp:// address that is not this host's or a port this process
// may not bind (ErrConfig). Other transports, wildcard or system-picked
// ports and interface names pass: Listen remains the authority.
func CheckBindFree(endpoint string) error {
	scheme, addr, ok := strings.Cut(endpoint, "://")
	switch {
	case !ok:
		return nil
	case scheme == "ipc":
		return checkIPCFree(endpoint)
	case scheme != "tcp" || strings.Contains(addr, ";"):
		return nil
	}
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return nil
	}
	host, port := strings.TrimSuffix(strings.TrimPrefix(addr[:i], "["), "]"), addr[i+1:]
	if port == "*" || port == "0" {
		return nil
	}
	if host == "*" {
		host = ""
	} else if net.ParseIP(host) == nil {
		return nil // an interface name: libzmq's to resolve
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	switch {
	case err == nil:
		_ = ln.Close()
		return nil
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%w: %s: port %s is in use by another socket (stop the process that holds it, or bind another port)", ErrEndpointInUse, endpoint, port)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return fmt.Errorf("%w: endpoint %q: %s is not an address of this host", ErrConfig, endpoint, host)
	case errors.Is(err, syscall.EACCES):
		return fmt.Errorf("%w: endpoint %q: this process may not bind port %s (below 1024 needs privilege)", ErrConfig, endpoint, port)
	}
	return nil
}

// checkIPCFree refuses to bind an ipc:// path that a live process listens
// on: libzmq unlinks whatever file is at the path and binds it anew, which
// would silently take the path over from a running engine. A socket file
// nobody accepts on (a process that died without unlinking it) is stale
// and left for libzmq to replace; a file that is not a socket is refused
// (libzmq would delete it). Other transports pass. A path in use is probed
// again for up to ipcInUseWait: a process killed a moment ago still holds
// its listening socket while the kernel tears down its memory (a large
// pool takes a while), and a restart right after the kill must not be
// refused for it.
func checkIPCFree(endpoint string) error {
	deadline := time.Now().Add(ipcInUseWait)
	for {
		err := probeIPC(endpoint)
		if !errors.Is(err, ErrEndpointInUse) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(ipcInUseProbe)
	}
}

// ipcInUseWait bounds how long checkIPCFree probes a path in use before it
// refuses it; ipcInUseProbe is the time between probes.
const (
	ipcInUseWait  = 2 * time.Second
	ipcInUseProbe = 50 * time.Millisecond
)

// probeIPC is one probe of checkIPCFree.
func probeIPC(endpoint string) error {
	path, ok := strings.CutPrefix(endpoint, "ipc://")
	if !ok || path == "" || strings.HasPrefix(path, "@") || path == "*" {
		return nil // not ipc, an abstract socket, or a path libzmq picks
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("%w: %s: %v", ErrConfig, endpoint, err)
	case fi.Mode()&os.ModeSocket == 0:
		return fmt.Errorf("%w: %s: %s exists and is not a socket (binding would delete it)", ErrConfig, endpoint, path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil || errors.Is(err, syscall.EAGAIN) { // EAGAIN: a live listener's backlog is full
		if c != nil {
			_ = c.Close()
		}
		return fmt.Errorf("%w: %s is in use by a live process (stop it, or bind another path)", ErrEndpointInUse, endpoint)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil // stale: its process is gone; libzmq replaces the file
	}
	return fmt.Errorf("%w: %s: probing the socket file: %v", ErrConfig, endpoint, err)
}
