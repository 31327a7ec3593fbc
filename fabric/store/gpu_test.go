package store

import (
	"errors"
	"slices"
	"testing"

	"github.com/orbitkv/orbitkv/transfer"
)

// TestAppendPlan checks how pages' descriptors accumulate in a recycled
// list: runs merge only within a run, and a failed plan leaves the list as
// it was, including the descriptor it had extended.
func TestAppendPlan(t *testing.T) {
	host := transfer.HostRegion("h", make([]byte, 1<<16))
	dev := &transfer.Region{Name: "d", Kind: transfer.Device, Size: 1 << 16}
	plan := func(off uint64, fail bool) func([]transfer.Desc) ([]transfer.Desc, error) {
		return func(dst []transfer.Desc) ([]transfer.Desc, error) {
			if n := len(dst); n > 0 && dst[n-1].SrcOff+dst[n-1].Len == off {
				dst[n-1].Len += 64 // merges, as Geometry.plan does
			} else {
				dst = append(dst, transfer.Desc{Src: host, SrcOff: off, Dst: dev, Len: 64})
			}
			if fail {
				return dst, errors.New("boom")
			}
			return dst, nil
		}
	}
	buf := getDescs(8)
	defer putDescs(buf)
	steps := []struct {
		name  string
		off   uint64
		fresh bool
		fail  bool
		want  []uint64 // lengths
	}{
		{"first", 0, true, false, []uint64{64}},
		{"merges", 64, false, false, []uint64{128}},
		{"fresh run does not merge", 128, true, false, []uint64{128, 64}},
		{"failed plan restores the extended descriptor", 192, false, true, []uint64{128, 64}},
		{"failed fresh plan", 512, true, true, []uint64{128, 64}},
		{"separate", 1024, false, false, []uint64{128, 64, 64}},
	}
	for _, st := range steps {
		err := appendPlan(buf, st.fresh, plan(st.off, st.fail))
		if (err != nil) != st.fail {
			t.Fatalf("%s: err %v", st.name, err)
		}
		var got []uint64
		for _, d := range *buf {
			got = append(got, d.Len)
		}
		if !slices.Equal(got, st.want) {
			t.Fatalf("%s: lengths %v, want %v", st.name, got, st.want)
		}
	}
}
