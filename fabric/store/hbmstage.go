package store

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/transfer"
)

// HBMStage is a device's staging area: page slots in the peer's own HBM on
// that GPU (cuMemAlloc in the peer's context, --hbm-stage-bytes). A CUDA
// session's save also copies its pages, device to device, into the stage of
// the session's GPU, beside its copy into DRAM (the save answers once both
// are done; only pages the save committed fresh are published); a later load of those pages by a CUDA
// session — on the same GPU, or another GPU of the host (NVLink) — copies
// them from the stage instead of from DRAM: the same-host P/D handoff, GPU
// to GPU. The stage is a cache beside the DRAM copy, never the only copy:
// a stage record names the catalog generation it was copied with, a load
// takes it only while the catalog still names that generation, and every
// failure falls back to DRAM. Slots are reused oldest first (a ring), never
// while a load reads them. Like DRAM pages, staged pages are not summed
// again when loaded: the generation says they are the bytes of the save
// the DRAM copy came from, copied from the same blocks in the same call.
type HBMStage struct {
	Ordinal int
	region  *transfer.Region // peer-owned device memory
	gpu     DeviceCopier     // the device's transport: fills the slots, is the source of loads
	mu      struct {
		sync.Mutex
		pageBytes uint64 // the slot size: the first page staged decides
		slots     []stageSlot
		next      int // ring cursor
		byKey     map[pagekey.Key]int
	}
}

// stageSlot is one page slot of a stage. A slot being filled has live
// false; a pinned slot is read by a load (or, pinned for good, may still be
// touched by a copy that never finished) and is never reused.
type stageSlot struct {
	key  pagekey.Key
	gen  uint64
	live bool
	pins int
}

// NewHBMStage returns a stage over region, device memory of GPU ordinal
// owned by the caller for the stage's life, filled and read through gpu.
func NewHBMStage(ordinal int, region *transfer.Region, gpu DeviceCopier) *HBMStage {
	st := &HBMStage{Ordinal: ordinal, region: region, gpu: gpu}
	st.mu.byKey = make(map[pagekey.Key]int)
	return st
}

// AddHBMStage makes a device's stage a source for loads from every CUDA
// session (sessions on its device fill it: Engine.Stage).
func (s *Store) AddHBMStage(st *HBMStage) {
	s.stagesMu.Lock()
	defer s.stagesMu.Unlock()
	s.stages = append(s.stages, st)
}

func (s *Store) hbmStages() []*HBMStage {
	s.stagesMu.Lock()
	defer s.stagesMu.Unlock()
	return s.stages
}

// stagedPage is one page a stage copy moves: the request index, the stage
// slot, the catalog generation it is published with (0: not published,
// the slot is freed) and the one the catalog held when the save began.
type stagedPage struct {
	i, slot    int
	key        pagekey.Key
	gen, prior uint64
}

// stageCopy is a save's copy into the HBM stage of its GPU, running beside
// the save's copy into DRAM (device to device beside device to host: HBM
// and PCIe, neither waits for the other).
type stageCopy struct {
	st    *HBMStage
	pages []stagedPage
	done  chan error
}

// startStage reserves stage slots for a CUDA save's pages and starts their
// device-to-device copy from the engine's blocks, which hold the same bytes
// until the save answers. Best effort: nil when there is no stage, no free
// slot or nothing to plan; the save's result never depends on it.
func (s *Store) startStage(ctx context.Context, sess *Engine, reqs []PageReq) *stageCopy {
	st := sess.Stage
	if st == nil || len(reqs) == 0 {
		return nil
	}
	pages := s.priorGens(reqs)
	pages, skipped := st.reserve(pages, sess.PageBytes)
	s.m.staged.WithLabelValues("skipped").Add(float64(skipped))
	if len(pages) == 0 {
		return nil
	}
	sc := &stageCopy{st: st, pages: pages, done: make(chan error, 1)}
	go func() { sc.done <- s.copyToStage(ctx, sess, reqs, sc) }() // planned there too: the DRAM copy starts at once
	return sc
}

// copyToStage plans a stage copy's pages from the engine's blocks into
// their slots and copies them as one device copy. A page that does not
// plan is left out (its generation 0: freed when the save finishes).
func (s *Store) copyToStage(ctx context.Context, sess *Engine, reqs []PageReq, sc *stageCopy) error {
	descs := make([]transfer.Desc, 0, len(sc.pages)*descsPerPage(sess))
	for k := range sc.pages {
		p := &sc.pages[k]
		d, err := sess.Geom.Gather(descs[len(descs):], sess.Bufs, reqs[p.i].Blocks, sc.st.region, sc.st.offsetOf(p.slot))
		if err != nil {
			p.gen = 0
			continue
		}
		descs = append(descs, d...)
	}
	return sc.st.gpu.CopyFrom(ctx, sess.GPU, descs)
}

// priorGens names every page of a save with the generation the catalog
// holds for it now (0: none).
func (s *Store) priorGens(reqs []PageReq) []stagedPage {
	s.mu.Lock()
	defer s.mu.Unlock()
	pages := make([]stagedPage, len(reqs))
	for i, r := range reqs {
		pages[i] = stagedPage{i: i, key: r.Key, gen: 1} // gen: planned; set from the commit
		if e, ok := s.cat.Get(r.Key); ok {
			pages[i].prior = e.Generation
		}
	}
	return pages
}

// finishStage waits for a save's stage copy (bounded: the copy's own
// deadline) and publishes the pages the save committed fresh into DRAM,
// with the generation the catalog still holds for them; the other slots
// (pages stored already, failed, replaced meanwhile) are freed.
func (s *Store) finishStage(sc *stageCopy, items []*saveItem, res []Result) {
	if sc == nil {
		return
	}
	err := <-sc.done
	gens := make(map[int]uint64, len(items))
	for _, it := range items {
		if res[it.i].Code == CodeOK {
			gens[it.i] = it.entry.Generation
		}
	}
	n := s.committedGens(sc.pages, gens)
	sc.st.filled(sc.pages, err)
	switch {
	case err != nil:
		s.m.staged.WithLabelValues("failed").Add(float64(n))
		s.log.Debug().Err(err).Int("device", sc.st.Ordinal).Int("pages", len(sc.pages)).Msg("hbm stage: copy failed; the pages load from dram")
	default:
		s.m.staged.WithLabelValues("staged").Add(float64(n))
	}
}

// committedGens sets each planned page's generation to the one its save
// committed, where the catalog still holds it in DRAM, else 0, and counts
// the pages kept.
func (s *Store) committedGens(pages []stagedPage, gens map[int]uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k := range pages {
		p := &pages[k]
		g, ok := gens[p.i]
		if e, in := s.cat.Get(p.key); p.gen == 0 || !ok || !in || e.Generation != g || e.DRAMSlot < 0 {
			p.gen = 0
			continue
		}
		p.gen = g
		n++
	}
	return n
}

func (st *HBMStage) offset(slot int) uint64 { return uint64(slot) * st.mu.pageBytes }

// reserve takes a slot for every page, oldest first, skipping pinned ones,
// and returns the pages that got one and how many were skipped: pages of
// another size than the stage's slots, and pages past the free slots.
func (st *HBMStage) reserve(pages []stagedPage, pageBytes uint64) ([]stagedPage, int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.mu.pageBytes == 0 && pageBytes > 0 {
		st.mu.pageBytes = pageBytes
		st.mu.slots = make([]stageSlot, st.region.Size/pageBytes)
	}
	if pageBytes != st.mu.pageBytes || len(st.mu.slots) == 0 {
		return nil, len(pages)
	}
	out := pages[:0]
	skipped := 0
	for _, p := range pages {
		if j, ok := st.mu.byKey[p.key]; ok && p.prior != 0 && st.mu.slots[j].gen == p.prior {
			continue // staged already, with the bytes the catalog holds
		}
		j, ok := st.freeSlotLocked()
		if !ok {
			skipped++
			continue
		}
		if old := &st.mu.slots[j]; old.live && st.mu.byKey[old.key] == j {
			delete(st.mu.byKey, old.key)
		}
		st.mu.slots[j] = stageSlot{key: p.key, pins: 1} // pinned while it fills; its generation comes with filled
		p.slot = j
		out = append(out, p)
	}
	return out, skipped
}

// freeSlotLocked returns the oldest slot no load reads, advancing the ring.
func (st *HBMStage) freeSlotLocked() (int, bool) {
	n := len(st.mu.slots)
	for range n {
		j := st.mu.next
		st.mu.next = (j + 1) % n
		if st.mu.slots[j].pins == 0 {
			return j, true
		}
	}
	return 0, false
}

// filled publishes the pages a stage copy moved (err nil) that have a
// generation and frees the other slots; after a stuck copy the slots stay
// pinned for good (the device may still write them).
func (st *HBMStage) filled(pages []stagedPage, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	stuck := errors.Is(err, transfer.ErrStuck)
	for _, p := range pages {
		sl := &st.mu.slots[p.slot]
		switch {
		case stuck:
		case err != nil || p.gen == 0:
			*sl = stageSlot{}
		default:
			if j, ok := st.mu.byKey[p.key]; ok && j != p.slot {
				st.mu.slots[j].live = false // an older copy of the key: free for reuse
			}
			sl.gen, sl.live, sl.pins = p.gen, true, 0
			st.mu.byKey[p.key] = p.slot
		}
	}
}

// stagedLoad is a load's pages found in one stage, pinned there.
type stagedLoad struct {
	st    *HBMStage
	items []*loadItem
	slots []int
}

// pinStaged finds, in every stage, the DRAM pages of a load whose staged
// copy has the generation the load pinned, and pins those slots.
func (s *Store) pinStaged(sess *Engine, items []*loadItem) []stagedLoad {
	var out []stagedLoad
	taken := make(map[*loadItem]bool)
	for _, st := range s.hbmStages() {
		l := stagedLoad{st: st}
		st.mu.Lock()
		if st.mu.pageBytes == sess.PageBytes {
			for _, it := range items {
				j, ok := st.mu.byKey[it.req.Key]
				if !ok || taken[it] || it.tier != catalog.TierDRAM {
					continue
				}
				if sl := &st.mu.slots[j]; sl.live && sl.gen == it.entry.Generation {
					sl.pins++
					taken[it] = true
					l.items, l.slots = append(l.items, it), append(l.slots, j)
				}
			}
		}
		st.mu.Unlock()
		if len(l.items) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// unpin releases a staged load's slots; after a stuck copy they stay
// pinned for good (the device may still read them).
func (l stagedLoad) unpin(stuck bool) {
	if stuck {
		return
	}
	l.st.mu.Lock()
	defer l.st.mu.Unlock()
	for _, j := range l.slots {
		l.st.mu.slots[j].pins--
	}
}

// loadStaged copies the load's pages that a stage holds straight from HBM
// into the session's blocks, one device copy per stage, and returns the
// items still to load from DRAM: those no stage holds, and those of a stage
// whose copy failed. Items of a copy that got stuck fail (their blocks may
// still be written) and are not returned.
func (s *Store) loadStaged(ctx context.Context, sess *Engine, items []*loadItem, res []Result) []*loadItem {
	if len(s.hbmStages()) == 0 {
		return items
	}
	done := make(map[*loadItem]bool)
	for _, l := range s.pinStaged(sess, items) {
		err := s.copyStaged(ctx, sess, l)
		stuck := errors.Is(err, transfer.ErrStuck)
		l.unpin(stuck)
		switch {
		case err == nil:
			for _, it := range l.items {
				res[it.i] = okResult(it.tier)
				done[it] = true
			}
			s.m.loadedPages.WithLabelValues("hbm").Add(float64(len(l.items)))
		case stuck:
			for _, it := range l.items {
				res[it.i] = FailResult(fmt.Errorf("load from the hbm stage of device %d: %w", l.st.Ordinal, err))
				done[it] = true
			}
		default:
			s.log.Debug().Err(err).Int("device", l.st.Ordinal).Int("pages", len(l.items)).Msg("hbm stage: load failed; loading from dram")
		}
	}
	if len(done) == 0 {
		return items
	}
	s.m.loadedTokens.Add(float64(loadedTokens(sess, okItems(items, done, res))))
	rest := items[:0:0]
	for _, it := range items {
		if !done[it] {
			rest = append(rest, it)
		}
	}
	return rest
}

// okItems are the items done that loaded.
func okItems(items []*loadItem, done map[*loadItem]bool, res []Result) []*loadItem {
	var out []*loadItem
	for _, it := range items {
		if done[it] && res[it.i].Code == CodeOK {
			out = append(out, it)
		}
	}
	return out
}

// copyStaged plans a staged load's pages out of its stage's slots into the
// session's blocks and copies them as one device copy.
func (s *Store) copyStaged(ctx context.Context, sess *Engine, l stagedLoad) error {
	var descs []transfer.Desc
	var err error
	for k, it := range l.items {
		if descs, err = sess.Geom.Scatter(descs, sess.Bufs, it.req.Blocks, l.st.region, l.st.offsetOf(l.slots[k])); err != nil {
			return fmt.Errorf("plan a load from the hbm stage: %w", err)
		}
	}
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	return sess.GPU.CopyFrom(ctx, l.st.gpu, descs)
}

// offsetOf is offset for a caller without the stage's lock (the slot size
// never changes once set).
func (st *HBMStage) offsetOf(slot int) uint64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.offset(slot)
}

// HBMStageStats are a stage's slot counts.
type HBMStageStats struct {
	Slots, Live, Pinned int
	PageBytes           uint64
}

// Stats returns the stage's counts.
func (st *HBMStage) Stats() HBMStageStats {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := HBMStageStats{Slots: len(st.mu.slots), PageBytes: st.mu.pageBytes}
	for _, sl := range st.mu.slots {
		if sl.live {
			out.Live++
		}
		if sl.pins > 0 {
			out.Pinned++
		}
	}
	return out
}
