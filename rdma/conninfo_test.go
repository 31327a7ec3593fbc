package rdma

import (
	"errors"
	"reflect"
	"testing"
)

func sampleConnInfo() ConnInfo {
	return ConnInfo{
		ID: 0xfeedface,
		Lanes: []LaneInfo{
			{NIC: "mlx5_0", GID: GID{0xfe, 0x80, 15: 1}, LID: 3, QPN: 0x1a2, PSN: 0xabcdef, MTU: 5},
			{NIC: "mlx5_1", GID: GID{0xfe, 0x80, 15: 2}, QPN: 0xffffff, PSN: 0, MTU: 3},
		},
		Regions: []RemoteRegion{{Key: 1, Addr: 0x7f0000000000, Len: 1 << 30, RKeys: []uint32{0x11, 0x22}}},
	}
}

func TestConnInfoRoundTrip(t *testing.T) {
	c := sampleConnInfo()
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := UnmarshalConnInfo(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, c)
	}
}

func TestConnInfoRefusesBadData(t *testing.T) {
	good, _ := sampleConnInfo().Marshal()
	mutate := func(f func(*ConnInfo)) ConnInfo { c := sampleConnInfo(); f(&c); return c }
	for _, c := range []struct {
		name string
		info ConnInfo
	}{
		{"no lanes", mutate(func(c *ConnInfo) { c.Lanes = nil })},
		{"qpn over 24 bits", mutate(func(c *ConnInfo) { c.Lanes[0].QPN = 1 << 24 })},
		{"qpn 0", mutate(func(c *ConnInfo) { c.Lanes[0].QPN = 0 })},
		{"psn over 24 bits", mutate(func(c *ConnInfo) { c.Lanes[1].PSN = 1 << 24 })},
		{"bad mtu", mutate(func(c *ConnInfo) { c.Lanes[0].MTU = 6 })},
		{"rkeys per lane", mutate(func(c *ConnInfo) { c.Regions[0].RKeys = c.Regions[0].RKeys[:1] })},
		{"region wraps", mutate(func(c *ConnInfo) { c.Regions[0].Addr = ^uint64(0) })},
		{"region twice", mutate(func(c *ConnInfo) { c.Regions = append(c.Regions, c.Regions[0]) })},
	} {
		if _, err := c.info.Marshal(); !errors.Is(err, ErrBadConnInfo) {
			t.Errorf("%s: Marshal = %v, want ErrBadConnInfo", c.name, err)
		}
	}
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"magic", append([]byte("XKVR"), good[4:]...)},
		{"version", append(append([]byte("OKVR"), 9), good[5:]...)},
		{"truncated", good[:len(good)-1]},
		{"trailing", append(append([]byte{}, good...), 0)},
	} {
		if _, err := UnmarshalConnInfo(c.b); !errors.Is(err, ErrBadConnInfo) {
			t.Errorf("%s: Unmarshal = %v, want ErrBadConnInfo", c.name, err)
		}
	}
}

func FuzzUnmarshalConnInfo(f *testing.F) {
	good, _ := sampleConnInfo().Marshal()
	f.Add(good)
	f.Add([]byte("OKVR\x01\x01\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := UnmarshalConnInfo(b)
		if err != nil {
			return
		}
		again, err := c.Marshal()
		if err != nil {
			t.Fatalf("decoded data does not encode: %v", err)
		}
		if c2, err := UnmarshalConnInfo(again); err != nil || !reflect.DeepEqual(c, c2) {
			t.Fatalf("re-decode: %v", err)
		}
	})
}
