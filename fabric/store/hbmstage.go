package store

import (
	"errors"
	"sync"

	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/transfer"
)

// HBMStage is a device's staging area: page slots in the peer's own HBM on
// that GPU (cuMemAlloc in the peer's context, --hbm-stage-bytes). A CUDA
// session's save also copies the pages it stores, device to device, into
// the stage of the session's GPU, beside its copy into DRAM (save.go: the
// save answers once both are done; only pages it committed fresh are
// published); a later load of those pages by a CUDA session — on the same
// GPU, or another GPU of the host (NVLink) — copies them from the stage
// instead of from DRAM (load.go): the same-host P/D handoff, GPU to GPU. The stage is a cache beside the DRAM copy, never the only copy:
// a stage record names the catalog generation it was copied with, a load
// takes it only while the catalog still names that generation, and every
// failure falls back to DRAM. Slots are reused oldest first (a ring), never
// while a load reads them. Like DRAM pages, staged pages are not summed
// again when loaded: the generation says they are the bytes of the save
// the DRAM copy came from, copied from the same blocks in the same call.
type HBMStage struct {
	Ordinal int
	region  *transfer.Region    // peer-owned device memory
	src     transfer.PeerSource // the device's transport: what loads copy from
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
// owned by the caller for the stage's life; src is that GPU's transport.
// Sessions on the GPU fill it, loads on any GPU copy from src (gpu.go).
func NewHBMStage(ordinal int, region *transfer.Region, src transfer.PeerSource) *HBMStage {
	st := &HBMStage{Ordinal: ordinal, region: region, src: src}
	st.mu.byKey = make(map[pagekey.Key]int)
	return st
}

// stagedPage is one page a stage copy moves: the request index, the stage
// slot and the catalog generation it is published with (0: not published,
// the slot is freed).
type stagedPage struct {
	i, slot int
	key     pagekey.Key
	gen     uint64
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

// pin pins the slot holding key's copy of generation gen, for a load of
// pages of pageBytes; false when the stage holds none.
func (st *HBMStage) pin(key pagekey.Key, gen, pageBytes uint64) (int, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	j, ok := st.mu.byKey[key]
	if !ok || st.mu.pageBytes != pageBytes {
		return 0, false
	}
	if sl := &st.mu.slots[j]; sl.live && sl.gen == gen {
		sl.pins++
		return j, true
	}
	return 0, false
}

// unpin releases slots pin returned.
func (st *HBMStage) unpin(slots []int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, j := range slots {
		st.mu.slots[j].pins--
	}
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
