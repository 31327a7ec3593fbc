package store

import (
	"bytes"
	"context"
	"hash/crc32"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/tiers/ssd"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// demoteOut writes a page saved into DRAM to SSD and drops its DRAM copy, as
// eviction does: afterwards the peer holds it on SSD only.
func demoteOut(t *testing.T, ps *Store, k pagekey.Key) catalog.Entry {
	t.Helper()
	for ps.sealSome(testCtx(t)) > 0 {
	}
	ps.mu.Lock()
	e, _ := ps.cat.Get(k)
	ps.mu.dram.Pin(k)
	ps.mu.Unlock()
	if n := ps.demoteBatch(testCtx(t), []catalog.Entry{e}); n != 1 {
		t.Fatalf("demoted %d pages, want 1", n)
	}
	return ssdOnly(t, ps, k)
}

// ssdOnly returns k's entry, failing unless it is held on SSD only.
func ssdOnly(t *testing.T, ps *Store, k pagekey.Key) catalog.Entry {
	t.Helper()
	e, ok := ps.cat.Get(k)
	if !ok || !e.OnSSD || e.DRAMSlot >= 0 {
		t.Fatalf("page %x: present %v, on SSD %v, DRAM slot %d; want on SSD only", k[:4], ok, e.OnSSD, e.DRAMSlot)
	}
	return e
}

// saveOne saves the page at blocks 0..3 and returns its result.
func saveOne(t *testing.T, ps *Store, e *testEngine, k pagekey.Key, toSSD bool) Result {
	t.Helper()
	res := make([]Result, 1)
	ps.Save(testCtx(t), e.Engine, reqs([]pagekey.Key{k}, 0), toSSD, res)
	mustAllOK(t, "save", res)
	return res[0]
}

// loadOne loads k into blocks 32..35 and returns the tier it came from and
// the bytes that landed.
func loadOne(t *testing.T, ps *Store, e *testEngine, k pagekey.Key) (catalog.Tier, []byte) {
	t.Helper()
	dst := reqs([]pagekey.Key{k}, 32)
	res := make([]Result, 1)
	ps.Load(testCtx(t), e.Engine, dst, res)
	mustAllOK(t, "load", res)
	return res[0].Tier, e.page(dst[0].Blocks)
}

// flip changes the engine's bytes of the page at blocks 0..3, as KV
// recomputed in another batch differs in its last bits.
func flip(e *testEngine) {
	e.mem[7] ^= 0x01
}

func readmits(t *testing.T, ps *Store, result string) float64 {
	t.Helper()
	return counterValue(t, ps.m.readmitted.WithLabelValues(result))
}

// TestCacheFillReadmitsAPageHeldOnlyOnSSD: a page demoted to SSD and saved
// again with the same bytes comes back into DRAM as a clean copy of the
// same entry, and the next load restores it from DRAM. Before readmission
// the re-save was dropped as "already stored" and the page stayed on SSD
// for good (docs/benchmarks.md, the H200's SSD configuration).
func TestCacheFillReadmitsAPageHeldOnlyOnSSD(t *testing.T) {
	ps := testStore(t, 64<<20)
	e := newTestEngine(t)
	k := randKey(t)
	saveOne(t, ps, e, k, false)
	before := demoteOut(t, ps, k)
	if got := saveOne(t, ps, e, k, false); got.Tier != catalog.TierDRAM {
		t.Fatalf("re-save answered tier %v, want dram", got.Tier)
	}
	after, _ := ps.cat.Get(k)
	if after.DRAMSlot < 0 || !after.OnSSD || after.Generation != before.Generation || after.Checksum != before.Checksum {
		t.Fatalf("after readmission %+v; want the same entry (generation %d, checksum %08x) with a DRAM copy", after, before.Generation, before.Checksum)
	}
	if n := readmits(t, ps, "attached"); n != 1 {
		t.Fatalf("attached readmissions = %v, want 1", n)
	}
	tier, got := loadOne(t, ps, e, k)
	if tier != catalog.TierDRAM || !bytes.Equal(got, e.page(reqs([]pagekey.Key{k}, 0)[0].Blocks)) {
		t.Fatalf("load from %v, bytes equal %v; want dram, equal", tier, bytes.Equal(got, e.page(reqs([]pagekey.Key{k}, 0)[0].Blocks)))
	}
	ps.mu.Lock()
	dropped := ps.dropDRAMLocked(after) // a clean copy: eviction drops it without a write
	ps.mu.Unlock()
	if !dropped {
		t.Fatal("the readmitted DRAM copy could not be dropped")
	}
	if tier, got := loadOne(t, ps, e, k); tier != catalog.TierSSD || !bytes.Equal(got, e.page(reqs([]pagekey.Key{k}, 0)[0].Blocks)) {
		t.Fatalf("after the DRAM copy went: load from %v; want ssd, same bytes", tier)
	}
}

// TestNoReadmitLeavesThePageOnSSD: with readmission off (Options.NoReadmit,
// --ssd-no-readmit) a re-save of a page held only on SSD is answered
// "already stored" from the SSD: no DRAM copy, no readmission counted, and
// the next load reads it from the SSD, byte for byte.
func TestNoReadmitLeavesThePageOnSSD(t *testing.T) {
	ps := testStore(t, 64<<20)
	ps.opts.NoReadmit = true
	e := newTestEngine(t)
	k := randKey(t)
	saveOne(t, ps, e, k, false)
	before := demoteOut(t, ps, k)
	if got := saveOne(t, ps, e, k, false); got.Tier != catalog.TierSSD {
		t.Fatalf("re-save answered tier %v, want ssd (already stored)", got.Tier)
	}
	after := ssdOnly(t, ps, k)
	if after.Generation != before.Generation {
		t.Fatalf("entry changed: generation %d, was %d", after.Generation, before.Generation)
	}
	for _, r := range []string{"attached", "kept", "replaced", "no_room"} {
		if n := readmits(t, ps, r); n != 0 {
			t.Errorf("readmissions %s = %v, want 0", r, n)
		}
	}
	if tier, got := loadOne(t, ps, e, k); tier != catalog.TierSSD || !bytes.Equal(got, e.page(reqs([]pagekey.Key{k}, 0)[0].Blocks)) {
		t.Fatalf("load from %v; want ssd, the saved bytes", tier)
	}
}

// TestReadmitWithOtherBytes: recomputed KV whose bytes differ replaces the
// peer's own demoted SSD copy (every copy an entry names must hold the
// bytes of its checksum), but never a copy an engine saved durably, one
// acknowledged durable since its demotion, or one a lease holds.
func TestReadmitWithOtherBytes(t *testing.T) {
	cases := []struct {
		name    string
		prepare func(t *testing.T, ps *Store, e *testEngine, k pagekey.Key)
		replace bool
	}{
		{"demoted by the peer: replaced", func(t *testing.T, ps *Store, e *testEngine, k pagekey.Key) {
			saveOne(t, ps, e, k, false)
			demoteOut(t, ps, k)
		}, true},
		{"saved durably: kept", func(t *testing.T, ps *Store, e *testEngine, k pagekey.Key) {
			saveOne(t, ps, e, k, true)
			dropDRAMCopy(t, ps, k)
		}, false},
		{"demoted, then acknowledged to a durable save: kept", func(t *testing.T, ps *Store, e *testEngine, k pagekey.Key) {
			saveOne(t, ps, e, k, false)
			demoteOut(t, ps, k)
			if got := saveOne(t, ps, e, k, true); got.Tier != catalog.TierSSD {
				t.Fatalf("durable save answered %v, want ssd", got.Tier)
			}
		}, false},
		{"demoted while a durable save of it was in flight: kept", func(t *testing.T, ps *Store, e *testEngine, k pagekey.Key) {
			saveOne(t, ps, e, k, false)
			r := reqs([]pagekey.Key{k}, 0)[0]
			res := make([]Result, 1)
			it := ps.admitSave(testCtx(t), e.Engine, 0, r, true, res) // the durable save, up to its commit
			if it == nil {
				t.Fatalf("durable save took no slot: %+v", res[0])
			}
			if err := ps.gather(testCtx(t), e.Engine, r, it, true); err != nil {
				t.Fatal(err)
			}
			items := ps.writeThrough(testCtx(t), []*saveItem{it}, res)
			demoteOut(t, ps, k) // meanwhile the flusher demotes the cache fill
			ps.commitSaves(items, res)
			mustAllOK(t, "durable save", res)
			if res[0].Tier != catalog.TierSSD {
				t.Fatalf("durable save answered %v, want ssd", res[0].Tier)
			}
		}, false},
		{"demoted, leased: kept", func(t *testing.T, ps *Store, e *testEngine, k pagekey.Key) {
			saveOne(t, ps, e, k, false)
			demoteOut(t, ps, k)
			pins, _, _, _ := ps.LeasePins([]pagekey.Key{k})
			if pins.Len() != 1 {
				t.Fatal("lease pinned nothing")
			}
			t.Cleanup(func() { ps.ReleasePins(pins) })
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ps := testStore(t, 64<<20)
			e := newTestEngine(t)
			k := randKey(t)
			c.prepare(t, ps, e, k)
			before := ssdOnly(t, ps, k)
			old := e.page(reqs([]pagekey.Key{k}, 0)[0].Blocks)
			flip(e)
			fresh := e.page(reqs([]pagekey.Key{k}, 0)[0].Blocks)
			saveOne(t, ps, e, k, false)
			after, _ := ps.cat.Get(k)
			tier, got := loadOne(t, ps, e, k)
			if !c.replace {
				if after != before || readmits(t, ps, "kept") != 1 || tier != catalog.TierSSD || !bytes.Equal(got, old) {
					t.Fatalf("entry %+v (was %+v), %v kept, load from %v, old bytes %v; want the SSD copy untouched and served",
						after, before, readmits(t, ps, "kept"), tier, bytes.Equal(got, old))
				}
				return
			}
			want := crc32.Checksum(fresh, castagnoli)
			if after.OnSSD || after.DRAMSlot < 0 || after.Checksum != want || readmits(t, ps, "replaced") != 1 {
				t.Fatalf("entry %+v, %v replaced; want a DRAM-only page with checksum %08x", after, readmits(t, ps, "replaced"), want)
			}
			if tier != catalog.TierDRAM || !bytes.Equal(got, fresh) {
				t.Fatalf("load from %v, new bytes %v; want dram, the new bytes", tier, bytes.Equal(got, fresh))
			}
			if used := ps.ssd.Stats().UsedBytes; used != 0 {
				t.Fatalf("ssd holds %d bytes after the replacement; want the old copy freed", used)
			}
		})
	}
}

// dropDRAMCopy drops k's DRAM copy (held on SSD too), as eviction does.
func dropDRAMCopy(t *testing.T, ps *Store, k pagekey.Key) {
	t.Helper()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	e, _ := ps.cat.Get(k)
	if !ps.dropDRAMLocked(e) {
		t.Fatal("could not drop the DRAM copy")
	}
}

// storeIn is testStore over dir (catalog, SSD file), recovered from what an
// earlier store left there, as a peer's start does; closed with the test.
func storeIn(t *testing.T, dir string) *Store {
	t.Helper()
	pool, err := dram.New(dram.Config{Bytes: 4 << 20, SlabBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	st, err := ssd.Open(ssd.Config{Dir: filepath.Join(dir, "ssd"), CapacityBytes: 64 << 20, FileBytes: 64 << 20, QueueDepth: 8, Sync: ssd.SyncNone})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.Open(catalog.Options{Dir: filepath.Join(dir, "catalog")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close(); st.Close(); pool.Close() })
	ps := New(cat, pool, st, Options{QueryBudget: 1 << 20, SSDDir: filepath.Join(dir, "ssd"), Registry: prometheus.NewRegistry(), Log: zerolog.Nop()})
	sc, err := ps.ScanSSD(filepath.Join(dir, "ssd"), ScanFull)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Recover(sc); err != nil {
		t.Fatal(err)
	}
	return ps
}

// TestReadmissionAfterARestart: which SSD copies the peer demoted itself is
// persisted, so after a restart other bytes still replace such a copy, and
// still never one a durable save was acknowledged on.
func TestReadmissionAfterARestart(t *testing.T) {
	for _, durable := range []bool{false, true} {
		dir := t.TempDir()
		e := newTestEngine(t)
		k := randKey(t)
		func() {
			ps := storeIn(t, dir)
			saveOne(t, ps, e, k, false)
			demoteOut(t, ps, k)
			if durable {
				saveOne(t, ps, e, k, true) // acknowledged on the demoted copy
			}
			ps.cat.Close() // the peer stops
		}()
		ps := storeIn(t, dir)
		before := ssdOnly(t, ps, k)
		if before.Demoted == durable {
			t.Fatalf("durable %v: recovered entry %+v, demoted mark %v", durable, before, before.Demoted)
		}
		flip(e)
		saveOne(t, ps, e, k, false)
		after, _ := ps.cat.Get(k)
		if replaced := !after.OnSSD; replaced == durable || readmits(t, ps, "replaced") != boolFloat(!durable) {
			t.Fatalf("durable %v: after the restart, entry %+v (was %+v); want replaced %v", durable, after, before, !durable)
		}
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// storeWithSSDOnlyPages is a test store with an SSD tier and n pages saved
// and demoted: held on SSD only.
func storeWithSSDOnlyPages(t *testing.T, n int) (*Store, *testEngine, []pagekey.Key) {
	t.Helper()
	ps, e := testStore(t, 64<<20), newTestEngine(t)
	keys := randKeys(t, n)
	for _, k := range keys {
		saveOne(t, ps, e, k, false)
		demoteOut(t, ps, k)
	}
	return ps, e, keys
}

// TestAReadmissionIntoAFullPoolMustBeHotterThanThePageItPushesOut: with the
// pool inside the flusher's reserve, a readmission takes DRAM only when its
// page was asked for more often lately than the page the flusher would evict
// next; otherwise the page stays on SSD and nothing is copied (colder). On
// the H200's SSD configuration readmissions evicted pages about to be asked
// for, 8,179 a minute, with 1,888 pages restored from DRAM
// (docs/benchmarks.md). --ssd-readmit-all (Options.ReadmitAll) readmits
// regardless.
func TestAReadmissionIntoAFullPoolMustBeHotterThanThePageItPushesOut(t *testing.T) {
	ps, e, keys := storeWithSSDOnlyPages(t, 2)
	k, k2 := keys[0], keys[1]
	fresh := fillDRAM(t, ps, e.PageBytes)
	ps.mu.Lock()
	ps.dropDRAMLocked(fresh[len(fresh)-1]) // one slot free, well inside the reserve
	ps.mu.Unlock()
	if v, _ := ps.mu.dram.Victim(); v != fresh[0].Key {
		t.Fatal("the oldest fresh page is not the next victim")
	}
	slots := ps.pool.Stats().Slots
	ps.NoteAsked(e.Engine, []pagekey.Key{fresh[0].Key, fresh[0].Key, k, k}) // the victim twice, k as often

	if got := saveOne(t, ps, e, k, false); got.Tier != catalog.TierSSD {
		t.Fatalf("a readmission asked for as often as the victim answered %v, want ssd", got.Tier)
	}
	ssdOnly(t, ps, k)
	if n, a := readmits(t, ps, "colder"), readmits(t, ps, "attached"); n != 1 || a != 0 {
		t.Fatalf("colder %v, attached %v readmissions; want 1, 0", n, a)
	}
	if got := ps.pool.Stats().Slots; got != slots {
		t.Fatalf("a refused readmission left %d slots allocated, want %d: it took one", got, slots)
	}

	// The GPU path's allocation judges the same way: no slot, no item.
	gres := make([]Result, 1)
	if items := ps.allocSaves(testCtx(t), e.Engine, reqs([]pagekey.Key{k}, 0), false, gres); len(items) != 0 || gres[0].Code != CodeOK || gres[0].Tier != catalog.TierSSD {
		t.Fatalf("GPU-path allocation of a colder readmission: %d items, result %+v; want none, ok on ssd", len(items), gres[0])
	}
	if n := readmits(t, ps, "colder"); n != 2 {
		t.Fatalf("colder readmissions = %v after the GPU path's, want 2", n)
	}

	ps.NoteAsked(e.Engine, []pagekey.Key{k}) // now three asks against the victim's two
	if got := saveOne(t, ps, e, k, false); got.Tier != catalog.TierDRAM {
		t.Fatalf("a readmission hotter than the victim answered %v, want dram", got.Tier)
	}
	if a := readmits(t, ps, "attached"); a != 1 {
		t.Fatalf("attached readmissions = %v, want 1", a)
	}

	// The flusher restores its reserve; k2, never asked for, is colder than
	// any victim asked once, unless every readmission is taken.
	ps.mu.Lock()
	ps.dropDRAMLocked(fresh[1])
	ps.mu.Unlock()
	v, _ := ps.mu.dram.Victim()
	ps.NoteAsked(e.Engine, []pagekey.Key{v})
	ps.opts.ReadmitAll = true
	if got := saveOne(t, ps, e, k2, false); got.Tier != catalog.TierDRAM {
		t.Fatalf("with ReadmitAll a colder readmission answered %v, want dram", got.Tier)
	}
	if n := readmits(t, ps, "colder"); n != 2 {
		t.Fatalf("colder readmissions = %v after ReadmitAll, want still 2", n)
	}
}

// TestAReadmissionWithRoomIsNotJudged: while the pool has room beyond the
// flusher's reserve a readmission evicts nothing, so even a page never
// asked for comes back, whatever the pool holds.
func TestAReadmissionWithRoomIsNotJudged(t *testing.T) {
	ps, e, keys := storeWithSSDOnlyPages(t, 1)
	hot, k := randKey(t), keys[0]
	saveOne(t, ps, e, hot, false)
	ps.NoteAsked(e.Engine, []pagekey.Key{hot, hot, hot})
	if v, ok := ps.mu.dram.Victim(); !ok || v != hot {
		t.Fatal("the hot page is not the only DRAM page")
	}
	if got := saveOne(t, ps, e, k, false); got.Tier != catalog.TierDRAM {
		t.Fatalf("a readmission into a pool with room answered %v, want dram", got.Tier)
	}
	if n, a := readmits(t, ps, "colder"), readmits(t, ps, "attached"); n != 0 || a != 1 {
		t.Fatalf("colder %v, attached %v; want 0, 1", n, a)
	}
}

// TestAReadmissionIntoAFullPoolIsJudgedAgainstTheCopyItTakes: with no slot
// free a readmission takes a clean copy's slot (allocReadmit), not the
// flusher's next victim, so it is judged against that copy: here the next
// victim, a fresh page, was asked for three times, the clean copy never,
// and a page asked for once comes back in the clean copy's place.
func TestAReadmissionIntoAFullPoolIsJudgedAgainstTheCopyItTakes(t *testing.T) {
	ps, e, keys := storeWithSSDOnlyPages(t, 2)
	k, clean := keys[0], keys[1]
	if got := saveOne(t, ps, e, clean, false); got.Tier != catalog.TierDRAM { // readmitted while the pool has room: a clean copy
		t.Fatalf("clean copy's readmission answered %v", got.Tier)
	}
	fresh := fillDRAM(t, ps, e.PageBytes)
	if ps.pool.CanAlloc(e.PageBytes) {
		t.Fatal("the pool still has a free slot")
	}
	if v, _ := ps.mu.dram.Victim(); v != fresh[0].Key {
		t.Fatal("the oldest fresh page is not the next victim")
	}
	ps.NoteAsked(e.Engine, []pagekey.Key{fresh[0].Key, fresh[0].Key, fresh[0].Key, k})
	if got := saveOne(t, ps, e, k, false); got.Tier != catalog.TierDRAM {
		t.Fatalf("readmission hotter than the clean copy it takes answered %v, want dram", got.Tier)
	}
	ssdOnly(t, ps, clean)
	if n := readmits(t, ps, "colder"); n != 0 {
		t.Fatalf("colder readmissions = %v, want 0", n)
	}
}

// TestAsksAreCountedOffTheLookupsPath: while RunAsks runs, NoteAsked hands
// the keys over and returns; they are counted soon after. A full queue
// drops a lookup's keys, counted, rather than making the lookup wait.
func TestAsksAreCountedOffTheLookupsPath(t *testing.T) {
	e, k := newTestEngine(t), randKey(t)
	// Without an SSD tier there is no readmission to judge: nothing counted.
	dramOnly := testStore(t, 0)
	dramOnly.NoteAsked(e.Engine, []pagekey.Key{k})
	if got := dramOnly.AskedLately(k); got != 0 {
		t.Fatalf("a DRAM-only store counted %d asks", got)
	}
	ps := testStore(t, 64<<20)
	ps.NoteAsked(e.Engine, []pagekey.Key{k}) // no RunAsks: counted at once
	if got := ps.AskedLately(k); got != 1 {
		t.Fatalf("counted %d, want 1 at once", got)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan struct{})
	go func() { defer close(done); ps.RunAsks(ctx) }()
	for start := time.Now(); ps.askers.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("RunAsks did not start")
		}
	}
	ps.NoteAsked(e.Engine, []pagekey.Key{k, k})
	deadline := time.Now().Add(5 * time.Second)
	for ps.AskedLately(k) < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := ps.AskedLately(k); got != 3 {
		t.Fatalf("counted %d, want 3", got)
	}
	cancel()
	<-done

	// Nothing draining the queue (a RunAsks counted but stuck): the queue
	// fills, and the next lookup's keys are dropped.
	ps.askers.Add(1)
	defer ps.askers.Add(-1)
	for range askQueue + 1 {
		ps.NoteAsked(e.Engine, []pagekey.Key{k})
	}
	if d := counterValue(t, ps.m.askedDropped); d != 1 {
		t.Fatalf("dropped %v lookups, want 1", d)
	}
}
