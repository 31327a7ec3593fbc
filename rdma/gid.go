package rdma

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// GIDType is the RoCE version of a GID table entry: the kernel keeps one
// entry per address and version, and the index chosen decides how every
// packet of a lane is framed.
type GIDType uint8

const (
	// GIDTypeUnknown: the type could not be read (no sysfs entry, as with
	// the stand-in library).
	GIDTypeUnknown GIDType = iota
	// GIDTypeIBRoCEv1 is InfiniBand's GID, or RoCE v1 on Ethernet: raw
	// Ethernet frames (ethertype 0x8915), which do not cross an IP router.
	GIDTypeIBRoCEv1
	// GIDTypeRoCEv2 is RoCE v2: UDP/IP (port 4791), routable.
	GIDTypeRoCEv2
)

func (t GIDType) String() string {
	switch t {
	case GIDTypeIBRoCEv1:
		return "IB/RoCE v1"
	case GIDTypeRoCEv2:
		return "RoCE v2"
	}
	return "unknown"
}

// MarshalText writes the type as sysfs names it (for the start's log line).
func (t GIDType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// MarshalText writes the GID as an IPv6 address (::ffff:a.b.c.d for an
// IPv4-mapped one), for logs.
func (g GID) MarshalText() ([]byte, error) { return []byte(net.IP(g[:]).String()), nil }

func (g GID) ipv4Mapped() bool { return net.IP(g[:]).To4() != nil }
func (g GID) linkLocal() bool  { return g[0] == 0xfe && g[1]&0xc0 == 0x80 }

// gidEntry is one non-zero entry of a port's GID table.
type gidEntry struct {
	Index int
	GID   GID
	Type  GIDType
}

// gidTypeFromSysfs reads the type of GID index on dev's port from
// root/<dev>/ports/<port>/gid_attrs/types/<index> (root is
// /sys/class/infiniband), as rdma-core's ibv_query_gid_type does on kernels
// without the netlink query. A missing or unreadable entry (an empty GID
// reads EINVAL) is GIDTypeUnknown.
func gidTypeFromSysfs(root, dev string, port uint8, index int) GIDType {
	b, err := os.ReadFile(filepath.Join(root, dev, "ports", strconv.Itoa(int(port)), "gid_attrs", "types", strconv.Itoa(index)))
	if err != nil {
		return GIDTypeUnknown
	}
	switch s := strings.TrimSpace(string(b)); {
	case strings.EqualFold(s, "RoCE v2"):
		return GIDTypeRoCEv2
	case strings.EqualFold(s, "IB/RoCE v1"), strings.EqualFold(s, "RoCE v1"), strings.EqualFold(s, "IB"):
		return GIDTypeIBRoCEv1
	}
	return GIDTypeUnknown
}

// errNoRoCEv2GID: an Ethernet port whose table holds no GID the default
// may use (only RoCE v1 ones, or none).
var errNoRoCEv2GID = errors.New("no RoCE v2 GID")

// chooseGID is the default choice of GID (no --rdma-gid-index), pure: on
// InfiniBand the first entry; on Ethernet (RoCE) a RoCE v2 GID, IPv4-mapped
// first, then global, then link-local (lowest index within each), and never
// a RoCE v1 one (on mlx5 index 0 is usually v1, which does not route). An
// entry whose type could not be read ranks after every RoCE v2 one, by the
// same address order: without types the choice is the best address.
func chooseGID(linkLayer uint8, table []gidEntry) (gidEntry, error) {
	if len(table) == 0 {
		return gidEntry{}, errors.New("no non-zero GID")
	}
	if linkLayer != linkEthernet {
		return table[0], nil
	}
	best, bestRank := gidEntry{}, -1
	var v1 []int
	for _, g := range table {
		r := gidRank(g)
		if r < 0 {
			v1 = append(v1, g.Index)
			continue
		}
		if bestRank < 0 || r < bestRank {
			best, bestRank = g, r
		}
	}
	if bestRank < 0 {
		return gidEntry{}, fmt.Errorf("%w (RoCE v1 only, at index %v; --rdma-gid-index forces one)", errNoRoCEv2GID, v1)
	}
	return best, nil
}

// gidRank orders RoCE GIDs, lower first; -1 is never chosen by default.
func gidRank(g gidEntry) int {
	addr := 2 // link-local
	switch {
	case g.GID.ipv4Mapped():
		addr = 0
	case !g.GID.linkLocal():
		addr = 1
	}
	switch g.Type {
	case GIDTypeRoCEv2:
		return addr
	case GIDTypeUnknown:
		return 3 + addr
	}
	return -1
}

// pickGID returns Config.GIDIndex's entry (whatever its type: asked for),
// or with -1 chooseGID's over the port's table.
func (e *Engine) pickGID(ctx handle, name string, port uint8, pi portInfo) (gidEntry, error) {
	if i := e.cfg.GIDIndex; i >= 0 {
		g, err := e.v.queryGID(ctx, port, i)
		if err != nil {
			return gidEntry{}, fmt.Errorf("query %s port %d GID %d: %w", name, port, i, err)
		}
		if g == (GID{}) && pi.LinkLayer == linkEthernet {
			return gidEntry{}, fmt.Errorf("%s port %d: GID %d is empty (RoCE needs one; set --rdma-gid-index)", name, port, i)
		}
		return gidEntry{Index: i, GID: g, Type: e.v.gidType(name, port, i)}, nil
	}
	var table []gidEntry
	for i := range pi.GIDs {
		if g, err := e.v.queryGID(ctx, port, i); err == nil && g != (GID{}) {
			table = append(table, gidEntry{Index: i, GID: g, Type: e.v.gidType(name, port, i)})
		}
	}
	g, err := chooseGID(pi.LinkLayer, table)
	if err != nil {
		return gidEntry{}, fmt.Errorf("%s port %d (a table of %d): %w", name, port, pi.GIDs, err)
	}
	return g, nil
}
