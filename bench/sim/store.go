package sim

import (
	"fmt"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers"
)

// store is one host's HBM prefix cache and peer tiers. Its DRAM/SSD logic
// mirrors fabric's page store (fabric/store/store.go): the catalog records which
// tier holds a page, one tiers.LRU per tier orders eviction and skips pinned
// pages, and capacity is accounted in bytes.
type store struct {
	cat       *catalog.Catalog
	fp        pagekey.Fingerprint
	pageBytes uint64

	hbm               *tiers.LRU
	hbmPages          int // capacity
	dram, ssd         *tiers.LRU
	dramCap, ssdCap   uint64
	dramUsed, ssdUsed uint64
	nextSlot, nextLoc int64
	gen               uint64
	now               int64 // virtual ns of the current operation
	moved             *Counters
	noReadmit         bool // Config.NoReadmit
	readmitAll        bool // Config.ReadmitAll
	freq              *tiers.Frequency
}

func newStore(cfg Config, c *Counters) (*store, error) {
	cat, err := catalog.Open(catalog.Options{})
	if err != nil {
		return nil, fmt.Errorf("open in-memory catalog: %w", err)
	}
	// The peer's sketch (fabric/store): sized by the pool, aged by the pages
	// it holds once a lookup names their size.
	freq := tiers.NewFrequency(int(cfg.DRAMBytes / tiers.FreqPageBytes))
	freq.SetPages(int(cfg.DRAMBytes / cfg.PageBytes()))
	return &store{
		cat: cat, fp: cfg.Model.Layout(cfg.PageTokens).Fingerprint(), pageBytes: cfg.PageBytes(),
		hbm: tiers.NewLRU(), hbmPages: int(cfg.HBMTokens / int64(cfg.PageTokens)),
		dram: cfg.dramLRU(), ssd: tiers.NewLRU(), dramCap: cfg.DRAMBytes, ssdCap: cfg.SSDBytes,
		moved: c, noReadmit: cfg.NoReadmit, readmitAll: cfg.ReadmitAll, freq: freq,
	}, nil
}

func (s *store) close() error { return s.cat.Close() }

// hbmPrefix is how many leading keys the HBM prefix cache holds.
func (s *store) hbmPrefix(keys []pagekey.Key) int {
	n := 0
	for n < len(keys) && s.hbm.Contains(keys[n]) {
		n++
	}
	return n
}

// keepInHBM records that the engine's prefix cache holds keys after a
// prefill, then evicts its least recently used pages over capacity. The
// chain is touched tail first so a request's tail is evicted before its
// head, as vLLM frees a finished request's blocks.
func (s *store) keepInHBM(keys []pagekey.Key) {
	if s.hbmPages == 0 {
		return
	}
	for i := len(keys) - 1; i >= 0; i-- {
		s.hbm.Touch(keys[i])
	}
	for s.hbm.Len() > s.hbmPages {
		k, _ := s.hbm.Victim()
		s.hbm.Remove(k)
		s.moved.EvictedPages.HBM++
	}
}

// save stores one page of a finished prefill in DRAM: kept if there,
// promoted if on SSD only (the SSD read buffer becomes the DRAM copy when
// the request restored it, the computed page a readmission otherwise),
// written from HBM otherwise. A page that finds no room (every DRAM page
// pinned, or no DRAM tier) is not saved.
func (s *store) save(k pagekey.Key, restored bool) error {
	e, held := s.cat.Get(k)
	if held && (e.DRAMSlot >= 0 || (s.noReadmit && !restored)) {
		return nil // a hit touched when it was loaded, or (before readmission) a computed page left on SSD
	}
	readmit := held && !restored
	if readmit && !s.admitsReadmit(k) {
		s.moved.ColderReadmits++
		return nil
	}
	alloc := s.allocDRAM
	if readmit {
		alloc = s.allocReadmit
	}
	room, err := alloc()
	if err != nil || !room {
		if !readmit {
			s.moved.UnsavedPages++
		}
		return err
	}
	slot := s.nextSlot
	s.nextSlot++
	// Making room may have dropped the page's own SSD copy: look again.
	if _, ok := s.cat.Get(k); ok {
		_, _, err = s.cat.Update(k, func(c *catalog.Entry) bool { c.DRAMSlot = slot; return true })
	} else {
		s.gen++
		err = s.cat.Put(catalog.Entry{Key: k, Layout: s.fp, Size: s.pageBytes, Generation: s.gen, DRAMSlot: slot, LastAccess: s.now})
		if !held {
			s.moved.Bytes.HBMToDRAM += s.pageBytes
		}
	}
	if err != nil {
		return fmt.Errorf("save page %s: %w", k, err)
	}
	if held {
		s.dram.Promote(k) // an SSD hit promoted, or a page readmitted: used again
	} else {
		s.dram.Touch(k)
	}
	return nil
}

// noteAsked records that a lookup asked for keys, as the peer's lookups do
// (fabric/store/readmit.go, NoteAsked).
func (s *store) noteAsked(keys []pagekey.Key) { s.freq.Record(keys) }

// admitsReadmit is the peer's rule: a readmission that would eat into the
// flusher's reserve takes DRAM only if its page was asked for more often
// lately than the page that leaves for it: the next victim while a slot is
// free, else the clean copy allocReadmit would drop.
func (s *store) admitsReadmit(k pagekey.Key) bool {
	free := s.dramCap - s.dramUsed
	if s.readmitAll || free >= s.dramCap/flushReserve+s.pageBytes {
		return true
	}
	v, ok := s.dram.Victim()
	if free < s.pageBytes {
		v, ok = s.cleanVictim()
	}
	return !ok || s.freq.Hotter(k, v)
}

// cleanVictim is the page allocReadmit drops for a readmission into a full
// tier: the first clean copy (on SSD too) among the readmitScan oldest.
func (s *store) cleanVictim() (pagekey.Key, bool) {
	for k := range s.dram.Oldest(readmitScan) {
		if e, _ := s.cat.Get(k); e.OnSSD {
			return k, true
		}
	}
	return pagekey.Key{}, false
}

// evictBatch is how many pages the peer demotes or drops from SSD in one
// round (fabric/store/evict.go).
const evictBatch = 16

// allocDRAM makes room for one page the way the peer's allocDRAM does: when
// DRAM is full it drops the oldest unpinned copy that needs no I/O (already
// on SSD, or no SSD tier), or else demotes up to evictBatch of the oldest
// pages to SSD together. It reports false when every page is pinned, when
// the tier is smaller than a page, or when a demotion round frees nothing
// (the peer would retry until its deadline).
func (s *store) allocDRAM() (bool, error) {
	if s.dramCap < s.pageBytes {
		return false, nil
	}
	for s.dramUsed+s.pageBytes > s.dramCap {
		if moved, err := s.evictOnce(); err != nil || !moved {
			return false, err
		}
	}
	s.dramUsed += s.pageBytes
	return true, s.flush()
}

// evictOnce frees DRAM once as the peer does: it drops the oldest copy that
// needs no I/O or demotes a batch, and reports false when nothing moved.
func (s *store) evictOnce() (bool, error) {
	dropped, demote, err := s.pickVictims()
	if err != nil || (!dropped && len(demote) == 0) {
		return false, err
	}
	if len(demote) > 0 {
		if freed, err := s.demoteBatch(demote); err != nil || freed == 0 {
			return false, err
		}
	}
	return true, nil
}

// flushReserve is the peer's (fabric/store/flush.go): with an SSD tier its
// flusher keeps 1/flushReserve of the DRAM tier free, evicting ahead of
// need (clean copies dropped, the others demoted in batches).
const flushReserve = 8

// flush evicts as the peer's flusher would after an allocation, at once:
// until 1/flushReserve of DRAM is free or nothing moves.
func (s *store) flush() error {
	if s.ssdCap < s.pageBytes {
		return nil
	}
	for s.dramCap-s.dramUsed < s.dramCap/flushReserve {
		if moved, err := s.evictOnce(); err != nil || !moved {
			return err
		}
	}
	return nil
}

// readmitScan is the peer's fillScan (fabric/store/evict.go): how many of
// the oldest unpinned pages of each DRAM segment a readmission looks at.
const readmitScan = 64

// allocReadmit makes room for a readmitted page the way the peer's
// allocReadmit does: a free slot (the flusher's reserve), or the slot of a
// clean copy (on SSD too) among the readmitScan oldest pages of each
// segment; never a demotion of its own. It reports false when neither
// exists: the page stays on SSD only.
func (s *store) allocReadmit() (bool, error) {
	if s.dramCap < s.pageBytes {
		return false, nil
	}
	if s.dramUsed+s.pageBytes > s.dramCap {
		clean, found := s.cleanVictim()
		if !found {
			return false, nil
		}
		if err := s.dropDRAM(clean); err != nil {
			return false, err
		}
	}
	s.dramUsed += s.pageBytes
	return true, s.flush()
}

// pickVictims drops the oldest unpinned DRAM copy that needs no I/O, or else
// pins and returns up to evictBatch pages to demote.
func (s *store) pickVictims() (dropped bool, demote []pagekey.Key, err error) {
	for len(demote) < evictBatch {
		victim, ok := s.dram.Victim()
		if !ok {
			break
		}
		e, _ := s.cat.Get(victim)
		if e.OnSSD || s.ssdCap < s.pageBytes {
			if err := s.dropDRAM(victim); err != nil {
				return false, nil, err
			}
			dropped = true
			break
		}
		s.dram.Pin(victim)
		demote = append(demote, victim)
	}
	if dropped {
		for _, k := range demote {
			s.dram.Unpin(k)
		}
		demote = nil
	}
	return dropped, demote, nil
}

// dropDRAM removes a page's DRAM copy; a page held nowhere else leaves the
// catalog.
func (s *store) dropDRAM(k pagekey.Key) error {
	e, _ := s.cat.Get(k)
	var err error
	if e.OnSSD {
		_, _, err = s.cat.Update(k, func(c *catalog.Entry) bool { c.DRAMSlot = -1; return true })
	} else {
		err = s.cat.Delete(k)
	}
	if err != nil {
		return fmt.Errorf("evict page %s from dram: %w", k, err)
	}
	s.dram.Remove(k)
	s.dramUsed -= s.pageBytes
	s.moved.EvictedPages.DRAM++
	return nil
}

// demoteBatch writes pinned DRAM pages to SSD (where it finds room) and
// records them there; a page nobody else pins loses its DRAM copy. It
// unpins every page and returns how many DRAM copies it freed.
func (s *store) demoteBatch(keys []pagekey.Key) (freed int, err error) {
	defer func() {
		for _, k := range keys {
			s.dram.Unpin(k)
		}
	}()
	for _, k := range keys {
		room, err := s.allocSSD()
		if err != nil {
			return freed, err
		}
		if !room {
			continue
		}
		loc := catalog.SSDLoc{Offset: uint64(s.nextLoc) * s.pageBytes, Bytes: s.pageBytes}
		s.nextLoc++
		drop := s.dram.Pins(k) == 1 // only our pin: the DRAM copy can go
		if _, _, err := s.cat.Update(k, func(c *catalog.Entry) bool {
			c.OnSSD, c.SSD = true, loc
			if drop {
				c.DRAMSlot = -1
			}
			return true
		}); err != nil {
			return freed, fmt.Errorf("demote page %s: %w", k, err)
		}
		s.ssd.Touch(k)
		s.moved.Bytes.DRAMToSSD += s.pageBytes
		s.moved.DemotedPages++
		if drop {
			s.dram.Remove(k)
			s.dramUsed -= s.pageBytes
			s.moved.EvictedPages.DRAM++
			freed++
		}
	}
	return freed, nil
}

// allocSSD makes room for one page on SSD, dropping the least recently used
// unpinned copies evictBatch at a time.
func (s *store) allocSSD() (bool, error) {
	if s.ssdCap < s.pageBytes {
		return false, nil
	}
	for s.ssdUsed+s.pageBytes > s.ssdCap {
		var victims []pagekey.Key
		for len(victims) < evictBatch {
			v, ok := s.ssd.Victim()
			if !ok {
				break
			}
			s.ssd.Pin(v) // so Victim moves on; dropSSD removes it
			victims = append(victims, v)
		}
		if len(victims) == 0 {
			return false, nil
		}
		for _, v := range victims {
			if err := s.dropSSD(v); err != nil {
				return false, err
			}
		}
	}
	s.ssdUsed += s.pageBytes
	return true, nil
}

// dropSSD removes a page's SSD copy: the catalog forgets it first.
func (s *store) dropSSD(k pagekey.Key) error {
	e, _ := s.cat.Get(k)
	var err error
	if e.DRAMSlot >= 0 {
		_, _, err = s.cat.Update(k, func(c *catalog.Entry) bool { c.OnSSD, c.SSD = false, catalog.SSDLoc{}; return true })
	} else {
		err = s.cat.Delete(k)
	}
	if err != nil {
		return fmt.Errorf("evict page %s from ssd: %w", k, err)
	}
	s.ssd.Remove(k)
	s.ssdUsed -= s.pageBytes
	s.moved.EvictedPages.SSD++
	return nil
}

// pin leases a hit page in the tier it is read from, and marks it used
// again there (the peer's load does both: Promote, in a segmented DRAM).
func (s *store) pin(k pagekey.Key, t catalog.Tier) {
	l := s.lru(t)
	l.Pin(k)
	l.Promote(k)
}

func (s *store) unpin(k pagekey.Key, t catalog.Tier) { s.lru(t).Unpin(k) }

func (s *store) lru(t catalog.Tier) *tiers.LRU {
	if t == catalog.TierSSD {
		return s.ssd
	}
	return s.dram
}
