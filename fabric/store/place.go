package store

import (
	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/transfer"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// PlaceDRAM says where the pages of wants are in the DRAM region
// (DRAMRegion) for members to RDMA READ them, and pins them: a page held in
// DRAM with the asked layout and size gets its slot's offset and its header
// (sealed first when it had no checksum yet); one held only on SSD, or not
// as asked, is not placed (a fetch by content promotes it). release unpins
// the placed pages; the caller must call it exactly once, bounded in time.
func (s *Store) PlaceDRAM(wants []tcp.Want) ([]transfer.Placed, func()) {
	res := make([]Result, len(wants))
	items := s.pinDRAMForPlace(wants, res)
	entries := make([]catalog.Entry, len(items))
	for j, it := range items {
		entries[j] = it.entry
	}
	for j, e := range s.sealForWrite(entries) {
		items[j].entry.Checksum = e.Checksum
	}
	out := make([]transfer.Placed, len(wants))
	for _, it := range items {
		out[it.i] = transfer.Placed{OK: true, Off: s.pool.Offset(it.slot), Header: header(it.entry)}
	}
	return out, func() { s.unpinLoads(items) }
}

// pinDRAMForPlace pins the pages of wants held in DRAM as asked.
func (s *Store) pinDRAMForPlace(wants []tcp.Want, res []Result) []*loadItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	items := make([]*loadItem, 0, len(wants))
	for i, w := range wants {
		e, ok := s.cat.Get(w.Key)
		if !ok || e.Layout != w.Layout || e.Size != w.Size || e.DRAMSlot < 0 {
			res[i] = notFound("page %s not in dram", w.Key)
			continue
		}
		it := &loadItem{i: i, req: PageReq{Key: w.Key}, entry: e, tier: catalog.TierDRAM}
		s.pinItemLocked(it)
		items = append(items, it)
	}
	return items
}
