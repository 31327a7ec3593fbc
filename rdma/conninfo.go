package rdma

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// GID is a port's 128-bit global identifier (an IPv6 address; for RoCE v2
// the IPv4-mapped address of the netdev).
type GID [16]byte

func (g GID) String() string { return hex.EncodeToString(g[:]) }

// MTU is a path MTU as verbs numbers it (enum ibv_mtu): 1 = 256 bytes … 5 =
// 4096 bytes.
type MTU uint8

// Bytes returns the MTU in bytes (0 if out of range).
func (m MTU) Bytes() int {
	if m < 1 || m > 5 {
		return 0
	}
	return 128 << m
}

// mtuFromBytes maps 256…4096 to the enum; other values give 0.
func mtuFromBytes(n int) MTU {
	for m := MTU(1); m <= 5; m++ {
		if m.Bytes() == n {
			return m
		}
	}
	return 0
}

// ConnInfo is what two engines exchange to connect their queue pairs: one
// LaneInfo per lane (a QP; lanes stripe a connection over NICs) and the
// regions the sender exposes to remote READ/WRITE with their rkeys per
// lane. It rides the mutual-TLS peer gRPC service as an opaque byte field
// (Marshal/Unmarshal; the format is below), so proto/ needs no verbs types.
//
// Wire format (version 1, little endian):
//
//	"OKVR" | version u8 | lanes u8 | regions u16 | id u64 |
//	lanes × (nic_len u8 | nic | gid [16] | lid u16 | qpn u32 | psn u32 | mtu u8) |
//	regions × (key u32 | addr u64 | len u64 | lanes × rkey u32)
type ConnInfo struct {
	// ID names the connection on both ends; the dialer picks it. A second
	// exchange with a known ID reconnects that connection's lanes whose QP
	// number or PSN changed (QP error recovery).
	ID      uint64
	Lanes   []LaneInfo
	Regions []RemoteRegion
}

// LaneInfo is one QP's end of a lane.
type LaneInfo struct {
	NIC string // device name, for messages
	GID GID
	LID uint16 // InfiniBand local ID (0 on RoCE)
	QPN uint32 // 24 bits
	PSN uint32 // the first packet sequence number this end sends (24 bits)
	MTU MTU    // this end's effective MTU: min(port active MTU, Config.MaxMTU)
}

// RemoteRegion is a region the sender registered for remote access.
type RemoteRegion struct {
	Key   uint32   // the sender's region key (Region.Key)
	Addr  uint64   // virtual address (or IOVA) of byte 0 in work requests
	Len   uint64   // bytes
	RKeys []uint32 // rkey on each lane's NIC, one per lane
}

const (
	connMagic    = "OKVR"
	connVersion  = 1
	maxLanes     = 64
	maxRegions   = 4096
	qpnMask      = 1<<24 - 1
	connHeadSize = 4 + 1 + 1 + 2 + 8
)

// Marshal encodes c in the wire format.
func (c ConnInfo) Marshal() ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, connHeadSize+len(c.Lanes)*48+len(c.Regions)*(20+4*len(c.Lanes)))
	b = append(b, connMagic...)
	b = append(b, connVersion, byte(len(c.Lanes)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Regions)))
	b = binary.LittleEndian.AppendUint64(b, c.ID)
	for _, l := range c.Lanes {
		b = append(b, byte(len(l.NIC)))
		b = append(b, l.NIC...)
		b = append(b, l.GID[:]...)
		b = binary.LittleEndian.AppendUint16(b, l.LID)
		b = binary.LittleEndian.AppendUint32(b, l.QPN)
		b = binary.LittleEndian.AppendUint32(b, l.PSN)
		b = append(b, byte(l.MTU))
	}
	for _, r := range c.Regions {
		b = binary.LittleEndian.AppendUint32(b, r.Key)
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Len)
		for _, k := range r.RKeys {
			b = binary.LittleEndian.AppendUint32(b, k)
		}
	}
	return b, nil
}

func (c ConnInfo) validate() error {
	if len(c.Lanes) == 0 || len(c.Lanes) > maxLanes {
		return fmt.Errorf("%w: %d lanes (1…%d)", ErrBadConnInfo, len(c.Lanes), maxLanes)
	}
	if len(c.Regions) > maxRegions {
		return fmt.Errorf("%w: %d regions (at most %d)", ErrBadConnInfo, len(c.Regions), maxRegions)
	}
	for i, l := range c.Lanes {
		switch {
		case len(l.NIC) > 255:
			return fmt.Errorf("%w: lane %d: NIC name of %d bytes", ErrBadConnInfo, i, len(l.NIC))
		case l.QPN == 0 || l.QPN > qpnMask || l.PSN > qpnMask:
			return fmt.Errorf("%w: lane %d: qpn %#x psn %#x (24 bits, qpn not 0)", ErrBadConnInfo, i, l.QPN, l.PSN)
		case l.MTU.Bytes() == 0:
			return fmt.Errorf("%w: lane %d: mtu %d", ErrBadConnInfo, i, l.MTU)
		}
	}
	seen := make(map[uint32]bool, len(c.Regions))
	for _, r := range c.Regions {
		switch {
		case len(r.RKeys) != len(c.Lanes):
			return fmt.Errorf("%w: region %d: %d rkeys for %d lanes", ErrBadConnInfo, r.Key, len(r.RKeys), len(c.Lanes))
		case r.Addr+r.Len < r.Addr:
			return fmt.Errorf("%w: region %d: %d bytes at %#x wrap", ErrBadConnInfo, r.Key, r.Len, r.Addr)
		case seen[r.Key]:
			return fmt.Errorf("%w: region %d listed twice", ErrBadConnInfo, r.Key)
		}
		seen[r.Key] = true
	}
	return nil
}

// UnmarshalConnInfo decodes and validates connection data from a peer.
func UnmarshalConnInfo(b []byte) (ConnInfo, error) {
	var c ConnInfo
	if len(b) < connHeadSize || string(b[:4]) != connMagic {
		return c, fmt.Errorf("%w: not connection data (%d bytes)", ErrBadConnInfo, len(b))
	}
	if b[4] != connVersion {
		return c, fmt.Errorf("%w: version %d (want %d)", ErrBadConnInfo, b[4], connVersion)
	}
	nl, nr := int(b[5]), int(binary.LittleEndian.Uint16(b[6:]))
	c.ID = binary.LittleEndian.Uint64(b[8:])
	r := reader{b: b[connHeadSize:]}
	for range nl {
		l := LaneInfo{NIC: string(r.bytes(int(r.u8())))}
		copy(l.GID[:], r.bytes(16))
		l.LID, l.QPN, l.PSN, l.MTU = r.u16(), r.u32(), r.u32(), MTU(r.u8())
		c.Lanes = append(c.Lanes, l)
	}
	for range nr {
		if r.short || len(r.b) < 20+4*nl {
			r.short = true
			break
		}
		g := RemoteRegion{Key: r.u32(), Addr: r.u64(), Len: r.u64(), RKeys: make([]uint32, nl)}
		for j := range g.RKeys {
			g.RKeys[j] = r.u32()
		}
		c.Regions = append(c.Regions, g)
	}
	switch {
	case r.short:
		return ConnInfo{}, fmt.Errorf("%w: truncated (%d bytes)", ErrBadConnInfo, len(b))
	case len(r.b) != 0:
		return ConnInfo{}, fmt.Errorf("%w: %d trailing bytes", ErrBadConnInfo, len(r.b))
	}
	if err := c.validate(); err != nil {
		return ConnInfo{}, err
	}
	return c, nil
}

// reader reads little-endian fields; a read past the end sets short and
// returns zeros.
type reader struct {
	b     []byte
	short bool
}

func (r *reader) bytes(n int) []byte {
	if len(r.b) < n {
		r.short, r.b = true, nil
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8   { return r.bytes(1)[0] }
func (r *reader) u16() uint16 { return binary.LittleEndian.Uint16(r.bytes(2)) }
func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.bytes(4)) }
func (r *reader) u64() uint64 { return binary.LittleEndian.Uint64(r.bytes(8)) }
