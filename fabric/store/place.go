package store

import (
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
	items := s.pinWants(wants, true, res)
	s.sealPinned(items, res)
	out := make([]transfer.Placed, len(wants))
	for _, it := range items {
		out[it.i] = transfer.Placed{OK: true, Off: s.pool.Offset(it.slot), Header: header(it.entry)}
	}
	return out, func() { s.unpinLoads(items) }
}
