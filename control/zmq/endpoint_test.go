package zmq

import (
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckTCPEndpoint: a tcp:// endpoint needs HOST:PORT with a port in
// 1..65535 (or, to bind, `*` or 0); every form libzmq takes passes, and a
// bad one is named with what is wrong. A peer's endpoint (to connect to)
// takes no wildcard. (Checked to fail: before checkTCP,
// tcp://127.0.0.1:99999 passed and libzmq bound port 34463, and
// tcp://nohost:abc and tcp://127.0.0.1 passed.)
func TestCheckTCPEndpoint(t *testing.T) {
	for _, c := range []struct {
		endpoint    string
		bind, dial  string // "" passes; else part of the error
		description string
	}{
		{"tcp://127.0.0.1:5600", "", "", "IPv4"},
		{"tcp://10.0.0.1:65535", "", "", "highest port"},
		{"tcp://127.0.0.1:1", "", "", "lowest port"},
		{"tcp://localhost:5600", "a bind takes an IP address", "", "host name: libzmq binds none (it takes one for an interface)"},
		{"tcp://[fe80::1%lo]:5600", "", "", "IPv6 link-local address with its zone"},
		{"tcp://[::1]:5600", "", "", "IPv6 in brackets"},
		{"tcp://::1:5600", "", "", "IPv6 without brackets (libzmq takes the last colon)"},
		{"tcp://eth0:5555", "", "", "interface name"},
		{"tcp://127.0.0.1:0", "", "port 0 is no peer's port", "port the system picks"},
		{"tcp://*:5600", "", "host `*` is a wildcard to bind", "every interface"},
		{"tcp://*:*", "", "wildcard", "every interface, any port"},
		{"tcp://127.0.0.1:0;10.0.0.2:5600", "", "", "source address, then the peer"},
		{"tcp://eth0:*;10.0.0.2:5600", "", "", "source interface"},
		{"tcp://127.0.0.1:99999", "port 99999 is out of range (1..65535)", "port 99999 is out of range", "port past 65535"},
		{"tcp://127.0.0.1:65536", "port 65536 is out of range", "port 65536 is out of range", "port 65536"},
		{"tcp://nohost:abc", `port "abc" is not a number`, `port "abc" is not a number`, "port not a number"},
		{"tcp://h:-1", `port "-1" is not a number`, `port "-1" is not a number`, "negative port"},
		{"tcp://h:+80", `port "+80" is not a number`, `port "+80" is not a number`, "signed port"},
		{"tcp://127.0.0.1", "no port", "no port", "no port"},
		{"tcp://127.0.0.1:", "no port", "no port", "empty port"},
		{"tcp://[::1]", "no port", "no port", "IPv6 without port"},
		{"tcp://:5600", "no host", "no host", "no host"},
		{"tcp://[::1:5600", "an IPv6 address goes in brackets", "an IPv6 address goes in brackets", "unclosed bracket"},
		{"tcp://[]:5600", "empty IPv6 address", "empty IPv6 address", "empty brackets"},
		{"tcp://a b:5600", `host "a b"`, `host "a b"`, "space in host"},
		{"tcp://h:1;h:0", "", "port 0 is no peer's port", "source, then a wildcard peer"},
		{"tcp://h:x;h:1", `port "x" is not a number`, `port "x" is not a number`, "bad source"},
		{"ipc:///run/ctx.sock", "", "", "ipc"},
		{"ipc:///" + strings.Repeat("a", MaxIPCPath-1), "", "", "longest ipc path"},
		{"ipc:///" + strings.Repeat("a", MaxIPCPath), "a unix socket's holds at most 107", "a unix socket's holds at most 107", "ipc path too long"},
		{"inproc://ctx", "", "", "inproc"},
	} {
		for _, check := range []struct {
			name string
			fn   func(string) error
			want string
		}{{"CheckEndpoint", CheckEndpoint, c.bind}, {"CheckPeerEndpoint", CheckPeerEndpoint, c.dial}} {
			err := check.fn(c.endpoint)
			switch {
			case check.want == "" && err != nil:
				t.Errorf("%s(%s) (%s): %v, want nil", check.name, c.endpoint, c.description, err)
			case check.want != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), check.want) ||
				!strings.Contains(err.Error(), c.endpoint)):
				t.Errorf("%s(%s) (%s): %v, want ErrConfig naming the endpoint and %q", check.name, c.endpoint, c.description, err, check.want)
			}
		}
	}
}

// TestIPCEndpointWithOneSlash: an ipc endpoint written with one slash
// (ipc:/ctx.sock, a typo for ipc://) is refused naming the value and the
// form ipc://PATH; where the absolute reading would put the socket in the
// filesystem root, the working directory's reading is offered first and
// the root is named as such. (Checked to fail before: the error said the
// endpoint had no transport and suggested ipc:///ctx.sock alone, a
// socket in the root.)
func TestIPCEndpointWithOneSlash(t *testing.T) {
	for _, c := range []struct{ endpoint, want string }{
		{"ipc:/ctx.sock", `endpoint "ipc:/ctx.sock": the transport is followed by "://" (ipc://PATH): did you mean ipc://ctx.sock (ctx.sock in the working directory) or ipc:///ctx.sock (/ctx.sock in the filesystem root)?`},
		{"ipc:/run/ctx.sock", `endpoint "ipc:/run/ctx.sock": the transport is followed by "://" (ipc://PATH): did you mean ipc:///run/ctx.sock?`},
		{"tcp:/h:1", `endpoint "tcp:/h:1": the transport is followed by "://" (tcp://HOST:PORT): did you mean tcp://h:1?`},
	} {
		for _, check := range []func(string) error{CheckEndpoint, CheckPeerEndpoint} {
			if err := check(c.endpoint); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v, want ErrConfig with %s", c.endpoint, err, c.want)
			}
		}
	}
}

// TestIPCInUseReleasedMeanwhile: a path whose listener goes away while
// checkIPCFree probes it (as a process killed a moment ago releases its
// socket once the kernel tore down its memory) is free, not in use; one
// that stays in use is refused. (Checked to fail with a single probe: the
// first finds the listener and refuses.)
func TestIPCInUseReleasedMeanwhile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ctx.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go func() { // the first probe's connection is the last it takes
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
		ln.Close()
	}()
	if err := checkIPCFree("ipc://" + path); err != nil {
		t.Fatalf("checkIPCFree of a path whose listener went away while probed: %v, want nil", err)
	}

	live := filepath.Join(t.TempDir(), "live.sock")
	ln2, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	if err := checkIPCFree("ipc://" + live); !errors.Is(err, ErrEndpointInUse) {
		t.Fatalf("checkIPCFree of a live path: %v, want ErrEndpointInUse", err)
	}
}

// ipv6Endpoint picks out the tcp:// endpoints that name an IPv6 literal
// (libzmq needs ZMQ_IPV6 for them), and no other: `*`, IPv4, interface
// and host names keep resolving as IPv4.
func TestIPv6EndpointDetected(t *testing.T) {
	for ep, want := range map[string]bool{
		"tcp://[::1]:5712":                true,
		"tcp://[fe80::1%eth0]:5712":       true,
		"tcp://::1:5712":                  true,
		"tcp://127.0.0.1:0;[::1]:5712":    true,
		"tcp://[::1]:0;10.0.0.2:5712":     true,
		"tcp://127.0.0.1:5712":            false,
		"tcp://*:5712":                    false,
		"tcp://localhost:5712":            false,
		"tcp://eth0:*;10.0.0.2:5712":      false,
		"ipc:///run/[x]:1.sock":           false,
		"inproc://a:b":                    false,
		"tcp://127.0.0.1:0;10.0.0.2:5712": false,
	} {
		if got := ipv6Endpoint(ep); got != want {
			t.Errorf("ipv6Endpoint(%s) = %v, want %v", ep, got, want)
		}
	}
}
