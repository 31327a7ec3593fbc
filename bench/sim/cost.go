package sim

import "math"

// Load is the bytes a request brings into HBM, by path.
type Load struct {
	DRAM       uint64 // local DRAM → HBM
	SSD        uint64 // local SSD → (DRAM buffer) → HBM
	RemoteDRAM uint64 // a peer's DRAM → network → HBM
	RemoteSSD  uint64 // a peer's SSD → network → HBM
}

// LoadNs is the time to move l into HBM. Paths run one after another; a
// remote path runs at the lesser of the network and the owner's tier.
func (m CostModel) LoadNs(l Load) int64 {
	return transferNs(l.DRAM, m.DRAMGBps) + transferNs(l.SSD, m.SSDGBps) +
		transferNs(l.RemoteDRAM, min(m.NetGBps, m.DRAMGBps)) +
		transferNs(l.RemoteSSD, min(m.NetGBps, m.SSDGBps))
}

// PrefillNs is the compute time of tokens missed tokens.
func (m CostModel) PrefillNs(tokens int64) int64 {
	return int64(math.Round(float64(tokens) * m.PrefillUsPerToken * 1e3))
}

// transferNs is bytes at gbps GB/s (1e9 bytes/s), i.e. bytes/gbps ns.
func transferNs(bytes uint64, gbps float64) int64 {
	if bytes == 0 {
		return 0
	}
	return int64(math.Round(float64(bytes) / gbps))
}
