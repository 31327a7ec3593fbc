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
//     peer service succeeded; TCP otherwise, and after the member's lane
//     went down until a fresh connection is dialed (5 s later; the old one
//     is closed on both sides). A connection ID is accepted only from the
//     member that first sent it (rdma.go).
//   - A route (route.go) ranks members by the leading pages of a chain the
//     gossiped index says each holds, and has each candidate confirm its
//     run and tiers (Holds: catalog.Peek, no lease, no hit counted); a
//     candidate that does not answer in the deadline stays in the answer,
//     unconfirmed and suspect. Gossip carries no tier.
//   - With the compact catalog (Config.CompactCatalog; summary.go,
//     index.go) a member publishes a filter of its page keys, changed bit
//     by bit in its announcement sequence; a copy caught up with the
//     sequence equals the member's filter, which claims every page the
//     member holds. A claim is never acted on unasked: a lookup counts a
//     claimed run only as far as the member confirms it (Holds, asked in
//     pieces of at most 4,096 keys), and a load fetches only confirmed
//     pages; a later lookup counts a confirmation unasked for 2 s at most
//     (a dropped page's bits may stay set by other keys). A false positive
//     costs one Holds, is counted (summary_claims_total{result="false"})
//     and is not asked again for 5 s, or until the member's filter sets a
//     bit or a snapshot replaces it (a page saved whose bits were all set
//     already waits out the 5 s). A lookup's questions share one
//     250 ms deadline; a member that does not answer is not asked again
//     for 2 s. Members of both kinds mix.
//   - With mutual TLS, membership needs the data plane's identity (auth.go):
//     memberlist's AliveDelegate lets a node into the view only when its
//     metadata carries a signature, by the key of a certificate that chains
//     to the cluster CA and is valid now, over its name, gossip address and
//     metadata. The gossip key alone makes no member. The certificate does
//     not fit in memberlist's 512 bytes of metadata, so only its SHA-256
//     fingerprint travels; the certificate is taken from the node's peer
//     service in a mutual-TLS handshake (its chain is checked there and
//     again here, with the fingerprint) and kept, and the node's state is
//     then pulled again. A member whose certificate expires is dropped
//     from this peer's members (memberlist keeps it in its own view until
//     it fails or leaves). Soundness rests on the signature and the chain,
//     not on where the certificate came from. The name is bound by the
//     signature, not by the certificate (peers are verified by chain, as
//     on the data plane). Without a CA, membership is open, and the peer
//     says so once at start.
package cluster
