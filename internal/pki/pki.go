// Package pki makes and loads the cluster's TLS credentials: a cluster CA,
// peer certificates it signs, and the mutual-TLS configs every TCP surface
// between peers uses (DESIGN.md §7: a peer without the cluster's
// credentials can neither read pages nor join).
//
// Peers verify each other by chain only: a certificate signed by the
// cluster CA is a member, whatever address it is reached at (peers are
// usually dialled by IP). Hostnames are not checked.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// Pair is a PEM certificate and its PEM private key.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// NewCA makes a self-signed cluster CA valid for validity.
func NewCA(name string, validity time.Duration) (Pair, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name, Organization: []string{"orbitkv"}},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	return sign(tmpl, nil, nil, validity)
}

// Issue makes a peer certificate signed by ca, usable as TLS server and
// client; hosts (IPs or names) go into its SANs for tools that check them.
func Issue(ca Pair, name string, hosts []string, validity time.Duration) (Pair, error) {
	caCert, caKey, err := parse(ca)
	if err != nil {
		return Pair{}, fmt.Errorf("ca: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: []string{"orbitkv"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{name},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return sign(tmpl, caCert, caKey, validity)
}

func sign(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, validity time.Duration) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return Pair{}, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(validity)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return Pair{}, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}, nil
}

func parse(p Pair) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(p.CertPEM)
	kb, _ := pem.Decode(p.KeyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// Configs are the two sides of mutual TLS between peers, with what they
// are made of: the peer's certificate and key (Cert; Cert.Leaf parsed) and
// the cluster CA (Roots). Membership signs with and verifies against them
// (fabric/cluster/auth.go).
type Configs struct {
	Server, Client *tls.Config
	Cert           tls.Certificate
	Roots          *x509.CertPool
}

// LoadFiles reads a peer certificate, its key and the cluster CA (PEM files)
// and returns the mutual-TLS configs.
func LoadFiles(certFile, keyFile, caFile string) (Configs, error) {
	var files [3][]byte
	for i, f := range []string{certFile, keyFile, caFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			return Configs{}, fmt.Errorf("tls: %w", err)
		}
		files[i] = b
	}
	return New(Pair{CertPEM: files[0], KeyPEM: files[1]}, files[2])
}

// New returns the mutual-TLS configs of a peer holding pair, trusting caPEM:
// the server demands a client certificate signed by the CA, the client
// accepts a server whose chain leads to the CA. TLS 1.3 only.
func New(pair Pair, caPEM []byte) (Configs, error) {
	cert, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
	if err != nil {
		return Configs{}, fmt.Errorf("tls: peer certificate: %w", err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return Configs{}, fmt.Errorf("tls: peer certificate: %w", err)
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return Configs{}, errors.New("tls: no CA certificate in the CA file")
	}
	server := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
	client := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// Peers are dialled by address; the chain is checked below instead
		// of a hostname.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyChain(cs, pool)
		},
	}
	return Configs{Server: server, Client: client, Cert: cert, Roots: pool}, nil
}

func verifyChain(cs tls.ConnectionState, roots *x509.CertPool) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: peer sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("tls: peer certificate not signed by the cluster CA: %w", err)
	}
	return nil
}
