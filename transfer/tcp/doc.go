// Package tcp is the TCP data plane between peers: a client fetches pages by
// key from another peer's server, straight into memory the caller provides
// (a slot of its DRAM pool), and verifies every page's checksum on receipt
// (DESIGN.md §7). It is what moves pages between hosts where no RDMA device
// exists; the gossip that tells a peer who holds a page is not its business.
// The Client is a transfer.Transport (transport.go: Submit, Reads of pages
// named by content into host memory, checksums left to the caller as that
// contract says); Fetch is the same request with the checksums verified
// here, for callers outside the contract (orbitkv bench fabric).
//
// # Wire format (version 1, little endian)
//
// A connection carries requests one after the other; the client may reuse
// it after a request has been answered in full.
//
//	request:  "OKVF" | version u8 | op u8 (1 = fetch) | reserved u16 |
//	          deadline_ms u32 | count u32 |
//	          count × (key [16] | layout [16] | size u64)
//	response: count × (status u8 | if status is OK: page header
//	          (internal/page, WireSize bytes) | size data bytes)
//
// Pages come back in the order they were asked for. A status other than OK
// says that page is not sent (NotFound: the server no longer holds it, or
// holds it with another layout or size). The server sends a page's header
// from its catalog entry, checksum included; the client checks that the
// header names the page it asked for and that the bytes match the checksum
// before it reports the page fetched.
//
// # Deadlines and failure
//
// Every request carries the caller's deadline; the client sets it on the
// connection and the server bounds its own writes by it (and by MaxDeadline).
// A page that fails its check fails alone (a *page.CorruptError) and the
// connection stays usable; a broken or timed-out connection fails every page
// not yet received and is closed. Nothing waits without a deadline.
//
// # Security
//
// Both sides take an optional *tls.Config. With the configs of
// fabric's LoadTLS the connection is mutual TLS: a client without a
// certificate signed by the cluster's CA is refused during the handshake and
// is never sent a page.
package tcp
