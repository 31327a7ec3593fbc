package store

import (
	"bytes"
	"hash/crc32"
	"testing"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// TestDemotionSealsInline demotes a page whose checksum is still pending:
// the demotion computes it, so the SSD copy verifies on its way back.
func TestDemotionSealsInline(t *testing.T) {
	ps := testStore(t, 64<<20)
	e := newTestEngine(t)
	k := randKey(t)
	src := reqs([]pagekey.Key{k}, 0)
	saveAll(t, "save", ps, e, src)
	unseal(ps, k)
	if _, err := ps.Evict(testCtx(t), catalog.TierDRAM, nil); err != nil {
		t.Fatal(err)
	}
	ent, _ := ps.cat.Get(k)
	if want := crc32.Checksum(e.page(src[0].Blocks), castagnoli); !ent.OnSSD || ent.Checksum != want {
		t.Fatalf("after demotion: on ssd %v, checksum %08x, want %08x", ent.OnSSD, ent.Checksum, want)
	}
	dst := reqs([]pagekey.Key{k}, 32)
	res := make([]Result, 1)
	ps.Load(testCtx(t), e.Engine, dst, res)
	mustAllOK(t, "load", res)
}

// TestDemotionTakesASumSealedMeanwhile: a victim picked while unsealed (its
// copy of the entry holds no checksum) and sealed before its demotion writes
// is written with the sealed sum, so it loads back from SSD intact.
func TestDemotionTakesASumSealedMeanwhile(t *testing.T) {
	ps := testStore(t, 64<<20)
	e := newTestEngine(t)
	keys := randKeys(t, 2)
	src := reqs(keys, 0)
	saveAll(t, "save", ps, e, src)
	for ps.sealSome(testCtx(t)) > 0 { // the sealer's work, done here
	}
	var picked []catalog.Entry // as pickVictimsLocked copied them, before the sealer ran
	ps.mu.Lock()
	for _, k := range keys {
		ent, _ := ps.cat.Get(k)
		ent.Checksum = 0
		picked = append(picked, ent)
		ps.mu.dram.Pin(ent.Key)
	}
	ps.mu.Unlock()
	if n := ps.demoteBatch(testCtx(t), picked); n != 2 {
		t.Fatalf("demoted %d pages, want 2", n)
	}
	dst := reqs(keys, 32)
	res := make([]Result, len(keys))
	ps.Load(testCtx(t), e.Engine, dst, res)
	mustAllOK(t, "load", res)
	for i := range dst {
		if res[i].Tier != catalog.TierSSD || !bytes.Equal(e.page(src[i].Blocks), e.page(dst[i].Blocks)) {
			t.Fatalf("page %d: from %v, bytes equal %v", i, res[i].Tier, bytes.Equal(e.page(src[i].Blocks), e.page(dst[i].Blocks)))
		}
	}
}

// TestSealerLeavesCopiesAloneWhilePoolFills: a backlog of unsealed pages
// over a quarter of the DRAM pool does not make the sealer seal while
// copies run (it took a core from the copy workers); only sealBacklog
// pages do. The pages are sealed once the copies stop.
func TestSealerLeavesCopiesAloneWhilePoolFills(t *testing.T) {
	ps := testStore(t, 0)
	e := newTestEngine(t)
	keys := randKeys(t, 8)
	saveAll(t, "save", ps, e, reqs(keys, 0))
	slots := ps.pool.Stats().Slots
	ps.mu.Lock()
	for len(ps.mu.unsealed) < slots/2 { // half the pool unsealed
		ps.mu.unsealed[randKey(t)] = struct{}{}
	}
	ps.mu.Unlock()
	if ps.sealUrgent() {
		t.Fatalf("urgent with %d of %d slots unsealed, want only from %d pages", slots/2, slots, sealBacklog)
	}
	for ps.sealSome(testCtx(t)) > 0 {
	}
	for _, k := range keys {
		if _, pending := ps.mu.unsealed[k]; pending {
			t.Fatalf("page %s still unsealed after the sealer ran", k)
		}
	}
}

// TestSealerPausesInAPageForACopy: with a copy running the sealer sums one
// piece of a page and keeps its place; calls while the copy runs each sum
// one more piece, and the sum recorded is the page's CRC-32C.
func TestSealerPausesInAPageForACopy(t *testing.T) {
	defer func(p int) { sealPiece = p }(sealPiece)
	sealPiece = 1 << 10
	ps := testStore(t, 0)
	e := newTestEngine(t)
	k := randKey(t)
	saveOne(t, ps, e, k, false)
	src := reqs([]pagekey.Key{k}, 0)
	pieces := int(e.PageBytes) / sealPiece
	ps.copying.Add(1) // a copy in flight
	for i := 1; i < pieces; i++ {
		if n := ps.sealSome(testCtx(t)); n != 1 {
			t.Fatalf("call %d: sealSome = %d, want 1", i, n)
		}
		if p := ps.mu.sealPart; p == nil || p.done != i*sealPiece {
			t.Fatalf("call %d: paused at %v, want %d bytes summed", i, p, i*sealPiece)
		}
	}
	ps.copying.Add(-1)
	for ps.sealSome(testCtx(t)) > 0 {
	}
	ent, _ := ps.cat.Get(k)
	if want := crc32.Checksum(e.page(src[0].Blocks), castagnoli); ent.Checksum != want || len(ps.mu.unsealed) != 0 {
		t.Fatalf("checksum %08x, want %08x; %d pages unsealed", ent.Checksum, want, len(ps.mu.unsealed))
	}
}

// castagnoli is hash/crc32's table, the reference the tests check the
// peer's checksums (internal/crc32c) against.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)
