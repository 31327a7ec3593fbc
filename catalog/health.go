package catalog

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// persistState is whether the persisted catalog can take commits. Its
// fields change under the catalog's writer lock; Health reads them under
// mu from any goroutine.
//
//   - failed: the store is unusable or was never opened (a failed commit,
//     a Pebble Fatalf, corruption seen at run time, an open that failed
//     for want of resources). Commits that persist records fail with
//     ErrUnavailable (and ErrNoSpace when the cause is a full disk);
//     deletions change memory only. Repair rewrites a fresh store from
//     memory, which is authoritative while the peer runs.
//   - full: the last commit that persists records found less free space
//     than Options.ReserveBytes and wrote nothing. The store is fine; the
//     next commit (or Repair) checks again.
type persistState struct {
	mu struct {
		sync.Mutex
		failed, full error
	}
	rebuilds, background atomic.Uint64
}

func (p *persistState) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.failed = err
}

func (p *persistState) setFull(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.full = err
}

func (p *persistState) get() (failed, full error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.failed, p.mu.full
}

// countBackground adds the background errors of a store being let go.
func (p *persistState) countBackground(s *store) { p.background.Add(s.ev.background.Load()) }

// Health reports why the catalog cannot persist now: nil when it can (or
// when it is in memory only by configuration). The error wraps ErrNoSpace
// or ErrUnavailable.
func (c *Catalog) Health() error {
	failed, full := c.persist.get()
	switch {
	case failed != nil:
		return unavailable(failed)
	case full != nil:
		return full
	}
	return nil
}

// unavailable wraps why the store cannot be used in ErrUnavailable, and in
// ErrNoSpace too when the filesystem is full.
func unavailable(cause error) error {
	if isNoSpace(cause) && !errors.Is(cause, ErrNoSpace) {
		return fmt.Errorf("%w: %w: %w", ErrUnavailable, ErrNoSpace, cause)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, cause)
}

// Repair makes the catalog persistent again after a failure: a failed or
// never-opened store is replaced by a fresh one written from memory; a
// full filesystem is checked again; a store Pebble reported corruption or
// a fatal error for on its own goroutines is failed first. It returns
// Health afterwards. The fabric calls it every second, and with backoff
// while Health is not nil.
//
// The rewrite runs off the writer lock (issue 34, item 6a): writers go on
// meanwhile as they do with a failed store (DRAM-only changes and
// deletions in memory, records failing with ErrUnavailable), and the keys
// they change are written again into the fresh store before it is
// installed, under the lock.
func (c *Catalog) Repair() error {
	c.repair.Lock()
	defer c.repair.Unlock()
	c.writer.Lock()
	if c.writer.closed {
		c.writer.Unlock()
		return ErrClosed
	}
	if c.opts.Dir == "" {
		c.writer.Unlock()
		return nil
	}
	if c.store != nil {
		if err := c.store.failure(); err != nil {
			c.persist.fail(err)
		}
	}
	failed, full := c.persist.get()
	switch {
	case failed != nil:
		old := c.store
		c.store = nil // writers now see a failed store until the rebuild is installed
		c.writer.dirty = map[pagekey.Key]struct{}{}
		c.writer.Unlock()
		c.rebuild(old)
	case full != nil:
		if err := c.checkSpaceLocked(); err == nil {
			c.persist.setFull(nil)
		}
		c.writer.Unlock()
	default:
		c.writer.Unlock()
	}
	return c.Health()
}

// rebuild drops the failed store old (nil: none was open) and writes every
// persistable entry into a fresh one in the same directory (its old files
// removed first; the directory itself stays, it may be a mount point),
// without the writer lock; then, under it, writes the keys changed
// meanwhile again and installs the fresh store. On failure the catalog
// stays failed with the new cause. A crash half way leaves a partial
// catalog, which the next start completes from the SSD tier like any
// damaged one. The caller holds c.repair.
func (c *Catalog) rebuild(old *store) {
	if old != nil {
		c.persist.countBackground(old)
		_ = old.close() // its error is the failure being repaired
	}
	select { // a store a failed commit let go may still be closing
	case <-abandonedDone(c.opts.Dir):
	case <-time.After(closeTimeout):
	}
	s, err := c.writeFresh()
	c.writer.Lock()
	defer c.writer.Unlock()
	dirty := c.writer.dirty
	c.writer.dirty = nil
	if err == nil {
		if err = c.catchUpLocked(s, dirty); err != nil {
			c.persist.countBackground(s)
			err = errors.Join(err, s.close())
		}
	}
	if err != nil {
		c.persist.fail(err)
		return
	}
	c.store = s
	c.persist.fail(nil)
	c.persist.setFull(nil)
	c.persist.rebuilds.Add(1)
}

// catchUpLocked writes into s the current state of the keys changed while
// s was being written from memory: the record of an entry on SSD, the
// deletion of any other.
func (c *Catalog) catchUpLocked(s *store, dirty map[pagekey.Key]struct{}) error {
	b := s.newBatch()
	var err error
	for k := range dirty {
		if e, ok := c.Get(k); ok && e.OnSSD {
			err = b.set(e)
		} else {
			err = b.delete(k)
		}
		if err == nil && b.sets+b.dels >= rebuildBatch {
			err = s.commit(b, true)
			b.close()
			b = s.newBatch()
		}
		if err != nil {
			break
		}
	}
	if err == nil && !b.empty() {
		err = s.commit(b, true)
	}
	b.close()
	if err != nil {
		return fmt.Errorf("write catalog changes made during its rebuild: %w", err)
	}
	return nil
}

// writeFresh empties the catalog directory and opens a store there
// holding the index's persistable entries. It runs without the writer
// lock: no writer touches the store while c.store is nil.
func (c *Catalog) writeFresh() (*store, error) {
	if err := c.checkSpaceLocked(); err != nil { // reads only c.opts
		return nil, err // writing on a full disk only fails again
	}
	if err := abandonedDir(c.opts.Dir); err != nil {
		return nil, err // its files may still be the abandoned DB's
	}
	if err := clearDir(c.opts.fs, c.opts.Dir); err != nil {
		return nil, err
	}
	s, err := openStore(c.opts.fs, c.opts.Dir, c.opts.NoSync)
	if err != nil {
		return nil, err
	}
	if err := c.copyIndexTo(s); err != nil {
		c.persist.countBackground(s)
		return nil, errors.Join(err, s.close())
	}
	return s, nil
}

// rebuildBatch is how many records one commit of a rebuild writes.
const rebuildBatch = 4096

func (c *Catalog) copyIndexTo(s *store) error {
	var err error
	copied := 0
	b := s.newBatch()
	c.Range(func(e Entry) bool {
		if !e.OnSSD {
			return true
		}
		if copied++; c.onRepairCopy != nil {
			c.onRepairCopy(copied)
		}
		if err = b.set(e); err == nil && b.sets >= rebuildBatch {
			err = s.commit(b, true)
			b.close()
			b = s.newBatch()
		}
		return err == nil
	})
	if err == nil && !b.empty() {
		err = s.commit(b, true)
	}
	b.close()
	if err != nil {
		return fmt.Errorf("write catalog from memory: %w", err)
	}
	return nil
}

// asidePrefix starts the names of damaged stores kept for diagnosis.
const asidePrefix = "corrupt-"

// clearDir removes dir's files, keeping the damaged stores set aside in it.
func clearDir(fs vfs.FS, dir string) error {
	names, err := fs.List(dir)
	if err != nil {
		return fmt.Errorf("list catalog %s: %w", dir, err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, asidePrefix) {
			continue
		}
		if err := fs.RemoveAll(fs.PathJoin(dir, n)); err != nil {
			return fmt.Errorf("clear catalog %s: %w", dir, err)
		}
	}
	return nil
}

// moveAside moves a damaged store's files out of the way, into
// <dir>/corrupt-<UTC time>/, and returns that directory ("" when there was
// nothing to move). The directory itself stays: it may be a mount point.
func moveAside(fs vfs.FS, dir string) (string, error) {
	names, err := fs.List(dir)
	if err != nil {
		return "", fmt.Errorf("list catalog %s: %w", dir, err)
	}
	to := fs.PathJoin(dir, asidePrefix+time.Now().UTC().Format("20060102T150405.000000000Z"))
	moved := false
	for _, n := range names {
		if strings.HasPrefix(n, asidePrefix) {
			continue
		}
		if !moved {
			if err := fs.MkdirAll(to, 0o700); err != nil {
				return "", fmt.Errorf("move damaged catalog aside: %w", err)
			}
			moved = true
		}
		if err := fs.Rename(fs.PathJoin(dir, n), fs.PathJoin(to, n)); err != nil {
			return "", fmt.Errorf("move damaged catalog aside: %w", err)
		}
	}
	if !moved {
		return "", nil
	}
	return to, nil
}

// checkSpaceLocked fails with ErrNoSpace when the catalog's filesystem is
// below the reserve (checkSpace).
func (c *Catalog) checkSpaceLocked() error {
	return checkSpace(c.opts.fs, c.opts.Dir, c.opts.ReserveBytes)
}

// Adopt records what the SSD tier holds, at recovery: put are entries
// rebuilt from page headers, drop the keys whose pages the tier no longer
// holds. Memory changes whatever happens to persistence; if the store
// cannot take the commit it is left failed for Repair, and Adopt still
// returns nil. Only a closed catalog or an invalid entry is an error.
func (c *Catalog) Adopt(put []Entry, drop []pagekey.Key) error {
	changes := make([]change, 0, len(put)+len(drop))
	for _, e := range put {
		if e.DRAMSlot < -1 {
			return fmt.Errorf("%w: page %s: DRAM slot %d", ErrInvalidEntry, e.Key, e.DRAMSlot)
		}
		changes = append(changes, change{e: e})
	}
	c.writer.Lock()
	defer c.writer.Unlock()
	for _, k := range drop {
		if e, ok := c.Get(k); ok {
			changes = append(changes, change{e: e, deleted: true})
		}
	}
	return c.applyLocked(changes, true)
}
