package catalog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// stuckClose makes Pebble's Close hang while armed: the sync of its WAL
// that closing the log writer makes blocks until release (errorfs injects
// nothing into Close itself).
type stuckClose struct {
	armed   atomic.Bool
	release chan struct{}
}

func (s *stuckClose) String() string { return "stuckClose" }
func (s *stuckClose) MaybeError(op errorfs.Op) error {
	isSync := op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo
	if s.armed.Load() && isSync && strings.HasSuffix(op.Path, ".log") {
		<-s.release
		return nil
	}
	return nil
}

func newStuckFS(t *testing.T) (*stuckClose, vfs.FS) {
	s := &stuckClose{release: make(chan struct{})}
	prev := closeTimeout
	closeTimeout = 50 * time.Millisecond
	t.Cleanup(func() {
		if s.armed.Load() {
			close(s.release)
		}
		closeTimeout = prev
	})
	d := &diskFS{FS: vfs.Default}
	d.avail.Store(1 << 40)
	return s, errorfs.Wrap(d, s)
}

// walFiles lists dir's Pebble WAL files (not those set aside).
func walFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// releaseStuck lets the abandoned Close end and waits until it has.
func releaseStuck(t *testing.T, s *stuckClose, dir string) {
	t.Helper()
	s.armed.Store(false)
	close(s.release)
	select {
	case <-abandonedDone(dir):
	case <-time.After(repairGuard):
		t.Fatal("the abandoned Close never ended")
	}
}

// TestRepairLeavesAbandonedStore (issue 34, item 6b): a store whose Close
// timed out is abandoned with its DB still running in the directory.
// Repair must not clear that directory or open a fresh store in it until
// the abandoned Close ends, and must say why; then it rewrites the store
// from memory.
func TestRepairLeavesAbandonedStore(t *testing.T) {
	stuck, fs := newStuckFS(t)
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir, fs: fs})
	if err := c.Put(ssdEntry(1), ssdEntry(2)); err != nil {
		t.Fatal(err)
	}
	// Corruption Pebble reported on its own goroutines: Repair fails the
	// store and closes it, and that Close hangs.
	c.store.ev.listener().DataCorruption(pebble.DataCorruptionInfo{Path: "test", Details: errors.New("injected")})
	stuck.armed.Store(true)
	wal := walFiles(t, dir)
	if len(wal) == 0 {
		t.Fatal("no WAL in the store")
	}
	err := c.Repair()
	for _, w := range wal {
		if _, err := os.Stat(w); err != nil {
			t.Errorf("Repair removed the abandoned store's files: %v", err)
		}
	}
	if !errors.Is(err, ErrAbandoned) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Repair while the failed store still closes: %v, want ErrAbandoned", err)
	}
	releaseStuck(t, stuck, dir)
	if err := c.Repair(); err != nil {
		t.Fatalf("Repair once the abandoned store closed: %v", err)
	}
	if err := c.Put(ssdEntry(3)); err != nil {
		t.Fatal(err)
	}
	assertReopens(t, c, dir, fs, []int{1, 2, 3})
}

// TestReopenAfterAbandonedClose (issue 34, item 6b): a Close that timed out
// leaves its DB running in the directory; an Open of the same directory in
// this process (a peer started again) must not read it, move it aside as
// damaged or open a second DB in it: it stays in memory only, unavailable
// with ErrAbandoned, and its Repair succeeds once the old Close ended.
func TestReopenAfterAbandonedClose(t *testing.T) {
	stuck, fs := newStuckFS(t)
	dir := t.TempDir()
	c, err := Open(Options{Dir: dir, fs: fs})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ssdEntry(1), ssdEntry(2)); err != nil {
		t.Fatal(err)
	}
	stuck.armed.Store(true)
	if err := c.Close(); err == nil || !strings.Contains(err.Error(), "abandoned") {
		t.Fatalf("Close = %v, want it abandoned", err)
	}
	c2 := mustOpen(t, Options{Dir: dir, fs: fs})
	if d := c2.Stats().Damage; d != (Damage{}) {
		t.Fatalf("the abandoned store was taken for damage: %+v", d)
	}
	if err := c2.Health(); !errors.Is(err, ErrAbandoned) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Health of a reopen over an abandoned store: %v, want ErrAbandoned", err)
	}
	if len(walFiles(t, dir)) == 0 {
		t.Fatal("the abandoned store's files were moved")
	}
	if err := c2.Repair(); !errors.Is(err, ErrAbandoned) {
		t.Fatalf("Repair while the old store still closes: %v", err)
	}
	releaseStuck(t, stuck, dir)
	// The fabric adopts the pages from the SSD headers into the catalog
	// that opened without its store; Repair then persists them.
	if err := c2.Adopt([]Entry{ssdEntry(1), ssdEntry(2)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c2.Repair(); err != nil {
		t.Fatalf("Repair once the old store closed: %v", err)
	}
	assertReopens(t, c2, dir, fs, []int{1, 2})
}

// TestFailedCommitDoesNotWaitForClose (issue 34, item 6a): a commit that
// finds its store failed lets it go; the writer (a save, under the fabric
// store's lock) must not wait for Pebble's Close, which may hang up to
// closeTimeout or for good. The directory is reused once that Close ends.
func TestFailedCommitDoesNotWaitForClose(t *testing.T) {
	stuck, fs := newStuckFS(t)
	closeTimeout = time.Hour // a writer waiting on the Close never returns here
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir, fs: fs})
	if err := c.Put(ssdEntry(1)); err != nil {
		t.Fatal(err)
	}
	c.store.ev.listener().DataCorruption(pebble.DataCorruptionInfo{Path: "test", Details: errors.New("injected")})
	stuck.armed.Store(true)
	done := make(chan error, 1)
	go func() { done <- c.Put(ssdEntry(2)) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Put on a store reported corrupt: %v, want ErrUnavailable", err)
		}
	case <-time.After(repairGuard):
		releaseStuck(t, stuck, dir)
		<-done
		t.Fatal("a failed commit waited for the store's Close")
	}
	closeTimeout = 50 * time.Millisecond // how long Repair waits for it
	if err := c.Repair(); !errors.Is(err, ErrAbandoned) {
		t.Fatalf("Repair while the dropped store still closes: %v, want ErrAbandoned", err)
	}
	releaseStuck(t, stuck, dir)
	if err := c.Repair(); err != nil {
		t.Fatalf("Repair once the dropped store closed: %v", err)
	}
	if err := c.Put(ssdEntry(2)); err != nil {
		t.Fatal(err)
	}
	assertReopens(t, c, dir, fs, []int{1, 2})
}
