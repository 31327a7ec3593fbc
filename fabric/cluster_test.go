package fabric

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/pki"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// clusterCreds writes a cluster CA, a peer certificate and a gossip key into
// dir and returns a config setter using them.
type clusterCreds struct{ cert, key, ca, gossipKey string }

func writeCreds(t testing.TB, dir string, gossipKey []byte) clusterCreds {
	t.Helper()
	ca, err := pki.NewCA("test cluster", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := pki.Issue(ca, "peer", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := clusterCreds{cert: filepath.Join(dir, "peer.pem"), key: filepath.Join(dir, "peer-key.pem"),
		ca: filepath.Join(dir, "ca.pem"), gossipKey: filepath.Join(dir, "gossip.key")}
	for path, b := range map[string][]byte{c.cert: peer.CertPEM, c.key: peer.KeyPEM, c.ca: ca.CertPEM,
		c.gossipKey: []byte(base64.StdEncoding.EncodeToString(gossipKey) + "\n")} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func clusterConfig(t testing.TB, creds clusterCreds, join string) Config {
	cfg := smallConfig(t.TempDir())
	cfg.ClusterAddr, cfg.ClusterJoin = "127.0.0.1:0", join
	cfg.ClusterKeyFile, cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = creds.gossipKey, creds.cert, creds.key, creds.ca
	return cfg
}

func (tp *testPeer) gossipAddr() string { return tp.p.cluster.GossipAddr() }

func (tp *testPeer) members() int {
	resp, err := tp.admin.Peers(ctx(tp.t), &pb.PeersRequest{})
	if err != nil {
		tp.t.Fatal(err)
	}
	n := 0
	for _, p := range resp.Peers {
		if p.State == "alive" {
			n++
		}
	}
	return n
}

// waitRemote waits until e's lookup of keys hits want pages, all remote.
func waitRemote(t *testing.T, e *engine, keys [][]byte, want int) {
	t.Helper()
	waitFor(t, "remote pages in the lookup", 10*time.Second, func() bool {
		look, err := e.Lookup(ctx(t), keys, false)
		return err == nil && int(look.HitPages) == want && int(look.Tiers.Remote) == want
	})
}

// TestClusterSharesPages: pages one peer saves are found by the other's
// lookup and loaded byte-exact over the mutual-TLS data plane, from the
// holder's DRAM and from its SSD; a page the holder dropped leaves the
// other's lookups; a holder that leaves takes its pages with it, and a load
// of them fails per page instead of hanging.
func TestClusterSharesPages(t *testing.T) {
	creds := writeCreds(t, t.TempDir(), bytes.Repeat([]byte{7}, 32))
	a := startPeer(t, clusterConfig(t, creds, ""))
	b := startPeer(t, clusterConfig(t, creds, a.gossipAddr()))
	waitFor(t, "two members", 10*time.Second, func() bool { return a.members() == 2 && b.members() == 2 })

	ea, eb := a.engine(tinyFlash), b.engine(tinyFlash)
	keys := randKeys(6)
	src := refs(keys, 0, 4)
	okOp(t)(ea.Save(ctx(t), src[:4], pb.Durability_DURABILITY_DRAM))
	okOp(t)(ea.Save(ctx(t), src[4:], pb.Durability_DURABILITY_SSD))
	if _, err := a.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM, Keys: keys[4:]}); err != nil {
		t.Fatal(err)
	}
	waitRemote(t, eb, keys, 6)

	dst := refs(keys, 32, 4)
	okOp(t)(eb.Load(ctx(t), dst))
	for i := range keys {
		if !bytes.Equal(ea.page(src[i].Blocks), eb.page(dst[i].Blocks)) {
			t.Fatalf("page %d differs after a remote load", i)
		}
	}
	look, err := eb.Lookup(ctx(t), keys, false)
	if err != nil || look.HitPages != 6 || look.Tiers.Dram != 6 {
		t.Fatalf("after the load the pages are b's own: %v %v", look, err)
	}
	if got := b.metric(`orbitkv_cluster_fetched_pages_total{result="ok"}`); !strings.HasSuffix(got, " 6") {
		t.Errorf("fetched pages metric: %q", got)
	}
	if got := b.metric("orbitkv_cluster_fetch_duration_seconds_count"); got == "" || strings.HasSuffix(got, " 0") {
		t.Errorf("the load's fetch was not timed: %q", got)
	}

	// Pages a drops leave b's view of a (b still holds its own copies).
	more := randKeys(3)
	okOp(t)(ea.Save(ctx(t), refs(more, 0, 4), pb.Durability_DURABILITY_DRAM))
	waitRemote(t, eb, more, 3)
	for _, tier := range []pb.Tier{pb.Tier_TIER_DRAM, pb.Tier_TIER_SSD} { // DRAM eviction demotes to SSD first
		if _, err := a.admin.Evict(ctx(t), &pb.EvictRequest{Tier: tier, Keys: more[1:]}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := a.p.cat.Get(mustKey(t, more[1])); ok {
		t.Fatal("page 1 still in a's catalog after eviction from both tiers")
	}
	waitRemote(t, eb, more, 1)

	// The holder leaves: its pages leave b's lookups, and a load naming one
	// fails that page at once.
	a.shutdown()
	waitFor(t, "a to leave", 10*time.Second, func() bool { return b.members() == 1 })
	if look, err := eb.Lookup(ctx(t), more, false); err != nil || look.HitPages != 0 {
		t.Fatalf("lookup after the holder left: %v %v", look, err)
	}
	// At once: the page fails not found without a fetch sent to anyone
	// (no data-plane fetch is timed), so nothing waits on the departed.
	fetches := b.metric("orbitkv_cluster_fetch_duration_seconds_count")
	st, err := eb.Load(ctx(t), refs(more[:1], 40, 4))
	if err != nil || st.Pages[0].Code != pb.PageCode_PAGE_NOT_FOUND {
		t.Fatalf("load of a departed holder's page: %v %v", st, err)
	}
	if got := b.metric("orbitkv_cluster_fetch_duration_seconds_count"); got != fetches {
		t.Fatalf("fetches %q, %q before the load: it sent a fetch for a departed holder's page", got, fetches)
	}
}

// TestClusterSnapshotOnJoinAndRestart: a peer that joins late learns what a
// member already holds from its snapshot; a member restarted from its SSD
// (a new incarnation) is synced again.
func TestClusterSnapshotOnJoinAndRestart(t *testing.T) {
	creds := writeCreds(t, t.TempDir(), bytes.Repeat([]byte{9}, 16))
	cfgA := clusterConfig(t, creds, "")
	a := startPeer(t, cfgA)
	ea := a.engine(tinyFlash)
	keys := randKeys(5)
	okOp(t)(ea.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_SSD))
	ea.Close(ctx(t))

	b := startPeer(t, clusterConfig(t, creds, a.gossipAddr()))
	eb := b.engine(tinyFlash)
	waitRemote(t, eb, keys, 5)

	a.shutdown()
	waitFor(t, "a to leave", 10*time.Second, func() bool { return b.members() == 1 })
	cfgA.ClusterJoin = b.gossipAddr()
	a = startPeer(t, cfgA)
	waitRemote(t, eb, keys, 5)
	resp, err := b.admin.Peers(ctx(t), &pb.PeersRequest{})
	if err != nil || len(resp.Peers) != 2 || resp.Peers[1].Pages != 5 || resp.Peers[1].SyncedUnixMs == 0 {
		t.Fatalf("peers after a's restart: %v %v", resp, err)
	}
}

// TestClusterRefusesOtherKeys: a peer with another gossip key cannot join,
// and its lookups see none of the cluster's pages.
func TestClusterRefusesOtherKeys(t *testing.T) {
	a := startPeer(t, clusterConfig(t, writeCreds(t, t.TempDir(), bytes.Repeat([]byte{1}, 32)), ""))
	ea := a.engine(tinyFlash)
	keys := randKeys(2)
	okOp(t)(ea.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	intruder := startPeer(t, clusterConfig(t, writeCreds(t, t.TempDir(), bytes.Repeat([]byte{2}, 32)), a.gossipAddr()))
	ei := intruder.engine(tinyFlash)
	time.Sleep(2 * time.Second) // a few join attempts
	if a.members() != 1 || intruder.members() != 1 {
		t.Fatalf("members: a sees %d, the intruder %d", a.members(), intruder.members())
	}
	if look, err := ei.Lookup(ctx(t), keys, false); err != nil || look.HitPages != 0 {
		t.Fatalf("intruder lookup: %v %v", look, err)
	}
}

// TestClusterConfigRefusesOpenClusters: a cluster without mutual TLS or a
// gossip key needs --cluster-insecure; half a TLS configuration and an
// over-long node name are refused.
func TestClusterConfigRefusesOpenClusters(t *testing.T) {
	creds := writeCreds(t, t.TempDir(), bytes.Repeat([]byte{4}, 16))
	for name, tc := range map[string]struct {
		edit func(*Config)
		want string // "" = valid
	}{
		"secure":        {func(*Config) {}, ""},
		"no tls":        {func(c *Config) { c.TLSCert, c.TLSKey, c.TLSCA = "", "", "" }, "--cluster-insecure"},
		"no gossip key": {func(c *Config) { c.ClusterKeyFile = "" }, "--cluster-insecure"},
		"insecure, asked": {func(c *Config) {
			c.TLSCert, c.TLSKey, c.TLSCA, c.ClusterKeyFile, c.ClusterInsecure = "", "", "", "", true
		}, ""},
		"half tls":        {func(c *Config) { c.TLSKey = "" }, "all of --tls-cert"},
		"long name":       {func(c *Config) { c.NodeName = strings.Repeat("n", 201) }, "node-name"},
		"no cluster addr": {func(c *Config) { c.ClusterAddr = "" }, "needs --cluster-addr"},
	} {
		cfg := clusterConfig(t, creds, "")
		tc.edit(&cfg)
		err := cfg.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
