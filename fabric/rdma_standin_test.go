//go:build cgo && linux

package fabric

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/orbitkv/orbitkv/internal/pki"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	ibv "github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/rdma/rdmatest"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// TestClusterExchangesRDMAOverStandIn: two peers whose RDMA engines open
// rdma's STAND-IN libibverbs (rdma/testdata/standin_ibverbs.c: a memcpy
// model in this process, NOT HARDWARE) advertise a device, exchange their
// ConnInfo over the mutual-TLS peer service (ExchangeRDMA), connect, and
// then reach each other over RDMA in peers and metrics. On that route a
// remote load of DRAM pages moves their bytes by RDMA READ (placements from
// PlacePages; the engine's read counters move, the TCP data plane serves
// nothing), byte-exact, and the leases are released; SSD-only pages go by
// TCP (counted as fallbacks); a page corrupted in the member's DRAM after
// placement fails its checksum and is not stored; a lease not released
// unpins at its end. Child process: a process holds one libibverbs. Needs
// cc and libibverbs-dev (rdmatest.OverStandIn: skips without;
// ORBITKV_REQUIRE=verbs-headers fails).
func TestClusterExchangesRDMAOverStandIn(t *testing.T) {
	rdmatest.OverStandIn(t, clusterOverStandIn)
}

func clusterOverStandIn(t *testing.T) {
	creds := writeCreds(t, t.TempDir(), bytes.Repeat([]byte{7}, 32))
	a := startPeer(t, clusterConfig(t, creds, ""))
	b := startPeer(t, clusterConfig(t, creds, a.gossipAddr()))
	transportOf := func(tp *testPeer, self bool) (string, string) {
		resp, err := tp.admin.Peers(ctx(t), &pb.PeersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.Peers {
			if p.Self == self {
				return p.Transport, p.TransportReason
			}
		}
		return "", ""
	}
	waitFor(t, "rdma both ways", 15*time.Second, func() bool {
		ta, _ := transportOf(a, false)
		tb, _ := transportOf(b, false)
		return ta == "rdma" && tb == "rdma"
	})
	if tr, why := transportOf(a, true); tr != "rdma" || why != "" {
		t.Fatalf("a's own transport: %s (%s)", tr, why)
	}
	bName := b.p.cluster.Name()
	if got := a.metric(`orbitkv_cluster_member_transport{member="` + bName + `",transport="rdma"}`); !strings.HasSuffix(got, " 1") {
		t.Fatalf("a's transport gauge for b: %q", got)
	}

	ea, eb := a.engine(tinyFlash), b.engine(tinyFlash)
	keys := randKeys(4)
	src := refs(keys, 0, 4)
	okOp(t)(ea.Save(ctx(t), src, pb.Durability_DURABILITY_DRAM))
	waitRemote(t, eb, keys, 4)
	before := rdmaStats(t, b)
	dst := refs(keys, 32, 4)
	okOp(t)(eb.Load(ctx(t), dst))
	for i := range keys {
		if !bytes.Equal(ea.page(src[i].Blocks), eb.page(dst[i].Blocks)) {
			t.Fatalf("page %d differs after a load on the rdma route", i)
		}
	}
	after := rdmaStats(t, b)
	pageBytes := wantsOf(t, a, keys[:1])[0].Size
	if got := after.BytesRead - before.BytesRead; got != 4*pageBytes || after.Batches == before.Batches || after.OpsFailed != before.OpsFailed {
		t.Fatalf("rdma reads for 4 pages of %d bytes: %d bytes, batches %d→%d, failed ops %d→%d",
			pageBytes, got, before.Batches, after.Batches, before.OpsFailed, after.OpsFailed)
	}
	for metric, want := range map[string]string{
		`orbitkv_cluster_transport_fallbacks_total`: " 0", `orbitkv_cluster_rdma_fallback_pages_total`: " 0",
		`orbitkv_cluster_fetched_pages_total{result="ok"}`: " 4",
	} {
		if got := b.metric(metric); !strings.HasSuffix(got, want) {
			t.Fatalf("b's %s with the lane up: %q", metric, got)
		}
	}
	for metric, want := range map[string]uint64{ // Engine.Stats as metrics, read at the scrape
		"orbitkv_rdma_read_bytes_total": after.BytesRead, "orbitkv_rdma_batches_total": after.Batches,
		"orbitkv_rdma_failed_ops_total": after.OpsFailed,
	} {
		var got float64
		if f := strings.Fields(b.metric(metric)); len(f) != 2 {
			t.Fatalf("b exports no %s", metric)
		} else if _, err := fmt.Sscan(f[1], &got); err != nil || got != float64(want) {
			t.Fatalf("b's %s = %s, want %d (Engine.Stats)", metric, f[1], want)
		}
	}
	for metric, want := range map[string]string{ // a's TCP data plane served nothing
		`orbitkv_cluster_served_pages_total`: " 0", `orbitkv_cluster_served_requests_total`: " 0",
		`orbitkv_cluster_placement_leases_total{end="released"}`: " 1",
	} {
		if got := a.metric(metric); !strings.HasSuffix(got, want) {
			t.Fatalf("a's %s after the rdma load: %q", metric, got)
		}
	}
	for i, k := range keys {
		if dram, ssd := a.p.pages.Pinned(mustKey(t, k)); dram || ssd {
			t.Fatalf("a's page %d still pinned after the load", i)
		}
	}

	t.Run("ssd-only pages go by tcp", func(t *testing.T) { standInSSDOnly(t, a, b) })
	t.Run("corrupt in the member's dram", func(t *testing.T) { standInCorrupt(t, a, b) })
	t.Run("lease expiry unpins", func(t *testing.T) { standInLeaseExpiry(t, a, b, creds) })
	t.Run("qp in error", func(t *testing.T) { standInQPError(t, a, b, false) })
	t.Run("qp in error at the holder", func(t *testing.T) { standInQPError(t, a, b, true) })
}

// standInQPError: b's QPs to a (atHolder: a's QPs that answer b) are moved
// to the error state behind the engine's back, as a NIC does on a fatal
// error. The next load's READs fail (b's come back flushed; a's answer
// none: over the stand-in b's retries run out at once, on rxe the batch
// reaches its deadline), and it ends by its deadline, every page right
// (the lane found down, the same call carries them over TCP) or failed,
// none wrong;
// a's leases are released; once b has dialed a fresh connection (5 s
// after the lane went down) or the engine reconnected the lanes, a load
// moves every page by RDMA READ again, a's TCP data plane serving none of
// them.
func standInQPError(t *testing.T, a, b *testPeer, atHolder bool) {
	ea, eb := a.engine(tinyFlash), b.engine(tinyFlash)
	keys := randKeys(4)
	src := refs(keys, 0, 4)
	okOp(t)(ea.Save(ctx(t), src, pb.Durability_DURABILITY_DRAM))
	waitRemote(t, eb, keys, 4)
	fail := func() (int, error) { return b.p.cluster.FailRDMAQPs(a.p.cluster.Name()) }
	if atHolder {
		fail = a.p.cluster.FailAcceptedRDMAQPs
	}
	n, err := fail()
	if err != nil || n == 0 {
		t.Fatalf("QPs into ERR (at the holder: %v): %d moved, %v", atHolder, n, err)
	}
	before, served := rdmaStats(t, b), metricNum(t, a, "orbitkv_cluster_served_pages_total")
	lctx, cancel := context.WithTimeout(context.Background(), 4*time.Second) // inside the session's keepalive
	defer cancel()
	dst := refs(keys, 16, 4)
	start := time.Now()
	st, err := eb.Load(lctx, dst)
	if err != nil {
		t.Fatalf("load over QPs in error: %v", err)
	}
	ok := 0
	for i, pg := range st.Pages {
		if pg.Code != pb.PageCode_PAGE_OK {
			t.Logf("page %d: %v %s", i, pg.Code, pg.Message)
			continue
		}
		if !bytes.Equal(ea.page(src[i].Blocks), eb.page(dst[i].Blocks)) {
			t.Fatalf("page %d answered OK with wrong bytes after the QPs failed", i)
		}
		ok++
	}
	after := rdmaStats(t, b)
	t.Logf("%d QPs in ERR (at the holder: %v): the load took %v, %d of 4 pages right, none wrong; a served %v pages over TCP; b's engine %+v → %+v; lane fallbacks %v",
		n, atHolder, time.Since(start).Round(time.Millisecond), ok, metricNum(t, a, "orbitkv_cluster_served_pages_total")-served,
		before, after, metricNum(t, b, "orbitkv_cluster_transport_fallbacks_total"))
	if after.BytesRead != before.BytesRead || after.OpsFailed == before.OpsFailed {
		t.Fatalf("READs on QPs in error: %d bytes moved, %d ops failed (want 0 bytes, failed ops)",
			after.BytesRead-before.BytesRead, after.OpsFailed-before.OpsFailed)
	}
	waitFor(t, "a's leases released", 10*time.Second, func() bool { return metricNum(t, a, "orbitkv_cluster_placement_leases_held") == 0 })
	standInAllByRDMA(t, a, b, ea, eb, keys, src)
}

// standInAllByRDMA loads keys (dropped from b first) until every page
// arrives by RDMA READ, right (a few loads: a lane left broken reconnects
// on the next batch; one marked down is redialed 5 s later), none over
// a's TCP data plane.
func standInAllByRDMA(t *testing.T, a, b *testPeer, ea, eb *engine, keys [][]byte, src []*pb.PageRef) {
	t.Helper()
	pageBytes := wantsOf(t, a, keys[:1])[0].Size
	for try := 0; ; try++ {
		if _, err := b.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM, Keys: keys}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_SSD, Keys: keys}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a over rdma in b's peers", 15*time.Second, func() bool {
			return metricNum(t, b, `orbitkv_cluster_member_transport{member="`+a.p.cluster.Name()+`",transport="rdma"}`) == 1
		})
		before, served := rdmaStats(t, b), metricNum(t, a, "orbitkv_cluster_served_pages_total")
		dst := refs(keys, 32, 4)
		st, err := eb.Load(ctx(t), dst)
		read := rdmaStats(t, b).BytesRead - before.BytesRead
		right := 0
		for i := range keys {
			if err == nil && st.Pages[i].Code == pb.PageCode_PAGE_OK && bytes.Equal(ea.page(src[i].Blocks), eb.page(dst[i].Blocks)) {
				right++
			}
		}
		t.Logf("reload %d: %d of %d pages right, %d bytes by RDMA READ, a served %v over TCP; b's engine %+v (%v)",
			try, right, len(keys), read, metricNum(t, a, "orbitkv_cluster_served_pages_total")-served, rdmaStats(t, b), err)
		if right == len(keys) && read == uint64(len(keys))*pageBytes && metricNum(t, a, "orbitkv_cluster_served_pages_total") == served {
			return
		}
		if try == 4 {
			t.Fatalf("the lane did not carry the pages by RDMA READ again in %d loads", try+1)
		}
	}
}

// metricNum is the value of one of tp's series (-1 when it has none).
func metricNum(t *testing.T, tp *testPeer, series string) float64 {
	t.Helper()
	f := strings.Fields(tp.metric(series))
	var v float64
	if len(f) != 2 || f[0] != series {
		return -1
	}
	if _, err := fmt.Sscan(f[1], &v); err != nil {
		t.Fatalf("%s: %q", series, f[1])
	}
	return v
}

// rdmaStats is tp's RDMA engine's counters.
func rdmaStats(t *testing.T, tp *testPeer) ibv.Stats {
	t.Helper()
	st, ok := tp.p.cluster.RDMAStats()
	if !ok {
		t.Fatal("no rdma engine")
	}
	return st
}

// standInSSDOnly: pages a holds only on SSD are not placed; the route
// carries them over TCP (a serves them, promoting them), byte-exact.
func standInSSDOnly(t *testing.T, a, b *testPeer) {
	ea, eb := a.engine(tinyFlash), b.engine(tinyFlash)
	keys := randKeys(2)
	src := refs(keys, 0, 4)
	okOp(t)(ea.Save(ctx(t), src, pb.Durability_DURABILITY_SSD))
	if _, err := a.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM, Keys: keys}); err != nil {
		t.Fatal(err)
	}
	waitRemote(t, eb, keys, 2)
	before := rdmaStats(t, b)
	dst := refs(keys, 40, 4)
	okOp(t)(eb.Load(ctx(t), dst))
	for i := range keys {
		if !bytes.Equal(ea.page(src[i].Blocks), eb.page(dst[i].Blocks)) {
			t.Fatalf("ssd page %d differs after a load on the rdma route", i)
		}
	}
	if got := rdmaStats(t, b).BytesRead - before.BytesRead; got != 0 {
		t.Fatalf("rdma read %d bytes of pages not in the member's dram", got)
	}
	if got := b.metric(`orbitkv_cluster_rdma_fallback_pages_total`); !strings.HasSuffix(got, " 2") {
		t.Fatalf("b's fallback pages: %q", got)
	}
	if got := a.metric(`orbitkv_cluster_served_pages_total`); !strings.HasSuffix(got, " 2") {
		t.Fatalf("a's tcp served pages: %q", got)
	}
}

// standInCorrupt: a page placed (so sealed), then corrupted in a's DRAM,
// arrives by RDMA, fails its checksum at b and is not stored.
func standInCorrupt(t *testing.T, a, b *testPeer) {
	ea, eb := a.engine(tinyFlash), b.engine(tinyFlash)
	keys := randKeys(2)
	okOp(t)(ea.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	waitRemote(t, eb, keys, 2)
	k := mustKey(t, keys[1])
	placed, release := a.p.pages.PlaceDRAM(wantsOf(t, a, keys[1:]))
	if !placed[0].OK {
		t.Fatal("a did not place its dram page")
	}
	a.p.pages.DRAMRegion().Host[placed[0].Off+5] ^= 0x5a
	release()
	before := rdmaStats(t, b)
	st, err := eb.Load(ctx(t), refs(keys, 48, 4))
	if err != nil || st.Pages[0].Code != pb.PageCode_PAGE_OK || st.Pages[1].Code == pb.PageCode_PAGE_OK {
		t.Fatalf("load with a page corrupt in the member's dram: %v %v", st, err)
	}
	if rdmaStats(t, b).BytesRead == before.BytesRead {
		t.Fatal("the pages did not move by rdma")
	}
	if got := b.metric(`orbitkv_cluster_fetched_pages_total{result="corrupt"}`); !strings.HasSuffix(got, " 1") {
		t.Fatalf("b's corrupt fetches: %q", got)
	}
	if _, ok := b.p.cat.Get(k); ok {
		t.Fatal("b stored the corrupt page")
	}
}

// standInLeaseExpiry: a lease b never releases ends at its deadline and
// unpins a's page; a page a holds no more answers not in DRAM.
func standInLeaseExpiry(t *testing.T, a, b *testPeer, creds clusterCreds) {
	ea := a.engine(tinyFlash)
	keys := randKeys(1)
	okOp(t)(ea.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	want := wantsOf(t, a, keys)[0]
	cl := peerServiceOf(t, b, a, creds)
	absent := mustKey(t, randKeys(1)[0])
	resp, err := cl.PlacePages(ctx(t), &pb.PlaceRequest{From: b.p.cluster.Name(), Layout: want.Layout[:], Size: want.Size,
		Keys: append(want.Key[:], absent[:]...), LeaseMs: 200})
	if err != nil || resp.Lease == 0 || len(resp.Pages) != 2 || !resp.Pages[0].InDram || resp.Pages[1].InDram || resp.LeaseMs != 200 {
		t.Fatalf("placement: %v %v", resp, err)
	}
	if p := resp.Pages[0]; p.Length != want.Size || p.Checksum == 0 {
		t.Fatalf("placement's header: %v", p)
	}
	if dram, _ := a.p.pages.Pinned(want.Key); !dram {
		t.Fatal("the placed page is not pinned")
	}
	waitFor(t, "the lease to end", 5*time.Second, func() bool { dram, _ := a.p.pages.Pinned(want.Key); return !dram })
	if got := a.metric(`orbitkv_cluster_placement_leases_total{end="expired"}`); !strings.HasSuffix(got, " 1") {
		t.Fatalf("a's expired leases: %q", got)
	}
	if rel, err := cl.ReleasePlacements(ctx(t), &pb.ReleasePlacementsRequest{Lease: resp.Lease}); err != nil || rel.Released {
		t.Fatalf("release after expiry: %v %v", rel, err)
	}
}

// wantsOf is what a's catalog holds of keys, as placement requests.
func wantsOf(t *testing.T, a *testPeer, keys [][]byte) []tcp.Want {
	t.Helper()
	out := make([]tcp.Want, len(keys))
	for i, kb := range keys {
		e, ok := a.p.cat.Get(mustKey(t, kb))
		if !ok {
			t.Fatalf("page %d not in a's catalog", i)
		}
		out[i] = tcp.Want{Key: e.Key, Layout: e.Layout, Size: e.Size}
	}
	return out
}

// peerServiceOf dials to's peer service with the cluster's mutual TLS.
func peerServiceOf(t *testing.T, from, to *testPeer, creds clusterCreds) pb.PeerServiceClient {
	t.Helper()
	resp, err := from.admin.Peers(ctx(t), &pb.PeersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	addr := ""
	for _, p := range resp.Peers {
		if p.Name == to.p.cluster.Name() {
			addr = p.PeerAddr
		}
	}
	tlsc, err := pki.LoadFiles(creds.cert, creds.key, creds.ca)
	if err != nil || addr == "" {
		t.Fatalf("peer address %q: %v", addr, err)
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsc.Client)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewPeerServiceClient(cc)
}
