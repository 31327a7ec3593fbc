// Package store is the peer's local page store: saves, loads, eviction,
// sealing and flushing over the catalog, the DRAM pool and the SSD tier,
// the GPU and layer-wise paths for CUDA sessions, recovery at start, and
// fetching members' pages into DRAM through the Members interface it
// defines (fabric/cluster implements it; store and cluster never import
// each other). Every operation reports one Result per page.
//
// Invariants:
//   - A catalog entry names only bytes that are in place: a DRAM slot after
//     its gather finished, an SSD slot after the SSD tier made it durable.
//     Slots are freed only after the catalog stopped naming them, and a
//     DRAM slot that pinned copies still read only after their pins go
//     (retire.go). Every copy an entry names holds the bytes its checksum
//     covers, under its generation: a durable re-save of a DRAM-only page
//     replaces that copy rather than adding to it (commitSaves).
//   - A page is pinned (tiers.LRU) for every lease and copy that needs it,
//     and eviction never picks a pinned page; only the store takes and
//     releases pins (pins.go says where), leases' against the query budget.
//   - A page that fails its checksum, or whose SSD copy cannot be read, is
//     removed from the catalog (so no longer announced) and reported as
//     corrupt or as an I/O error; it is never copied into an engine. SSD
//     tier faults make Problem non-empty for a while (faults.go).
//   - A save acknowledged into DRAM only may not have its checksum yet; the
//     sealer (seal.go) computes it in the background, and every path that
//     moves a page out of DRAM seals it first. SSD-durable saves are
//     checksummed before they are written.
//   - A page fetched from a member is verified on receipt and then is this
//     peer's own, like a saved one (remote.go).
//   - Nothing stored is dropped by configuration: a start whose SSD tier no
//     longer covers pages on SSD is refused unless Options.SSDDiscard says
//     to drop them (discard.go).
//   - Decisions read the clock through Options.Now (the SSD rate's age,
//     fault windows), so tests move time instead of sleeping.
package store
