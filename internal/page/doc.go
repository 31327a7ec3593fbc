// Package page defines the page blob's header and checksum, shared by every
// tier and transport: a page in an OrbitKV tier is one contiguous blob of the
// page's (layer × plane) segments, described by a Header that carries its key,
// layout fingerprint, length and CRC-32C checksum.
//
// On SSD the header is encoded into its own HeaderSize-byte block in front of
// the data; Decode rejects anything that is not a whole, self-consistent
// header (magic, version, header checksum), so a torn or foreign block is
// never mistaken for a page.
package page
