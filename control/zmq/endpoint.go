package zmq

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// transports are the ZeroMQ transports an endpoint may name.
var transports = []string{"tcp", "ipc", "inproc", "pgm", "epgm", "tipc", "vmci", "udp", "ws", "wss"}

// CheckEndpoint reports whether endpoint is a ZeroMQ endpoint
// (TRANSPORT://ADDRESS). An endpoint without a transport ("127.0.0.1:5000",
// "/run/ctx.sock") is refused with the endpoint it probably meant; the
// error wraps ErrConfig.
func CheckEndpoint(endpoint string) error {
	if endpoint == "" {
		return fmt.Errorf("%w: empty endpoint", ErrConfig)
	}
	scheme, addr, ok := strings.Cut(endpoint, "://")
	if !ok {
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
	}
	return nil
}

// suggestEndpoint is what an endpoint without a transport probably meant:
// a transport with a mistyped separator ("tcp//h:1", "tcp:h:1",
// "ipc:/run/x.sock") that transport with "://"; else a path is an ipc
// endpoint, anything else a tcp one.
func suggestEndpoint(endpoint string) string {
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
		if t == "ipc" && strings.Contains(sep, "/") {
			addr = "/" + addr // "ipc:/run/x.sock": an absolute path
		}
		return t + "://" + addr
	}
	if strings.HasPrefix(endpoint, "/") || strings.HasPrefix(endpoint, ".") || strings.HasSuffix(endpoint, ".sock") {
		return "ipc://" + endpoint
	}
	return "tcp://" + endpoint
}

// checkIPCFree refuses to bind an ipc:// path that a live process listens
// on: libzmq unlinks whatever file is at the path and binds it anew, which
// would silently take the path over from a running engine. A socket file
// nobody accepts on (a process that died without unlinking it) is stale
// and left for libzmq to replace; a file that is not a socket is refused
// (libzmq would delete it). Other transports pass.
func checkIPCFree(endpoint string) error {
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
