package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/dram"
)

// TestFailedDemotionFailsFast: an allocation whose own demotion moves
// nothing (the SSD full, nothing on it that may go) fails at once with no
// space, even while another demotion is writing, instead of waiting out its
// deadline. No flusher runs, so nothing makes room behind the test.
func TestFailedDemotionFailsFast(t *testing.T) {
	ps := testStore(t, 64<<20)
	const page = 512 << 10
	for { // the SSD full of slots no catalog entry names: nothing there can be evicted
		if _, err := ps.ssd.Alloc(page); err != nil {
			break
		}
	}
	// DRAM full of pages held there only: the victims a demotion would take.
	for i := 0; ; i++ {
		sl, err := ps.pool.Alloc(page)
		if err != nil {
			break
		}
		k := randKey(t)
		if err := ps.cat.Put(catalog.Entry{Key: k, Size: page, Generation: uint64(i + 1), DRAMSlot: int64(sl), LastAccess: ps.now().UnixNano()}); err != nil {
			t.Fatal(err)
		}
		ps.mu.dram.Touch(k)
	}
	ps.demoting.Add(1) // as if another demotion were writing
	// The other demotion never ends, so an allocation that waited for it
	// would end only by its deadline, with the context's error: no space,
	// before the deadline, shows it gave up on its own failed demotions.
	// The deadline is a hang guard only.
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := ps.allocDRAM(c, page)
	if !errors.Is(err, ErrNoSpace) || c.Err() != nil {
		t.Fatalf("allocDRAM = %v (context: %v); want no space before the deadline", err, c.Err())
	}
}

// TestCacheFillDropsInsteadOfDemoting: a DRAM-acknowledged save that finds
// the pool full while the disk is behind (cache fills waited for demotions
// more than fillWaitLimit this second) takes the slot of the oldest
// DRAM-only page by dropping it — no SSD write on the engine's path — unless
// that page was used within fillProtect; an allocation for an SSD-bound save
// still demotes, and so does a cache fill while the disk keeps up. The
// store is not Run, so no flusher makes room behind the test.
func TestCacheFillDropsInsteadOfDemoting(t *testing.T) {
	ps := testStore(t, 64<<20)
	const page = 512 << 10
	var keys []catalog.Entry
	for i := 0; ; i++ { // DRAM full of pages held there only, oldest first
		sl, err := ps.pool.Alloc(page)
		if err != nil {
			break
		}
		used := ps.now().UnixNano()
		if i == 0 {
			used = ps.now().Add(-time.Minute).UnixNano() // the only page not used lately
		}
		e := catalog.Entry{Key: randKey(t), Size: page, Generation: uint64(i + 1), DRAMSlot: int64(sl), LastAccess: used}
		if err := ps.cat.Put(e); err != nil {
			t.Fatal(err)
		}
		ps.mu.dram.Touch(e.Key)
		keys = append(keys, e)
	}
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	alloc := func(what string, f func(context.Context, uint64) (dram.Slot, error)) {
		t.Helper()
		if _, err := f(c, page); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	counts := func(what string, drops float64, demoted bool) {
		t.Helper()
		if d, m := counterValue(t, ps.m.unflushedDrops), counterValue(t, ps.m.demotedPages); d != drops || (m > 0) != demoted {
			t.Fatalf("%s: %v unflushed drops, %v demoted; want %v drops, demotions %v", what, d, m, drops, demoted)
		}
	}
	ps.fillWaits.add(ps.now(), 2*fillWaitLimit) // the disk behind
	alloc("cache fill, disk behind", ps.allocCacheFill)
	if _, ok := ps.cat.Get(keys[0].Key); ok {
		t.Fatal("the oldest DRAM-only page should have been dropped for the cache fill")
	}
	counts("cache fill, disk behind", 1, false)
	alloc("cache fill, disk behind, next page used lately", ps.allocCacheFill)
	if e, ok := ps.cat.Get(keys[1].Key); !ok || !e.OnSSD {
		t.Fatalf("a page used within fillProtect is demoted, not dropped: %+v, %v", e, ok)
	}
	counts("cache fill, recent victims", 1, true)
	alloc("SSD-bound save", ps.allocDRAM)
	ps.fillWaits.mu.Lock()
	ps.fillWaits.cur, ps.fillWaits.prev = 0, 0 // the disk keeps up
	ps.fillWaits.mu.Unlock()
	alloc("cache fill, disk keeping up", ps.allocCacheFill)
	if got := counterValue(t, ps.m.unflushedDrops); got != 1 {
		t.Fatalf("unflushed drops = %v, want still 1", got)
	}
	for _, k := range keys[1:] { // nothing else lost: every other page still held (DRAM or SSD)
		if _, ok := ps.cat.Get(k.Key); !ok {
			t.Fatalf("page %x lost", k.Key)
		}
	}
}

// TestWaitWindow: waits count in the current second and the one before it.
func TestWaitWindow(t *testing.T) {
	var w waitWindow
	t0 := time.Unix(1000, 0)
	w.add(t0, 60*time.Millisecond)
	w.add(t0.Add(500*time.Millisecond), 60*time.Millisecond)
	if !w.over(t0.Add(900*time.Millisecond), 100*time.Millisecond) {
		t.Fatal("120 ms within a second should be over 100 ms")
	}
	if !w.over(t0.Add(1500*time.Millisecond), 100*time.Millisecond) {
		t.Fatal("the last second's waits still count")
	}
	if w.over(t0.Add(2500*time.Millisecond), 100*time.Millisecond) {
		t.Fatal("waits two seconds old no longer count")
	}
	if w.over(t0.Add(10*time.Second), 0) {
		t.Fatal("a long quiet spell starts afresh")
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestRestoredPagesOutliveAStreamOfNewSaves: a prefix an engine restored
// stays in DRAM while more pages than the pool holds are saved once after
// it (tiers.NewSegmentedLRU); with one LRU the stream evicted it, and on the
// H200 the prefixes that kept coming back were recomputed instead
// (docs/benchmarks.md).
func TestRestoredPagesOutliveAStreamOfNewSaves(t *testing.T) {
	ps := testStore(t, 0) // no SSD: a DRAM eviction drops the page
	e := newTestEngine(t)
	hot := randKeys(t, 4)
	saveAll(t, "save hot", ps, e, reqs(hot, 0))
	res := make([]Result, len(hot))
	ps.Load(testCtx(t), e.Engine, reqs(hot, 32), res)
	mustAllOK(t, "restore hot", res)
	slots := int(ps.pool.Stats().CapacityBytes / dram.SlotBytes(e.PageBytes))
	for saved := 0; saved < 3*slots; saved += 16 {
		saveAll(t, "save stream", ps, e, reqs(randKeys(t, 16), 0))
	}
	if ev := counterValue(t, ps.m.evictedPages.WithLabelValues("dram")); ev < float64(slots) {
		t.Fatalf("only %v pages evicted from a pool of %d slots: the stream did not cycle the pool", ev, slots)
	}
	res = make([]Result, len(hot))
	ps.Load(testCtx(t), e.Engine, reqs(hot, 32), res)
	for i, r := range res {
		if r.Code != CodeOK || r.Tier != catalog.TierDRAM {
			t.Fatalf("restored page %d after the stream: code %d tier %v (%s); want still in DRAM", i, r.Code, r.Tier, r.Msg)
		}
	}
}

// fillDRAM fills the rest of the DRAM pool with pages held there only, each
// used just now, and returns them.
func fillDRAM(t *testing.T, ps *Store, size uint64) []catalog.Entry {
	t.Helper()
	var out []catalog.Entry
	for i := 0; ; i++ {
		sl, err := ps.pool.Alloc(size)
		if err != nil {
			return out
		}
		e := catalog.Entry{Key: randKey(t), Size: size, Generation: uint64(1000 + i), DRAMSlot: int64(sl), LastAccess: ps.now().UnixNano()}
		if err := ps.cat.Put(e); err != nil {
			t.Fatal(err)
		}
		ps.mu.dram.Touch(e.Key)
		out = append(out, e)
	}
}

// TestNoWriteOnTheEnginesPathForACopyTheSSDHas reproduces the H200's SSD
// configuration after readmission landed (docs/journal/2026-12-01-vllm-h200.md,
// "Fourth session"): the DRAM pool full of fresh saves, clean copies (readmitted,
// protected in the LRU order) behind them. A readmission there must not
// demote anything to take a slot — the page is on SSD already — but may take
// a clean copy's; a cache fill with the disk behind drops a clean copy
// before it drops a fresh page unused for a while, and that before it
// writes one. On the H200 such waits were 46 s of a 60-s run. No flusher
// runs.
func TestNoWriteOnTheEnginesPathForACopyTheSSDHas(t *testing.T) {
	ps := testStore(t, 64<<20)
	e := newTestEngine(t)
	ssdPage, cleanPage := randKey(t), randKey(t)
	saveOne(t, ps, e, ssdPage, false)
	demoteOut(t, ps, ssdPage)
	demoted := counterValue(t, ps.m.demotedPages)
	fresh := fillDRAM(t, ps, e.PageBytes)
	// The engine looked both pages up before it recomputed and saved them
	// again, ssdPage more often; the fresh pages were never asked for. So
	// every readmission below passes the frequency rule (readmit.go), the
	// one of ssdPage over cleanPage's clean copy too, and meets the
	// allocation's.
	ps.NoteAsked(e.Engine, []pagekey.Key{ssdPage, ssdPage, cleanPage})
	nothingWritten := func(what string, drops float64) {
		t.Helper()
		if d, u := counterValue(t, ps.m.demotedPages), counterValue(t, ps.m.unflushedDrops); d != demoted || u != drops {
			t.Fatalf("%s: %v demoted, %v unflushed drops; want none demoted, %v dropped", what, d-demoted, u, drops)
		}
	}
	freshKept := func(what string, from int) {
		t.Helper()
		for _, f := range fresh[from:] {
			if got, ok := ps.cat.Get(f.Key); !ok || got.DRAMSlot < 0 {
				t.Fatalf("%s: fresh page %x lost its DRAM copy", what, f.Key[:4])
			}
		}
	}

	// A readmission with no slot free of a write: the page stays on SSD.
	if got := saveOne(t, ps, e, ssdPage, false); got.Tier != catalog.TierSSD {
		t.Fatalf("readmission into a pool of fresh pages answered %v, want ssd (no room)", got.Tier)
	}
	nothingWritten("readmission, no clean copy", 0)
	if n := readmits(t, ps, "no_room"); n != 1 {
		t.Fatalf("no_room readmissions = %v, want 1", n)
	}
	ssdOnly(t, ps, ssdPage)

	// A clean copy behind the fresh pages: one fresh page's slot goes to a
	// readmitted page, and the pool is full again.
	ps.mu.Lock()
	ps.dropDRAMLocked(fresh[0])
	ps.mu.Unlock()
	saveOne(t, ps, e, cleanPage, false)
	demoteOut(t, ps, cleanPage)
	demoted = counterValue(t, ps.m.demotedPages)
	if got := saveOne(t, ps, e, cleanPage, false); got.Tier != catalog.TierDRAM {
		t.Fatalf("readmission into a free slot answered %v, want dram", got.Tier)
	}
	// The next readmission takes the clean copy's slot.
	if got := saveOne(t, ps, e, ssdPage, false); got.Tier != catalog.TierDRAM {
		t.Fatalf("readmission with a clean copy in the pool answered %v, want dram", got.Tier)
	}
	nothingWritten("readmission over a clean copy", 0)
	ssdOnly(t, ps, cleanPage)
	freshKept("readmission over a clean copy", 1)

	// The disk behind, a fresh page unused for long and a clean copy: the
	// clean copy goes, then the stale page.
	if _, _, err := ps.cat.Update(fresh[1].Key, func(x *catalog.Entry) bool { x.LastAccess = time.Now().Add(-time.Minute).UnixNano(); return true }); err != nil {
		t.Fatal(err)
	}
	ps.fillWaits.add(ps.now(), 2*fillWaitLimit)
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := ps.allocCacheFill(c, e.PageBytes); err != nil {
		t.Fatal(err)
	}
	nothingWritten("cache fill with the disk behind, a clean copy there", 0)
	ssdOnly(t, ps, ssdPage)
	freshKept("cache fill with the disk behind, a clean copy there", 1)
	if _, err := ps.allocCacheFill(c, e.PageBytes); err != nil {
		t.Fatal(err)
	}
	nothingWritten("cache fill with the disk behind, no clean copy", 1)
	if _, ok := ps.cat.Get(fresh[1].Key); ok {
		t.Fatal("the stale fresh page should have been dropped for the cache fill")
	}
	freshKept("cache fill with the disk behind, no clean copy", 2)
}

// TestFillProtectReadsTheStoresClock: a page's last use, stamped when it is
// saved, and a cache fill's judgement of it (fillProtect) read the same
// clock, the store's (Options.Now; here a fake one, away from the wall
// clock). With the disk behind and the pool full, a DRAM-only page saved
// just now is demoted, not dropped; unused past fillProtect by that clock,
// it is dropped.
func TestFillProtectReadsTheStoresClock(t *testing.T) {
	ps := testStore(t, 64<<20)
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ps.opts.Now = func() time.Time { return clock }
	e := newTestEngine(t)
	slots := int(ps.pool.Stats().CapacityBytes / dram.SlotBytes(e.PageBytes))
	for n := 0; n < slots; n += 16 { // the engine holds 16 pages
		saveAll(t, "fill the pool", ps, e, reqs(randKeys(t, min(16, slots-n)), 0))
	}
	fillBehind := func(what string) {
		t.Helper()
		ps.fillWaits.add(ps.now(), 2*fillWaitLimit) // the disk behind
		if _, err := ps.allocCacheFill(testCtx(t), e.PageBytes); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for ps.pool.CanAlloc(e.PageBytes) { // full again: slots no page holds
			if _, err := ps.pool.Alloc(e.PageBytes); err != nil {
				t.Fatal(err)
			}
		}
	}
	fillBehind("pages saved just now")
	if d, m := counterValue(t, ps.m.unflushedDrops), counterValue(t, ps.m.demotedPages); d != 0 || m == 0 {
		t.Fatalf("pages saved just now: %v unflushed drops, %v demoted; want none dropped, some demoted", d, m)
	}
	clock = clock.Add(fillProtect + time.Second)
	fillBehind("pages unused past fillProtect")
	if d := counterValue(t, ps.m.unflushedDrops); d != 1 {
		t.Fatalf("pages unused past fillProtect by the store's clock: %v unflushed drops, want 1", d)
	}
}
