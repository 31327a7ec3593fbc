package transfer

import (
	"errors"
	"testing"

	"github.com/orbitkv/orbitkv/cuda"
)

// TestLowerPeer: device-to-device descriptors lower to absolute peer
// segments (empty ones dropped, bytes counted); a host region, a region of
// another device on either side, or an overrun is refused.
func TestLowerPeer(t *testing.T) {
	stage := &Region{Name: "cuda0/hbm-stage", Kind: Device, Device: 0x7f0000000000, Ordinal: 0, Size: 1 << 20}
	blocks := &Region{Name: "cuda1/buffer0", Kind: Device, Device: 0x7e0000000000, Ordinal: 1, Size: 4 << 20}
	other := &Region{Name: "cuda2/buffer0", Kind: Device, Device: 0x7d0000000000, Ordinal: 2, Size: 4 << 20}
	host := HostRegion("dram", make([]byte, 1<<20))
	segs, n, err := lowerPeer(nil, []Desc{
		{Src: stage, Dst: blocks, SrcOff: 0, DstOff: 8192, Len: 4096},
		{Src: stage, Dst: blocks, SrcOff: 4096, DstOff: 0, Len: 0},
		{Src: stage, Dst: blocks, SrcOff: 4096, DstOff: 65536, Len: 1000},
	}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := []cuda.PeerSegment{
		{Src: 0x7f0000000000, Dst: 0x7e0000000000 + 8192, Len: 4096},
		{Src: 0x7f0000000000 + 4096, Dst: 0x7e0000000000 + 65536, Len: 1000},
	}
	if n != 5096 || len(segs) != len(want) || segs[0] != want[0] || segs[1] != want[1] {
		t.Fatalf("lowered %v (%d bytes), want %v (5096)", segs, n, want)
	}
	for name, d := range map[string]Desc{
		"host source":         {Src: host, Dst: blocks, Len: 16},
		"host destination":    {Src: stage, Dst: host, Len: 16},
		"another source":      {Src: other, Dst: blocks, Len: 16},
		"another dest":        {Src: stage, Dst: other, Len: 16},
		"source overrun":      {Src: stage, Dst: blocks, SrcOff: 1<<20 - 8, Len: 16},
		"destination overrun": {Src: stage, Dst: blocks, DstOff: 4 << 20, Len: 1},
	} {
		_, _, err := lowerPeer(nil, []Desc{d}, 0, 1)
		if err == nil {
			t.Errorf("%s: lowered, want an error", name)
		} else if name != "source overrun" && name != "destination overrun" && !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: %v, want ErrUnsupported", name, err)
		}
	}
}
