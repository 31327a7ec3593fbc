package fabric

import (
	"bytes"
	"hash/crc32"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// TestSealerChecksumsDRAMSaves saves pages into DRAM only: the sealer fills
// in every checksum, the gauge drains, and the demoted pages load back from
// SSD through checksum verification.
func TestSealerChecksumsDRAMSaves(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(8)
	src := refs(keys, 0, 4)
	okOp(t)(e.Save(ctx(t), src, pb.Durability_DURABILITY_DRAM))
	waitFor(t, "the sealer to drain", 5*time.Second, func() bool {
		return tp.metric("orbitkv_tiers_unsealed_pages") == "orbitkv_tiers_unsealed_pages 0"
	})
	for i, k := range keys {
		ent, _ := tp.p.cat.Get(mustKey(t, k))
		if want := crc32.Checksum(e.page(src[i].Blocks), castagnoli); ent.Checksum != want {
			t.Fatalf("page %d checksum %08x, want %08x", i, ent.Checksum, want)
		}
	}
	if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM}); err != nil {
		t.Fatal(err)
	}
	st, err := e.Load(ctx(t), refs(keys, 32, 4))
	mustOK(t, st, err)
	if st.Pages[0].Tier != pb.Tier_TIER_SSD {
		t.Fatalf("want a load from SSD, got %v", st.Pages[0].Tier)
	}
}

// TestDemotionSealsInline demotes a page whose checksum is still pending:
// the demotion computes it, so the SSD copy verifies on its way back.
func TestDemotionSealsInline(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(1)
	src := refs(keys, 0, 4)
	okOp(t)(e.Save(ctx(t), src, pb.Durability_DURABILITY_DRAM))
	k := mustKey(t, keys[0])
	ps := tp.p.pages
	ps.mu.Lock() // pretend the sealer has not got to it
	ps.cat.Update(k, func(c *catalog.Entry) bool { c.Checksum = 0; return true })
	ps.mu.unsealed[k] = struct{}{}
	ps.mu.Unlock()
	if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM}); err != nil {
		t.Fatal(err)
	}
	ent, _ := tp.p.cat.Get(k)
	if want := crc32.Checksum(e.page(src[0].Blocks), castagnoli); !ent.OnSSD || ent.Checksum != want {
		t.Fatalf("after demotion: on ssd %v, checksum %08x, want %08x", ent.OnSSD, ent.Checksum, want)
	}
	okOp(t)(e.Load(ctx(t), refs(keys, 32, 4)))
}

// TestDemotionTakesASumSealedMeanwhile: a victim picked while unsealed (its
// copy of the entry holds no checksum) and sealed before its demotion writes
// is written with the sealed sum, so it loads back from SSD intact.
func TestDemotionTakesASumSealedMeanwhile(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(2)
	src := refs(keys, 0, 4)
	okOp(t)(e.Save(ctx(t), src, pb.Durability_DURABILITY_DRAM))
	waitFor(t, "the sealer to drain", 5*time.Second, func() bool {
		return tp.metric("orbitkv_tiers_unsealed_pages") == "orbitkv_tiers_unsealed_pages 0"
	})
	ps := tp.p.pages
	var picked []catalog.Entry // as pickVictimsLocked copied them, before the sealer ran
	ps.mu.Lock()
	for _, k := range keys {
		ent, _ := ps.cat.Get(mustKey(t, k))
		ent.Checksum = 0
		picked = append(picked, ent)
		ps.mu.dram.Pin(ent.Key)
	}
	ps.mu.Unlock()
	if n := ps.demoteBatch(ctx(t), picked); n != 2 {
		t.Fatalf("demoted %d pages, want 2", n)
	}
	dst := refs(keys, 32, 4)
	st, err := e.Load(ctx(t), dst)
	mustOK(t, st, err)
	for i := range dst {
		if st.Pages[i].Tier != pb.Tier_TIER_SSD || !bytes.Equal(e.page(src[i].Blocks), e.page(dst[i].Blocks)) {
			t.Fatalf("page %d: from %v, bytes equal %v", i, st.Pages[i].Tier, bytes.Equal(e.page(src[i].Blocks), e.page(dst[i].Blocks)))
		}
	}
}
