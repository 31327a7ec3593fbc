package catalog

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// writeGenerations leaves dir with every kind of Pebble file: two rounds of
// puts, each followed by a close and a reopen (which flushes the replayed
// WAL into an SST), then a third round left in the WAL.
func writeGenerations(t *testing.T, dir string) map[pagekey.Key]Entry {
	t.Helper()
	want := map[pagekey.Key]Entry{}
	for round := range 3 {
		c := mustOpenNoCleanup(t, Options{Dir: dir})
		for i := range 40 {
			e := ssdEntry(round*100 + i)
			if err := c.Put(e); err != nil {
				t.Fatal(err)
			}
			want[e.Key] = e
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return want
}

func mustOpenNoCleanup(t *testing.T, opts Options) *Catalog {
	t.Helper()
	c, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return c
}

// catalogFiles returns dir's files of one kind, sorted by name.
func catalogFiles(t *testing.T, dir, kind string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		n := de.Name()
		if (kind == ".sst" || kind == ".log") && strings.HasSuffix(n, kind) ||
			strings.HasPrefix(n, kind) && kind != ".sst" && kind != ".log" {
			out = append(out, filepath.Join(dir, n))
		}
	}
	sort.Strings(out)
	return out
}

func flipBit(t *testing.T, path string, at float64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		t.Fatalf("read %s: %d bytes, %v", path, len(b), err)
	}
	b[int(float64(len(b)-1)*at)] ^= 0x10
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestOpenSurvivesDamage damages each kind of catalog file and opens it
// again: Open must not end the process (Pebble's DataCorruption and Fatalf
// handlers exit by default), must never return an entry that differs from
// what was written, must say when it set the store aside, and must leave a
// store that takes commits and recovers them.
func TestOpenSurvivesDamage(t *testing.T) {
	newest := func(kind string) func(t *testing.T, dir string) string {
		return func(t *testing.T, dir string) string {
			fs := catalogFiles(t, dir, kind)
			if len(fs) == 0 {
				t.Fatalf("no %s file in %s", kind, dir)
			}
			return fs[len(fs)-1]
		}
	}
	// olderWAL copies the live WAL under a newer number, so the original
	// becomes an older WAL that Pebble must replay strictly.
	olderWAL := func(t *testing.T, dir string) string {
		wal := newest(".log")(t, dir)
		b, err := os.ReadFile(wal)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "999999.log"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return wal
	}
	for _, tc := range []struct {
		name   string
		pick   func(t *testing.T, dir string) string
		damage func(t *testing.T, path string)
	}{
		{"flip SST start", newest(".sst"), func(t *testing.T, p string) { flipBit(t, p, 0.1) }},
		{"flip SST middle", newest(".sst"), func(t *testing.T, p string) { flipBit(t, p, 0.5) }},
		{"flip SST footer", newest(".sst"), func(t *testing.T, p string) { flipBit(t, p, 0.99) }},
		{"delete SST", newest(".sst"), func(t *testing.T, p string) { os.Remove(p) }},
		{"flip last WAL", newest(".log"), func(t *testing.T, p string) { flipBit(t, p, 0.3) }},
		{"flip older WAL", olderWAL, func(t *testing.T, p string) { flipBit(t, p, 0.3) }},
		{"flip MANIFEST", newest("MANIFEST"), func(t *testing.T, p string) { flipBit(t, p, 0.5) }},
		{"delete MANIFEST", newest("MANIFEST"), func(t *testing.T, p string) { os.Remove(p) }},
		{"flip OPTIONS", newest("OPTIONS"), func(t *testing.T, p string) { flipBit(t, p, 0.2) }},
		{"delete OPTIONS", newest("OPTIONS"), func(t *testing.T, p string) { os.Remove(p) }},
		{"delete dir", func(t *testing.T, dir string) string { return dir }, func(t *testing.T, p string) { os.RemoveAll(p) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "catalog")
			want := writeGenerations(t, dir)
			tc.damage(t, tc.pick(t, dir))

			c := mustOpen(t, Options{Dir: dir})
			for k, e := range snapshot(c) {
				if w, ok := want[k]; !ok || w != e {
					t.Fatalf("recovered %+v, written %+v (%v)", e, w, ok)
				}
			}
			d := c.Stats().Damage
			t.Logf("recovered %d of %d; damage %+v", c.Len(), len(want), d)
			if d.Reason != "" {
				if _, err := os.Stat(d.MovedAside); err != nil {
					t.Fatalf("damaged store not kept aside: %v", err)
				}
			}
			if err := c.Health(); err != nil {
				t.Fatalf("Health after damage: %v", err)
			}
			// The store works: a commit survives a reopen.
			fresh := ssdEntry(999)
			if err := c.Put(fresh); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			c2 := mustOpen(t, Options{Dir: dir})
			if e, ok := c2.Get(fresh.Key); !ok || e != fresh {
				t.Fatalf("entry put after damage: %+v %v", e, ok)
			}
		})
	}
}

// diskFS reports a settable amount of free space.
type diskFS struct {
	vfs.FS
	avail atomic.Uint64
}

func (f *diskFS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{AvailBytes: f.avail.Load(), TotalBytes: 1 << 40}, nil
}

// enospc fails every write while on (only to paths containing only, if
// set).
type enospc struct {
	on   atomic.Bool
	only string
}

func (e *enospc) String() string { return "enospc" }
func (e *enospc) MaybeError(op errorfs.Op) error {
	if e.on.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && strings.Contains(op.Path, e.only) {
		return syscall.ENOSPC
	}
	return nil
}

func newFaultFS() (*diskFS, *enospc, vfs.FS) {
	d := &diskFS{FS: vfs.Default}
	d.avail.Store(1 << 40)
	inj := &enospc{}
	return d, inj, errorfs.Wrap(d, inj)
}

// TestReserveRefusesCommits: below the reserve, commits that persist records
// fail with ErrNoSpace before Pebble writes anything, deletions and DRAM-only
// changes go on, Health says why, and everything works again when space
// returns.
func TestReserveRefusesCommits(t *testing.T) {
	disk, _, fs := newFaultFS()
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir, fs: fs, ReserveBytes: 1 << 20})
	if err := c.Put(ssdEntry(1), ssdEntry(2)); err != nil {
		t.Fatal(err)
	}
	disk.avail.Store(1 << 19)
	commits := c.Stats().Commits
	if err := c.Put(ssdEntry(3)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Put below the reserve: %v, want ErrNoSpace", err)
	}
	if _, ok := c.Get(key(3)); ok || c.Stats().Commits != commits {
		t.Fatal("a refused Put changed the catalog")
	}
	if err := c.Health(); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Health = %v, want ErrNoSpace", err)
	}
	if err := c.Put(dramEntry(4)); err != nil {
		t.Fatalf("DRAM-only Put: %v", err)
	}
	if err := c.Delete(key(2)); err != nil {
		t.Fatalf("Delete below the reserve: %v", err)
	}
	// A DRAM copy added to or dropped from an SSD page changes nothing the
	// record says about the page: it must not need the disk.
	if _, _, err := c.Update(key(1), func(e *Entry) bool { e.DRAMSlot, e.LastAccess = 9, 12345; return true }); err != nil {
		t.Fatalf("Update of the DRAM copy below the reserve: %v", err)
	}
	if _, _, err := c.Update(key(1), func(e *Entry) bool { e.Generation++; return true }); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Update of the generation below the reserve: %v, want ErrNoSpace", err)
	}
	if err := c.Repair(); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Repair while full = %v", err)
	}
	disk.avail.Store(1 << 30)
	if err := c.Repair(); err != nil {
		t.Fatalf("Repair with space back: %v", err)
	}
	if err := c.Put(ssdEntry(3)); err != nil {
		t.Fatal(err)
	}
	assertReopens(t, c, dir, fs, []int{1, 3})
}

// assertReopens closes c and checks that its directory recovers exactly the
// SSD entries ids.
func assertReopens(t *testing.T, c *Catalog, dir string, fs vfs.FS, ids []int) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c2 := mustOpen(t, Options{Dir: dir, fs: fs})
	got := snapshot(c2)
	if len(got) != len(ids) {
		t.Fatalf("reopened with %d entries %v, want %v", len(got), got, ids)
	}
	for _, i := range ids {
		if got[key(i)] != asRecovered(ssdEntry(i)) {
			t.Fatalf("reopened entry %d = %+v", i, got[key(i)])
		}
	}
}

// TestFailedCommitDoesNotExit: a write failing under Pebble (ENOSPC after
// the reserve check passed) is Pebble's "fatal commit error", which exits
// the process by default. It must fail that Put, leave memory as it was,
// keep deletions working in memory, and Repair must rewrite the store from
// memory once writes succeed again.
func TestFailedCommitDoesNotExit(t *testing.T) {
	_, inj, fs := newFaultFS()
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir, fs: fs})
	if err := c.Put(ssdEntry(1), ssdEntry(2), ssdEntry(5)); err != nil {
		t.Fatal(err)
	}
	inj.on.Store(true)
	if err := c.Put(ssdEntry(3)); !errors.Is(err, ErrNoSpace) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Put on a failing disk: %v, want ErrNoSpace and ErrUnavailable", err)
	}
	if _, ok := c.Get(key(3)); ok {
		t.Fatal("a failed Put changed memory")
	}
	if err := c.Health(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Health = %v", err)
	}
	if err := c.Delete(key(2)); err != nil {
		t.Fatalf("Delete with the store failed: %v", err)
	}
	if err := c.Put(ssdEntry(4)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Put with the store failed: %v", err)
	}
	if err := c.Repair(); err == nil {
		t.Fatal("Repair succeeded on a failing disk")
	}
	inj.on.Store(false)
	if err := c.Repair(); err != nil {
		t.Fatalf("Repair: %v", err)
	}
	if err := c.Put(ssdEntry(4)); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Rebuilds != 1 {
		t.Fatalf("Stats = %+v, want one rebuild", s)
	}
	assertReopens(t, c, dir, fs, []int{1, 4, 5})
}

// TestOpenOnFullDisk: a store that cannot be opened for want of space
// leaves an in-memory catalog that Adopt fills and Repair persists.
func TestOpenOnFullDisk(t *testing.T) {
	_, inj, fs := newFaultFS()
	dir := t.TempDir()
	inj.on.Store(true)
	c := mustOpen(t, Options{Dir: dir, fs: fs})
	if err := c.Health(); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Health = %v, want ErrNoSpace", err)
	}
	if d := c.Stats().Damage; d.Reason != "" {
		t.Fatalf("a full disk is not damage: %+v", d)
	}
	if err := c.Adopt([]Entry{ssdEntry(1), ssdEntry(2)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ssdEntry(3)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Put = %v", err)
	}
	inj.on.Store(false)
	if err := c.Repair(); err != nil {
		t.Fatal(err)
	}
	assertReopens(t, c, dir, fs, []int{1, 2})
}

// TestOpenWhoseFlushDiesReturns: reopening a store with entries in its WAL
// flushes them; when that flush's MANIFEST write fails (the disk filled
// after the space check), Pebble calls Fatalf on its flush goroutine and
// its Open would wait forever. Open must return, with the catalog
// unavailable, and Repair must persist it once writes succeed.
func TestOpenWhoseFlushDiesReturns(t *testing.T) {
	_, inj, fs := newFaultFS()
	dir := t.TempDir()
	c := mustOpenNoCleanup(t, Options{Dir: dir, fs: fs})
	if err := c.Put(ssdEntry(1), ssdEntry(2)); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	inj.only = "MANIFEST" // the SST of the flush is written, its version edit is not
	inj.on.Store(true)
	c = mustOpen(t, Options{Dir: dir, fs: fs})
	if err := c.Health(); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Health = %v, want ErrNoSpace", err)
	}
	if err := c.Adopt([]Entry{ssdEntry(1), ssdEntry(2)}, nil); err != nil {
		t.Fatal(err)
	}
	inj.on.Store(false)
	if err := c.Repair(); err != nil {
		t.Fatal(err)
	}
	assertReopens(t, c, dir, fs, []int{1, 2})
}

// TestRuntimeCorruptionRebuilds: corruption Pebble reports on its own
// goroutines (a compaction reading a bad block) goes to the DataCorruption
// listener, which by default exits. Here it fails the store; the next
// Repair rewrites it from memory, and the rewritten store holds exactly
// the catalog's entries.
func TestRuntimeCorruptionRebuilds(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	if err := c.Put(ssdEntry(1), ssdEntry(2)); err != nil {
		t.Fatal(err)
	}
	c.store.ev.listener().DataCorruption(pebble.DataCorruptionInfo{Path: "000001.sst", Details: errors.New("checksum mismatch")})
	if err := c.Put(ssdEntry(3)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Put after corruption: %v, want ErrUnavailable", err)
	}
	if err := c.Repair(); err != nil {
		t.Fatalf("Repair: %v", err)
	}
	if err := c.Put(ssdEntry(3)); err != nil {
		t.Fatal(err)
	}
	assertReopens(t, c, dir, nil, []int{1, 2, 3})
}

var _ io.Closer = (*Catalog)(nil)
