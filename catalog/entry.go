package catalog

import (
	"strconv"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Tier names where a page's bytes are held.
type Tier uint8

// Tiers, slowest last. TierRemote is never produced by this package; the
// fabric uses it when it extends a local result with other peers' pages.
const (
	TierNone Tier = iota
	TierDRAM
	TierSSD
	TierRemote
)

// String returns the tier's lower-case name.
func (t Tier) String() string {
	switch t {
	case TierNone:
		return "none"
	case TierDRAM:
		return "dram"
	case TierSSD:
		return "ssd"
	case TierRemote:
		return "remote"
	}
	return "tier(" + strconv.Itoa(int(t)) + ")"
}

// SSDLoc is where the SSD tier keeps a page: a file id, a byte offset in it
// and the length of the stored blob, header included.
type SSDLoc struct {
	File   uint32
	Offset uint64 // bytes
	Bytes  uint64 // bytes
}

// Entry describes one page held by this peer.
type Entry struct {
	Key    pagekey.Key
	Layout pagekey.Fingerprint

	Size       uint64 // page data bytes
	Checksum   uint32 // CRC-32C of the data
	Generation uint64 // peer-wide save counter

	DRAMSlot int64 // -1 = not in DRAM; slot ids belong to the DRAM pool
	OnSSD    bool  // SSD holds the page durably at SSD
	SSD      SSDLoc
	// Demoted: the SSD copy is one the peer wrote itself, demoting a save
	// acknowledged in DRAM only, and no durable save was acknowledged on it
	// since; other bytes for the page may replace it (fabric/store/readmit.go).
	Demoted bool

	LastAccess int64  // unix nanoseconds
	Hits       uint64 // lookups that hit this page
}

// Tier returns the fastest tier holding the page: DRAM, then SSD, else none.
func (e Entry) Tier() Tier {
	switch {
	case e.DRAMSlot >= 0:
		return TierDRAM
	case e.OnSSD:
		return TierSSD
	}
	return TierNone
}
