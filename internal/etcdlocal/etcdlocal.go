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
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"

	"github.com/kvxfer/kvxfer/internal/scratch"
)

// Server is a running embedded etcd.
type Server struct {
	srv      *embed.Etcd
	dir      string
	endpoint string
}

// Options are what a server asks of its clients beyond the defaults.
type Options struct {
	// TLS: clients connect over TLS to the PKI's server certificate and
	// must show a certificate the PKI's CA signed (--client-cert-auth).
	TLS *PKI
	// User and Password: etcd's auth is on, and User (read and write on
	// /kvxfer/) logs in with Password. The server's root user has the
	// same password.
	User, Password string
}

// Start starts an embedded etcd and waits until it serves (up to 30 s).
// A free port taken by another process before etcd binds it is retried.
func Start() (*Server, error) { return StartWith(Options{}) }

// StartWith starts an embedded etcd as o asks.
func StartWith(o Options) (*Server, error) {
	var err error
	for range 5 {
		var s *Server
		if s, err = start(o); err == nil {
			return s, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("etcdlocal: %w", err)
}

func start(o Options) (*Server, error) {
	// Its data, and those left by processes killed before they removed
	// theirs (internal/scratch).
	dir, _, err := scratch.Dir("kvxfer-etcd-")
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
	if o.TLS != nil {
		client.Scheme = "https"
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: o.TLS.ServerCert, KeyFile: o.TLS.ServerKey,
			TrustedCAFile: o.TLS.CA, ClientCertAuth: true}
	}
	cfg.Name = "kvxfer-local"
	cfg.Dir = dir
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	cfg.BcryptCost = 4 // bcrypt.MinCost: a password check in microseconds, not a race-detected second
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
	s := &Server{srv: srv, dir: dir, endpoint: client.Host}
	if o.User != "" {
		if err := s.enableAuth(o); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// enableAuth adds the root user and o.User with read and write on
// /kvxfer/, and turns auth on.
func (s *Server) enableAuth(o Options) error {
	c := v3client.New(s.srv.Server)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := c.UserAdd(ctx, "root", o.Password); return err },
		func() error { _, err := c.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.RoleAdd(ctx, "kvxfer"); return err },
		func() error {
			_, err := c.RoleGrantPermission(ctx, "kvxfer", "/kvxfer/", clientv3.GetPrefixRangeEnd("/kvxfer/"),
				clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := c.UserAdd(ctx, o.User, o.Password); return err },
		func() error { _, err := c.UserGrantRole(ctx, o.User, "kvxfer"); return err },
		func() error { _, err := c.AuthEnable(ctx); return err },
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return fmt.Errorf("etcdlocal: auth: %w", err)
		}
	}
	return nil
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

// URL is the --discovery value that reaches the server: etcd://HOST:PORT
// (etcds:// for a server over TLS).
func (s *Server) URL() string {
	if s.srv.Config().ClientTLSInfo.CertFile != "" {
		return "etcds://" + s.endpoint
	}
	return "etcd://" + s.endpoint
}

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
