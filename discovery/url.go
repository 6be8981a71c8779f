package discovery

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// EtcdScheme is the scheme of an etcd discovery URL; EtcdTLSScheme of
// one whose connections to etcd use TLS.
const (
	EtcdScheme    = "etcd://"
	EtcdTLSScheme = "etcds://"
)

// IsEtcd reports whether spec names an etcd registry (etcd:// or
// etcds://; ParseEtcdURL checks the rest).
func IsEtcd(spec string) bool {
	return strings.HasPrefix(spec, EtcdScheme) || strings.HasPrefix(spec, EtcdTLSScheme)
}

// EtcdTLS reports whether spec names an etcd registry reached over TLS.
func EtcdTLS(spec string) bool { return strings.HasPrefix(spec, EtcdTLSScheme) }

// ParseEtcdURL parses etcd://host:port[,host:port...] (or etcds://, over
// TLS) into the endpoints an etcd client dials ("host:port" each). Hosts are names, IPv4 addresses
// or bracketed IPv6 addresses; every endpoint needs its port; no user,
// path, query or fragment. Errors wrap ErrInvalidURL and name the part
// that is wrong.
func ParseEtcdURL(s string) ([]string, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: "+format, append([]any{ErrInvalidURL, s}, args...)...)
	}
	scheme := EtcdScheme
	if EtcdTLS(s) {
		scheme = EtcdTLSScheme
	}
	rest, ok := strings.CutPrefix(s, scheme)
	if !ok {
		if i := strings.Index(s, "://"); i >= 0 {
			return nil, bad("scheme %q, want etcd:// (or etcds:// for TLS to etcd)", s[:i])
		}
		return nil, bad("want etcd://host:port[,host:port] (or etcds://)")
	}
	if rest == "" {
		return nil, bad("no endpoint after %s", scheme)
	}
	if i := strings.IndexAny(rest, "/?#@ "); i >= 0 {
		return nil, bad("%q at %d: want only host:port endpoints separated by commas", rest[i], len(scheme)+i)
	}
	var eps []string
	seen := map[string]bool{}
	for i, ep := range strings.Split(rest, ",") {
		if ep == "" {
			return nil, bad("endpoint %d is empty", i+1)
		}
		host, port, err := net.SplitHostPort(ep)
		if err != nil {
			return nil, bad("endpoint %d %q: want host:port ([v6addr]:port for IPv6)", i+1, ep)
		}
		if host == "" {
			return nil, bad("endpoint %d %q has no host", i+1, ep)
		}
		if strings.Contains(host, ":") && net.ParseIP(host) == nil {
			return nil, bad("endpoint %d %q: host %q is not an IPv6 address", i+1, ep, host)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
			return nil, bad("endpoint %d %q: port %q, want 1..65535", i+1, ep, port)
		}
		if seen[ep] {
			return nil, bad("endpoint %q is listed twice", ep)
		}
		seen[ep] = true
		eps = append(eps, ep)
	}
	return eps, nil
}
