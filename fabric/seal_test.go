package fabric

import (
	"hash/crc32"
	"testing"
	"time"

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
		if want := crc32.Checksum(e.page(src[i].Blocks), crc32.MakeTable(crc32.Castagnoli)); ent.Checksum != want {
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
