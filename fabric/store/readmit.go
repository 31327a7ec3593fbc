package store

import (
	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
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
// The save checksums a readmitted page while it copies, and the commit
// decides (readmitVerdictLocked; save.go's settleReadmitsLocked acts, one
// catalog commit for all a save attaches and one for all it replaces):
//   - the same bytes as the SSD copy (a deterministic engine): the DRAM copy
//     joins the entry as a clean copy, which eviction drops without a write;
//   - other bytes (KV recomputed in another batch differs in its last bits):
//     when the SSD copy is one the peer demoted itself and nothing pins it,
//     the SSD copy is dropped and ours is stored as a fresh DRAM page, so
//     every copy an entry names holds the bytes its checksum covers. A copy
//     an engine saved durably (or one recovered at start, whose history is
//     unknown) is never replaced: its bytes stay, and ours are freed.

// readmittable reports whether a save of a page with entry e takes the page
// back into DRAM: a cache fill of a page held only on SSD.
func readmittable(e catalog.Entry, toSSD bool) bool {
	return !toSSD && e.OnSSD && e.DRAMSlot < 0
}

// noteDemotedLocked records pages the peer wrote to SSD itself (demotions of
// cache fills): their SSD copies may be replaced by a readmission.
func (s *Store) noteDemotedLocked(entries []catalog.Entry) {
	for _, e := range entries {
		s.mu.demoted[e.Key] = e.Generation
	}
}

// forgetDemotedLocked stops tracking pages whose SSD copies are gone.
func (s *Store) forgetDemotedLocked(keys ...pagekey.Key) {
	for _, k := range keys {
		delete(s.mu.demoted, k)
	}
}

// replaceableLocked reports whether e's SSD copy may give way to other
// bytes: one the peer demoted itself, not acknowledged durable since, that
// nothing reads or leases now.
func (s *Store) replaceableLocked(e catalog.Entry) bool {
	gen, ok := s.mu.demoted[e.Key]
	return ok && gen == e.Generation && !s.mu.ssd.Pinned(e.Key)
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
