package discovery

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseEtcdURL(t *testing.T) {
	ok := map[string][]string{
		"etcd://127.0.0.1:2379":                   {"127.0.0.1:2379"},
		"etcd://a.example:2379,b.example:2380":    {"a.example:2379", "b.example:2380"},
		"etcd://[::1]:2379,10.0.0.2:2379":         {"[::1]:2379", "10.0.0.2:2379"},
		"etcd://etcd-0:2379,etcd-1:2379,etcd-2:1": {"etcd-0:2379", "etcd-1:2379", "etcd-2:1"},
		"etcds://a.example:2379,b.example:2380":   {"a.example:2379", "b.example:2380"},
	}
	for in, want := range ok {
		got, err := ParseEtcdURL(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: %v, %v; want %v", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":                       "want etcd://host:port",
		"127.0.0.1:2379":         "want etcd://host:port",
		"http://127.0.0.1:2379":  `scheme "http"`,
		"etcdss://h:1":           `scheme "etcdss"`,
		"etcds://":               "no endpoint after etcds://",
		"etcds://h:1/x":          `'/' at 11`,
		"etcd://":                "no endpoint",
		"etcd://h":               `endpoint 1 "h": want host:port`,
		"etcd://h:":              `port ""`,
		"etcd://:2379":           "has no host",
		"etcd://h:0":             `port "0"`,
		"etcd://h:65536":         `port "65536"`,
		"etcd://h:02379":         `port "02379"`,
		"etcd://h:1,":            "endpoint 2 is empty",
		"etcd://h:1,,g:2":        "endpoint 2 is empty",
		"etcd://h:1,h:1":         "listed twice",
		"etcd://h:1/path":        `'/' at 10`,
		"etcd://user@h:1":        `'@'`,
		"etcd://h:1?x=1":         `'?'`,
		"etcd://::1:2379":        `want host:port`,
		"etcd://[fe80::zz]:2379": "not an IPv6 address",
		"etcd://h:1, g:2":        `' '`,
	}
	for in, want := range bad {
		_, err := ParseEtcdURL(in)
		if !errors.Is(err, ErrInvalidURL) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), in) {
			t.Errorf("%q: %v, want %v naming the input and %q", in, err, ErrInvalidURL, want)
		}
	}
}

func TestOpenSpec(t *testing.T) {
	for _, spec := range []string{"", "static"} {
		r, err := Open(ctxFor(t, 5*time.Second), spec, "c", nil)
		if err != nil {
			t.Fatalf("%q: %v", spec, err)
		}
		if _, ok := r.(*Static); !ok {
			t.Errorf("%q opened %T, want *Static", spec, r)
		}
		_ = r.Close()
	}
	if _, err := Open(ctxFor(t, 5*time.Second), "consul://x:1", "c", nil); !errors.Is(err, ErrInvalidURL) {
		t.Errorf("unknown scheme: %v", err)
	}
	if _, err := Open(ctxFor(t, 5*time.Second), "etcd://x", "c", nil); !errors.Is(err, ErrInvalidURL) {
		t.Errorf("bad etcd URL: %v", err)
	}
	if _, err := Open(ctxFor(t, 5*time.Second), "etcd://x:1", "bad/cluster", nil); !errors.Is(err, ErrInvalidRecord) {
		t.Errorf("bad cluster: %v", err)
	}
	// Nothing listens on port 1: Open fails within its dial timeout and
	// names the endpoint, and what to do.
	if _, err := Open(ctxFor(t, 5*time.Second), "etcd://127.0.0.1:1", "c", nil, WithDialTimeout(300*time.Millisecond)); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") ||
		!strings.Contains(err.Error(), "is etcd running there? --discovery (discovery) must name etcd's client URL") {
		t.Errorf("unreachable etcd: %v, want an error naming it and what to do", err)
	}
}
