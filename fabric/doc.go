// Package fabric is the per-host OrbitKV peer: the composition root that
// opens the DRAM and SSD tiers, the catalog and the GPU, makes the wings
// with what each uses (constructor injection: no field is set after
// construction), owns the metrics registry and the servers' lifetimes:
//
//   - fabric/engineapi: the engine and admin services on the Unix socket
//     (owner-only permissions): sessions, operations, leases, the error
//     codes;
//   - fabric/store: the local page store (save, load, evict, seal, flush,
//     recovery, remote fetch into DRAM);
//   - fabric/cluster: membership, announcements, snapshots, the peer
//     service and the data plane.
//
// store and cluster never import each other (internal/lint); the peer
// hands the cluster to the store as its Members. docs/architecture.md
// shows the wings and how their file reference graphs are measured.
//
// Invariants of the peer as a whole (each wing's doc lists its own):
//   - Gauges (leases, query bytes, in-flight operations, SSD queue, unsealed
//     pages) return to zero when the peer is idle.
//   - Nothing stored is dropped by configuration: a start whose SSD tier no
//     longer covers pages on SSD is refused unless Config.SSDDiscard says
//     to drop them.
//   - A start that fails after the tiers opened leaves the disk as it was
//     (abandonStart).
package fabric
