package rdma

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func gidOf(ip string) GID {
	var g GID
	copy(g[:], net.ParseIP(ip).To16())
	return g
}

// mlx5Table is a ConnectX port's GID table on a netdev with an IPv4 and a
// global IPv6 address: each address twice, RoCE v1 then v2, the link-local
// one first (index 0 is RoCE v1, which does not route), the IPv4-mapped
// v2 GID at 3.
func mlx5Table(ipv4 string) map[int]gidEntry {
	t := map[int]gidEntry{}
	for i, a := range []struct {
		ip  string
		typ GIDType
	}{
		{"fe80::2", GIDTypeIBRoCEv1}, {"fe80::2", GIDTypeRoCEv2},
		{"::ffff:" + ipv4, GIDTypeIBRoCEv1}, {"::ffff:" + ipv4, GIDTypeRoCEv2},
		{"2001:db8::" + ipv4[len(ipv4)-1:], GIDTypeIBRoCEv1}, {"2001:db8::" + ipv4[len(ipv4)-1:], GIDTypeRoCEv2},
	} {
		t[i] = gidEntry{Index: i, GID: gidOf(a.ip), Type: a.typ}
	}
	return t
}

// TestDefaultGIDIsRoCEv2IPv4MappedOverMlx5LikeTable: with the default
// (--rdma-gid-index -1) the engine addresses a port by its RoCE v2
// IPv4-mapped GID, not index 0 (RoCE v1); two engines so configured
// connect and READ over the fake, which refuses RoCE v1 to v2. Forcing
// index 0 is still possible (asked for), and reported as RoCE v1.
func TestDefaultGIDIsRoCEv2IPv4MappedOverMlx5LikeTable(t *testing.T) {
	f := newFakeVerbs("a0", "a1", "b0", "b1")
	for i, n := range []string{"a0", "a1", "b0", "b1"} {
		d := f.devices[n]
		d.gids = mlx5Table("10.0.0." + string(rune('1'+i)))
		d.gid = d.gids[3].GID // what peers address: the v2 IPv4-mapped GID
		d.port.GIDs = len(d.gids)
	}
	p := newPairOn(t, f, Config{})
	for _, n := range append(p.a.NICs(), p.b.NICs()...) {
		if n.GIDIndex != 3 || n.GIDType != GIDTypeRoCEv2 || !n.GID.ipv4Mapped() {
			t.Errorf("%s: GID %d (%v, %s), want index 3, RoCE v2, IPv4-mapped", n.Name, n.GIDIndex, n.GIDType, n.GID)
		}
	}
	ops := scatterOps(p, 8, 16<<10)
	checkScatter(t, p, ops, p.conn.Read(ctxFor(t, 5e9), ops))

	e, err := open(f, Config{Devices: []DeviceSel{{"a0", 1}}, GIDIndex: 0}, noNetdevs)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if n := e.NICs()[0]; n.GIDIndex != 0 || n.GIDType != GIDTypeIBRoCEv1 {
		t.Errorf("forced index 0: GID %d (%v), want 0 (IB/RoCE v1)", n.GIDIndex, n.GIDType)
	}
}

func TestChooseGID(t *testing.T) {
	v1, v2, unk := GIDTypeIBRoCEv1, GIDTypeRoCEv2, GIDTypeUnknown
	e := func(i int, ip string, typ GIDType) gidEntry { return gidEntry{Index: i, GID: gidOf(ip), Type: typ} }
	for _, c := range []struct {
		name  string
		link  uint8
		table []gidEntry
		want  int // index; -1: errNoRoCEv2GID
	}{
		{"mlx5: v1 at 0, v2 IPv4-mapped at 3", linkEthernet, []gidEntry{
			e(0, "fe80::1", v1), e(1, "fe80::1", v2), e(2, "::ffff:10.0.0.1", v1), e(3, "::ffff:10.0.0.1", v2)}, 3},
		{"IPv4-mapped before global IPv6", linkEthernet, []gidEntry{
			e(1, "2001:db8::1", v2), e(3, "::ffff:10.0.0.1", v2)}, 3},
		{"global before link-local", linkEthernet, []gidEntry{
			e(0, "fe80::1", v1), e(1, "fe80::1", v2), e(2, "2001:db8::1", v1), e(3, "2001:db8::1", v2)}, 3},
		{"link-local v2 before any v1", linkEthernet, []gidEntry{
			e(0, "::ffff:10.0.0.1", v1), e(1, "fe80::1", v2)}, 1},
		{"lowest index of a rank", linkEthernet, []gidEntry{
			e(4, "::ffff:10.0.0.1", v2), e(6, "::ffff:10.0.0.2", v2)}, 4},
		{"known v2 before unknown", linkEthernet, []gidEntry{
			e(0, "::ffff:10.0.0.1", unk), e(1, "fe80::1", v2)}, 1},
		{"types unreadable: the best address", linkEthernet, []gidEntry{
			e(0, "fe80::1", unk), e(1, "::ffff:10.0.0.1", unk)}, 1},
		{"RoCE v1 only", linkEthernet, []gidEntry{e(0, "fe80::1", v1), e(1, "::ffff:10.0.0.1", v1)}, -1},
		{"InfiniBand: the first", linkIB, []gidEntry{e(0, "fe80::1", v1), e(1, "fe80::2", v1)}, 0},
	} {
		got, err := chooseGID(c.link, c.table)
		switch {
		case c.want < 0 && !errors.Is(err, errNoRoCEv2GID):
			t.Errorf("%s: %v, %v; want errNoRoCEv2GID", c.name, got.Index, err)
		case c.want >= 0 && (err != nil || got.Index != c.want):
			t.Errorf("%s: %v, %v; want index %d", c.name, got.Index, err, c.want)
		}
	}
	if _, err := chooseGID(linkEthernet, nil); err == nil {
		t.Error("empty table: no error")
	}
}

func TestGIDTypeFromSysfs(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "mlx5_0", "ports", "1", "gid_attrs", "types")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "0"), []byte("IB/RoCE v1\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "3"), []byte("RoCE v2\n"), 0o644)
	for i, want := range map[int]GIDType{0: GIDTypeIBRoCEv1, 3: GIDTypeRoCEv2, 7: GIDTypeUnknown} {
		if got := gidTypeFromSysfs(root, "mlx5_0", 1, i); got != want {
			t.Errorf("index %d: %v, want %v", i, got, want)
		}
	}
	if got := gidTypeFromSysfs(root, "mlx5_0", 2, 0); got != GIDTypeUnknown {
		t.Errorf("absent port: %v", got)
	}
}
