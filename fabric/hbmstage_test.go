package fabric

import (
	"bytes"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/fabric/store"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/transfer"
)

// The HBM stage's CPU side (fabric/store/hbmstage.go), through fakeGPU: two
// sessions the peer treats as CUDA sessions on two devices, a producer
// whose saves fill its device's stage and a consumer whose loads copy from
// it. The stage's "HBM" here is host memory (a Host region), which
// fakeGPU's copies move like every other region; the real device-to-device
// copy (cuda.Copier.StartPeer) runs in TestGPUStagedHandoff on a GPU.

// stagedPair returns the peer, the producer (its session's stage holds
// slots pages) and the consumer, each with its fake device.
func stagedPair(t *testing.T, slots int) (tp *testPeer, prod, cons *engine, fp, fc *fakeGPU, st *store.HBMStage) {
	tp = startPeer(t, smallConfig(t.TempDir()))
	prod, cons = tp.engine(layerFlash), tp.engine(layerFlash)
	fp, fc = &fakeGPU{f: layerFlash}, &fakeGPU{f: layerFlash}
	ps, err := tp.p.api.Engine(prod.Session)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := tp.p.api.Engine(cons.Session)
	if err != nil {
		t.Fatal(err)
	}
	hbm := make([]byte, slots*int(ps.PageBytes))
	st = store.NewHBMStage(0, transfer.HostRegion("fake-hbm-stage", hbm), fp)
	tp.p.pages.AddHBMStage(st)
	ps.GPU, ps.Stage = fp, st
	cs.GPU = fc
	return tp, prod, cons, fp, fc, st
}

func (tp *testPeer) counter(name string) string {
	line := tp.metric(name)
	return line[strings.LastIndexByte(line, ' ')+1:]
}

const (
	hbmLoaded  = `orbitkv_fabric_loaded_pages_total{tier="hbm"}`
	dramLoaded = `orbitkv_fabric_loaded_pages_total{tier="dram"}`
	stagedOK   = `orbitkv_fabric_hbm_staged_pages_total{result="staged"}`
	stagedSkip = `orbitkv_fabric_hbm_staged_pages_total{result="skipped"}`
)

// wantCounts checks the stage's and the loads' counters.
func wantCounts(t *testing.T, tp *testPeer, want map[string]string) {
	t.Helper()
	for name, v := range want {
		if got := tp.counter(name); got != v {
			t.Errorf("%s = %s, want %s", name, got, v)
		}
	}
}

// loadInto loads keys into the consumer's blocks from first and checks
// every page against the producer's blocks from 0.
func loadInto(t *testing.T, prod, cons *engine, keys [][]byte, first uint32) {
	t.Helper()
	dst := refs(keys, first, 4)
	okOp(t)(cons.Load(ctx(t), dst))
	for i, r := range refs(keys, 0, 4) {
		if !bytes.Equal(cons.page(dst[i].Blocks), prod.page(r.Blocks)) {
			t.Fatalf("page %d: the consumer's blocks differ from the producer's", i)
		}
	}
}

// TestHBMStageHandoff: a producer's DRAM save fills its GPU's stage; the
// consumer's load copies every page from the stage (one device-to-device
// copy, none through DRAM) and the bytes are the producer's.
func TestHBMStageHandoff(t *testing.T) {
	tp, prod, cons, _, fc, st := stagedPair(t, 16)
	keys := randKeys(4)
	okOp(t)(prod.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	if s := st.Stats(); s.Live != 4 || s.Pinned != 0 || s.Slots != 16 {
		t.Fatalf("stage after the save: %+v, want 4 live of 16 slots, none pinned", s)
	}
	loadInto(t, prod, cons, keys, 20)
	wantCounts(t, tp, map[string]string{stagedOK: "4", hbmLoaded: "4", dramLoaded: "0"})
	fc.mu.Lock()
	n := fc.mu.peerCopies
	fc.mu.Unlock()
	if n != 1 {
		t.Errorf("consumer device-to-device copies: %d, want 1 (one per stage per load)", n)
	}
	if s := st.Stats(); s.Pinned != 0 {
		t.Errorf("stage after the load: %+v, want nothing pinned", s)
	}
}

// TestHBMStageStaleGenerationLoadsFromDRAM: the stage still holds a page's
// old bytes while the catalog names newer ones (evicted, saved again with
// other bytes, the new copy not staged): the load takes DRAM's, the new
// bytes, not the stage's.
func TestHBMStageStaleGenerationLoadsFromDRAM(t *testing.T) {
	tp, prod, cons, fp, _, st := stagedPair(t, 16)
	keys := randKeys(2)
	okOp(t)(prod.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	evictAll(t, tp, keys)
	if lk, err := prod.Lookup(ctx(t), keys, false); err != nil || lk.HitPages != 0 {
		t.Fatalf("lookup after evicting: %v %v, want no hit", lk, err)
	}
	flipBlocks(prod, 8) // new bytes in the producer's blocks 0..7
	fp.failPeer = true  // the new save commits to DRAM; its staging copy fails
	okOp(t)(prod.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	if s := st.Stats(); s.Live != 2 {
		t.Fatalf("stage: %+v, want the 2 old pages still live", s)
	}
	loadInto(t, prod, cons, keys, 20)
	wantCounts(t, tp, map[string]string{hbmLoaded: "0", dramLoaded: "2"})

	// Once more with the staging copy working: the new copies replace the
	// old ones in the stage (2 live, not 4) and the load takes them.
	fp.failPeer = false
	evictAll(t, tp, keys)
	flipBlocks(prod, 8)
	okOp(t)(prod.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	if s := st.Stats(); s.Live != 2 {
		t.Fatalf("stage after the re-save: %+v, want 2 live (the old copies freed)", s)
	}
	loadInto(t, prod, cons, keys, 40)
	wantCounts(t, tp, map[string]string{hbmLoaded: "2", dramLoaded: "2"})
}

// evictAll drops keys from every tier.
func evictAll(t *testing.T, tp *testPeer, keys [][]byte) {
	t.Helper()
	for _, tier := range []pb.Tier{pb.Tier_TIER_DRAM, pb.Tier_TIER_SSD} {
		if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: tier, Keys: keys}); err != nil {
			t.Fatal(err)
		}
	}
}

// flipBlocks gives the first n blocks of e other bytes (one per block).
func flipBlocks(e *engine, n int) {
	for b := range n {
		e.shm.Mem[layerFlash.BlockOffset(0, 0, b)] ^= 0xff
	}
}

// TestHBMStageCopyFailureLoadsFromDRAM: a load whose device-to-device copy
// fails loads the same pages from DRAM.
func TestHBMStageCopyFailureLoadsFromDRAM(t *testing.T) {
	tp, prod, cons, _, fc, st := stagedPair(t, 16)
	keys := randKeys(3)
	okOp(t)(prod.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	fc.failPeer = true
	loadInto(t, prod, cons, keys, 20)
	wantCounts(t, tp, map[string]string{hbmLoaded: "0", dramLoaded: "3"})
	if s := st.Stats(); s.Pinned != 0 || s.Live != 3 {
		t.Errorf("stage: %+v, want 3 live, none pinned", s)
	}
}

// TestHBMStageStuckLoadKeepsSlotsPinned: a load whose device-to-device copy
// never finished fails those pages (their blocks may still be written: no
// second copy into them) and its stage slots stay pinned for good, never
// refilled while the device may still read them.
func TestHBMStageStuckLoadKeepsSlotsPinned(t *testing.T) {
	_, prod, cons, _, fc, st := stagedPair(t, 4)
	keys := randKeys(2)
	okOp(t)(prod.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	fc.stuck = true
	h, err := cons.C.Load(ctx(t), &pb.LoadRequest{SessionId: cons.Session, Pages: refs(keys, 20, 4)})
	if err != nil {
		t.Fatal(err)
	}
	stat, err := cons.Wait(ctx(t), h.OpId)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range stat.Pages {
		if r.Code == pb.PageCode_PAGE_OK {
			t.Errorf("page %d: OK after a stuck copy, want a failure", i)
		}
	}
	if s := st.Stats(); s.Pinned != 2 {
		t.Fatalf("stage: %+v, want the 2 slots the stuck copy names pinned", s)
	}
	more := randKeys(4)
	okOp(t)(prod.Save(ctx(t), refs(more, 8, 4), pb.Durability_DURABILITY_DRAM))
	if s := st.Stats(); s.Live != 4 || s.Pinned != 2 {
		t.Fatalf("stage after 4 more pages: %+v, want 2 of them staged beside the 2 pinned (4 live, 2 pinned)", s)
	}
}

// TestHBMStageRingReusesOldestSlots: a stage of 2 slots keeps the last
// pages saved; older ones load from DRAM, and a save larger than the free
// slots stages what fits.
func TestHBMStageRingReusesOldestSlots(t *testing.T) {
	tp, prod, cons, _, _, st := stagedPair(t, 2)
	old, recent := randKeys(3), randKeys(2)
	okOp(t)(prod.Save(ctx(t), refs(old, 0, 4), pb.Durability_DURABILITY_DRAM))
	wantCounts(t, tp, map[string]string{stagedOK: "2", stagedSkip: "1"})
	okOp(t)(prod.Save(ctx(t), refs(recent, 12, 4), pb.Durability_DURABILITY_DRAM))
	if s := st.Stats(); s.Live != 2 {
		t.Fatalf("stage: %+v, want 2 live", s)
	}
	dst := refs(recent, 40, 4)
	okOp(t)(cons.Load(ctx(t), dst))
	for i, r := range refs(recent, 12, 4) {
		if !bytes.Equal(cons.page(dst[i].Blocks), prod.page(r.Blocks)) {
			t.Fatalf("recent page %d differs", i)
		}
	}
	loadInto(t, prod, cons, old, 20)
	wantCounts(t, tp, map[string]string{hbmLoaded: "2", dramLoaded: "3"})
}

// TestHBMStageSkipsOtherPageSizes: a stage's slots take the first page size
// staged; a session of another layout on the same device is not staged
// and loads from DRAM as before.
func TestHBMStageSkipsOtherPageSizes(t *testing.T) {
	tp, prod, _, _, _, st := stagedPair(t, 8)
	okOp(t)(prod.Save(ctx(t), refs(randKeys(1), 0, 4), pb.Durability_DURABILITY_DRAM))
	other := layerFlash
	other.HeadDim = 32
	e := tp.engine(other)
	sess, err := tp.p.api.Engine(e.Session)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeGPU{f: other}
	sess.GPU, sess.Stage = f, st
	keys := randKeys(2)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	wantCounts(t, tp, map[string]string{stagedOK: "1", stagedSkip: "2"})
	dst := refs(keys, 20, 4)
	okOp(t)(e.Load(ctx(t), dst))
	for i, r := range refs(keys, 0, 4) {
		if !bytes.Equal(e.page(dst[i].Blocks), e.page(r.Blocks)) {
			t.Fatalf("page %d differs", i)
		}
	}
	wantCounts(t, tp, map[string]string{hbmLoaded: "0", dramLoaded: "2"})
	ps, err := tp.p.api.Engine(prod.Session)
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Stats(); s.PageBytes != ps.PageBytes || s.PageBytes == sess.PageBytes {
		t.Fatalf("stage slots of %d bytes, want the producer's %d (the other layout's pages are %d)", s.PageBytes, ps.PageBytes, sess.PageBytes)
	}
}

// TestHBMStageLeavesAlreadyStoredPagesOut: a save of pages DRAM holds
// already (from an earlier save whose stage copy failed) copies nothing into
// DRAM, so its stage copy is not published either: the blocks' bytes now
// need not be the bytes DRAM holds. The consumer loads from DRAM, and the
// slots are free again.
func TestHBMStageLeavesAlreadyStoredPagesOut(t *testing.T) {
	tp, prod, cons, fp, _, st := stagedPair(t, 8)
	keys := randKeys(3)
	fp.failPeer = true
	okOp(t)(prod.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	fp.failPeer = false
	okOp(t)(prod.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	if s := st.Stats(); s.Live != 0 || s.Pinned != 0 {
		t.Fatalf("stage: %+v, want nothing live or pinned", s)
	}
	loadInto(t, prod, cons, keys, 20)
	wantCounts(t, tp, map[string]string{stagedOK: "0", hbmLoaded: "0", dramLoaded: "3"})
}

// TestHBMStageConcurrentSavesAndLoads: a producer saves rounds of pages with
// new bytes each round into a stage of two rounds' slots while a consumer
// loads the rounds as they come, so loads pin slots the ring wants to reuse
// and some pages come from HBM, others (overwritten in the stage) from
// DRAM. Every page loaded must hold the bytes it was saved with.
func TestHBMStageConcurrentSavesAndLoads(t *testing.T) {
	tp, prod, cons, _, _, st := stagedPair(t, 8)
	const rounds, perRound = 40, 4
	type round struct {
		keys [][]byte
		want [][]byte
	}
	ch := make(chan round) // unbuffered: saves run while the consumer loads
	errs := make(chan error, 1)
	quit := make(chan struct{}) // a failed check ends the producer too
	defer close(quit)
	go func() {
		defer close(ch)
		for range rounds {
			r := round{keys: randKeys(perRound)}
			rand.Read(prod.shm.Mem[:layerFlash.Size()/2]) // new bytes in the producer's first 32 blocks
			for _, ref := range refs(r.keys, 0, 4) {
				r.want = append(r.want, prod.page(ref.Blocks))
			}
			st, err := prod.Save(ctx(t), refs(r.keys, 0, 4), pb.Durability_DURABILITY_DRAM)
			if err == nil {
				err = engineclient.AllOK(st)
			}
			if err != nil {
				errs <- err
				return
			}
			select {
			case ch <- r:
			case <-quit:
				return
			}
		}
	}()
	load := func(r round) {
		dst := refs(r.keys, 40, 4)
		okOp(t)(cons.Load(ctx(t), dst))
		for i := range r.keys {
			if !bytes.Equal(cons.page(dst[i].Blocks), r.want[i]) {
				t.Fatalf("page %d of a round: not the bytes it was saved with", i)
			}
		}
	}
	var behind []round // the consumer lags 0 to 3 rounds: the ring holds 2
	n := 0
	for r := range ch {
		behind = append(behind, r)
		for n++; len(behind) > n%4; behind = behind[1:] {
			load(behind[0])
		}
	}
	for _, r := range behind {
		load(r)
	}
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	hbm, dram := tp.counter(hbmLoaded), tp.counter(dramLoaded)
	t.Logf("pages loaded from hbm %s, from dram %s; stage %+v", hbm, dram, st.Stats())
	if hbm == "0" || dram == "0" {
		t.Errorf("pages from hbm %s, from dram %s: want both (the lag makes the ring overwrite some)", hbm, dram)
	}
	if s := st.Stats(); s.Pinned != 0 {
		t.Errorf("stage after the loads: %+v, want nothing pinned", s)
	}
}
