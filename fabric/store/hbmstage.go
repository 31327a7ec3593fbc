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
// session's save into DRAM also copies its pages, device to device, into
// the stage of the session's GPU; a later load of those pages by a CUDA
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
// slot, the catalog generation.
type stagedPage struct {
	i, slot int
	key     pagekey.Key
	gen     uint64
}

// stageSaved copies the pages a CUDA save just committed into DRAM into the
// stage of the session's GPU, device to device, before the save answers
// (the engine's blocks hold the same bytes until then). Best effort: the
// save's result stands whatever happens here.
func (s *Store) stageSaved(ctx context.Context, sess *Engine, reqs []PageReq, items []*saveItem, res []Result) {
	st := sess.Stage
	if st == nil || len(items) == 0 {
		return
	}
	var pages []stagedPage
	for _, it := range items {
		if res[it.i].Code == CodeOK {
			pages = append(pages, stagedPage{i: it.i, key: it.key, gen: it.entry.Generation})
		}
	}
	pages = s.currentGens(pages)
	pages, skipped := st.reserve(pages, sess.PageBytes)
	s.m.staged.WithLabelValues("skipped").Add(float64(skipped))
	if len(pages) == 0 {
		return
	}
	var descs []transfer.Desc
	var err error
	for _, p := range pages {
		if descs, err = sess.Geom.Gather(descs, sess.Bufs, reqs[p.i].Blocks, st.region, st.offset(p.slot)); err != nil {
			break
		}
	}
	if err == nil {
		err = st.gpu.CopyFrom(ctx, sess.GPU, descs)
	}
	st.filled(pages, err)
	if err != nil {
		s.m.staged.WithLabelValues("failed").Add(float64(len(pages)))
		s.log.Debug().Err(err).Int("device", st.Ordinal).Int("pages", len(pages)).Msg("hbm stage: copy failed; the pages load from dram")
		return
	}
	s.m.staged.WithLabelValues("staged").Add(float64(len(pages)))
}

// currentGens keeps the pages whose catalog entry still has the generation
// the save committed (a concurrent save or discard may have replaced it).
func (s *Store) currentGens(pages []stagedPage) []stagedPage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := pages[:0]
	for _, p := range pages {
		if e, ok := s.cat.Get(p.key); ok && e.Generation == p.gen && e.DRAMSlot >= 0 {
			out = append(out, p)
		}
	}
	return out
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
		if j, ok := st.mu.byKey[p.key]; ok && st.mu.slots[j].gen == p.gen {
			continue // staged already
		}
		j, ok := st.freeSlotLocked()
		if !ok {
			skipped++
			continue
		}
		if old := &st.mu.slots[j]; old.live && st.mu.byKey[old.key] == j {
			delete(st.mu.byKey, old.key)
		}
		st.mu.slots[j] = stageSlot{key: p.key, gen: p.gen, pins: 1} // pinned while it fills
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

// filled publishes the pages a stage copy moved (err nil) or frees their
// slots; after a stuck copy the slots stay pinned for good (the device may
// still write them).
func (st *HBMStage) filled(pages []stagedPage, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	stuck := errors.Is(err, transfer.ErrStuck)
	for _, p := range pages {
		sl := &st.mu.slots[p.slot]
		switch {
		case stuck:
		case err != nil:
			*sl = stageSlot{}
		default:
			if j, ok := st.mu.byKey[p.key]; ok && j != p.slot {
				st.mu.slots[j].live = false // an older copy of the key: free for reuse
			}
			sl.live, sl.pins = true, 0
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
