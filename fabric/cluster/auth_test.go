package cluster

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pki"
	ibv "github.com/orbitkv/orbitkv/rdma"
)

// memberCreds are the files of one node: its certificate, key and the CA it
// trusts ("" for a node without TLS), and the gossip key.
type memberCreds struct{ cert, key, ca, gossipKey string }

func writeFile(t *testing.T, path string, b []byte) string {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issueCreds writes a certificate for name signed by ca (valid for
// validity; negative: expired), trusting trust.
func issueCreds(t *testing.T, ca pki.Pair, trust []byte, name string, validity time.Duration, gossipKey string) memberCreds {
	t.Helper()
	p, err := pki.Issue(ca, name, []string{"127.0.0.1"}, validity)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	return memberCreds{cert: writeFile(t, filepath.Join(dir, "peer.pem"), p.CertPEM),
		key: writeFile(t, filepath.Join(dir, "peer-key.pem"), p.KeyPEM), ca: writeFile(t, filepath.Join(dir, "ca.pem"), trust),
		gossipKey: gossipKey}
}

func newCA(t *testing.T, name string) pki.Pair {
	t.Helper()
	ca, err := pki.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func gossipKeyFile(t *testing.T) string {
	t.Helper()
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i * 7)
	}
	return writeFile(t, filepath.Join(t.TempDir(), "gossip.key"), []byte(base64.StdEncoding.EncodeToString(key)+"\n"))
}

// startMember starts a member on 127.0.0.1 named name, joining through
// join; before runs between New and Start.
func startMember(t *testing.T, name string, creds memberCreds, join string, before ...func(*Cluster)) *Cluster {
	t.Helper()
	cfg := Config{ClusterAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0", NodeName: name,
		ClusterJoin: join, ClusterKeyFile: creds.gossipKey, TLSCert: creds.cert, TLSKey: creds.key, TLSCA: creds.ca,
		ClusterInsecure: creds.cert == "", RDMA: ibv.Config{Off: true}}
	c, err := New(cfg, t.TempDir(), prometheus.NewRegistry(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range before {
		f(c)
	}
	cat, err := catalog.Open(catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := c.Start(context.Background(), cat, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return c
}

// listed is whom c lists alive, itself aside: the members it tracks and
// those in memberlist's view.
func listed(c *Cluster) []string {
	var out []string
	for _, m := range c.Peers(0) {
		if !m.Self && m.State == stateAlive.String() {
			out = append(out, m.Name)
		}
	}
	for _, n := range c.mlp.Load().Members() {
		if n.Name != c.name && !slices.Contains(out, n.Name) {
			out = append(out, n.Name+" (memberlist only)")
		}
	}
	slices.Sort(out)
	return out
}

// waitUntil polls cond until it holds; check runs at every poll and fails
// the test at once (what must never happen meanwhile).
func waitUntil(t *testing.T, what string, cond func() bool, check func()) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // a hang guard, not a timing assertion
	for {
		if check != nil {
			check()
		}
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within the guard", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func converged(members []*Cluster) func() bool {
	return func() bool {
		for _, c := range members {
			var want []string
			for _, o := range members {
				if o != c {
					want = append(want, o.name)
				}
			}
			slices.Sort(want)
			if !slices.Equal(listed(c), want) {
				return false
			}
		}
		return true
	}
}

func refusals(t *testing.T, c *Cluster, reason string) float64 {
	return counterValue(t, c.m.rejected.WithLabelValues(reason))
}

// TestMembershipNeedsTheClusterCA: three members with certificates of the
// cluster CA see each other; a node holding the gossip key but a
// certificate of another CA, no certificate at all, or an expired
// certificate of the cluster CA is never listed alive by any of them, and
// its refusal is counted.
func TestMembershipNeedsTheClusterCA(t *testing.T) {
	key := gossipKeyFile(t)
	ca := newCA(t, "cluster")
	var members []*Cluster
	for i, name := range []string{"m1", "m2", "m3"} {
		join := ""
		if i > 0 {
			join = members[0].GossipAddr()
		}
		members = append(members, startMember(t, name, issueCreds(t, ca, ca.CertPEM, name, time.Hour, key), join))
	}
	waitUntil(t, "three members seeing each other", converged(members), nil)

	other := newCA(t, "other")
	for _, tc := range []struct {
		name   string
		creds  memberCreds
		reason string
		// seesMembers: the intruder itself takes the members' certificates,
		// so it gossips to all of them (not only the seed) and each refuses it.
		seesMembers bool
	}{
		{"other-ca", issueCreds(t, other, other.CertPEM, "intruder", time.Hour, key), rejectUntrusted, false},
		{"other-ca-trusting-ours", issueCreds(t, other, ca.CertPEM, "intruder", time.Hour, key), rejectUntrusted, true},
		{"no-cert", memberCreds{gossipKey: key}, rejectNoProof, true},
		{"expired", issueCreds(t, ca, ca.CertPEM, "intruder", -time.Minute, key), rejectUntrusted, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := make([]float64, len(members))
			for i, c := range members {
				before[i] = refusals(t, c, tc.reason)
			}
			name := "intruder-" + tc.name
			intruder := startMember(t, name, tc.creds, members[0].GossipAddr())
			never := func() {
				for _, c := range members {
					if l := listed(c); slices.ContainsFunc(l, func(s string) bool { return s == name || s == name+" (memberlist only)" }) {
						t.Fatalf("%s lists the intruder: %v", c.name, l)
					}
				}
			}
			// The seed refuses the join; an intruder that lists the members
			// gossips to each, and each refuses it.
			waitUntil(t, "the seed's refusal", func() bool { return refusals(t, members[0], tc.reason) > before[0] }, never)
			if tc.seesMembers {
				waitUntil(t, "refusals by every member", func() bool {
					if len(listed(intruder)) < len(members) {
						return false
					}
					for i, c := range members {
						if refusals(t, c, tc.reason) <= before[i] {
							return false
						}
					}
					return true
				}, never)
			}
			never()
			if !converged(members)() {
				t.Fatalf("the members lost each other: %v %v %v", listed(members[0]), listed(members[1]), listed(members[2]))
			}
		})
	}
}

// TestMembershipDropsExpiredMembers: a member whose certificate expires
// while it is a member is dropped by the others (here: one member's clock
// moves past the certificates' end).
func TestMembershipDropsExpiredMembers(t *testing.T) {
	key := gossipKeyFile(t)
	ca := newCA(t, "cluster")
	var skew atomic.Int64
	var members []*Cluster
	for i, name := range []string{"e1", "e2", "e3"} {
		join := ""
		var before []func(*Cluster)
		if i > 0 {
			join = members[0].GossipAddr()
		} else {
			before = append(before, func(c *Cluster) {
				c.auth.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
			})
		}
		members = append(members, startMember(t, name, issueCreds(t, ca, ca.CertPEM, name, time.Hour, key), join, before...))
	}
	waitUntil(t, "three members seeing each other", converged(members), nil)
	was := refusals(t, members[0], rejectUntrusted)
	skew.Store(int64(2 * time.Hour))
	waitUntil(t, "e1 to drop the members whose certificates expired", func() bool {
		for _, m := range members[0].Peers(0) {
			if !m.Self {
				return false
			}
		}
		return refusals(t, members[0], rejectUntrusted) >= was+2
	}, nil)
}

// TestMembershipWithoutTLS: a dev cluster (no CA) forms as before and
// refuses no one.
func TestMembershipWithoutTLS(t *testing.T) {
	key := gossipKeyFile(t)
	var members []*Cluster
	for i, name := range []string{"d1", "d2", "d3"} {
		join := ""
		if i > 0 {
			join = members[0].GossipAddr()
		}
		members = append(members, startMember(t, name, memberCreds{gossipKey: key}, join))
	}
	waitUntil(t, "three members seeing each other", converged(members), nil)
	for _, c := range members {
		if c.auth != nil {
			t.Fatalf("%s authenticates membership without TLS", c.name)
		}
		for _, r := range rejectReasons {
			if v := refusals(t, c, r); v != 0 {
				t.Fatalf("%s refused %v nodes (%s)", c.name, v, r)
			}
		}
	}
}

// testAuth is the membership check of a peer holding a certificate of ca,
// with the clock at *now.
func testAuth(t *testing.T, ca pki.Pair, now *time.Time) (*auth, tls.Certificate) {
	t.Helper()
	p, err := pki.Issue(ca, "peer", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pki.New(p, ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	a, err := newAuth(cfg.Roots, cfg.Client, cfg.Cert)
	if err != nil {
		t.Fatal(err)
	}
	a.now = func() time.Time { return *now }
	t.Cleanup(a.close)
	return a, cfg.Cert
}

// TestProofBindsIdentity: a proof verifies only for the name, address,
// port and metadata it signed, while the certificate's chain is valid; a
// certificate is taken only when it is the one the proof names and chains
// to the cluster CA; a node of unknown certificate waits for its fetch.
func TestProofBindsIdentity(t *testing.T) {
	now := time.Now()
	ca := newCA(t, "cluster")
	a, cert := testAuth(t, ca, &now)
	md := meta{incarnation: 5, peerAddr: "127.0.0.1:7947", dataAddr: "127.0.0.1:7948"}.encode()
	signed, err := a.sign("m1", "127.0.0.1:7946", md)
	if err != nil {
		t.Fatal(err)
	}
	if len(signed) > memberlist.MetaMaxSize {
		t.Fatalf("metadata of %d bytes, memberlist takes %d", len(signed), memberlist.MetaMaxSize)
	}
	check := func(n *memberlist.Node) (string, *certFetch, error) {
		md, err := decodeMeta(n.Meta)
		if err != nil {
			return rejectBadProof, nil, err
		}
		return a.check(n, md.proof, md.signed, md.peerAddr)
	}
	node := func(name string, port uint16, meta []byte) *memberlist.Node {
		return &memberlist.Node{Name: name, Addr: net.ParseIP("127.0.0.1"), Port: port, Meta: meta}
	}
	// Unknown certificate: refused until fetched.
	reason, fetch, err := check(node("m1", 7946, signed))
	if err == nil || reason != rejectAwaiting || fetch == nil || fetch.peerAddr != "127.0.0.1:7947" || fetch.gossip != "127.0.0.1:7946" {
		t.Fatalf("unknown certificate: %q %+v %v", reason, fetch, err)
	}
	// The certificate arrives (what fetch does after the handshake).
	e, err := a.verifyChain([]*x509.Certificate{cert.Leaf}, a.fpr)
	if err != nil {
		t.Fatal(err)
	}
	a.good[a.fpr] = e
	if reason, _, err := check(node("m1", 7946, signed)); err != nil {
		t.Fatalf("valid proof refused: %s %v", reason, err)
	}
	tampered := slices.Clone(signed)
	tampered[1] ^= 1 // the incarnation
	for what, n := range map[string]*memberlist.Node{
		"another name":     node("m2", 7946, signed),
		"another port":     node("m1", 7000, signed),
		"another address":  {Name: "m1", Addr: net.ParseIP("127.0.0.2"), Port: 7946, Meta: signed},
		"altered metadata": node("m1", 7946, tampered),
	} {
		if reason, _, err := check(n); err == nil || reason != rejectBadProof {
			t.Fatalf("%s: %q %v", what, reason, err)
		}
	}
	if reason, _, err := check(node("m1", 7946, md)); err == nil || reason != rejectNoProof {
		t.Fatalf("no proof: %q %v", reason, err)
	}
	if reason, _, err := check(node("m1", 7946, signed[:len(signed)-3])); err == nil || reason != rejectBadProof {
		t.Fatalf("truncated proof: %q %v", reason, err)
	}
	// The certificate expires while known.
	now = cert.Leaf.NotAfter.Add(time.Second)
	if reason, _, err := check(node("m1", 7946, signed)); err == nil || reason != rejectUntrusted {
		t.Fatalf("expired certificate: %q %v", reason, err)
	}
	now = time.Now()
	// Certificates the fetch must not take.
	if _, err := a.verifyChain([]*x509.Certificate{cert.Leaf}, sha256.Sum256([]byte("another"))); err == nil {
		t.Fatal("a certificate other than the proof names was taken")
	}
	other := newCA(t, "other")
	op, err := pki.Issue(other, "peer", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(op.CertPEM)
	oc, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	var uae x509.UnknownAuthorityError
	if _, err := a.verifyChain([]*x509.Certificate{oc}, sha256.Sum256(oc.Raw)); !errors.As(err, &uae) {
		t.Fatalf("another CA's certificate: %v", err)
	}
}

// TestMembershipHealsAFailedCertificateFetch: the seed's fetch of a joiner's
// certificate fails, and the joiner verifies the seed and pulls its state
// only once the seed holds the failure (so the seed refuses that push/pull).
// The joiner still takes the seed's state from it and keeps the seed in its
// view, so once the seed's hold on the failed certificate ends (its clock
// moved past certRetryAfter) both see each other: one failed fetch does not
// split a two-member cluster for good.
func TestMembershipHealsAFailedCertificateFetch(t *testing.T) {
	key := gossipKeyFile(t)
	ca := newCA(t, "cluster")
	var skew atomic.Int64
	failed := make(chan struct{})
	var once sync.Once
	seed := startMember(t, "s1", issueCreds(t, ca, ca.CertPEM, "s1", time.Hour, key), "", func(c *Cluster) {
		c.auth.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
		c.auth.fault = func(*certFetch) error {
			err := errors.New("injected: the first fetch fails")
			once.Do(func() { close(failed) })
			if skew.Load() == 0 {
				return err
			}
			return nil
		}
	})
	joiner := startMember(t, "j1", issueCreds(t, ca, ca.CertPEM, "j1", time.Hour, key), seed.GossipAddr(), func(c *Cluster) {
		c.auth.fault = func(*certFetch) error { // verify the seed only once it holds our failed certificate
			<-failed
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if refusals(t, seed, rejectUntrusted) >= 1 {
					break
				}
			}
			return nil
		}
	})
	waitUntil(t, "the seed to refuse the joiner's certificate", func() bool { return refusals(t, seed, rejectUntrusted) >= 1 }, nil)
	skew.Store(int64(certRetryAfter + time.Second)) // the seed's hold on the failed certificate ends
	waitUntil(t, "seed and joiner seeing each other", converged([]*Cluster{seed, joiner}), nil)
}
