package fabric

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/tiers/ssd"
	"github.com/orbitkv/orbitkv/transfer"
)

// errNoSpace reports that no tier could make room: every page is pinned.
var errNoSpace = errors.New("no room: every page is pinned")

// pageStore moves pages between engine buffers and the local tiers and keeps
// the catalog, the DRAM pool, the SSD tier and their LRUs consistent. Every
// metadata change happens under mu; bytes move outside it, protected by pins.
type pageStore struct {
	cat   *catalog.Catalog
	pool  *dram.Pool
	ssd   *ssd.Store // nil when the SSD tier is disabled
	local transfer.Local
	dramR *transfer.Region
	m     *metrics
	mu    struct {
		sync.Mutex
		dram, ssd *tiers.LRU
		gen       uint64
	}
}

func newPageStore(cat *catalog.Catalog, pool *dram.Pool, st *ssd.Store, m *metrics) *pageStore {
	s := &pageStore{cat: cat, pool: pool, ssd: st, m: m, dramR: transfer.HostRegion("dram", pool.Region())}
	s.mu.dram, s.mu.ssd = tiers.NewLRU(), tiers.NewLRU()
	return s
}

// recover rebuilds SSD allocation and LRU order from the recovered catalog:
// every entry names a durable SSD slot. Entries whose slot cannot be
// reserved (out of range, overlapping) are dropped. It returns the number
// of recovered and dropped pages.
func (s *pageStore) recover() (kept, dropped int, err error) {
	var entries []catalog.Entry
	s.cat.Range(func(e catalog.Entry) bool { entries = append(entries, e); return true })
	sort.Slice(entries, func(i, j int) bool { return entries[i].LastAccess < entries[j].LastAccess })
	var bad []pagekey.Key
	for _, e := range entries {
		s.mu.gen = max(s.mu.gen, e.Generation)
		if s.ssd == nil || !e.OnSSD || s.ssd.Reserve(ssdLoc(e.SSD)) != nil {
			bad = append(bad, e.Key)
			continue
		}
		s.mu.ssd.Touch(e.Key)
	}
	if len(bad) > 0 {
		if err := s.cat.Delete(bad...); err != nil {
			return 0, 0, err
		}
	}
	s.updateGauges()
	return len(entries) - len(bad), len(bad), nil
}

func ssdLoc(l catalog.SSDLoc) ssd.Loc { return ssd.Loc{File: l.File, Offset: l.Offset, Bytes: l.Bytes} }
func catLoc(l ssd.Loc) catalog.SSDLoc {
	return catalog.SSDLoc{File: l.File, Offset: l.Offset, Bytes: l.Bytes}
}

// allocDRAM returns a free DRAM slot, evicting unpinned pages (demoting them
// to SSD when they are not there yet) until one is free.
func (s *pageStore) allocDRAM(ctx context.Context, size uint64) (dram.Slot, error) {
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		s.mu.Lock()
		slot, err := s.pool.Alloc(size)
		if !errors.Is(err, dram.ErrFull) {
			s.mu.Unlock()
			return slot, err
		}
		victim, ok := s.mu.dram.Victim()
		if !ok {
			s.mu.Unlock()
			return 0, errNoSpace
		}
		e, _ := s.cat.Get(victim)
		if e.OnSSD || s.ssd == nil {
			s.dropDRAMLocked(e)
			s.mu.Unlock()
			continue
		}
		s.mu.dram.Pin(victim)
		s.mu.Unlock()
		derr := s.demote(ctx, e)
		s.mu.Lock()
		s.mu.dram.Unpin(victim)
		if cur, ok := s.cat.Get(victim); ok && cur.DRAMSlot == e.DRAMSlot && !s.mu.dram.Pinned(victim) {
			if derr == nil || !cur.OnSSD {
				s.dropDRAMLocked(cur)
			}
		}
		s.mu.Unlock()
	}
}

// dropDRAMLocked removes a page's DRAM copy; a page held nowhere else leaves
// the catalog first, then its slot is freed.
func (s *pageStore) dropDRAMLocked(e catalog.Entry) {
	if e.DRAMSlot < 0 {
		return
	}
	var err error
	if e.OnSSD {
		_, _, err = s.cat.Update(e.Key, func(c *catalog.Entry) bool { c.DRAMSlot = -1; return true })
	} else {
		err = s.cat.Delete(e.Key)
	}
	if err != nil {
		return // the catalog still names the slot: keep it
	}
	s.mu.dram.Remove(e.Key)
	s.pool.Free(dram.Slot(e.DRAMSlot))
	s.m.evictedPages.WithLabelValues("dram").Inc()
}

// demote writes a DRAM page to SSD and records it there.
func (s *pageStore) demote(ctx context.Context, e catalog.Entry) error {
	loc, err := s.allocSSD(e.Size)
	if err != nil {
		return err
	}
	slot := s.pool.Bytes(dram.Slot(e.DRAMSlot))
	errs := s.ssd.Write(ctx, []ssd.WriteReq{{Loc: loc, Header: header(e), Data: slot}})
	if errs[0] != nil {
		s.freeSSD(loc)
		return errs[0]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok, err := s.cat.Update(e.Key, func(c *catalog.Entry) bool {
		c.OnSSD, c.SSD = true, catLoc(loc)
		return true
	})
	if !ok || err != nil {
		s.ssd.Free(loc)
		return errors.Join(errNoSpace, err)
	}
	s.mu.ssd.Touch(e.Key)
	s.m.demotedPages.Inc()
	return nil
}

func (s *pageStore) freeSSD(loc ssd.Loc) {
	s.mu.Lock()
	s.ssd.Free(loc)
	s.mu.Unlock()
}

// allocSSD returns a free SSD slot, dropping the least recently used
// unpinned SSD copies until one is free.
func (s *pageStore) allocSSD(size uint64) (ssd.Loc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		loc, err := s.ssd.Alloc(size)
		if !errors.Is(err, ssd.ErrFull) {
			return loc, err
		}
		victim, ok := s.mu.ssd.Victim()
		if !ok {
			return ssd.Loc{}, errNoSpace
		}
		if err := s.dropSSDLocked(victim); err != nil {
			return ssd.Loc{}, err
		}
	}
}

// dropSSDLocked removes a page's SSD copy: the catalog forgets it first, then
// the slot is freed.
func (s *pageStore) dropSSDLocked(k pagekey.Key) error {
	s.mu.ssd.Remove(k)
	e, ok := s.cat.Get(k)
	if !ok || !e.OnSSD {
		return nil
	}
	var err error
	if e.DRAMSlot >= 0 {
		_, _, err = s.cat.Update(k, func(c *catalog.Entry) bool { c.OnSSD = false; c.SSD = catalog.SSDLoc{}; return true })
	} else {
		err = s.cat.Delete(k)
	}
	if err != nil {
		return err
	}
	s.ssd.Free(ssdLoc(e.SSD))
	s.m.evictedPages.WithLabelValues("ssd").Inc()
	return nil
}

func header(e catalog.Entry) page.Header {
	return page.Header{Key: e.Key, Layout: e.Layout, Length: e.Size, Checksum: e.Checksum, Generation: e.Generation}
}

// nextGen returns a fresh generation number.
func (s *pageStore) nextGen() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.gen++
	return s.mu.gen
}

// updateGauges refreshes the tier gauges.
func (s *pageStore) updateGauges() {
	ps := s.pool.Stats()
	s.m.tierBytes.WithLabelValues("dram").Set(float64(ps.UsedBytes))
	s.m.tierPages.WithLabelValues("dram").Set(float64(ps.Slots))
	s.m.tierCapacity.WithLabelValues("dram").Set(float64(ps.CapacityBytes))
	if s.ssd != nil {
		st := s.ssd.Stats()
		s.m.tierBytes.WithLabelValues("ssd").Set(float64(st.UsedBytes))
		s.m.tierCapacity.WithLabelValues("ssd").Set(float64(st.CapacityBytes))
		s.mu.Lock()
		s.m.tierPages.WithLabelValues("ssd").Set(float64(s.mu.ssd.Len()))
		s.mu.Unlock()
	}
	s.m.catalogEntries.Set(float64(s.cat.Len()))
}

func now() int64 { return time.Now().UnixNano() }

// copyWorkers is how many pages of one operation are copied at once: one
// per CPU (a single core's memcpy does not saturate memory bandwidth).
var copyWorkers = min(runtime.GOMAXPROCS(0), 8)

// parallel runs fn(0..n-1) on up to copyWorkers goroutines and waits.
func parallel(n int, fn func(i int)) {
	w := min(copyWorkers, n)
	if w <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < w; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		}()
	}
	wg.Wait()
}
