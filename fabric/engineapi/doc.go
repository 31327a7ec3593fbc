// Package engineapi is the peer's engine and admin services on the Unix
// socket: sessions (an engine worker's layout and mapped KV buffers),
// their Save, Load and Wait operations, lookups and the leases they take,
// the only conversion between those services' generated types and the
// peer's own (engine_convert.go, admin_server.go), and the table from the
// peer's sentinel errors to gRPC codes (errors.go). It drives the page store
// (fabric/store) and reads the cluster (fabric/cluster); fabric wires it.
//
// Invariants:
//   - Every request from outside is validated before it reaches anything:
//     a buffer inside the data dir, a geometry past 2^64, an unknown
//     durability, a keepalive above 10 minutes and a Load lease that is not
//     live or is another model's are refused.
//   - Every operation has a deadline; a session that stops sending
//     keepalives is closed, its leases released and its operations
//     cancelled and waited for before its buffers are unmapped.
//   - A shared-memory buffer whose file shrank fails that session's Save
//     and Load (checked before each; a copy that faults mid-way fails its
//     pages), never the peer.
//   - Lease expiry, keepalives and the access time a lookup stamps on the
//     pages it hits read the clock given in Deps.Now.
package engineapi
