package store

import (
	"context"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/crc32c"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/dram"
)

// Sealing: a save acknowledged into DRAM only does not wait for the page's
// CRC-32C; the page is "unsealed" until a background sealer computes it
// from the page's DRAM slot (which never changes while the entry names
// it). Whatever takes a page out of DRAM — demotion, SSD write-through,
// a later network send — seals it first, inline if the sealer has not got
// to it yet. So every page that leaves the peer's DRAM carries its checksum,
// and the checksum, which costs as much CPU as the copy, stays off the
// engine's critical path. Saves acknowledged as durable on SSD are
// checksummed before they are written, as before.

// sealBatch is how many pages the sealer takes per round.
const sealBatch = 64

// sealBacklog is how many unsealed pages the sealer lets wait while copies
// are running; beyond it, it seals even then. Below it, sealing waits for a
// gap between copies, so it does not take a core from the copies engines
// wait on.
const sealBacklog = 4096

// markUnsealedLocked records pages whose checksum is pending.
func (s *Store) markUnsealedLocked(keys []pagekey.Key) {
	for _, k := range keys {
		s.mu.unsealed[k] = struct{}{}
	}
	s.m.unsealedPages.Set(float64(len(s.mu.unsealed)))
	select {
	case s.sealWake <- struct{}{}:
	default:
	}
}

// RunSealer seals pages until ctx ends. The peer's Run owns it.
func (s *Store) RunSealer(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.sealWake:
		}
		for ctx.Err() == nil {
			if !s.waitForCopyGap(ctx) {
				return
			}
			if s.sealSome(ctx) == 0 {
				break
			}
		}
	}
}

// waitForCopyGap returns once no page copy is running or the backlog is
// too long to wait; false when ctx ended.
func (s *Store) waitForCopyGap(ctx context.Context) bool {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for s.copying.Load() > 0 {
		if s.sealUrgent() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// sealUrgent reports a backlog too long to wait for a gap between copies:
// sealBacklog pages. A backlog as large as the pool is no reason to seal
// during copies: every way out of DRAM seals its pages inline (demotion and
// network sends on every copy worker, sealForWrite), and a page evicted
// without an SSD tier needs no sum. Sealing during copies only moves that
// CRC onto the cores the copies run on: on two cores an urgent sealer took
// one of the two copy workers' cores and held a save or load of 64 pages of
// 9 MiB to 14–15 GB/s against 24–25 GB/s without it
// (BenchmarkSaveLoadDRAM, docs/benchmarks.md).
func (s *Store) sealUrgent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sealUrgentLocked()
}

func (s *Store) sealUrgentLocked() bool { return len(s.mu.unsealed) >= sealBacklog }

// sealPiece is how much of a page the sealer sums before it looks again
// for a copy that started meanwhile: a 9 MiB page is over a millisecond of
// one core, which a copy would otherwise wait out on a two-core host.
var sealPiece = 1 << 20

// sealSome seals up to sealBatch unsealed pages and returns how many it
// sealed or began (0: nothing was pending).
func (s *Store) sealSome(ctx context.Context) int {
	s.mu.Lock()
	urgent := s.sealUrgentLocked()
	parts := s.sealBatchLocked()
	s.mu.Unlock()
	// No pins: eviction must never wait for the sealer. A slot freed (and
	// reused) meanwhile is still mapped memory, and recordSealLocked keeps
	// a sum only if the entry still names the same slot and generation.
	// One goroutine: sealing is background work and must leave the other
	// cores to the copies engines wait on.
	// Every sealPiece it yields to a copy that started meanwhile (unless
	// the backlog is long), keeping its place in the page: a page is
	// milliseconds of memory reads, and a copy on the other core, or a GPU
	// copy's DMA into DRAM, shares that bandwidth. A page's first piece (of
	// this call) is always summed, so each call makes progress.
	var paused *partialSeal
	var done []*partialSeal
	for i, p := range parts {
		if i > 0 && !urgent && s.copying.Load() > 0 {
			break
		}
		for first := true; p.done < len(p.buf); first = false {
			if !first && !urgent && s.copying.Load() > 0 {
				paused = p
				break
			}
			n := min(sealPiece, len(p.buf)-p.done)
			p.crc = crc32c.Update(p.crc, p.buf[p.done:p.done+n])
			p.done += n
		}
		if paused != nil {
			break
		}
		done = append(done, p)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range done {
		s.recordSealLocked(p.e, p.crc)
	}
	if paused != nil && s.mu.sealPart == nil {
		s.mu.sealPart = paused
	}
	s.m.unsealedPages.Set(float64(len(s.mu.unsealed)))
	if paused != nil {
		return len(done) + 1
	}
	return len(done)
}

// sealBatchLocked takes up to sealBatch pending pages to seal, the one the
// sealer paused in first; s.mu is held.
func (s *Store) sealBatchLocked() []*partialSeal {
	var parts []*partialSeal
	if p := s.mu.sealPart; p != nil {
		s.mu.sealPart = nil
		_, pending := s.mu.unsealed[p.e.Key]
		if cur, ok := s.cat.Get(p.e.Key); pending && ok && cur.Generation == p.e.Generation && cur.DRAMSlot == p.e.DRAMSlot {
			parts = append(parts, p)
		}
	}
	for k := range s.mu.unsealed {
		if len(parts) == sealBatch {
			break
		}
		if len(parts) > 0 && parts[0].e.Key == k && parts[0].done > 0 {
			continue // the paused page, resumed above
		}
		e, ok := s.cat.Get(k)
		if !ok || e.DRAMSlot < 0 {
			delete(s.mu.unsealed, k) // gone, or sealed by whoever moved it
			continue
		}
		// The slice is taken while the slot is allocated (every Free runs
		// under mu): its shape stays valid even if the slot is freed later.
		parts = append(parts, &partialSeal{e: e, buf: s.pool.Bytes(dram.Slot(e.DRAMSlot))[:e.Size]})
	}
	return parts
}

// recordSealLocked stores a page's checksum if the page is still the one that
// was summed.
func (s *Store) recordSealLocked(e catalog.Entry, sum uint32) {
	if _, pending := s.mu.unsealed[e.Key]; !pending {
		return
	}
	matched := false
	cur, ok, err := s.cat.Update(e.Key, func(c *catalog.Entry) bool {
		if c.Generation == e.Generation && c.DRAMSlot == e.DRAMSlot {
			c.Checksum, matched = sum, true
		}
		return true
	})
	// Done when sealed now, or the page is gone or out of DRAM (whoever
	// moved it sealed it). A newer save of the same key stays pending.
	if err == nil && (matched || !ok || cur.DRAMSlot < 0) {
		delete(s.mu.unsealed, e.Key)
	}
}

// sealForWrite returns entries with their checksums, computing the pending
// ones inline from their DRAM slots. The pages must be pinned in DRAM.
func (s *Store) sealForWrite(entries []catalog.Entry) []catalog.Entry {
	return s.sealEntries(entries, parallel)
}

// sealEntries is sealForWrite with the checksums spread by each (parallel,
// or one at a time for background work).
func (s *Store) sealEntries(entries []catalog.Entry, each func(n int, fn func(i int))) []catalog.Entry {
	s.mu.Lock()
	var todo []int
	for i, e := range entries {
		_, pending := s.mu.unsealed[e.Key]
		if cur, ok := s.cat.Get(e.Key); !pending && ok && cur.Generation == e.Generation && cur.DRAMSlot == e.DRAMSlot {
			// Sealed, perhaps since the caller copied the entry (the sealer
			// may run between picking a victim and writing it): take its sum.
			entries[i].Checksum = cur.Checksum
			continue
		}
		// Pending, or no longer the entry's copy (a durable re-save
		// replaced it, retire.go, and its sum was never recorded): sum the
		// pinned slot itself.
		todo = append(todo, i)
	}
	s.mu.Unlock()
	if len(todo) == 0 {
		return entries
	}
	each(len(todo), func(j int) {
		e := &entries[todo[j]]
		e.Checksum = crc32c.Checksum(s.pool.Bytes(dram.Slot(e.DRAMSlot))[:e.Size])
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, i := range todo {
		s.recordSealLocked(entries[i], entries[i].Checksum)
	}
	s.m.unsealedPages.Set(float64(len(s.mu.unsealed)))
	return entries
}
