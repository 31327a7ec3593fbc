// Package fabric is the per-host OrbitKV peer: the composition root that
// opens the tiers, the catalog and the GPU, wires its wings together and
// owns the metrics registry and the servers' lifetimes. The wings:
//
//   - the engine and admin APIs on the Unix socket (owner-only
//     permissions): sessions, operations, leases, the only proto conversion
//     of those services and the error-code table (in this package until it
//     moves to fabric/engineapi);
//   - fabric/store: the local page store (save, load, evict, seal, flush,
//     recovery, remote fetch into DRAM);
//   - fabric/cluster: membership, announcements, snapshots, the peer
//     service and the data plane.
//
// Invariants of the peer as a whole (each wing's doc lists its own):
//   - Every operation has a deadline; a session that stops sending
//     keepalives is closed, its leases released and its operations
//     cancelled before its buffers are unmapped.
//   - Gauges (leases, query bytes, in-flight operations, SSD queue, unsealed
//     pages) return to zero when the peer is idle.
//   - Engine memory and requests are untrusted: a shared-memory buffer whose
//     file shrank fails that session's Save and Load (checked before each,
//     and a copy that faults mid-way fails its pages), never the peer; a
//     buffer inside the data dir, a geometry past 2^64, an unknown
//     durability, a keepalive above 10 minutes and a Load lease that is not
//     live or is another model's are refused.
//   - Wiring is by constructor: each wing gets what it uses when it is
//     made or started, and no field is set after construction.
package fabric
