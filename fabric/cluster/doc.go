// Package cluster is the peer's membership and its view of the shared
// catalog: the memberlist delegate, catalog announcements and snapshots,
// the peer gRPC service and the TCP data plane's listener and client. It
// has its own Config and metrics (orbitkv_cluster_*), and it never imports
// the page store (fabric/store) nor the store it: the store reaches members
// through its own Members interface, which *Cluster satisfies, and the
// peer (fabric) wires the two (DESIGN.md §4).
//
// Invariants:
//   - memberlist types never leave the package: its callbacks go through
//     an unexported delegate that copies buffers and forwards.
//   - A member's pages are offered (Usable) only while it is alive and a
//     snapshot of its current incarnation has been applied; a member that
//     leaves or fails takes its pages out of the index at once.
//   - Announcements are applied in sequence per member; a duplicate is
//     ignored, a hole waits for a snapshot (cluster.go).
//   - A member that went down is tried again (rejoin.go) until it is back
//     or an hour has passed, so a partition longer than memberlist's
//     GossipToTheDeadTime heals; the data plane's serving side is counted
//     (served.go).
//   - The data plane is chosen per member (transport.go, pure): RDMA only
//     when both ends opened a device and their ConnInfo exchange over the
//     peer service succeeded; TCP otherwise, and for good after the
//     member's lane went down. A connection ID is accepted only from the
//     member that first sent it (rdma.go).
package cluster
