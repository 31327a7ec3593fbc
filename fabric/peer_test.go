package fabric

import (
	"bytes"
	"github.com/orbitkv/orbitkv/fabric/store"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

func TestSaveLoadByteExact(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(6)
	src := refs(keys, 0, 4)
	st, err := e.Save(ctx(t), src, pb.Durability_DURABILITY_DRAM)
	mustOK(t, st, err)

	look, err := e.Lookup(ctx(t), append(keys, randKeys(2)...), false)
	if err != nil || look.HitPages != 6 || look.Tiers.Dram != 6 {
		t.Fatalf("lookup: %v %v", look, err)
	}
	dst := refs(keys, 32, 4)
	st, err = e.Load(ctx(t), dst)
	mustOK(t, st, err)
	for i := range keys {
		if !bytes.Equal(e.page(src[i].Blocks), e.page(dst[i].Blocks)) {
			t.Fatalf("page %d differs after load", i)
		}
	}
	if got := tp.metric("orbitkv_fabric_loaded_tokens_total"); !strings.HasSuffix(got, " 96") {
		t.Fatalf("loaded tokens metric: %q, want 96", got)
	}
}

// TestWaitingCalls: a Save or Load that asks to wait answers with the
// finished status and leaves no operation behind; one that does not answers
// with a handle its Wait completes.
func TestWaitingCalls(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(3)
	h, err := e.C.Save(ctx(t), &pb.SaveRequest{SessionId: e.Session, Pages: refs(keys, 0, 4), Wait: true})
	if err != nil || !h.Status.GetDone() || len(h.Status.Pages) != 3 {
		t.Fatalf("waiting save answered %v, %v; want a done status of 3 pages", h, err)
	}
	mustOK(t, h.Status, nil)
	if _, err := e.C.Wait(ctx(t), &pb.WaitRequest{SessionId: e.Session, OpId: h.OpId}); status.Code(err) != codes.NotFound {
		t.Fatalf("Wait on a waited save: %v, want NotFound (forgotten)", err)
	}
	h, err = e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: refs(keys, 32, 4)})
	if err != nil || h.Status != nil {
		t.Fatalf("load without wait answered %v, %v; want a bare handle", h, err)
	}
	st, err := e.Wait(ctx(t), h.OpId)
	mustOK(t, st, err)
	h, err = e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: refs(append(keys, randKeys(1)...), 32, 4), Wait: true})
	if err != nil || !h.Status.GetDone() || h.Status.Pages[3].Code != pb.PageCode_PAGE_NOT_FOUND || h.Status.Pages[0].Code != pb.PageCode_PAGE_OK {
		t.Fatalf("waiting load answered %v, %v; want pages 0-2 OK, page 3 not found", h, err)
	}
	for i := range keys {
		if !bytes.Equal(e.page(refs(keys, 0, 4)[i].Blocks), e.page(refs(keys, 32, 4)[i].Blocks)) {
			t.Fatalf("page %d differs", i)
		}
	}
}

// TestLoadSkipsLocalBlocks loads pages whose leading blocks the engine
// already holds (a partial local prefix hit): the skipped blocks stay as
// they were, the others get their own bytes of the page blob.
func TestLoadSkipsLocalBlocks(t *testing.T) {
	for _, tier := range []pb.Durability{pb.Durability_DURABILITY_DRAM, pb.Durability_DURABILITY_SSD} {
		t.Run(tier.String(), func(t *testing.T) {
			tp := startPeer(t, smallConfig(t.TempDir()))
			e := tp.engine(tinyFlash)
			keys := randKeys(2)
			src := refs(keys, 0, 4)
			okOp(t)(e.Save(ctx(t), src, tier))
			if tier == pb.Durability_DURABILITY_SSD {
				if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM}); err != nil {
					t.Fatal(err)
				}
			}
			dst := refs(keys, 32, 4)
			local := e.page([]uint32{32, 33, 34}) // blocks 32..34 are "computed locally"
			srcPage0 := e.page(src[0].Blocks)
			skip := ^uint32(0)
			dst[0].Blocks = []uint32{skip, skip, skip, 35}
			okOp(t)(e.Load(ctx(t), dst))
			if !bytes.Equal(e.page([]uint32{32, 33, 34}), local) {
				t.Fatal("skipped blocks were overwritten")
			}
			// Block 35 gets block 3 of page 0 (blob offsets unchanged by the skips).
			if !bytes.Equal(e.page([]uint32{35}), e.page([]uint32{3})) {
				t.Fatal("block 35 does not hold page 0's last block")
			}
			if bytes.Equal(e.page([]uint32{32, 33, 34, 35}), srcPage0) {
				t.Fatal("engine random bytes collide with the page: test is vacuous")
			}
			if !bytes.Equal(e.page(dst[1].Blocks), e.page(src[1].Blocks)) {
				t.Fatal("page 1 differs after load")
			}
			// One block of page 0 plus all of page 1: 5 blocks of 4 tokens.
			if got := tp.metric("orbitkv_fabric_loaded_tokens_total"); !strings.HasSuffix(got, " 20") {
				t.Fatalf("loaded tokens %q, want 20 (skipped blocks not counted)", got)
			}
		})
	}
}

func TestLoadMissingPageIsPerPage(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(3)
	okOp(t)(e.Save(ctx(t), refs(keys[:2], 0, 4), pb.Durability_DURABILITY_DRAM))
	st, err := e.Load(ctx(t), refs(keys, 20, 4))
	if err != nil {
		t.Fatal(err)
	}
	want := []pb.PageCode{pb.PageCode_PAGE_OK, pb.PageCode_PAGE_OK, pb.PageCode_PAGE_NOT_FOUND}
	for i, p := range st.Pages {
		if p.Code != want[i] {
			t.Fatalf("page %d: %v, want %v", i, p.Code, want[i])
		}
	}
}

// TestEvictionDemotesAndPromotes overfills a 4 MiB DRAM pool: the oldest
// pages move to SSD and come back byte-exact.
func TestEvictionDemotesAndPromotes(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	f := tinyFlash
	f.NumBlocks, f.HeadDim = 512, 128 // 64 KiB pages: 64 fit in DRAM
	e := tp.engine(f)
	keys := randKeys(100)
	src := refs(keys, 0, 4)
	for i := 0; i < len(keys); i += 10 {
		okOp(t)(e.Save(ctx(t), src[i:i+10], pb.Durability_DURABILITY_DRAM))
	}
	look, err := e.Lookup(ctx(t), keys, false)
	if err != nil || look.HitPages != 100 || look.Tiers.Ssd == 0 {
		t.Fatalf("lookup after overfill: %v %v", look, err)
	}
	// Load the oldest 10 (on SSD) into the top of the buffer.
	dst := refs(keys[:10], 400, 4)
	st, err := e.Load(ctx(t), dst)
	mustOK(t, st, err)
	for i := range dst {
		if st.Pages[i].Tier != pb.Tier_TIER_SSD {
			t.Fatalf("page %d came from %v, want SSD", i, st.Pages[i].Tier)
		}
		if !bytes.Equal(e.page(src[i].Blocks), e.page(dst[i].Blocks)) {
			t.Fatalf("page %d differs after demotion and promotion", i)
		}
	}
	if tp.metric("orbitkv_tiers_demoted_pages_total") == "" {
		t.Fatal("no demotion metric")
	}
}

func TestLeasePinsAndBudget(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	cfg.SSDBytes = 0 // evicted pages are dropped: only pins keep them
	f := tinyFlash
	f.NumBlocks, f.HeadDim = 512, 128
	page := uint64(f.BlockBytes() * 2 * f.Layers * 4)
	cfg.QueryBudgetBytes = 5 * 64 << 10
	tp := startPeer(t, cfg)
	e := tp.engine(f)
	keys := randKeys(8)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	look, err := e.Lookup(ctx(t), keys, true)
	if err != nil {
		t.Fatal(err)
	}
	if page != 64<<10 || look.HitPages != 5 || look.LeaseId == "" {
		t.Fatalf("lease within a 5-page budget: hit %d lease %q (page %d)", look.HitPages, look.LeaseId, page)
	}
	// The 3 stored pages the budget cut are told apart from misses.
	if got := tp.metric("orbitkv_fabric_lookup_budget_cut_pages_total"); got != "orbitkv_fabric_lookup_budget_cut_pages_total 3" {
		t.Fatalf("budget cut after an 8-page hit cut to 5: %q", got)
	}
	// Fill DRAM with other pages: leased ones must survive.
	for i := 0; i < 8; i++ {
		_, _ = e.Save(ctx(t), refs(randKeys(10), 100, 4), pb.Durability_DURABILITY_DRAM)
	}
	look2, err := e.Lookup(ctx(t), keys[:5], false)
	if err != nil || look2.HitPages != 5 {
		t.Fatalf("leased pages evicted: %v %v", look2, err)
	}
	if _, err := e.C.Release(ctx(t), &pb.ReleaseRequest{SessionId: e.Session, LeaseId: look.LeaseId}); err != nil {
		t.Fatal(err)
	}
	if got := tp.metric("orbitkv_fabric_query_bytes"); got != "orbitkv_fabric_query_bytes 0" {
		t.Fatalf("query bytes after release: %q", got)
	}
	_, err = e.C.Release(ctx(t), &pb.ReleaseRequest{SessionId: e.Session, LeaseId: look.LeaseId})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("second release: %v, want NotFound", err)
	}
}

// TestLookupLeasesOnlyPastTheEnginesOwnPages: a lookup whose engine holds
// the first pages itself (lease_from) still needs them stored for its hit,
// but leases, pins and charges to the query budget only the pages after
// them: a hit the budget cut to 5 pages from page 0 fits whole from page 3,
// and the engine's pages are evicted like any unpinned page.
func TestLookupLeasesOnlyPastTheEnginesOwnPages(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	cfg.SSDBytes = 0 // evicted pages are dropped: only pins keep them
	cfg.QueryBudgetBytes = 5 * 64 << 10
	f := tinyFlash
	f.NumBlocks, f.HeadDim = 512, 128 // 64 KiB pages
	tp := startPeer(t, cfg)
	e := tp.engine(f)
	keys := randKeys(8)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	lookup := func(from uint32, lease bool) (*pb.LookupResponse, error) {
		return e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: e.Session, Keys: keys, Lease: lease, LeaseFrom: from})
	}
	look, err := lookup(3, true)
	if err != nil || look.HitPages != 8 || look.BudgetCutPages != 0 || look.LeaseId == "" || look.Tiers.Dram != 5 {
		t.Fatalf("lease from page 3 in a 5-page budget: %v, %v; want hit 8, no cut, a lease, 5 DRAM pages", look, err)
	}
	if got := tp.metric("orbitkv_fabric_query_bytes"); got != "orbitkv_fabric_query_bytes "+strconv.Itoa(5*64<<10) {
		t.Fatalf("query bytes: %q, want the 5 pages past the engine's", got)
	}
	// All held by the engine: a hit, nothing to lease.
	if all, err := lookup(8, true); err != nil || all.HitPages != 8 || all.LeaseId != "" || all.Tiers.Dram != 0 {
		t.Fatalf("lease from the end: %v, %v; want hit 8 and no lease", all, err)
	}
	if _, err := lookup(9, true); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("lease_from past the keys: %v, want InvalidArgument", err)
	}
	// Fill DRAM with other pages: the leased pages survive, the engine's go.
	for range 8 {
		_, _ = e.Save(ctx(t), refs(randKeys(10), 100, 4), pb.Durability_DURABILITY_DRAM)
	}
	if tail, err := e.Lookup(ctx(t), keys[3:], false); err != nil || tail.HitPages != 5 {
		t.Fatalf("leased pages evicted: %v %v", tail, err)
	}
	if head, err := e.Lookup(ctx(t), keys[:3], false); err != nil || head.HitPages == 3 {
		t.Fatalf("the engine's own pages stayed pinned: %v %v", head, err)
	}
	if _, err := e.C.Release(ctx(t), &pb.ReleaseRequest{SessionId: e.Session, LeaseId: look.LeaseId}); err != nil {
		t.Fatal(err)
	}
	if got := tp.metric("orbitkv_fabric_query_bytes"); got != "orbitkv_fabric_query_bytes 0" {
		t.Fatalf("query bytes after release: %q", got)
	}
}

// TestLoadEndsItsLease: a Load naming a lease with end_lease frees the
// lease's query budget when the load ends; a later Release answers NotFound
// and a Load without end_lease leaves the lease alone.
func TestLoadEndsItsLease(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(4)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	load := func(end bool) string {
		t.Helper()
		look, err := e.Lookup(ctx(t), keys, true)
		if err != nil || look.LeaseId == "" {
			t.Fatalf("lookup: %v %v", look, err)
		}
		h, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, LeaseId: look.LeaseId, Pages: refs(keys, 32, 4), Wait: true, EndLease: end})
		mustOK(t, h.GetStatus(), err)
		return look.LeaseId
	}
	kept := load(false)
	if got := tp.metric("orbitkv_fabric_leases"); got != "orbitkv_fabric_leases 1" {
		t.Fatalf("a load without end_lease ended its lease: %q", got)
	}
	if _, err := e.C.Release(ctx(t), &pb.ReleaseRequest{SessionId: e.Session, LeaseId: kept}); err != nil {
		t.Fatal(err)
	}
	ended := load(true)
	for _, m := range []string{"orbitkv_fabric_leases 0", "orbitkv_fabric_query_bytes 0"} {
		if got := tp.metric(strings.Fields(m)[0]); got != m {
			t.Fatalf("after a load with end_lease: %q, want %q", got, m)
		}
	}
	_, err := e.C.Release(ctx(t), &pb.ReleaseRequest{SessionId: e.Session, LeaseId: ended})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("release of an ended lease: %v, want NotFound", err)
	}
}

func TestSessionLossReleasesLeases(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	f := tinyFlash
	req := f.OpenRequest("m", "")
	_ = req
	e := tp.engine(f)
	keys := randKeys(4)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	// A second session with a short keepalive takes a lease and goes silent.
	shortReq := f.OpenRequest("m", e.shm.Path)
	shortReq.KeepaliveMs = 200
	s2, err := e.C.OpenSession(ctx(t), shortReq)
	if err != nil {
		t.Fatal(err)
	}
	look, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: s2.SessionId, Keys: keys, Lease: true})
	if err != nil || look.HitPages != 4 {
		t.Fatalf("lookup: %v %v", look, err)
	}
	waitFor(t, "the silent session's lease to be released", 5*time.Second, func() bool {
		return tp.metric("orbitkv_fabric_leases") == "orbitkv_fabric_leases 0"
	})
	_, err = e.C.Keepalive(ctx(t), &pb.KeepaliveRequest{SessionId: s2.SessionId})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("keepalive of a reaped session: %v, want NotFound", err)
	}
}

// TestCorruptSSDPage flips a byte of one page on disk: loading it fails for
// that page only, and the page leaves the catalog.
func TestCorruptSSDPage(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(4)
	src := refs(keys, 0, 4)
	okOp(t)(e.Save(ctx(t), src, pb.Durability_DURABILITY_SSD))
	if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM}); err != nil {
		t.Fatal(err)
	}
	ent, ok := tp.p.cat.Get(mustKey(t, keys[2]))
	if !ok || !ent.OnSSD || ent.DRAMSlot >= 0 {
		t.Fatalf("page 2 should be on SSD only: %+v", ent)
	}
	flipByte(t, filepath.Join(tp.cfg.DataDir, "ssd"), ent.SSD.File, int64(ent.SSD.Offset)+4096+100)

	dst := refs(keys, 40, 4)
	st, err := e.Load(ctx(t), dst)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range st.Pages {
		want := pb.PageCode_PAGE_OK
		if i == 2 {
			want = pb.PageCode_PAGE_CORRUPT
		}
		if p.Code != want {
			t.Fatalf("page %d: %v (%s), want %v", i, p.Code, p.Message, want)
		}
		if want == pb.PageCode_PAGE_OK && !bytes.Equal(e.page(src[i].Blocks), e.page(dst[i].Blocks)) {
			t.Fatalf("page %d differs", i)
		}
	}
	look, err := tp.admin.CatalogLookup(ctx(t), &pb.CatalogLookupRequest{Keys: keys})
	if err != nil || look.HitPages != 2 {
		t.Fatalf("after corruption the chain should end at page 2: %v %v", look, err)
	}
	if !strings.HasSuffix(tp.metric("orbitkv_fabric_corrupt_pages_total"), " 1") {
		t.Fatal("corrupt page not counted")
	}
}

func TestRestartRecoversSSDPages(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	tp := startPeer(t, cfg)
	e := tp.engine(tinyFlash)
	keys := randKeys(5)
	src := refs(keys, 0, 4)
	okOp(t)(e.Save(ctx(t), src[:3], pb.Durability_DURABILITY_SSD))
	okOp(t)(e.Save(ctx(t), src[3:], pb.Durability_DURABILITY_DRAM))
	want := [][]byte{e.page(src[0].Blocks), e.page(src[1].Blocks), e.page(src[2].Blocks)}
	tp.shutdown()

	tp2 := startPeer(t, cfg)
	e2 := tp2.engine(tinyFlash)
	look, err := e2.Lookup(ctx(t), keys, false)
	if err != nil || look.HitPages != 3 || look.Tiers.Ssd != 3 {
		t.Fatalf("after restart: %v %v (want the 3 SSD pages)", look, err)
	}
	dst := refs(keys[:3], 30, 4)
	okOp(t)(e2.Load(ctx(t), dst))
	for i := range dst {
		if !bytes.Equal(want[i], e2.page(dst[i].Blocks)) {
			t.Fatalf("page %d differs after restart", i)
		}
	}
}

func TestGaugesDrainToZero(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(8)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_SSD))
	look, err := e.Lookup(ctx(t), keys, true)
	if err != nil {
		t.Fatal(err)
	}
	okOp(t)(e.Load(ctx(t), refs(keys, 32, 4)))
	if _, err := e.C.Release(ctx(t), &pb.ReleaseRequest{SessionId: e.Session, LeaseId: look.LeaseId}); err != nil {
		t.Fatal(err)
	}
	d, err := tp.admin.Drain(ctx(t), &pb.DrainRequest{TimeoutMs: 5000})
	if err != nil || !d.Idle {
		t.Fatalf("drain: %v %v", d, err)
	}
	for _, g := range []string{"orbitkv_fabric_leases", "orbitkv_fabric_query_bytes", "orbitkv_transfer_inflight_copies",
		"orbitkv_transfer_inflight_ops", "orbitkv_tiers_ssd_inflight"} {
		if got := tp.metric(g); got != g+" 0" {
			t.Errorf("gauge %q, want 0", got)
		}
	}
}

func flipByte(t *testing.T, dir string, file uint32, off int64) {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(dir, "*.pages"))
	if int(file) >= len(matches) {
		t.Fatalf("no ssd file %d in %v", file, matches)
	}
	f, err := os.OpenFile(matches[file], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	f.ReadAt(b, off)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestSSDFullDropsOldest overfills both tiers: the oldest pages leave, the
// newest stay loadable, and no save fails.
func TestSSDFullDropsOldest(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	cfg.SSDBytes, cfg.SSDFileBytes = 64<<20, 64<<20
	tp := startPeer(t, cfg)
	f := tinyFlash
	f.NumBlocks, f.HeadDim = 400, 2048 // 1 MiB pages: 4 fit in DRAM, ~60 on SSD
	e := tp.engine(f)
	keys := randKeys(100)
	src := refs(keys, 0, 4)
	for i := 0; i < len(keys); i += 10 {
		okOp(t)(e.Save(ctx(t), src[i:i+10], pb.Durability_DURABILITY_DRAM))
	}
	first, err := e.Lookup(ctx(t), keys[:1], false)
	if err != nil || first.HitPages != 0 {
		t.Fatalf("the oldest page should have been dropped: %v %v", first, err)
	}
	last, err := e.Lookup(ctx(t), keys[90:], false)
	if err != nil || last.HitPages != 10 {
		t.Fatalf("the newest pages should be held: %v %v", last, err)
	}
	dst := refs(keys[95:], 0, 4)
	okOp(t)(e.Load(ctx(t), dst))
	for i := range dst {
		if !bytes.Equal(e.page(src[95+i].Blocks), e.page(dst[i].Blocks)) {
			t.Fatalf("page %d differs", 95+i)
		}
	}
	if tp.metric(`orbitkv_tiers_evicted_pages_total{tier="ssd"}`) == "" {
		t.Fatal("no ssd eviction counted")
	}
}

// TestEvictionTrimsPrefixesFromTheTail saves one long prefix into a DRAM-only
// peer that holds 64 of its 80 pages: what survives is a usable head.
func TestEvictionTrimsPrefixesFromTheTail(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	cfg.SSDBytes = 0
	tp := startPeer(t, cfg)
	f := tinyFlash
	f.NumBlocks, f.HeadDim = 512, 128 // 64 KiB pages: 64 fit in DRAM
	e := tp.engine(f)
	keys := randKeys(80)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	look, err := e.Lookup(ctx(t), keys, false)
	if err != nil || look.HitPages < 48 {
		t.Fatalf("the head of the prefix should survive: hit %v, %v", look.GetHitPages(), err)
	}
}

// TestLookupLeavesSlowSSDToRecompute: a session that declares its engine's
// prefill rate gets lookups that stop at the first SSD-only page while the
// peer's measured SSD reads are slower than recomputing, and whole hits
// otherwise: without a rate, before any measured read, with a fast disk, and
// once the measurement is stale.
func TestLookupLeavesSlowSSDToRecompute(t *testing.T) {
	clock := newFakeClock()
	cfg := smallConfig(t.TempDir())
	cfg.Now, cfg.Keepalive = clock.Now, time.Hour // the clock moves past keepalives
	tp := startPeer(t, cfg)
	e := tp.engine(tinyFlash)
	req := tinyFlash.OpenRequest("m", e.shm.Path)
	req.RecomputeTokensPerS = 1000 // tinyFlash pages: 16 tokens = 16 ms to recompute
	fast, err := e.C.OpenSession(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	keys := randKeys(4)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM}); err != nil {
		t.Fatal(err)
	}
	lookup := func(sid string) *pb.LookupResponse {
		t.Helper()
		r, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: sid, Keys: keys})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	want := func(what string, r *pb.LookupResponse, hit, dram, ssd, recompute uint32) {
		t.Helper()
		if r.HitPages != hit || r.Tiers.Dram != dram || r.Tiers.Ssd != ssd || r.RecomputePages != recompute {
			t.Fatalf("%s: hit %d (dram %d, ssd %d), recompute %d; want %d (%d, %d), %d",
				what, r.HitPages, r.Tiers.Dram, r.Tiers.Ssd, r.RecomputePages, hit, dram, ssd, recompute)
		}
	}
	want("no SSD read measured yet", lookup(fast.SessionId), 4, 0, 4, 0)
	setRate := tp.p.pages.SetSSDReadRate
	// A page restores in pageBytes/rate seconds and recomputes in
	// PageTokens/1000 seconds: the break-even rate is pageBytes·1000/PageTokens.
	pageBytes := float64(tinyFlash.Size()/tinyFlash.NumBlocks) * 4 // one page: 4 blocks
	even := pageBytes * 1000 / float64(tinyFlash.PageTokens)
	slow, quick := even/4, even*4
	setRate(slow)
	want("slow SSD", lookup(fast.SessionId), 0, 0, 0, 4)
	want("slow SSD, session without a rate", lookup(e.Session), 4, 0, 4, 0)
	// Pages the engine holds itself are not judged: it reads none of them.
	held, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: fast.SessionId, Keys: keys, LeaseFrom: 4})
	if err != nil {
		t.Fatal(err)
	}
	want("slow SSD, every page held by the engine", held, 4, 0, 0, 0)
	// The rate an engine measures now and sends with the lookup overrides the
	// session's: a session that declared none is cut, one recomputing 16x
	// slower than it declared restores again.
	withRate := func(sid string, rate uint32) *pb.LookupResponse {
		t.Helper()
		r, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: sid, Keys: keys, RecomputeTokensPerS: rate})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	want("slow SSD, rate sent with the lookup", withRate(e.Session, 1000), 0, 0, 0, 4)
	want("slow SSD, engine slower than declared", withRate(fast.SessionId, 1000/16), 4, 0, 4, 0)
	// Promote pages 0 and 1 into DRAM: the hit keeps that DRAM prefix.
	okOp(t)(e.Load(ctx(t), refs(keys[:2], 32, 4)))
	if _, fresh := tp.p.pages.SSDReadRate(); !fresh {
		t.Fatal("an SSD read left no rate measurement")
	}
	setRate(slow)
	want("slow SSD after a DRAM prefix", lookup(fast.SessionId), 2, 2, 0, 2)
	if got := tp.metric("orbitkv_fabric_lookup_recompute_pages_total"); got != "orbitkv_fabric_lookup_recompute_pages_total 10" {
		t.Fatalf("metric %q, want 10", got)
	}
	// The engine holds page 0: the cut is judged on pages 1–3 (DRAM, SSD,
	// SSD) and falls after page 1.
	past, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: fast.SessionId, Keys: keys, LeaseFrom: 1})
	if err != nil {
		t.Fatal(err)
	}
	want("slow SSD after a DRAM prefix, page 0 held by the engine", past, 2, 1, 0, 2)
	setRate(quick)
	want("fast SSD", lookup(fast.SessionId), 4, 2, 2, 0)
	setRate(slow)
	clock.Advance(2 * store.SSDRateTTL)
	want("stale measurement: a probe restores one SSD page", lookup(fast.SessionId), 3, 2, 1, 1)
	want("stale measurement: the others keep the last rate", lookup(fast.SessionId), 2, 2, 0, 2)
	clock.Advance(2 * store.SSDProbeEvery)
	want("a probe that led to no read: another one", lookup(fast.SessionId), 3, 2, 1, 1)
}

// TestFlusherKeepsRoomFree: with an SSD tier, once saves fill DRAM past its
// reserve the flusher demotes the oldest pages in the background until an
// eighth of the pool is free again, so the next save need not wait for the
// disk; every page stays findable.
func TestFlusherKeepsRoomFree(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	f := tinyFlash
	f.NumBlocks, f.HeadDim = 512, 128 // 64 KiB pages: 64 fit in DRAM
	e := tp.engine(f)
	keys := randKeys(60)
	src := refs(keys, 0, 4)
	for i := 0; i < len(keys); i += 10 {
		okOp(t)(e.Save(ctx(t), src[i:i+10], pb.Durability_DURABILITY_DRAM))
	}
	waitFor(t, "the flusher to free an eighth of DRAM", 10*time.Second, func() bool {
		st := tp.p.pages.PoolStats()
		return st.CapacityBytes-st.UsedBytes >= st.CapacityBytes/8 // the store's flushReserve
	})
	if got := tp.metric("orbitkv_tiers_demoted_pages_total"); got == "orbitkv_tiers_demoted_pages_total 0" {
		t.Fatal("room was made without demoting")
	}
	if got := tp.metric("orbitkv_tiers_flusher_busy_seconds_total"); got == "" || got == "orbitkv_tiers_flusher_busy_seconds_total 0" {
		t.Fatalf("the flusher's work is not counted: %q", got)
	}
	look, err := e.Lookup(ctx(t), keys, false)
	if err != nil || look.HitPages != 60 || look.Tiers.Ssd == 0 {
		t.Fatalf("lookup after flushing: %v %v; want all 60 found, some on SSD", look, err)
	}
}

// TestLookupsCountWhatTheyAskFor: every page a lookup names counts as asked
// for, hit or miss, lease or not, the engine's own pages included: what a
// readmission into a full DRAM tier is judged by (fabric/store/readmit.go).
func TestLookupsCountWhatTheyAskFor(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(4)
	okOp(t)(e.Save(ctx(t), refs(keys[:2], 0, 4), pb.Durability_DURABILITY_DRAM))
	if _, err := e.Lookup(ctx(t), keys, true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: e.Session, Keys: keys[:3], LeaseFrom: 1}); err != nil {
		t.Fatal(err)
	}
	// The peer counts off the lookups' path (store.RunAsks): soon, not at once.
	deadline := time.Now().Add(5 * time.Second)
	for i, want := range []uint8{2, 2, 2, 1} {
		k, err := pagekey.FromBytes(keys[i])
		if err != nil {
			t.Fatal(err)
		}
		got := tp.p.pages.AskedLately(k)
		for got < want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
			got = tp.p.pages.AskedLately(k)
		}
		if got != want {
			t.Errorf("page %d asked for %d times, counted %d", i, want, got)
		}
	}
}
