package store

import (
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/dram"
)

// Retired DRAM slots. A durable re-save replaces a page's DRAM-only copy
// (commitSaves), but loads, member fetches and demotions that pinned the
// key before the replacement still read the old slot (they took its number
// with their pin). The catalog stops naming the slot at once; the slot
// itself is freed when the key's last DRAM pin goes, which is why every
// DRAM unpin goes through unpinDRAMLocked. A slot pinned for good (a stuck
// GPU copy, gpu.go) stays retired for good, as its pins do.

// retireDRAMLocked frees slot, which no catalog entry names any more, once
// nothing pins key in DRAM; s.mu is held.
func (s *Store) retireDRAMLocked(k pagekey.Key, slot dram.Slot) {
	if !s.mu.dram.Pinned(k) {
		s.pool.Free(slot)
		return
	}
	s.mu.retired[k] = append(s.mu.retired[k], slot)
}

// unpinDRAMLocked undoes one DRAM pin of k and frees k's retired slots when
// it was the last; s.mu is held.
func (s *Store) unpinDRAMLocked(k pagekey.Key) {
	s.mu.dram.Unpin(k)
	if s.mu.dram.Pinned(k) {
		return
	}
	for _, slot := range s.mu.retired[k] {
		s.pool.Free(slot)
	}
	delete(s.mu.retired, k)
}
