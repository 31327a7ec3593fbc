package catalog

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

func snapshot(c *Catalog) map[pagekey.Key]Entry {
	m := map[pagekey.Key]Entry{}
	c.Range(func(e Entry) bool { m[e.Key] = e; return true })
	return m
}

// asRecovered is what Open must return for a persisted entry.
func asRecovered(e Entry) Entry {
	e.DRAMSlot = -1
	return e
}

func TestRecoverOnlySSDEntries(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	want := map[pagekey.Key]Entry{}
	var batch []Entry
	for i := range 300 {
		switch i % 3 {
		case 0: // DRAM only: not persisted
			batch = append(batch, dramEntry(i))
		case 1: // SSD only
			batch = append(batch, ssdEntry(i))
			want[key(i)] = ssdEntry(i)
		case 2: // DRAM and SSD: persisted, recovered without its slot
			e := ssdEntry(i)
			e.DRAMSlot = int64(i)
			batch = append(batch, e)
			want[key(i)] = asRecovered(e)
		}
	}
	if err := c.Put(batch...); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	c = mustOpen(t, Options{Dir: dir})
	got := snapshot(c)
	if len(got) != len(want) {
		t.Fatalf("recovered %d entries, want %d", len(got), len(want))
	}
	for k, e := range want {
		if got[k] != e {
			t.Fatalf("recovered %s = %+v, want %+v", k, got[k], e)
		}
	}
	if s := c.Stats(); s.Recovered != len(want) || s.CorruptRecords != 0 {
		t.Fatalf("Stats = %+v", s)
	}
}

func TestUpdateDeletePersist(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if err := c.Put(ssdEntry(i)); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name string
		run  func() error
	}{
		{"update moves the page", func() error {
			_, _, err := c.Update(key(0), func(e *Entry) bool { e.SSD.Offset = 1 << 40; e.Generation = 77; return true })
			return err
		}},
		{"update drops SSD", func() error {
			_, _, err := c.Update(key(1), func(e *Entry) bool { e.OnSSD, e.DRAMSlot = false, 3; return true })
			return err
		}},
		{"update deletes", func() error {
			_, _, err := c.Update(key(2), func(*Entry) bool { return false })
			return err
		}},
		{"delete", func() error { return c.Delete(key(3)) }},
		{"put DRAM only over SSD", func() error { return c.Put(dramEntry(4)) }},
	}
	for _, s := range steps {
		if err := s.run(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = mustOpen(t, Options{Dir: dir})
	moved := ssdEntry(0)
	moved.SSD.Offset, moved.Generation = 1<<40, 77
	want := map[pagekey.Key]Entry{key(0): moved, key(5): ssdEntry(5)}
	got := snapshot(c)
	if len(got) != len(want) || got[key(0)] != want[key(0)] || got[key(5)] != want[key(5)] {
		t.Fatalf("recovered %+v, want %+v", got, want)
	}
}

func TestCorruptRecordSkipped(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := c.Put(ssdEntry(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// Damage records behind the catalog's back: a flipped bit, a truncated
	// value, an unknown version, a value moved under another key, and a key
	// of the wrong length.
	db, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLogger{&pebbleEvents{}}})
	if err != nil {
		t.Fatal(err)
	}
	rk := func(i int) []byte { return appendRecordKey(nil, key(i)) }
	val := func(i int) []byte { return appendRecord(nil, ssdEntry(i)) }
	flipped := val(0)
	flipped[20] ^= 1
	unknown := val(2)
	unknown[0] = 9
	writes := []struct{ k, v []byte }{
		{rk(0), flipped},
		{rk(1), val(1)[:40]},
		{rk(2), unknown},
		{rk(3), val(4)},
		{append(rk(5), 0), val(5)},
	}
	for _, w := range writes {
		if err := db.Set(w.k, w.v, pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	c = mustOpen(t, Options{Dir: dir})
	s := c.Stats()
	if s.CorruptRecords != len(writes) || s.Recovered != 6 || c.Len() != 6 {
		t.Fatalf("Stats = %+v, want 5 corrupt and 6 recovered", s)
	}
	for i := range 4 {
		if _, ok := c.Get(key(i)); ok {
			t.Fatalf("corrupt record %d recovered", i)
		}
	}
	for i := 4; i < 10; i++ {
		if e, ok := c.Get(key(i)); !ok || e != ssdEntry(i) {
			t.Fatalf("record %d = %+v, %v", i, e, ok)
		}
	}
}

// walSyncs counts the syncs of Pebble's write-ahead log files (*.log), as
// the filesystem sees them.
type walSyncs struct{ n atomic.Int64 }

func (w *walSyncs) String() string { return "walSyncs" }
func (w *walSyncs) MaybeError(op errorfs.Op) error {
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		if strings.HasSuffix(op.Path, ".log") {
			w.n.Add(1)
		}
	}
	return nil
}

// TestCommitsSyncOnlyWhatMustLast: a DRAM copy added to or dropped from an
// SSD page, and a change of LastAccess or Hits, commit without waiting for
// the disk (on the H200 every readmission and every eviction of a clean
// DRAM copy paid a synced Pebble commit under the store's lock: 46 s of a
// 60-s run in save allocation) and still reach it by a clean Close, Lookup's
// touches with them; a record that says something new, a page leaving the
// SSD, and a deletion wait for the disk. The syncs are counted at the
// filesystem.
func TestCommitsSyncOnlyWhatMustLast(t *testing.T) {
	dir := t.TempDir()
	syncs := &walSyncs{}
	fs := errorfs.Wrap(vfs.Default, syncs)
	c := mustOpenNoCleanup(t, Options{Dir: dir, fs: fs})
	e := ssdEntry(7)
	if err := c.Put(e, ssdEntry(8), ssdEntry(9)); err != nil {
		t.Fatal(err)
	}
	check := func(what string, fn func() error, synced bool) {
		t.Helper()
		before, stats := syncs.n.Load(), c.Stats().Syncs
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		got := syncs.n.Load() > before
		if got != synced || (c.Stats().Syncs > stats) != synced {
			t.Fatalf("%s: WAL synced %v (Stats.Syncs %d -> %d); want %v", what, got, stats, c.Stats().Syncs, synced)
		}
	}
	update := func(k pagekey.Key, fn func(*Entry)) func() error {
		return func() error {
			_, _, err := c.Update(k, func(x *Entry) bool { fn(x); return true })
			return err
		}
	}
	touched := ssdEntry(10)
	if err := c.Put(touched); err != nil {
		t.Fatal(err)
	}
	c.Lookup([]pagekey.Key{touched.Key}, 5_000_000) // LastAccess and Hits in memory only
	check("DRAM copy of a touched page added", update(touched.Key, func(x *Entry) { x.DRAMSlot = 4 }), false)
	check("DRAM copy added", update(e.Key, func(x *Entry) { x.DRAMSlot = 3 }), false)
	check("DRAM copy dropped", update(e.Key, func(x *Entry) { x.DRAMSlot = -1 }), false)
	check("used again", update(e.Key, func(x *Entry) { x.LastAccess, x.Hits = 99_000_000, 42 }), false)
	check("new bytes", update(e.Key, func(x *Entry) { x.Checksum, x.Generation = 77, 70 }), true)
	check("demoted mark", update(e.Key, func(x *Entry) { x.Demoted = true }), true)
	check("off the SSD", update(key(9), func(x *Entry) { x.OnSSD, x.SSD, x.DRAMSlot = false, SSDLoc{}, 5 }), true)
	check("deleted", func() error { return c.Delete(key(8)) }, true)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c2 := mustOpen(t, Options{Dir: dir})
	got, ok := c2.Get(e.Key)
	want := e
	want.LastAccess, want.Hits, want.Checksum, want.Generation, want.Demoted = 99_000_000, 42, 77, 70, true
	if !ok || got != want {
		t.Fatalf("after reopen: %+v %v, want %+v", got, ok, want)
	}
	touched.LastAccess, touched.Hits = 5_000_000, touched.Hits+1
	if got, ok := c2.Get(touched.Key); !ok || got != touched {
		t.Fatalf("the touched page after reopen: %+v %v, want Lookup's touch kept: %+v", got, ok, touched)
	}
	for _, k := range []pagekey.Key{key(8), key(9)} {
		if _, ok := c2.Get(k); ok {
			t.Fatalf("page %v came back after a clean Close", k)
		}
	}
}
