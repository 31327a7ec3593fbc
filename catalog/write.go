package catalog

import (
	"fmt"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// change is one upsert or deletion of a commit.
type change struct {
	e       Entry
	deleted bool
	added   bool // set by apply: the key was absent before
}

// Put inserts or replaces entries (keyed by Entry.Key) in one Pebble batch
// committed with sync: entries with OnSSD are persisted; entries without
// OnSSD have any persisted record deleted. The in-memory index changes only
// after the commit succeeded. When a key appears more than once, the last
// entry wins. A Put that persists nothing (DRAM-only pages never persisted)
// commits nothing; one that changes only LastAccess, Hits or the DRAM copy
// of SSD pages commits without waiting for the disk.
func (c *Catalog) Put(entries ...Entry) error {
	changes := make([]change, 0, len(entries))
	for i := range entries {
		if entries[i].DRAMSlot < -1 {
			return fmt.Errorf("%w: page %s: DRAM slot %d", ErrInvalidEntry, entries[i].Key, entries[i].DRAMSlot)
		}
		changes = append(changes, change{e: entries[i]})
	}
	c.writer.Lock()
	defer c.writer.Unlock()
	return c.commitLocked(changes)
}

// Update applies fn to a copy of k's entry and commits the result like Put;
// fn returning false deletes the entry instead. The read, fn and the commit
// are atomic with respect to other writers. Update returns the entry as fn
// left it and false if k is absent (fn is then not called). fn must not
// change Key and must not call the catalog's writers.
//
// Lookup keeps touching LastAccess and Hits while fn runs; touches between
// the read and the commit are overwritten by the values fn returns.
func (c *Catalog) Update(k pagekey.Key, fn func(e *Entry) (keep bool)) (Entry, bool, error) {
	c.writer.Lock()
	defer c.writer.Unlock()
	e, ok := c.Get(k)
	if !ok {
		return Entry{}, false, nil
	}
	keep := fn(&e)
	e.Key = k
	if keep && e.DRAMSlot < -1 {
		return e, true, fmt.Errorf("%w: page %s: DRAM slot %d", ErrInvalidEntry, k, e.DRAMSlot)
	}
	return e, true, c.commitLocked([]change{{e: e, deleted: !keep}})
}

// Delete removes keys, deleting their persisted records in one synced Pebble
// batch first. Absent keys are ignored.
func (c *Catalog) Delete(keys ...pagekey.Key) error {
	c.writer.Lock()
	defer c.writer.Unlock()
	changes := make([]change, 0, len(keys))
	for _, k := range keys {
		if e, ok := c.Get(k); ok {
			changes = append(changes, change{e: e, deleted: true})
		}
	}
	return c.commitLocked(changes)
}

// commitLocked persists changes, then applies them to memory, then reports
// them to OnChange. The caller holds c.writer, so no other writer changes an
// entry between the persisted state read here and the apply.
func (c *Catalog) commitLocked(changes []change) error { return c.applyLocked(changes, false) }

// applyLocked is commitLocked; with force, memory changes even when the
// store cannot take the commit (see Adopt).
func (c *Catalog) applyLocked(changes []change, force bool) error {
	if c.writer.closed {
		return ErrClosed
	}
	changes = lastWins(changes)
	if c.opts.Dir != "" {
		if err := c.persistLocked(changes, force); err != nil {
			return err
		}
	}
	for i := range changes {
		changes[i].added = c.apply(changes[i])
		if c.writer.dirty != nil { // a rebuild runs: it writes this key again (health.go)
			c.writer.dirty[changes[i].e.Key] = struct{}{}
		}
	}
	if c.onChange != nil {
		for _, ch := range changes {
			kind := Updated
			switch {
			case ch.deleted:
				kind = Deleted
			case ch.added:
				kind = Added
			}
			c.onChange(ch.e, kind)
		}
	}
	return nil
}

// persistLocked commits the records of changes. Changes that only delete
// records never fail: when the store cannot take them they change memory
// only and the store is left failed, for Repair to rewrite from memory.
// Changes that persist records fail (memory unchanged) with ErrNoSpace when
// the filesystem is below the reserve, with ErrUnavailable when the store
// is failed; force (Adopt) makes them behave like deletions.
func (c *Catalog) persistLocked(changes []change, force bool) error {
	// Without the disk, only changes to what a record says about its page
	// must fail; a record that would change only in LastAccess or Hits (a
	// DRAM copy dropped, say) is left as it is.
	optional := force || !c.changesRecords(changes)
	if c.store == nil {
		if optional {
			return nil
		}
		failed, _ := c.persist.get()
		return unavailable(failed)
	}
	b := c.store.newBatch()
	defer b.close()
	for _, ch := range changes {
		var err error
		switch {
		case !ch.deleted && ch.e.OnSSD:
			err = b.set(ch.e)
		case c.persisted(ch.e.Key):
			err = b.delete(ch.e.Key)
		}
		if err != nil {
			return fmt.Errorf("catalog batch page %s: %w", ch.e.Key, err)
		}
	}
	if b.empty() {
		return nil
	}
	if b.sets > 0 && !force {
		if err := c.checkSpaceLocked(); err != nil {
			if optional {
				return nil
			}
			c.persist.setFull(err)
			return err
		}
	}
	// Only records that say something new about their page, and deletions,
	// must be on the disk before the commit returns. A commit that changes
	// only LastAccess, Hits or the DRAM copy (which no record holds) — a
	// readmission's attach, a clean copy evicted — is written without
	// waiting: a crash may lose it (the next synced commit, or a clean
	// Close, writes it), and on the H200 each of those waits, thousands a
	// minute under the store's lock, stalled the engine's saves.
	sync := force || !optional || b.dels > 0
	if err := c.store.commit(b, sync); err != nil {
		err = fmt.Errorf("commit %d catalog changes: %w", len(changes), err)
		c.dropStoreLocked(err)
		if optional || b.sets == 0 {
			return nil
		}
		return unavailable(err)
	}
	if b.sets > 0 {
		c.persist.setFull(nil) // there was room for records
	}
	c.commits.Add(1)
	if sync && !c.opts.NoSync {
		c.syncs.Add(1)
	}
	return nil
}

// dropStoreLocked lets a store that failed go: Pebble's commit pipeline
// does not recover from a failed write, so the store is closed and the
// catalog is failed until Repair. The close runs in the background: the
// writer (a save, under the fabric store's lock) does not wait for it;
// Repair reuses the directory once it ended (ErrAbandoned until then), and
// Close waits for it up to closeTimeout.
func (c *Catalog) dropStoreLocked(cause error) {
	c.persist.fail(cause)
	c.persist.countBackground(c.store)
	c.store.closeInBackground()
	c.store = nil
}

// changesRecords reports whether any change writes a record that says
// something new about its page: a new record, or another layout, size,
// checksum, generation, SSD slot or demoted mark (a durable save
// acknowledged on a demoted copy must outlive a crash). Deletions do not
// count: they may wait.
func (c *Catalog) changesRecords(changes []change) bool {
	for _, ch := range changes {
		if ch.deleted || !ch.e.OnSSD {
			continue
		}
		old, ok := c.Get(ch.e.Key)
		if !ok || !old.OnSSD || old.Layout != ch.e.Layout || old.Size != ch.e.Size ||
			old.Checksum != ch.e.Checksum || old.Generation != ch.e.Generation || old.SSD != ch.e.SSD ||
			old.Demoted != ch.e.Demoted {
			return true
		}
	}
	return false
}

// persisted reports whether k has a persisted record, i.e. its current
// entry is on SSD.
func (c *Catalog) persisted(k pagekey.Key) bool {
	e, ok := c.Get(k)
	return ok && e.OnSSD
}

// apply changes the in-memory index; it reports whether it added a key.
func (c *Catalog) apply(ch change) bool {
	h := c.hash.hash(ch.e.Key)
	s := &c.shards[shardOf(h)]
	if ch.deleted {
		s.mu.Lock()
		removed := s.deleteLocked(c.hash, h, ch.e.Key)
		s.mu.Unlock()
		if removed {
			c.count.Add(-1)
		}
		return false
	}
	r := toRecord(ch.e, &c.layouts)
	s.mu.Lock()
	added := s.setLocked(c.hash, h, ch.e.Key, r)
	s.mu.Unlock()
	if added {
		c.count.Add(1)
	}
	return added
}

// lastWins drops every change whose key is changed again later in the list,
// keeping the order of the rest.
func lastWins(changes []change) []change {
	if len(changes) < 2 {
		return changes
	}
	last := make(map[pagekey.Key]int, len(changes))
	for i, ch := range changes {
		last[ch.e.Key] = i
	}
	if len(last) == len(changes) {
		return changes
	}
	out := changes[:0]
	for i, ch := range changes {
		if last[ch.e.Key] == i {
			out = append(out, ch)
		}
	}
	return out
}
