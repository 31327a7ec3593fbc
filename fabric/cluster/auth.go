package cluster

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Authenticated membership (doc.go). With mutual TLS configured, a node is
// let into memberlist's view only when its node metadata carries a proof
// made with the private key of a certificate the cluster CA signed:
//
//	proof: 'P' | sha256(certificate DER) [32] | sigLen u16 | signature
//
// appended to the metadata (after the flags byte; older peers ignore it).
// The signature covers proofMessage: a domain string, the node name, its
// gossip IP and port (as memberlist advertises them) and every metadata
// byte before the proof (this life's incarnation, the peer and data
// addresses, the flags). A certificate does not fit beside that in
// memberlist's 512 bytes of metadata, so only its fingerprint travels: the
// certificate itself is taken from the member's peer service (the mutual-TLS
// handshake of the address the signed metadata names), checked to chain to
// the CA and to be valid now, and kept by fingerprint. Until it is known the
// node is refused (awaiting_cert); once it is, this peer pulls the node's
// state (a push/pull with its gossip address) and lets it in.
const (
	proofDomain = "orbitkv membership proof v1\x00"
	metaProof   = 'P'

	certFetchTimeout = 5 * time.Second
	certRetryAfter   = 30 * time.Second // a certificate that failed is not fetched again before
	maxCertFetches   = 4                // certificate fetches at once
	maxCertEntries   = 4096             // certificates (and failures) kept
)

// Why a node was refused (orbitkv_cluster_rejected_members_total{reason}).
const (
	rejectNoProof   = "no_proof"       // its metadata carries no proof
	rejectBadProof  = "bad_proof"      // malformed, or the signature does not verify for its name, address and metadata
	rejectUntrusted = "untrusted_cert" // its certificate is not the CA's, not valid now, or not the one its proof names
	rejectAwaiting  = "awaiting_cert"  // its certificate is being fetched; it is let in once verified
)

var rejectReasons = []string{rejectNoProof, rejectBadProof, rejectUntrusted, rejectAwaiting}

// proof is the metadata's proof of identity.
type proof struct {
	fpr [32]byte
	sig []byte
}

func appendProof(b []byte, p proof) []byte {
	b = append(b, metaProof)
	b = append(b, p.fpr[:]...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(p.sig)))
	return append(b, p.sig...)
}

// decodeProof parses what follows the metadata's flags byte.
func decodeProof(b []byte) (*proof, error) {
	if len(b) == 0 || b[0] != metaProof {
		return nil, nil // none (an older or unauthenticated peer)
	}
	b = b[1:]
	if len(b) < 32+2 {
		return nil, fmt.Errorf("%w: proof truncated", errGossip)
	}
	p := &proof{}
	copy(p.fpr[:], b)
	n := int(binary.LittleEndian.Uint16(b[32:]))
	b = b[34:]
	if n == 0 || len(b) != n {
		return nil, fmt.Errorf("%w: proof signature of %d bytes in %d", errGossip, n, len(b))
	}
	p.sig = append([]byte(nil), b...)
	return p, nil
}

// proofMessage is what a proof signs.
func proofMessage(name string, ip net.IP, port uint16, signed []byte) []byte {
	b := []byte(proofDomain)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(name)))
	b = append(b, name...)
	ip16 := ip.To16()
	if ip16 == nil {
		ip16 = make(net.IP, 16)
	}
	b = append(b, ip16...)
	b = binary.LittleEndian.AppendUint16(b, port)
	return append(b, signed...)
}

func signProof(key crypto.Signer, msg []byte) ([]byte, error) {
	if _, ok := key.Public().(ed25519.PublicKey); ok {
		return key.Sign(rand.Reader, msg, crypto.Hash(0))
	}
	sum := sha256.Sum256(msg)
	return key.Sign(rand.Reader, sum[:], crypto.SHA256) // ECDSA: ASN.1; RSA: PKCS #1 v1.5
}

func verifyProof(pub crypto.PublicKey, msg, sig []byte) bool {
	sum := sha256.Sum256(msg)
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, sum[:], sig)
	case ed25519.PublicKey:
		return ed25519.Verify(k, msg, sig)
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], sig) == nil
	}
	return false
}

// certEntry is a verified member certificate: its key and the window in
// which its whole chain is valid.
type certEntry struct {
	pub                 crypto.PublicKey
	subject             string
	notBefore, notAfter time.Time
}

// auth is the membership check of a cluster with mutual TLS.
type auth struct {
	roots  *x509.CertPool
	client *tls.Config // dials members' peer services for their certificates
	signer crypto.Signer
	fpr    [32]byte
	now    func() time.Time
	fault  func(f *certFetch) error // tests: a fetch fails with what this returns (nil: no fault)

	mu       sync.Mutex
	good     map[[32]byte]certEntry
	bad      map[string]time.Time // fingerprint|peer address: not fetched again before
	inflight map[string]bool
	closed   bool
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func newAuth(roots *x509.CertPool, client *tls.Config, cert tls.Certificate) (*auth, error) {
	signer, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("tls: the peer key cannot sign")
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &auth{roots: roots, client: client, signer: signer, fpr: sha256.Sum256(cert.Certificate[0]), now: time.Now,
		good: map[[32]byte]certEntry{}, bad: map[string]time.Time{}, inflight: map[string]bool{}, ctx: ctx, cancel: cancel}, nil
}

// sign appends this peer's proof to its metadata, advertised at gossip.
func (a *auth) sign(name, gossip string, md []byte) ([]byte, error) {
	host, port, err := net.SplitHostPort(gossip)
	if err != nil {
		return nil, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, err
	}
	sig, err := signProof(a.signer, proofMessage(name, net.ParseIP(host), uint16(p), md))
	if err != nil {
		return nil, err
	}
	return appendProof(md, proof{fpr: a.fpr, sig: sig}), nil
}

// fetchKey is a certificate fetch: its fingerprint at a peer address.
func fetchKey(fpr [32]byte, peerAddr string) string { return string(fpr[:]) + "|" + peerAddr }

// check decides on node n, whose metadata carries p (nil: none) over
// signed and names peerAddr. fetch, when set, is the certificate fetch the
// node waits for (the caller starts it); reason names a refusal.
func (a *auth) check(n *memberlist.Node, p *proof, signed []byte, peerAddr string) (reason string, fetch *certFetch, err error) {
	if p == nil {
		return rejectNoProof, nil, errors.New("its metadata carries no certificate proof (a peer without --tls-cert, or an older version)")
	}
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.good[p.fpr]; ok {
		if now.Before(e.notBefore) || now.After(e.notAfter) {
			return rejectUntrusted, nil, fmt.Errorf("certificate %q valid from %s to %s only", e.subject,
				e.notBefore.Format(time.RFC3339), e.notAfter.Format(time.RFC3339))
		}
		if !verifyProof(e.pub, proofMessage(n.Name, n.Addr, n.Port, signed), p.sig) {
			return rejectBadProof, nil, fmt.Errorf("signature of certificate %q does not match the node's name, address or metadata", e.subject)
		}
		return "", nil, nil
	}
	key := fetchKey(p.fpr, peerAddr)
	if until, ok := a.bad[key]; ok && now.Before(until) {
		return rejectUntrusted, nil, fmt.Errorf("the certificate at %s did not verify against the cluster CA", peerAddr)
	}
	if a.inflight[key] {
		return rejectAwaiting, nil, fmt.Errorf("its certificate is being fetched from %s", peerAddr)
	}
	fetch = &certFetch{fpr: p.fpr, peerAddr: peerAddr, gossip: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))}
	return rejectAwaiting, fetch, fmt.Errorf("its certificate is being fetched from %s", peerAddr)
}

// expired says whether the certificate of fingerprint fpr is known and
// no longer (or not yet) valid.
func (a *auth) expired(fpr [32]byte) (certEntry, bool) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.good[fpr]
	return e, ok && (now.Before(e.notBefore) || now.After(e.notAfter))
}

// certFetch is one member's certificate to fetch.
type certFetch struct {
	fpr              [32]byte
	peerAddr, gossip string
}

// start runs f in the background unless it runs already, too many do, or
// auth closed; done gets its result.
func (a *auth) start(f *certFetch, done func(f *certFetch, err error)) {
	key := fetchKey(f.fpr, f.peerAddr)
	a.mu.Lock()
	if a.closed || a.inflight[key] || len(a.inflight) >= maxCertFetches {
		a.mu.Unlock()
		return // the node's next alive message tries again
	}
	a.inflight[key] = true
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		e, err := a.fetch(f)
		a.mu.Lock()
		delete(a.inflight, key)
		if len(a.good) >= maxCertEntries {
			clear(a.good)
		}
		if len(a.bad) >= maxCertEntries {
			clear(a.bad)
		}
		if err == nil {
			a.good[f.fpr] = e
		} else {
			a.bad[key] = a.now().Add(certRetryAfter)
		}
		a.mu.Unlock()
		done(f, err)
	}()
}

// fetch takes the certificate from the member's peer service in a mutual-TLS
// handshake (the client config refuses a chain not leading to the CA) and
// checks it is the one the proof names and valid now.
func (a *auth) fetch(f *certFetch) (certEntry, error) {
	if a.fault != nil {
		if err := a.fault(f); err != nil {
			return certEntry{}, fmt.Errorf("certificate from %s: %w", f.peerAddr, err)
		}
	}
	ctx, cancel := context.WithTimeout(a.ctx, certFetchTimeout)
	defer cancel()
	d := tls.Dialer{Config: a.client.Clone()}
	conn, err := d.DialContext(ctx, "tcp", f.peerAddr)
	if err != nil {
		return certEntry{}, fmt.Errorf("certificate from %s: %w", f.peerAddr, err)
	}
	cs := conn.(*tls.Conn).ConnectionState()
	conn.Close()
	return a.verifyChain(cs.PeerCertificates, f.fpr)
}

// verifyChain checks that chain's leaf is the certificate of fingerprint
// fpr and leads to the cluster CA now, and returns it.
func (a *auth) verifyChain(chain []*x509.Certificate, fpr [32]byte) (certEntry, error) {
	if len(chain) == 0 {
		return certEntry{}, errors.New("no certificate")
	}
	leaf := chain[0]
	if got := sha256.Sum256(leaf.Raw); !bytes.Equal(got[:], fpr[:]) {
		return certEntry{}, fmt.Errorf("certificate %q is not the one the member's proof names", leaf.Subject.CommonName)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: a.roots, Intermediates: inter, CurrentTime: a.now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		return certEntry{}, fmt.Errorf("certificate %q: %w", leaf.Subject.CommonName, err)
	}
	e := certEntry{pub: leaf.PublicKey, subject: leaf.Subject.CommonName, notBefore: leaf.NotBefore, notAfter: leaf.NotAfter}
	for _, c := range chains[0] {
		if c.NotBefore.After(e.notBefore) {
			e.notBefore = c.NotBefore
		}
		if c.NotAfter.Before(e.notAfter) {
			e.notAfter = c.NotAfter
		}
	}
	return e, nil
}

// close stops the fetches and waits for them.
func (a *auth) close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.cancel()
	a.wg.Wait()
}
