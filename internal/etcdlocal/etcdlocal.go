// Package etcdlocal runs an etcd server inside this process
// (go.etcd.io/etcd/server/v3/embed) on free 127.0.0.1 ports, for the
// cluster demo and the tests of package node and test/twoproc: a
// discovery.Etcd registry in any process of this host reaches it at
// Server.URL.
//
// It uses quick elections (10 ms ticks, 100 ms election timeout) so that
// leases as short as 1 s work, and no fsync: its data directory is
// temporary and removed by Close.
package etcdlocal

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is a running embedded etcd.
type Server struct {
	srv      *embed.Etcd
	dir      string
	endpoint string
}

// Start starts an embedded etcd and waits until it serves (up to 30 s).
// A free port taken by another process before etcd binds it is retried.
func Start() (*Server, error) {
	var err error
	for range 5 {
		var s *Server
		if s, err = start(); err == nil {
			return s, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("etcdlocal: %w", err)
}

func start() (*Server, error) {
	dir, err := os.MkdirTemp("", "kvxfer-etcd-")
	if err != nil {
		return nil, err
	}
	urls, err := freeURLs(2)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	peer, client := urls[0], urls[1]
	cfg := embed.NewConfig()
	cfg.Name = "kvxfer-local"
	cfg.Dir = dir
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	select {
	case <-srv.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		srv.Close()
		os.RemoveAll(dir)
		return nil, errors.New("embedded etcd not ready after 30 s")
	}
	return &Server{srv: srv, dir: dir, endpoint: client.Host}, nil
}

// freeURLs picks n distinct free ports on 127.0.0.1.
func freeURLs(n int) ([]url.URL, error) {
	var out []url.URL
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		out = append(out, url.URL{Scheme: "http", Host: l.Addr().String()})
	}
	return out, nil
}

// Endpoint is the client endpoint, HOST:PORT.
func (s *Server) Endpoint() string { return s.endpoint }

// URL is the --discovery value that reaches the server: etcd://HOST:PORT.
func (s *Server) URL() string { return "etcd://" + s.endpoint }

// Close stops the server and removes its data directory.
func (s *Server) Close() {
	s.srv.Close()
	os.RemoveAll(s.dir)
}

// Shared is one server started on first use and handed to every caller:
// the tests of a package share it, each under its own cluster name. The
// zero value is ready; Close stops the server if it started.
type Shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Get starts the server on the first call and returns it (or the error
// that start gave, every time).
func (s *Shared) Get() (*Server, error) {
	s.once.Do(func() { s.srv, s.err = Start() })
	return s.srv, s.err
}

// Close stops the server if Get started it.
func (s *Shared) Close() {
	if s.srv != nil {
		s.srv.Close()
	}
}
