package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// evictBatch is how many pages one eviction round demotes together: one
// batched SSD write and one catalog commit (one fdatasync, one fsync) for
// the lot instead of one each.
const evictBatch = 16

// allocMode is what a DRAM allocation may do when the pool is full.
type allocMode int

const (
	// allocDemote (an SSD-bound save, the flusher, a cache fill while the
	// disk keeps up): drop the oldest copy if it needs no write, else demote
	// a batch of the oldest pages and wait for the write.
	allocDemote allocMode = iota
	// allocBehind (a cache fill with the disk behind the saves): first any
	// of the oldest pages that go without a write — a clean copy, or a
	// DRAM-only page unused for fillProtect, dropped — then as allocDemote.
	allocBehind
	// allocReadmit (a readmission, readmit.go): only a clean copy among the
	// oldest pages, dropped; none is no slot, at once. A page the SSD holds
	// already is not worth a write, or a wait for one, on the engine's path.
	allocReadmit
)

// allocDRAM returns a free DRAM slot. When the pool is full it evicts the
// least recently used unpinned pages: copies already on SSD (or with no SSD
// tier) are dropped at once; the others are demoted in batches first.
func (s *Store) allocDRAM(ctx context.Context, size uint64) (dram.Slot, error) {
	return s.allocDRAMAs(ctx, size, allocDemote)
}

// allocCacheFill returns a DRAM slot for a save acknowledged in DRAM (a
// cache fill). Once the disk has fallen behind the saves (flush.go,
// behind: cache fills waiting for demotions more than fillWaitLimit a
// second) it stops waiting for the disk: a save that waits holds the
// engine's blocks (vLLM frees a request's blocks only once its saves end)
// — on the H200 such saves spent 27 s of a 60-s run in allocation and the
// SSD configuration served slower than none (docs/benchmarks.md). A clean
// copy among the oldest pages, or the oldest unpinned DRAM-only page not
// used within fillProtect, is dropped instead, as a DRAM-only peer would
// drop it, while the flusher goes on writing what the disk can absorb. A
// burst the disk keeps up with still demotes, and loses nothing.
func (s *Store) allocCacheFill(ctx context.Context, size uint64) (dram.Slot, error) {
	if s.behind() {
		return s.allocDRAMAs(ctx, size, allocBehind)
	}
	start := s.now()
	slot, err := s.allocDRAMAs(ctx, size, allocDemote)
	if end := s.now(); end.Sub(start) > 0 {
		s.fillWaits.add(end, end.Sub(start))
	}
	return slot, err
}

// allocSave returns the DRAM slot for one page of a save: an SSD-bound save
// demotes to make room, a readmission takes only a slot that costs no write
// (ErrNoSpace at once otherwise: the page stays as stored, on SSD), any
// other save is a cache fill.
func (s *Store) allocSave(ctx context.Context, size uint64, toSSD, readmit bool) (dram.Slot, error) {
	switch {
	case toSSD:
		return s.allocDRAM(ctx, size)
	case readmit:
		return s.allocDRAMAs(ctx, size, allocReadmit)
	}
	return s.allocCacheFill(ctx, size)
}

func (s *Store) allocDRAMAs(ctx context.Context, size uint64, mode allocMode) (dram.Slot, error) {
	failed := 0 // our own demotions that moved nothing
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		s.mu.Lock()
		slot, err := s.pool.Alloc(size)
		if !errors.Is(err, dram.ErrFull) {
			s.mu.Unlock()
			if err == nil && s.ssd != nil && s.flushLow() {
				s.wakeFlusher() // make room ahead of the next saves (flush.go)
			}
			return slot, err
		}
		dropped, demote := s.pickVictimsLocked(mode)
		s.mu.Unlock()
		switch {
		case dropped:
		case len(demote) > 0:
			n := s.demoteBatch(ctx, demote)
			s.demoting.Add(-1) // counted by pickVictimsLocked
			if n > 0 {
				break
			}
			// Our own write moved nothing (the SSD full of pages others
			// hold, or refusing): another demotion in flight may still free
			// room, but a disk that keeps refusing must fail us soon.
			if failed++; failed > maxFailedDemotions || s.demoting.Load() == 0 {
				return 0, ErrNoSpace
			}
			if err := sleepCtx(ctx, time.Millisecond); err != nil {
				return 0, err
			}
		case mode == allocReadmit:
			s.wakeFlusher() // the flusher frees slots for the next
			return 0, ErrNoSpace
		case s.demoting.Load() > 0:
			// The candidates are another demotion's (the flusher's): it
			// frees slots when its write lands; wait for it, not fail.
			if err := sleepCtx(ctx, time.Millisecond); err != nil {
				return 0, err
			}
		default:
			return 0, ErrNoSpace // nothing could move: every candidate is pinned
		}
	}
}

// maxFailedDemotions is how many of its own demotions an allocation lets
// fail (while others are writing) before it reports no space.
const maxFailedDemotions = 3

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// pickVictimsLocked drops the oldest unpinned DRAM copy that needs no I/O,
// or else pins and returns up to evictBatch pages to demote. A cache fill
// with the disk behind, or a readmission, first looks further for a page
// that goes without a write (freeVictimLocked); a readmission demotes
// nothing.
func (s *Store) pickVictimsLocked(mode allocMode) (dropped bool, demote []catalog.Entry) {
	if mode != allocDemote {
		if e, unflushed, ok := s.freeVictimLocked(mode); ok && s.dropDRAMLocked(e) {
			if unflushed {
				s.m.unflushedDrops.Inc()
			}
			return true, nil
		}
		if mode == allocReadmit {
			return false, nil
		}
	}
	for len(demote) < evictBatch {
		victim, ok := s.mu.dram.Victim()
		if !ok {
			break
		}
		e, ok := s.cat.Get(victim)
		if !ok {
			s.mu.dram.Remove(victim) // no catalog entry: a stale LRU key
			continue
		}
		// With no SSD tier, or a catalog that cannot persist a demotion (a
		// full disk), a DRAM-only page is dropped: DRAM keeps serving saves.
		if e.OnSSD || s.ssd == nil || s.cat.Health() != nil {
			dropped = s.dropDRAMLocked(e)
			break
		}
		s.mu.dram.Pin(victim)
		demote = append(demote, e)
	}
	if dropped {
		for _, e := range demote {
			s.unpinDRAMLocked(e.Key)
		}
		demote = nil
	}
	if len(demote) > 0 {
		// In flight from the pins on: an allocation that finds every
		// candidate pinned by us waits rather than fails (allocDRAM).
		s.demoting.Add(1)
	}
	return dropped, demote
}

// fillScan is how many of the oldest unpinned DRAM pages of each LRU
// segment a cache fill with the disk behind, or a readmission, looks
// through for one that goes without a write (pinned pages are skipped
// uncounted, as Victim skips them).
const fillScan = 64

// freeVictimLocked returns a page among the fillScan oldest unpinned DRAM
// pages of each segment (tiers.LRU.Oldest) that can go without a write: the
// first clean copy (on SSD as well), or else, for allocBehind, the first
// DRAM-only page unused for fillProtect (unflushed: dropping it loses it);
// with no SSD tier, or a catalog that cannot persist a demotion, a cache
// fill may take the oldest page of any kind. Restored and readmitted pages
// are protected in the LRU order, so on the H200 the oldest pages were fresh
// saves, each a write, while clean copies sat behind them.
func (s *Store) freeVictimLocked(mode allocMode) (e catalog.Entry, unflushed, ok bool) {
	anyPage := mode != allocReadmit && (s.ssd == nil || s.cat.Health() != nil)
	var stale catalog.Entry
	var haveStale bool
	now := s.now()
	for k := range s.mu.dram.Oldest(fillScan) {
		c, found := s.cat.Get(k)
		switch {
		case !found:
		case c.OnSSD || anyPage:
			return c, false, true
		case mode == allocBehind && !haveStale && now.Sub(time.Unix(0, c.LastAccess)) > fillProtect:
			stale, haveStale = c, true
		}
	}
	return stale, haveStale, haveStale
}

// dropDRAMLocked removes a page's DRAM copy; a page held nowhere else leaves
// the catalog first, then its slot is freed. It reports whether it did.
func (s *Store) dropDRAMLocked(e catalog.Entry) bool {
	if e.DRAMSlot < 0 {
		return false
	}
	var err error
	if e.OnSSD {
		_, _, err = s.cat.Update(e.Key, func(c *catalog.Entry) bool { c.DRAMSlot = -1; return true })
	} else {
		err = s.cat.Delete(e.Key)
	}
	if err != nil {
		return false // the catalog still names the slot: keep it
	}
	s.mu.dram.Remove(e.Key)
	s.pool.Free(dram.Slot(e.DRAMSlot))
	s.m.evictedPages.WithLabelValues("dram").Inc()
	return true
}

// demoteBatch writes pinned DRAM pages to SSD with one batched write, records
// them there with one catalog commit, then drops their DRAM copies unless
// someone else pinned them meanwhile. It unpins every page it was given and
// returns how many pages it moved.
func (s *Store) demoteBatch(ctx context.Context, pages []catalog.Entry) int {
	pages = s.sealForWrite(pages)
	var reqs []ssd.WriteReq
	var written []catalog.Entry
	for _, e := range pages {
		loc, err := s.allocSSD(e.Size)
		if err != nil {
			continue
		}
		e.OnSSD, e.SSD = true, catLoc(loc)
		reqs = append(reqs, ssd.WriteReq{Loc: loc, Header: header(e), Data: s.pool.Bytes(dram.Slot(e.DRAMSlot))})
		written = append(written, e)
	}
	errs := s.ssd.Write(ctx, reqs)
	for _, err := range errs {
		s.noteSSDError("write", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var commit []catalog.Entry
	var free []dram.Slot
	for i, w := range written {
		cur, ok := s.cat.Get(w.Key)
		if errs[i] != nil || !ok || cur.OnSSD || cur.DRAMSlot != w.DRAMSlot {
			s.ssd.Free(ssdLoc(w.SSD)) // failed, or the page changed meanwhile
			continue
		}
		cur.OnSSD, cur.SSD, cur.Checksum = true, w.SSD, w.Checksum // the checksum in the header just written
		cur.Demoted = true                                         // our own copy of a DRAM-acknowledged save (readmit.go)
		if s.mu.dram.Pins(w.Key) == 1 {                            // only our pin: the DRAM copy can go
			free = append(free, dram.Slot(cur.DRAMSlot))
			cur.DRAMSlot = -1
		}
		commit = append(commit, cur)
	}
	for _, e := range pages {
		s.unpinDRAMLocked(e.Key)
	}
	if err := s.cat.Put(commit...); err != nil {
		for _, c := range commit {
			s.ssd.Free(ssdLoc(c.SSD))
		}
		return 0
	}
	for _, c := range commit {
		s.mu.ssd.Touch(c.Key)
		if c.DRAMSlot < 0 {
			s.mu.dram.Remove(c.Key)
			s.m.evictedPages.WithLabelValues("dram").Inc()
		}
	}
	for _, sl := range free {
		s.pool.Free(sl)
	}
	s.m.demotedPages.Add(float64(len(commit)))
	return len(commit)
}

// allocSSD returns a free SSD slot, dropping the least recently used
// unpinned SSD copies, a batch at a time, until one is free.
func (s *Store) allocSSD(size uint64) (ssd.Loc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		loc, err := s.ssd.Alloc(size)
		if !errors.Is(err, ssd.ErrFull) {
			return loc, err
		}
		var victims []pagekey.Key
		for len(victims) < evictBatch {
			v, ok := s.mu.ssd.Victim()
			if !ok {
				break
			}
			s.mu.ssd.Pin(v) // so Victim moves on; dropSSDLocked removes it
			victims = append(victims, v)
		}
		if len(victims) == 0 {
			return ssd.Loc{}, ErrNoSpace
		}
		if err := s.dropSSDLocked(victims); err != nil {
			for _, v := range victims {
				s.mu.ssd.Unpin(v)
			}
			return ssd.Loc{}, err
		}
	}
}

// dropSSDLocked removes pages' SSD copies: the catalog forgets them first
// (one commit), then the slots are freed.
func (s *Store) dropSSDLocked(keys []pagekey.Key) error {
	var keep []catalog.Entry
	var del []pagekey.Key
	var keepLocs, delLocs []ssd.Loc
	for _, k := range keys {
		e, ok := s.cat.Get(k)
		if !ok || !e.OnSSD {
			s.mu.ssd.Remove(k) // a stale LRU key: nothing on SSD to drop
			continue
		}
		if e.DRAMSlot >= 0 {
			keepLocs = append(keepLocs, ssdLoc(e.SSD))
			e.OnSSD, e.SSD, e.Demoted = false, catalog.SSDLoc{}, false
			keep = append(keep, e)
		} else {
			delLocs = append(delLocs, ssdLoc(e.SSD))
			del = append(del, k)
		}
	}
	// Each commit frees exactly the slots it stopped naming.
	if err := s.cat.Put(keep...); err != nil {
		return err
	}
	s.freeSSDCopiesLocked(keep, keepLocs)
	if err := s.cat.Delete(del...); err != nil {
		return err
	}
	for _, k := range del {
		s.mu.ssd.Remove(k)
	}
	for _, l := range delLocs {
		s.ssd.Free(l)
	}
	s.m.evictedPages.WithLabelValues("ssd").Add(float64(len(keepLocs) + len(delLocs)))
	return nil
}

// freeSSDCopiesLocked frees the SSD slots of pages whose catalog entries no
// longer name them.
func (s *Store) freeSSDCopiesLocked(pages []catalog.Entry, locs []ssd.Loc) {
	for i, e := range pages {
		s.mu.ssd.Remove(e.Key)
		s.ssd.Free(locs[i])
	}
}

func (s *Store) freeSSD(loc ssd.Loc) {
	s.mu.Lock()
	s.ssd.Free(loc)
	s.mu.Unlock()
}

// Evict drops unpinned copies from one tier: the given keys, or every page
// when keys is empty. A DRAM copy not held on SSD is demoted first (when
// the SSD tier exists) so eviction from DRAM loses nothing. An SSD copy's
// slot header is invalidated on disk before the catalog forgets it, so the
// page does not come back after a restart (LRU eviction for room does not:
// such a page may come back until its slot is reused).
func (s *Store) Evict(ctx context.Context, tier catalog.Tier, keys []pagekey.Key) (int, error) {
	if len(keys) == 0 {
		s.cat.Range(func(e catalog.Entry) bool { keys = append(keys, e.Key); return true })
	}
	n := 0
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		ok, err := s.evictOne(ctx, tier, k)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	s.UpdateGauges()
	return n, nil
}

func (s *Store) evictOne(ctx context.Context, tier catalog.Tier, k pagekey.Key) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.cat.Get(k)
	if !ok {
		return false, nil
	}
	switch {
	case tier == catalog.TierDRAM && e.DRAMSlot >= 0 && !s.mu.dram.Pinned(k):
		if !e.OnSSD && s.ssd != nil {
			s.mu.dram.Pin(k)
			s.demoting.Add(1) // in flight from the pin on (allocDRAM waits for it)
			s.mu.Unlock()
			s.demoteBatch(ctx, []catalog.Entry{e})
			s.demoting.Add(-1)
			s.mu.Lock()
			e, ok = s.cat.Get(k)
			return ok && e.DRAMSlot < 0, nil
		}
		return s.dropDRAMLocked(e), nil
	case tier == catalog.TierSSD && e.OnSSD && !s.mu.ssd.Pinned(k):
		// An eviction asked for must outlive a restart: the slot's header
		// goes before the catalog forgets it, or the next start's scan
		// finds the page whole and adopts it again (issue 34, item 6d).
		// Unpinned under s.mu, so no read of the slot is in flight.
		if err := s.ssd.Invalidate([]ssd.Loc{ssdLoc(e.SSD)}); err != nil {
			return false, fmt.Errorf("evict page %s from ssd: %w", k, err)
		}
		return true, s.dropSSDLocked([]pagekey.Key{k})
	}
	return false, nil
}
