package store

import (
	"context"
	"errors"
	"slices"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/dram"
)

// Readmission: a cache-fill save of a page the peer holds only on SSD takes
// the engine's bytes back into DRAM instead of answering "already stored".
//
// Without it a hot page, once demoted, never came back: with a disk slower
// than the engine's prefill (the H200's, 1.1 GB/s against 2.7 GB/s) a
// lookup leaves SSD-only pages to recompute (ssdrate.go), the engine
// recomputes them and offers them again, and the re-save was dropped as a
// duplicate. The hot prefixes stayed on SSD while the DRAM tier held pages
// used once, and the SSD configuration served slower than none
// (docs/benchmarks.md). Readmitted, the next reuse restores from DRAM.
//
// A readmission takes only a DRAM slot that costs no write (evict.go,
// allocReadmit): a free one or a clean copy's; with none, the page stays on
// SSD (no_room). The save checksums a readmitted page while it copies, and
// the commit decides (readmitVerdictLocked; save.go's settleReadmitsLocked
// acts, one catalog commit — unsynced: only DRAM copies change — for all a
// save attaches and one for all it replaces):
//   - the same bytes as the SSD copy (a deterministic engine): the DRAM copy
//     joins the entry as a clean copy, which eviction drops without a write;
//   - other bytes (KV recomputed in another batch differs in its last bits):
//     when the SSD copy is one the peer demoted itself and nothing pins it,
//     the SSD copy is dropped and ours is stored as a fresh DRAM page, so
//     every copy an entry names holds the bytes its checksum covers. A copy
//     an engine saved durably, or acknowledged to a durable save since, is
//     never replaced: its bytes stay, and ours are freed. Which copies the
//     peer demoted is persisted (catalog.Entry.Demoted), so this holds
//     across restarts; a catalog rebuilt from the SSD files marks none.

// A readmission into a full DRAM tier also pushes a page out: the flusher
// keeps 1/flushReserve of the pool free and evicts the least recently used
// page to restore it. With a DRAM tier smaller than the pages that keep
// coming back and a disk slower than the engine's prefill — the seeds'
// SSD configuration on the H200: 4 GiB against about 7.3 GiB of prefixes —
// every readmission evicted a page about to be asked for, which was then
// recomputed and readmitted in turn: 8,179 readmissions a minute, 1,888
// pages restored from DRAM, and the save path's copies taking 6.3 s of the
// minute against the DRAM configuration's 1.7 s (reference engine, sixth
// session: docs/journal/2026-11-30-gpu-h200.md, "Sustained AB/BA pairs with
// CUDA-graph decode"). So once a readmission would
// eat into the flusher's reserve it is judged (admitsReadmit): the page
// comes back only if it was asked for more often lately than the page that
// leaves for it — the flusher's next victim, or with no slot free the clean
// copy the allocation would drop (tiers.Frequency over every page lookups
// ask for, TinyLFU's admission rule); otherwise it stays on SSD, nothing
// copied (colder). Pages equally asked for then keep their places instead of
// taking turns: the sim of the seeds' trace in that configuration serves
// 17.4% of the tokens from DRAM instead of 11.7%, refusing 6,883
// readmissions, each a device copy not made (docs/journal/2026-11-30-sim-serving-cpu.md,
// "sim").

// judgesReadmits reports whether readmissions are judged at all: with an
// SSD tier, readmission on, and not every readmission taken. Otherwise
// nothing reads the counts, and lookups do not keep them.
func (s *Store) judgesReadmits() bool {
	return s.ssd != nil && !s.opts.NoReadmit && !s.opts.ReadmitAll
}

// NoteAsked records that a lookup of sess asked for keys (tiers.Frequency):
// handed to RunAsks when it runs (the lookup does not wait; a full queue
// drops the lot, counted), else counted at once. A lookup naming a page
// size smaller than any before ages the counts by how many such pages the
// pool holds (tiers.Frequency.SetPages): with several models, by the one
// of most pages.
func (s *Store) NoteAsked(sess *Engine, keys []pagekey.Key) {
	if !s.judgesReadmits() {
		return
	}
	if pb := sess.PageBytes; pb > 0 {
		if cur := s.freqPage.Load(); (cur == 0 || pb < cur) && s.freqPage.CompareAndSwap(cur, pb) {
			s.freq.SetPages(int(s.pool.Stats().CapacityBytes / dram.SlotBytes(pb)))
		}
	}
	if s.askers.Load() == 0 {
		s.freq.Record(keys)
		return
	}
	select {
	case s.asks <- slices.Clone(keys):
	default:
		s.m.askedDropped.Inc()
	}
}

// RunAsks counts the keys NoteAsked hands over until ctx ends: the sketch's
// 512 counter updates of a 128-key lookup (5.5–13 µs here,
// docs/journal/2026-11-30-catalog.md "Catalog lookup") leave the lookup's
// path. The peer's Run owns it. Keys still queued when ctx ends are not
// counted: the counts live in memory
// only, and a restart begins them afresh. It returns at once where no
// readmission is judged.
func (s *Store) RunAsks(ctx context.Context) {
	if !s.judgesReadmits() {
		return
	}
	s.askers.Add(1)
	defer s.askers.Add(-1)
	for {
		select {
		case <-ctx.Done():
			return
		case keys := <-s.asks:
			s.freq.Record(keys)
		}
	}
}

// AskedLately is how often lookups asked for k lately (tiers.Frequency's
// estimate, 0 to tiers.FreqMax): what a readmission of k is judged by.
func (s *Store) AskedLately(k pagekey.Key) uint8 { return s.freq.Estimate(k) }

// admitsReadmit reports whether a readmission of k (size bytes) may take
// DRAM: always with Options.ReadmitAll, or while the pool has room beyond
// the flusher's reserve (the flusher then evicts nothing for it, give or
// take a slab's tail: flushLow); else only if k was asked for more often
// lately than the page that leaves for it — the flusher's next victim while
// a slot is free, the clean copy allocReadmit would drop when none is (with
// neither, the allocation answers no_room). The pages of one save are each
// judged against that same next page, though together they push out
// several: lenient, by at most a save's pages (a batch of 16 is the
// flusher's own unit).
func (s *Store) admitsReadmit(k pagekey.Key, size uint64) bool {
	if !s.judgesReadmits() {
		return true
	}
	slot, free := dram.SlotBytes(size), s.pool.FreeBytes()
	if free >= s.pool.Stats().CapacityBytes/flushReserve+slot {
		return true
	}
	s.mu.Lock()
	var victim pagekey.Key
	var ok bool
	if s.pool.CanAlloc(size) {
		victim, ok = s.mu.dram.Victim()
	} else if e, _, found := s.freeVictimLocked(allocReadmit); found {
		victim, ok = e.Key, true
	}
	s.mu.Unlock()
	return !ok || s.freq.Hotter(k, victim)
}

// storedAnswer is a save's answer for a page that needs no copy: stored
// already for the save's purpose and not readmittable, or a readmission
// admitsReadmit refuses (colder). ok false: the page is to be copied.
func (s *Store) storedAnswer(e catalog.Entry, stored, toSSD bool, k pagekey.Key, size uint64) (r Result, ok bool) {
	switch {
	case !stored:
		return Result{}, false
	case !s.readmittable(e, toSSD):
		return okResult(e.Tier()), true // already stored: saves are idempotent
	case !s.admitsReadmit(k, size):
		return s.readmitColder(e), true
	}
	return Result{}, false
}

// readmitColder is the result of a readmission admitsReadmit refused: the
// page stays as stored, on SSD, and nothing is copied.
func (s *Store) readmitColder(e catalog.Entry) Result {
	s.m.readmitted.WithLabelValues("colder").Inc()
	return okResult(e.Tier())
}

// readmittable reports whether a save of a page with entry e takes the page
// back into DRAM: a cache fill of a page held only on SSD, unless
// readmission is off (Options.NoReadmit).
func (s *Store) readmittable(e catalog.Entry, toSSD bool) bool {
	return !s.opts.NoReadmit && !toSSD && e.OnSSD && e.DRAMSlot < 0
}

// readmitFailed is the result of a readmission that took no DRAM copy: the
// page stays as stored, on SSD. err is why; ErrNoSpace (no slot free of a
// write, allocReadmit) is counted as no_room.
func (s *Store) readmitFailed(e catalog.Entry, err error) Result {
	if errors.Is(err, ErrNoSpace) {
		s.m.readmitted.WithLabelValues("no_room").Inc()
	}
	return okResult(e.Tier())
}

// ackDurableLocked records that a durable save was acknowledged on e's SSD
// copy: a copy the peer demoted is no longer replaceable (persisted, and
// synced with the commit: catalog.Entry.Demoted). s.mu is held.
func (s *Store) ackDurableLocked(e *catalog.Entry) error {
	if !e.Demoted {
		return nil
	}
	cur, _, err := s.cat.Update(e.Key, func(c *catalog.Entry) bool { c.Demoted = false; return true })
	if err != nil {
		return err
	}
	*e = cur
	return nil
}

// replaceableLocked reports whether e's SSD copy may give way to other
// bytes: one the peer demoted itself, not acknowledged durable since, that
// nothing reads or leases now.
func (s *Store) replaceableLocked(e catalog.Entry) bool {
	return e.Demoted && !s.mu.ssd.Pinned(e.Key)
}

// readmitVerdict is what becomes of a readmitted page at its commit.
type readmitVerdict int

const (
	readmitFresh   readmitVerdict = iota // the entry is gone: commit ours as a new page
	readmitAttach                        // the same bytes: our slot becomes the entry's DRAM copy
	readmitReplace                       // other bytes, a replaceable SSD copy: drop it, commit ours
	readmitKeep                          // the SSD copy stays; ours is freed
)

// readmitVerdictLocked decides a readmitted page (its checksum sum computed
// while it copied) against cur, the entry now (ok: present), and prior, the
// entry it was taken for. s.mu is held.
func (s *Store) readmitVerdictLocked(cur catalog.Entry, ok bool, prior catalog.Entry, sum uint32) readmitVerdict {
	switch {
	case !ok:
		return readmitFresh
	case cur.Generation != prior.Generation || !cur.OnSSD || cur.DRAMSlot >= 0:
		return readmitKeep // promoted, re-saved or dropped from SSD meanwhile: keep theirs
	case cur.Checksum == sum:
		return readmitAttach
	case s.replaceableLocked(cur):
		return readmitReplace
	}
	return readmitKeep
}
