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
// name "kvxfer") and a second CA that signed neither (a wrong CA).
type PKI struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey, OtherCA string
}

// NewPKI writes a PKI into dir (certificates valid for a day).
func NewPKI(dir string) (PKI, error) {
	p := PKI{CA: filepath.Join(dir, "ca.pem"), ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey: filepath.Join(dir, "server-key.pem"), ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey: filepath.Join(dir, "client-key.pem"), OtherCA: filepath.Join(dir, "other-ca.pem")}
	ca, caKey, err := newCert("kvxfer test CA", nil, nil, true, nil)
	if err != nil {
		return p, err
	}
	if err := writePEM(p.CA, "CERTIFICATE", ca.Raw); err != nil {
		return p, err
	}
	for _, c := range []struct {
		cn         string
		cert, key  string
		server     bool
		extKeyUsed x509.ExtKeyUsage
	}{
		{"127.0.0.1", p.ServerCert, p.ServerKey, true, x509.ExtKeyUsageServerAuth},
		{"kvxfer", p.ClientCert, p.ClientKey, false, x509.ExtKeyUsageClientAuth},
	} {
		tmpl := &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{c.extKeyUsed}}
		if c.server {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
			tmpl.DNSNames = []string{"localhost"}
		}
		cert, key, err := newCert(c.cn, ca, caKey, false, tmpl)
		if err != nil {
			return p, err
		}
		der, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return p, err
		}
		if err := writePEM(c.cert, "CERTIFICATE", cert.Raw); err != nil {
			return p, err
		}
		if err := writePEM(c.key, "EC PRIVATE KEY", der); err != nil {
			return p, err
		}
	}
	other, _, err := newCert("another CA", nil, nil, true, nil)
	if err != nil {
		return p, err
	}
	return p, writePEM(p.OtherCA, "CERTIFICATE", other.Raw)
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
