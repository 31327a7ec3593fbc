package fabric

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/page"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// Page integrity (issue 9): what a peer serves always matches what the
// catalog records, whatever happened to the page's copies.

// loadExpect loads keys into blocks from first on and checks each page is
// OK and holds want[i].
func loadExpect(t *testing.T, e *engine, keys [][]byte, first uint32, want [][]byte, when string) {
	t.Helper()
	dst := refs(keys, first, 4)
	st, err := e.Load(ctx(t), dst)
	if err != nil {
		t.Fatalf("%s: load: %v", when, err)
	}
	for i, p := range st.Pages {
		if p.Code != pb.PageCode_PAGE_OK {
			t.Fatalf("%s: page %d: %v (%s), want OK", when, i, p.Code, p.Message)
		}
		if !bytes.Equal(want[i], e.page(dst[i].Blocks)) {
			t.Fatalf("%s: page %d holds other bytes than the durable save's", when, i)
		}
	}
}

func pagesOf(e *engine, rs []*pb.PageRef) [][]byte {
	out := make([][]byte, len(rs))
	for i, r := range rs {
		out[i] = e.page(r.Blocks)
	}
	return out
}

// TestResaveDRAMThenSSD saves pages with DRAM durability, then the same
// keys again with SSD durability, from the same bytes and from other bytes
// (nondeterministic KV). The SSD save's bytes are what every copy serves:
// from DRAM, from SSD once the DRAM copy is evicted, and after a restart on
// the same data dir. Before the fix the entry kept the first save's
// generation (the SSD header has the second's), so the SSD copy loaded as
// PAGE_CORRUPT, and with other bytes the DRAM copy disagreed with the
// entry's checksum.
func TestResaveDRAMThenSSD(t *testing.T) {
	for _, tc := range []struct {
		name       string
		secondFrom uint32 // first block of the SSD save's source
	}{
		{"same bytes", 0},
		{"other bytes", 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := smallConfig(t.TempDir())
			tp := startPeer(t, cfg)
			e := tp.engine(tinyFlash)
			keys := randKeys(3)
			okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
			second := refs(keys, tc.secondFrom, 4)
			okOp(t)(e.Save(ctx(t), second, pb.Durability_DURABILITY_SSD))
			want := pagesOf(e, second)

			loadExpect(t, e, keys, 40, want, "from dram")
			if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM, Keys: keys}); err != nil {
				t.Fatal(err)
			}
			if look, err := e.Lookup(ctx(t), keys, false); err != nil || look.Tiers.Ssd != 3 {
				t.Fatalf("after evicting dram: %v %v, want 3 pages on ssd only", look, err)
			}
			loadExpect(t, e, keys, 40, want, "from ssd")
			if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM, Keys: keys}); err != nil {
				t.Fatal(err)
			}
			tp.shutdown()

			tp2 := startPeer(t, cfg)
			e2 := tp2.engine(tinyFlash)
			loadExpect(t, e2, keys, 40, want, "after restart")
		})
	}
}

// TestResaveWhilePinned re-saves a DRAM page with SSD durability and other
// bytes while a lease pins it: the new bytes are served at once, and the
// replaced DRAM copy is freed when the lease goes (no slot leaks).
func TestResaveWhilePinned(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(2)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	look, err := e.Lookup(ctx(t), keys, true)
	if err != nil || look.HitPages != 2 || look.LeaseId == "" {
		t.Fatalf("lookup with a lease: %v %v", look, err)
	}
	second := refs(keys, 16, 4)
	okOp(t)(e.Save(ctx(t), second, pb.Durability_DURABILITY_SSD))
	want := pagesOf(e, second)
	loadExpect(t, e, keys, 40, want, "while leased")
	if _, err := e.C.Release(ctx(t), &pb.ReleaseRequest{SessionId: e.Session, LeaseId: look.LeaseId}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replaced dram copies to be freed", 5*time.Second, func() bool {
		return tp.p.pages.PoolStats().Slots == len(keys)
	})
	if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM, Keys: keys}); err != nil {
		t.Fatal(err)
	}
	loadExpect(t, e, keys, 40, want, "from ssd")
}

// TestResaveConcurrently races DRAM saves and SSD saves of the same keys
// with other bytes against loads, leases and DRAM evictions: no load ever
// fails or returns bytes that neither save wrote, every page loads from SSD
// once the SSD save is acknowledged, and no DRAM slot leaks.
func TestResaveConcurrently(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	ea, eb, el := tp.engine(tinyFlash), tp.engine(tinyFlash), tp.engine(tinyFlash)
	src := func(keys [][]byte) []*pb.PageRef { return refs(keys, 0, 4) }
	for round := range 20 {
		keys := randKeys(3)
		va, vb := pagesOf(ea, src(keys)), pagesOf(eb, src(keys))
		either := func(what string, i int, got []byte) {
			if !bytes.Equal(got, va[i]) && !bytes.Equal(got, vb[i]) {
				t.Errorf("round %d, %s: page %d holds bytes neither save wrote", round, what, i)
			}
		}
		var wg sync.WaitGroup
		wg.Go(func() { okOp(t)(ea.Save(ctx(t), src(keys), pb.Durability_DURABILITY_DRAM)) })
		wg.Go(func() { okOp(t)(eb.Save(ctx(t), src(keys), pb.Durability_DURABILITY_SSD)) })
		wg.Go(func() {
			for range 4 {
				dst := refs(keys, 40, 4)
				st, err := el.Load(ctx(t), dst)
				if err != nil {
					t.Error(err)
					return
				}
				for i, p := range st.Pages {
					switch p.Code {
					case pb.PageCode_PAGE_OK:
						either("concurrent load", i, el.page(dst[i].Blocks))
					case pb.PageCode_PAGE_NOT_FOUND: // not saved yet
					default:
						t.Errorf("round %d: concurrent load of page %d: %v (%s)", round, i, p.Code, p.Message)
					}
				}
			}
		})
		wg.Go(func() {
			for range 3 {
				if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM, Keys: keys}); err != nil {
					t.Error(err)
				}
			}
		})
		wg.Go(func() {
			look, err := el.Lookup(ctx(t), keys, true)
			if err == nil && look.LeaseId != "" {
				_, err = el.C.Release(ctx(t), &pb.ReleaseRequest{SessionId: el.Session, LeaseId: look.LeaseId})
			}
			if err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM, Keys: keys}); err != nil {
			t.Fatal(err)
		}
		dst := refs(keys, 40, 4)
		st, err := el.Load(ctx(t), dst)
		for i, p := range st.GetPages() {
			if err != nil || p.Code != pb.PageCode_PAGE_OK {
				t.Fatalf("round %d: page %d from ssd: %v %v", round, i, p, err)
			}
			either("load from ssd", i, el.page(dst[i].Blocks))
		}
	}
	inDRAM := 0
	tp.p.cat.Range(func(e catalog.Entry) bool {
		if e.DRAMSlot >= 0 {
			inDRAM++
		}
		return true
	})
	if got := tp.p.pages.PoolStats().Slots; got != inDRAM {
		t.Fatalf("%d dram slots allocated for %d pages in dram: replaced copies leaked", got, inDRAM)
	}
}

// TestResaveServedToMember: a member fetching a page that was saved to DRAM
// and then re-saved to SSD with other bytes gets the bytes and checksum of
// one copy (before the fix: the old DRAM bytes under the new checksum,
// rejected as corrupt).
func TestResaveServedToMember(t *testing.T) {
	creds := writeCreds(t, t.TempDir(), bytes.Repeat([]byte{5}, 32))
	a := startPeer(t, clusterConfig(t, creds, ""))
	b := startPeer(t, clusterConfig(t, creds, a.gossipAddr()))
	waitFor(t, "two members", 10*time.Second, func() bool { return a.members() == 2 && b.members() == 2 })
	ea, eb := a.engine(tinyFlash), b.engine(tinyFlash)
	keys := randKeys(3)
	okOp(t)(ea.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	second := refs(keys, 16, 4)
	okOp(t)(ea.Save(ctx(t), second, pb.Durability_DURABILITY_SSD))
	waitRemote(t, eb, keys, 3)
	loadExpect(t, eb, keys, 40, pagesOf(ea, second), "remote fetch")
}

// ssdOnly saves keys with SSD durability, evicts their DRAM copies and
// returns their catalog entries.
func ssdOnly(t *testing.T, tp *testPeer, e *engine, keys [][]byte) []catalog.Entry {
	t.Helper()
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_SSD))
	if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM, Keys: keys}); err != nil {
		t.Fatal(err)
	}
	out := make([]catalog.Entry, len(keys))
	for i, k := range keys {
		ent, ok := tp.p.cat.Get(mustKey(t, k))
		if !ok || !ent.OnSSD || ent.DRAMSlot >= 0 {
			t.Fatalf("page %d should be on SSD only: %+v", i, ent)
		}
		out[i] = ent
	}
	return out
}

// rewriteSlot changes one data byte of an SSD slot and rewrites the slot's
// header with the changed data's checksum, behind the peer's back: the slot
// is self-consistent, but not the page the catalog recorded.
func rewriteSlot(t *testing.T, tp *testPeer, loc catalog.SSDLoc) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(tp.cfg.DataDir, "ssd", ssd.FileName(int(loc.File))), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	slot := make([]byte, loc.Bytes)
	if _, err := f.ReadAt(slot, int64(loc.Offset)); err != nil {
		t.Fatal(err)
	}
	h, err := page.Decode(slot[:page.HeaderSize])
	if err != nil {
		t.Fatal(err)
	}
	data := slot[page.HeaderSize:]
	data[h.Length/2] ^= 0x5a
	h.Checksum = page.Checksum(data[:h.Length])
	h.Encode(slot[:page.HeaderSize])
	if _, err := f.WriteAt(slot, int64(loc.Offset)); err != nil {
		t.Fatal(err)
	}
}

// TestSSDReadChecksCatalogSum (issue 9, finding 6): an SSD slot rewritten
// consistently (data and header checksum changed together) is refused
// against the catalog's checksum, reported corrupt, and dropped; before
// the fix it was served with the wrong bytes.
func TestSSDReadChecksCatalogSum(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(3)
	ents := ssdOnly(t, tp, e, keys)
	rewriteSlot(t, tp, ents[1].SSD)

	st, err := e.Load(ctx(t), refs(keys, 40, 4))
	if err != nil {
		t.Fatal(err)
	}
	if c := st.Pages[1].Code; c != pb.PageCode_PAGE_CORRUPT {
		t.Fatalf("rewritten page: %v (%s), want PAGE_CORRUPT", c, st.Pages[1].Message)
	}
	if _, ok := tp.p.cat.Get(mustKey(t, keys[1])); ok {
		t.Fatal("the rewritten page is still in the catalog")
	}
	if !strings.HasSuffix(tp.metric("orbitkv_fabric_corrupt_pages_total"), " 1") {
		t.Fatal("corrupt page not counted")
	}
}

// TestTruncatedSSDFileDropsPages (issue 9, finding 5): pages whose SSD
// slots a truncation cut off fail their load once with PAGE_IO_ERROR, then
// leave the catalog (local lookups and a member's stop offering them), are
// counted, and the peer's status turns unhealthy naming the SSD tier; the
// pages before the cut still load.
func TestTruncatedSSDFileDropsPages(t *testing.T) {
	creds := writeCreds(t, t.TempDir(), bytes.Repeat([]byte{6}, 32))
	a := startPeer(t, clusterConfig(t, creds, ""))
	b := startPeer(t, clusterConfig(t, creds, a.gossipAddr()))
	waitFor(t, "two members", 10*time.Second, func() bool { return a.members() == 2 && b.members() == 2 })
	ea, eb := a.engine(tinyFlash), b.engine(tinyFlash)
	keys := randKeys(5)
	want := pagesOf(ea, refs(keys, 0, 4))
	ents := ssdOnly(t, a, ea, keys)
	waitRemote(t, eb, keys, 5)
	for i := 1; i < len(ents); i++ {
		if ents[i].SSD.File != ents[0].SSD.File || ents[i].SSD.Offset <= ents[i-1].SSD.Offset {
			t.Fatalf("pages not laid out in one file in save order: %+v", ents)
		}
	}
	path := filepath.Join(a.cfg.DataDir, "ssd", ssd.FileName(int(ents[0].SSD.File)))
	if err := os.Truncate(path, int64(ents[2].SSD.Offset)); err != nil {
		t.Fatal(err)
	}
	if st, err := a.admin.Status(ctx(t), &pb.StatusRequest{}); err != nil || !st.Healthy {
		t.Fatalf("status before any read: %v %v, want healthy", st, err)
	}

	st, err := ea.Load(ctx(t), refs(keys, 40, 4))
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range st.Pages {
		if wantCode := pb.PageCode_PAGE_IO_ERROR; i >= 2 && p.Code != wantCode {
			t.Fatalf("page %d past the cut: %v (%s), want %v", i, p.Code, p.Message, wantCode)
		}
	}
	loadExpect(t, ea, keys[:2], 40, want[:2], "before the cut")
	if look, err := ea.Lookup(ctx(t), keys, false); err != nil || look.HitPages != 2 {
		t.Fatalf("local lookup after the failed reads: %v %v, want 2 pages", look, err)
	}
	if st, err := ea.Load(ctx(t), refs(keys[2:], 40, 4)); err != nil || st.Pages[0].Code != pb.PageCode_PAGE_NOT_FOUND {
		t.Fatalf("second load past the cut: %v %v, want PAGE_NOT_FOUND", st, err)
	}
	if got := a.metric(`orbitkv_tiers_ssd_dropped_pages_total{reason="io_error"}`); !strings.HasSuffix(got, " 3") {
		t.Errorf("dropped pages metric: %q, want 3", got)
	}
	if got := a.metric(`orbitkv_tiers_ssd_errors_total{op="read"}`); !strings.HasSuffix(got, " 3") {
		t.Errorf("ssd read errors metric: %q, want 3", got)
	}
	status, err := a.admin.Status(ctx(t), &pb.StatusRequest{})
	if err != nil || status.Healthy || !strings.Contains(status.Problem, "ssd") {
		t.Fatalf("status after the failed reads: %v %v, want unhealthy naming the ssd tier", status, err)
	}
	waitFor(t, "the member to stop offering the dropped pages", 10*time.Second, func() bool {
		look, err := eb.Lookup(ctx(t), keys, false)
		return err == nil && look.HitPages == 2
	})
}
