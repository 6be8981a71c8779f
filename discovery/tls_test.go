package discovery

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/etcdlocal"
)

// pkiOnce holds the test PKI, written once per test binary.
var pkiOnce struct {
	sync.Once
	dir string // removed by TestMain
	pki etcdlocal.PKI
	err error
}

// testPKI writes the test PKI once per test binary.
func testPKI(t *testing.T) etcdlocal.PKI {
	t.Helper()
	pkiOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvxfer-pki-")
		if err != nil {
			pkiOnce.err = err
			return
		}
		pkiOnce.dir = dir
		pkiOnce.pki, pkiOnce.err = etcdlocal.NewPKI(dir)
	})
	if pkiOnce.err != nil {
		t.Fatal(pkiOnce.err)
	}
	return pkiOnce.pki
}

// startEtcd starts an embedded etcd as o asks, closed when t ends.
func startEtcd(t *testing.T, o etcdlocal.Options) *etcdlocal.Server {
	t.Helper()
	srv, err := etcdlocal.StartWith(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// TestEtcdOverTLS: two ranks find each other through an etcd that speaks
// only TLS and wants a client certificate (etcds://, LoadTLS with the CA
// and the client's certificate).
func TestEtcdOverTLS(t *testing.T) {
	pki := testPKI(t)
	srv := startEtcd(t, etcdlocal.Options{TLS: &pki})
	cfg, err := LoadTLS(pki.CA, pki.ClientCert, pki.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	cluster := clusterName(t)
	open := func() Registry {
		r, err := Open(ctxFor(t, 10*time.Second), srv.URL(), cluster, nil, WithTLS(cfg))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	if !strings.HasPrefix(srv.URL(), "etcds://") {
		t.Fatalf("URL of a TLS server: %s", srv.URL())
	}
	a, b := open(), open()
	ra, rb := testRecord("ctx", 0, 10), testRecord("gen", 0, 20)
	if err := a.Register(ctxFor(t, 10*time.Second), ra); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(ctxFor(t, 10*time.Second), rb); err != nil {
		t.Fatal(err)
	}
	if got := waitEvent(t, a, waitFor, "gen/0 up at ctx", isUp("gen", 0, 20)); !recordsEqual(got.Record, rb) {
		t.Errorf("ctx sees %+v, want %+v", got.Record, rb)
	}
	waitEvent(t, b, waitFor, "ctx/0 up at gen", isUp("ctx", 0, 10))
}

// TestEtcdTLSMistakesNamed: each mistake a user makes with TLS to etcd
// fails Open within its dial timeout with an error that says what is
// wrong — not only "context deadline exceeded". (Checked to fail without
// diagnose: the errors then end at the deadline.)
func TestEtcdTLSMistakesNamed(t *testing.T) {
	pki := testPKI(t)
	srv := startEtcd(t, etcdlocal.Options{TLS: &pki})
	plain := etcdEndpoints(t)[0]
	load := func(ca, cert, key string) Option {
		cfg, err := LoadTLS(ca, cert, key)
		if err != nil {
			t.Fatal(err)
		}
		return WithTLS(cfg)
	}
	for _, tc := range []struct {
		name, url string
		opts      []Option
		want      []string
	}{
		{"wrong CA", srv.URL(), []Option{load(pki.OtherCA, pki.ClientCert, pki.ClientKey)},
			[]string{"TLS to etcd at " + srv.Endpoint(), "certificate signed by unknown authority", "is --discovery-ca (discovery_ca) the CA that signed it?",
				"CA read at ", " from " + pki.OtherCA + "; restart to reload"}},
		{"wrong CA with a user", srv.URL(), []Option{load(pki.OtherCA, pki.ClientCert, pki.ClientKey), WithAuth("kvxfer", "pw")},
			[]string{`as user "kvxfer"`, "certificate signed by unknown authority"}}, // fails in the client's login
		{"system roots", srv.URL(), nil, []string{"certificate signed by unknown authority", "checked against the system's roots; give the CA"}},
		{"no client certificate", srv.URL(), []Option{load(pki.CA, "", "")},
			[]string{"TLS to etcd at " + srv.Endpoint(), "certificate required", "etcd asks for a client certificate: give --discovery-cert"}},
		{"client certificate of another CA", srv.URL(), []Option{load(pki.CA, pki.OtherClientCert, pki.OtherClientKey)},
			[]string{"TLS to etcd at " + srv.Endpoint(), "etcd refused this rank's client certificate"}},
		{"plaintext to TLS", "etcd://" + srv.Endpoint(), nil,
			[]string{"etcd at " + srv.Endpoint() + " speaks TLS: use etcds://"}},
		{"TLS to plaintext", "etcds://" + plain, []Option{load(pki.CA, pki.ClientCert, pki.ClientKey)},
			[]string{"etcd at " + plain + " does not speak TLS: use etcd://"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			err := openFails(t, tc.url, clusterName(t), append(tc.opts, WithDialTimeout(2*time.Second)), tc.want...)
			t.Logf("%v after %v", err, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestEtcdTLSSettingsRefused: TLS settings that cannot work are refused
// before anything is dialled, naming what is wrong.
func TestEtcdTLSSettingsRefused(t *testing.T) {
	pki := testPKI(t)
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, ca, cert, key string
		want                string
	}{
		{"missing CA", filepath.Join(t.TempDir(), "none.pem"), "", "", "none.pem"},
		{"CA not PEM", notPEM, "", "", "holds no PEM certificate"},
		{"certificate without key", pki.CA, pki.ClientCert, "", "needs both its certificate file and its key file"},
		{"key without certificate", pki.CA, "", pki.ClientKey, "needs both"},
		{"key of another certificate", pki.CA, pki.ClientCert, pki.ServerKey, "private key does not match public key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadTLS(tc.ca, tc.cert, tc.key)
			if !errors.Is(err, ErrTLS) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadTLS: %v, want ErrTLS saying %q", err, tc.want)
			}
		})
	}
	cfg, err := LoadTLS(pki.CA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctxFor(t, 10*time.Second), "etcd://127.0.0.1:1", "c", nil, WithTLS(cfg)); !errors.Is(err, ErrTLS) ||
		!strings.Contains(err.Error(), "use etcds://") {
		t.Fatalf("TLS settings with etcd://: %v, want ErrTLS saying to use etcds://", err)
	}
}

// TestEtcdAuth: with etcd's user auth on, a registry logs in with
// WithAuth; a wrong password or no user is refused at Open, naming the
// user and etcd's reason, and, with no user, that etcd requires one and
// the settings that give it. (Checked to fail without explain's case for
// etcd's "user name is empty".)
func TestEtcdAuth(t *testing.T) {
	srv := startEtcd(t, etcdlocal.Options{User: "kvxfer", Password: "s3cret"})
	cluster := clusterName(t)
	r, err := Open(ctxFor(t, 10*time.Second), srv.URL(), cluster, nil, WithAuth("kvxfer", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rec := testRecord("ctx", 0, 10)
	if err := r.Register(ctxFor(t, 10*time.Second), rec); err != nil {
		t.Fatal(err)
	}
	w, err := Open(ctxFor(t, 10*time.Second), srv.URL(), cluster, nil, WithAuth("kvxfer", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	waitEvent(t, w, waitFor, "ctx/0 up", isUp("ctx", 0, 10))

	for _, tc := range []struct {
		name string
		opts []Option
		want []string
	}{
		{"wrong password", []Option{WithAuth("kvxfer", "guess")}, []string{`as user "kvxfer"`, "authentication failed"}},
		{"no user", nil, []string{"user name is empty", "etcd requires authentication", "--discovery-user", "discovery_user", "WithAuth"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The default dial timeout: the check of a password is
			// bcrypt's, slow under the race detector.
			openFails(t, srv.URL(), cluster, tc.opts, tc.want...)
		})
	}
}

// openFails checks that Open of url fails with an error saying each of
// want, and returns it.
func openFails(t *testing.T, url, cluster string, opts []Option, want ...string) error {
	t.Helper()
	r, err := Open(ctxFor(t, 20*time.Second), url, cluster, nil, opts...)
	if err == nil {
		_ = r.Close()
		t.Fatal("Open succeeded")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not say %q", err, w)
		}
	}
	return err
}

// TestClientCertificateRotates: LoadTLS's client certificate is read again
// when its files change, at the next handshake, and a rotation half done
// (a new certificate beside the old key) keeps the last good pair.
// (Checked to fail with the pair read once: the serial stays the first.)
func TestClientCertificateRotates(t *testing.T) {
	first := testPKI(t)
	second, err := etcdlocal.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	install := func(p etcdlocal.PKI, files ...string) {
		t.Helper()
		later := time.Now().Add(time.Duration(len(files)) * time.Minute)
		for _, f := range files {
			src := p.ClientCert
			if f == key {
				src = p.ClientKey
			}
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(f, later, later); err != nil { // a new mtime whatever the clock's step
				t.Fatal(err)
			}
		}
	}
	serial := func(cfg *tls.Config) string {
		t.Helper()
		c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil || c == nil || c.Leaf == nil {
			t.Fatalf("client certificate: %v, %v", c, err)
		}
		return c.Leaf.SerialNumber.String() + "/" + c.Leaf.Issuer.CommonName
	}
	install(first, cert, key)
	cfg, err := LoadTLS(first.CA, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	was := serial(cfg)
	install(second, cert) // half done: the key is still the first's
	if got := serial(cfg); got != was {
		t.Fatalf("a rotation half done changed the certificate to %s", got)
	}
	install(second, cert, key)
	now := serial(cfg)
	if now == was {
		t.Fatalf("the rotated certificate was not read: still %s", now)
	}
	want, err := tls.LoadX509KeyPair(second.ClientCert, second.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	if w := want.Leaf.SerialNumber.String() + "/" + want.Leaf.Issuer.CommonName; now != w {
		t.Fatalf("after the rotation: %s, want %s", now, w)
	}
}

// TestEtcdRotatedCANamedInError: LoadTLS reads the CA once; a registry
// opened with that configuration after the CA file was rotated fails, and
// its error says when and from which file the CA was read, that the file
// changed since, and to restart. A restart (LoadTLS again) connects.
// (A wrong CA from the start is named the same way, without the change:
// TestEtcdTLSMistakesNamed.)
func TestEtcdRotatedCANamedInError(t *testing.T) {
	pki := testPKI(t)
	srv := startEtcd(t, etcdlocal.Options{TLS: &pki})
	ca := filepath.Join(t.TempDir(), "ca.pem")
	install := func(src string, at time.Time) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(ca, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(ca, at, at); err != nil { // a new mtime whatever the clock's step
			t.Fatal(err)
		}
	}
	install(pki.OtherCA, time.Now().Add(-time.Hour))
	cfg, err := LoadTLS(ca, pki.ClientCert, pki.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	install(pki.CA, time.Now().Add(time.Hour)) // etcd's CA, rotated in
	cluster := clusterName(t)
	err = openFails(t, srv.URL(), cluster, []Option{WithTLS(cfg), WithDialTimeout(2 * time.Second)},
		"certificate signed by unknown authority", "CA read at ", " from "+ca+", which changed since; restart to reload")
	t.Log(err)
	cfg, err = LoadTLS(ca, pki.ClientCert, pki.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(ctxFor(t, 10*time.Second), srv.URL(), cluster, nil, WithTLS(cfg))
	if err != nil {
		t.Fatalf("after reloading the rotated CA: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// silentListener is the address of a TCP listener that accepts
// connections and never reads or writes them (a stopped etcd), closed with
// them when the test ends.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // kept open, never read or written
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// TestEtcdThatAnswersNothingNamed: an etcd that accepts connections and
// answers nothing (a stopped process: SIGSTOP, or a wedged one) is named
// as such, not only "context deadline exceeded" (a review). (Checked to
// fail without the silent-endpoint case in diagnose.)
func TestEtcdThatAnswersNothingNamed(t *testing.T) {
	addr := silentListener(t)
	openFails(t, "etcd://"+addr, clusterName(t), []Option{WithDialTimeout(time.Second)},
		"etcd at "+addr+" accepts connections but answers nothing")
}

// TestEtcdOpenEndsWithItsContextWhenAuthenticating: with a user
// (WithAuth) the etcd client authenticates as it is made, and NewEtcd
// made it within Background and the dial timeout, not ctx: a node's Open
// whose context ended (a Ctrl-C as the rank starts) against an etcd that
// accepts and answers nothing waited the whole dial timeout (here a
// minute) on. It must end with ctx, and the registry's client must still
// outlive ctx once made (the other tests).
func TestEtcdOpenEndsWithItsContextWhenAuthenticating(t *testing.T) {
	addr := silentListener(t)
	ctx := ctxFor(t, 200*time.Millisecond)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		r, err := Open(ctx, "etcd://"+addr, clusterName(t), nil, WithAuth("u", "p"), WithDialTimeout(time.Minute))
		if err == nil {
			_ = r.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Open of an etcd that answers nothing: no error")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Open: %v, want its context's end", err)
		}
		t.Logf("Open after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(10 * time.Second):
		t.Fatal("Open whose context ended after 200 ms still waits 10 s on (for its dial timeout)")
	}
}
