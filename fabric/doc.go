// Package fabric is the per-host OrbitKV peer: the composition root that
// wires the catalog, the tiers and the transports, owns the gRPC servers
// (engine and admin, on a Unix socket with owner-only permissions), sessions
// and leases, and exports Prometheus metrics.
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
//     and eviction never picks a pinned page.
//   - Every operation has a deadline; a session that stops sending
//     keepalives is closed, its leases released and its operations
//     cancelled before its buffers are unmapped.
//   - A page that fails its checksum, or whose SSD copy cannot be read, is
//     removed from the catalog (so no longer announced) and reported as
//     corrupt or as an I/O error; it is never copied into an engine. SSD
//     tier faults make Status unhealthy for a while (health.go).
//   - A save acknowledged into DRAM only may not have its checksum yet; the
//     sealer (seal.go) computes it in the background, and every path that
//     moves a page out of DRAM seals it first. SSD-durable saves are
//     checksummed before they are written.
//   - Gauges (leases, query bytes, in-flight operations, SSD queue, unsealed
//     pages) return to zero when the peer is idle.
//   - Engine memory and requests are untrusted: a shared-memory buffer whose
//     file shrank fails that session's Save and Load (checked before each,
//     and a copy that faults mid-way fails its pages), never the peer; a
//     buffer inside the data dir, a geometry past 2^64, an unknown
//     durability, a keepalive above 10 minutes and a Load lease that is not
//     live or is another model's are refused.
//   - Nothing stored is dropped by configuration: a start whose SSD tier no
//     longer covers pages on SSD is refused unless Config.SSDDiscard says to
//     drop them (discard.go).
//
// With Config.ClusterAddr the peer is a cluster member (cluster.go: membership
// and catalog announcements; cluster_run.go: listeners, memberlist, the peer
// gRPC service; remote.go: fetching members' pages at load and serving ours).
// A page fetched from a member is verified on receipt and then is this
// peer's own, like a saved one.
package fabric
