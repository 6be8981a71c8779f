package etcdlocal

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is a throwaway certificate authority and the certificates an etcd
// over TLS needs, as PEM files in one directory: the CA, the server's
// certificate for 127.0.0.1 and localhost, a client certificate (common
// name "kvxfer"), and a second CA that signed neither, with a client
// certificate of its own (a wrong CA, a certificate etcd does not trust).
type PKI struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	OtherCA, OtherClientCert, OtherClientKey         string
}

// NewPKI writes a PKI into dir (certificates valid for a day).
func NewPKI(dir string) (PKI, error) {
	f := func(name string) string { return filepath.Join(dir, name) }
	p := PKI{CA: f("ca.pem"), ServerCert: f("server.pem"), ServerKey: f("server-key.pem"),
		ClientCert: f("client.pem"), ClientKey: f("client-key.pem"),
		OtherCA: f("other-ca.pem"), OtherClientCert: f("other-client.pem"), OtherClientKey: f("other-client-key.pem")}
	for _, ca := range []struct {
		path, cn          string
		client, clientKey string
		server, serverKey string
	}{
		{p.CA, "kvxfer test CA", p.ClientCert, p.ClientKey, p.ServerCert, p.ServerKey},
		{p.OtherCA, "another CA", p.OtherClientCert, p.OtherClientKey, "", ""},
	} {
		cert, key, err := newCert(ca.cn, nil, nil, true, nil)
		if err != nil {
			return p, err
		}
		if err := writePEM(ca.path, "CERTIFICATE", cert.Raw); err != nil {
			return p, err
		}
		if err := issue("kvxfer", cert, key, ca.client, ca.clientKey, false); err != nil {
			return p, err
		}
		if ca.server != "" {
			if err := issue("127.0.0.1", cert, key, ca.server, ca.serverKey, true); err != nil {
				return p, err
			}
		}
	}
	return p, nil
}

// issue writes a certificate for cn signed by ca, and its key: a server's
// for 127.0.0.1 and localhost, or a client's.
func issue(cn string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certPath, keyPath string, server bool) error {
	tmpl := &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	cert, key, err := newCert(cn, ca, caKey, false, tmpl)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certPath, "CERTIFICATE", cert.Raw); err != nil {
		return err
	}
	return writePEM(keyPath, "EC PRIVATE KEY", der)
}

var serials = big.NewInt(1)

// newCert makes a certificate for cn signed by parent (self-signed when
// parent is nil), from tmpl's extensions when given.
func newCert(cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, isCA bool, tmpl *x509.Certificate) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if tmpl == nil {
		tmpl = &x509.Certificate{}
	}
	serials.Add(serials, big.NewInt(1))
	tmpl.SerialNumber = new(big.Int).Set(serials)
	tmpl.Subject = pkix.Name{CommonName: cn}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
