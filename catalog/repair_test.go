package catalog

import (
	"errors"
	"testing"
	"time"
)

// repairGuard bounds the wait for a writer that a paused rebuild must not
// block. It is not a timing: a writer that waits on the rebuild never
// finishes while the rebuild is paused, however long the guard.
const repairGuard = 10 * time.Second

// TestRepairDoesNotBlockWriters (issue 34, item 6a): Repair rewrote a
// failed store from memory with the writer lock held, so every Put,
// Update and Delete (the store's commitSaves holds its own lock around
// them: DRAM saves and loads) waited for a rebuild of the whole catalog.
// A rebuild paused half way through its copy must let DRAM-only writes,
// deletions and DRAM-copy updates complete, fail SSD records at once (the
// store is still unavailable), and the store it installs must hold what
// memory holds after those writes.
func TestRepairDoesNotBlockWriters(t *testing.T) {
	_, inj, fs := newFaultFS()
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir, fs: fs})
	const n = 3 * rebuildBatch
	var all []Entry
	for i := 1; i <= n; i++ {
		all = append(all, ssdEntry(i))
	}
	if err := c.Put(all...); err != nil {
		t.Fatal(err)
	}
	inj.on.Store(true)
	if err := c.Put(ssdEntry(n + 1)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Put on a failing disk: %v", err)
	}
	inj.on.Store(false)

	writesDone, paused := 0, 0
	var blocked []string
	c.onRepairCopy = func(copied int) {
		if copied != n/2 {
			return
		}
		paused++
		for _, w := range []struct {
			name string
			fn   func() error
			want error
		}{
			{"DRAM-only Put", func() error { return c.Put(dramEntry(n + 2)) }, nil},
			{"Delete", func() error { return c.Delete(key(1), key(n)) }, nil},
			{"DRAM copy Update", func() error {
				_, _, err := c.Update(key(2), func(e *Entry) bool { e.DRAMSlot = 7; return true })
				return err
			}, nil},
			{"SSD Put", func() error { return c.Put(ssdEntry(n + 3)) }, ErrUnavailable},
		} {
			done := make(chan error, 1)
			go func() { done <- w.fn() }()
			select {
			case err := <-done:
				if w.want == nil && err != nil || w.want != nil && !errors.Is(err, w.want) {
					t.Errorf("%s during the rebuild: %v, want %v", w.name, err, w.want)
				}
				writesDone++
			case <-time.After(repairGuard):
				blocked = append(blocked, w.name)
				go func() { <-done }()
			}
		}
	}
	if err := c.Repair(); err != nil {
		t.Fatalf("Repair: %v", err)
	}
	if paused != 1 {
		t.Fatalf("the rebuild paused %d times, want 1", paused)
	}
	if len(blocked) > 0 {
		t.Fatalf("writers blocked by a paused rebuild: %v (%d of 4 completed)", blocked, writesDone)
	}
	if e, _ := c.Get(key(2)); e.DRAMSlot != 7 {
		t.Fatalf("entry 2 = %+v, want its DRAM copy", e)
	}
	var want []int
	for i := 2; i < n; i++ {
		want = append(want, i)
	}
	assertReopens(t, c, dir, fs, want)
}
