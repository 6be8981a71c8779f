package discovery

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
	"weak"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrTLS: TLS settings for etcd that cannot be used (a file that cannot
// be read or parsed, a certificate without its key, TLS settings with a
// plaintext etcd:// URL).
var ErrTLS = errors.New("discovery: etcd TLS")

// LoadTLS builds the TLS configuration of an etcds:// registry from PEM
// files: caFile, the CA certificates that signed etcd's server
// certificate ("": the system's roots); certFile and keyFile, this
// rank's client certificate and key for an etcd that asks for one
// (--client-cert-auth), both or neither. The client certificate is read
// again from its files when they change (a rotation), at the next
// handshake. Errors wrap ErrTLS and name the file and what is wrong with
// it.
//
// The CA is read once, here: a CA file rotated later is not seen until
// the process restarts (or calls LoadTLS again). Once etcd's certificate
// is signed by a CA the file did not hold then, this rank's connections
// to etcd fail verification: its keepalive stops (Lost), and an Open with
// this configuration fails naming when and from which file the CA was
// read. To rotate without a gap, add the new CA to the file beside the
// old one, restart the ranks, then rotate etcd's certificate.
// (Re-reading the CA at each handshake would mean verifying etcd's
// certificate by hand, and a TLS client knows no name to check it
// against for an endpoint given as an IP address.)
func LoadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: CA file: %v", ErrTLS, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: CA file %s holds no PEM certificate", ErrTLS, caFile)
		}
		cfg.RootCAs = pool
		noteCA(pool, caFile, time.Now())
	}
	switch {
	case certFile == "" && keyFile == "":
	case certFile == "" || keyFile == "":
		return nil, fmt.Errorf("%w: a client certificate needs both its certificate file and its key file (certificate %q, key %q)",
			ErrTLS, certFile, keyFile)
	default:
		kp := &keyPair{certFile: certFile, keyFile: keyFile}
		if err := kp.reload(); err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = kp.get
	}
	return cfg, nil
}

// caRead is where and when LoadTLS read a CA pool.
type caRead struct {
	file string
	at   time.Time
}

// caReads maps each CA pool LoadTLS built (weakly: an entry goes with its
// pool) to its caRead, for the error of a failed verification. A pool,
// not a configuration: clones of the configuration share it.
var caReads sync.Map // weak.Pointer[x509.CertPool] → caRead

func noteCA(pool *x509.CertPool, file string, at time.Time) {
	k := weak.Make(pool)
	caReads.Store(k, caRead{file: file, at: at})
	runtime.AddCleanup(pool, func(k weak.Pointer[x509.CertPool]) { caReads.Delete(k) }, k)
}

// caNote says when and from which file LoadTLS read pool, and whether the
// file changed since; "" for a pool LoadTLS did not build.
func caNote(pool *x509.CertPool) string {
	if pool == nil {
		return ""
	}
	v, ok := caReads.Load(weak.Make(pool))
	if !ok {
		return ""
	}
	c := v.(caRead)
	changed := ""
	if st, err := os.Stat(c.file); err == nil && st.ModTime().After(c.at) {
		changed = ", which changed since"
	}
	return fmt.Sprintf(" (CA read at %s from %s%s; restart to reload)", c.at.Format(time.RFC3339), c.file, changed)
}

// keyPair is a client certificate read from its files again when they
// change (a certificate rotated before it expires, as cert-manager or an
// operator does), at the next TLS handshake: a rank that runs for longer
// than its certificate lives keeps reaching etcd.
type keyPair struct {
	certFile, keyFile string
	mu                sync.Mutex
	pair              *tls.Certificate
	certMod, keyMod   time.Time
}

// reload reads the pair; on error the pair read before stays.
func (k *keyPair) reload() error {
	cs, err := os.Stat(k.certFile)
	if err != nil {
		return fmt.Errorf("%w: client certificate: %v", ErrTLS, err)
	}
	ks, err := os.Stat(k.keyFile)
	if err != nil {
		return fmt.Errorf("%w: client certificate key: %v", ErrTLS, err)
	}
	pair, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("%w: client certificate %s with key %s: %v", ErrTLS, k.certFile, k.keyFile, err)
	}
	k.pair, k.certMod, k.keyMod = &pair, cs.ModTime(), ks.ModTime()
	return nil
}

// get is tls.Config.GetClientCertificate: the pair, read again first if
// either file changed since. A pair that does not load (a rotation half
// written: a new certificate beside the old key) leaves the last good one
// in use until both files agree.
func (k *keyPair) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	cs, cerr := os.Stat(k.certFile)
	ks, kerr := os.Stat(k.keyFile)
	if cerr == nil && kerr == nil && (!cs.ModTime().Equal(k.certMod) || !ks.ModTime().Equal(k.keyMod)) {
		_ = k.reload()
	}
	return k.pair, nil
}

// explain adds to err, an etcd that did not answer, what diagnose finds.
// An answer of etcd's own (a refused login, a permission) is left as it
// is: the connection worked, there is nothing to probe; only etcd's
// "user name is empty", which says nothing of why, gets the settings
// that give it one.
func explain(err error, endpoints []string, cfg *tls.Config) error {
	if errors.Is(err, rpctypes.ErrUserEmpty) {
		return fmt.Errorf("%w: etcd requires authentication and no user was given: "+
			"give --discovery-user and --discovery-password-file (discovery_user, discovery_password_file; WithAuth)", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) && status.Code(errors.Unwrap(err)) != codes.DeadlineExceeded {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if why := diagnose(ctx, endpoints, cfg); why != "" {
		return fmt.Errorf("%w (%s)", err, why)
	}
	return err
}

// diagnose says, for an etcd that did not answer, what each endpoint's
// first bytes show: whether it speaks TLS when the registry does not (or
// the other way round), and the handshake's error (an unknown authority,
// a name mismatch, a client certificate refused), or what a dial that
// failed met. It returns "" when no endpoint tells more than the error at
// hand.
func diagnose(ctx context.Context, endpoints []string, cfg *tls.Config) string {
	var unreachable []string
	for _, ep := range endpoints {
		d := net.Dialer{Timeout: time.Second}
		raw, err := d.DialContext(ctx, "tcp", ep)
		if err != nil {
			// The client's own error is only its deadline: say what the
			// dial met (connection refused, no such host, a timeout),
			// unless another endpoint tells more.
			unreachable = append(unreachable, fmt.Sprintf("nothing answers at %s: %v", ep, err))
			continue
		}
		probe := cfg
		if probe == nil {
			// A plaintext registry: does the server want TLS?
			// A probe that sends nothing: no need to trust the server.
			probe = &tls.Config{InsecureSkipVerify: true}
		} else {
			probe = cfg.Clone()
		}
		if probe.ServerName == "" {
			probe.ServerName, _, _ = net.SplitHostPort(ep)
		}
		c := tls.Client(raw, probe)
		_ = c.SetDeadline(time.Now().Add(time.Second))
		herr := c.HandshakeContext(ctx)
		if herr == nil && cfg != nil {
			// TLS 1.3: a server refuses the client's certificate (or its
			// absence) after the client's side of the handshake is over,
			// with an alert in place of its first bytes.
			var op *net.OpError
			if _, err := c.Read(make([]byte, 1)); errors.As(err, &op) && op.Op == "remote error" {
				herr = err
			}
		}
		_ = c.Close()
		switch {
		case cfg == nil && herr == nil:
			return fmt.Sprintf("etcd at %s speaks TLS: use etcds:// (with the CA that signed its certificate)", ep)
		case cfg == nil && !speaksHTTP(ctx, ep):
			// Plaintext, and neither TLS nor HTTP answered: the port
			// accepts connections, nothing behind it replies.
			unreachable = append(unreachable, fmt.Sprintf("etcd at %s accepts connections but answers nothing (stopped, overloaded, or not etcd?)", ep))
		case cfg != nil && herr != nil:
			var rh tls.RecordHeaderError
			if errors.As(herr, &rh) || speaksHTTP(ctx, ep) {
				return fmt.Sprintf("etcd at %s does not speak TLS: use etcd://", ep)
			}
			var unknown x509.UnknownAuthorityError
			var op *net.OpError
			switch {
			case errors.As(herr, &op) && op.Op == "remote error" && cfg.GetClientCertificate == nil && len(cfg.Certificates) == 0:
				return fmt.Sprintf("TLS to etcd at %s: %v: etcd asks for a client certificate: give --discovery-cert and --discovery-key (discovery_cert, discovery_key)", ep, herr)
			case errors.As(herr, &op) && op.Op == "remote error":
				return fmt.Sprintf("TLS to etcd at %s: %v: etcd refused this rank's client certificate (is it signed by a CA etcd trusts, and valid now?)", ep, herr)
			case errors.As(herr, &unknown) && cfg.RootCAs == nil:
				return fmt.Sprintf("TLS to etcd at %s: %v: checked against the system's roots; give the CA that signed it (--discovery-ca, discovery_ca)", ep, herr)
			case errors.As(herr, &unknown):
				return fmt.Sprintf("TLS to etcd at %s: %v: is --discovery-ca (discovery_ca) the CA that signed it?%s", ep, herr, caNote(cfg.RootCAs))
			}
			return fmt.Sprintf("TLS to etcd at %s: %v", ep, herr)
		}
	}
	if len(unreachable) == len(endpoints) && len(unreachable) > 0 {
		// No endpoint answered at all: what the user can do about it.
		return strings.Join(unreachable, "; ") + ": is etcd running there? --discovery (discovery) must name etcd's client URL (its --advertise-client-urls)"
	}
	return strings.Join(unreachable, "; ")
}

// speaksHTTP reports whether ep answers a plaintext HTTP request (etcd's
// client port serves /version in the clear when it does not speak TLS;
// it closes a TLS handshake without a word).
func speaksHTTP(ctx context.Context, ep string) bool {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", ep)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("GET /version HTTP/1.0\r\n\r\n")); err != nil {
		return false
	}
	b := make([]byte, 5)
	_, err = io.ReadFull(c, b)
	return err == nil && string(b) == "HTTP/"
}
