package store

import (
	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Pins by tier. A page is pinned in the LRU of the tier it is read from
// (tiers.LRU), for every lease and copy that needs it, and eviction never
// picks a pinned page. Only the store takes and releases pins: leases'
// here (the engine API holds a Pins value and gives it back), copies' in
// load.go, demotions' in evict.go. A DRAM pin is always undone through
// unpinDRAMLocked, which frees the key's retired slots with its last pin
// (retire.go). Leases' pins count against the query budget
// (Options.QueryBudget), so leases can never pin every slot.

// Pins are the pages a lease pinned, each in the tier it was pinned in,
// and the bytes they charge to the query budget.
type Pins struct {
	keys  []pagekey.Key
	onSSD []bool // which LRU each key's pin was taken in
	bytes uint64
}

// Len is how many pages are pinned.
func (p Pins) Len() int { return len(p.keys) }

// Bytes is what the pins charge to the query budget.
func (p Pins) Bytes() uint64 { return p.bytes }

// LeasePins pins the leading pages of chain that are still stored, in the
// tier each is read from, charging their real size (whatever layout the
// session declared, so the budget stays hard) to the query budget. It stops
// at the first page gone since the caller's lookup, or that the budget
// cannot hold: budgetCut is how many pages of chain it cut for the budget.
// dram and ssd count the pinned pages by tier.
func (s *Store) LeasePins(chain []pagekey.Key) (p Pins, dram, ssd, budgetCut int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	left := uint64(0)
	if s.mu.leased < s.opts.QueryBudget {
		left = s.opts.QueryBudget - s.mu.leased
	}
	for i, k := range chain {
		e, ok := s.cat.Get(k)
		if !ok {
			break // evicted since the lookup: the hit ends here
		}
		if p.bytes+e.Size > left {
			budgetCut = len(chain) - i
			break
		}
		onSSD := e.DRAMSlot < 0
		if onSSD {
			ok = s.mu.ssd.Pin(e.Key)
		} else {
			ok = s.mu.dram.Pin(e.Key)
		}
		if !ok {
			break
		}
		p.keys, p.onSSD = append(p.keys, e.Key), append(p.onSSD, onSSD)
		p.bytes += e.Size
		if e.Tier() == catalog.TierDRAM {
			dram++
		} else {
			ssd++
		}
	}
	s.mu.leased += p.bytes
	return p, dram, ssd, budgetCut
}

// ReleasePins unpins a lease's pages and returns its budget.
func (s *Store) ReleasePins(p Pins) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range p.keys {
		if p.onSSD[i] {
			s.mu.ssd.Unpin(k)
		} else {
			s.unpinDRAMLocked(k)
		}
	}
	s.mu.leased -= p.bytes
}

// Pinned reports whether k is pinned in DRAM and on SSD (status, tests).
func (s *Store) Pinned(k pagekey.Key) (dram, ssd bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.dram.Pinned(k), s.mu.ssd.Pinned(k)
}
