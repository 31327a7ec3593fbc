package transfer

import (
	"errors"
	"testing"

	"github.com/orbitkv/orbitkv/cuda"
)

// TestCUDALowering checks how descriptors become copier segments, without a
// GPU: directions, offsets, the host-region and device checks.
func TestCUDALowering(t *testing.T) {
	dev := &cuda.Device{}
	host := HostRegion("dram", make([]byte, 1<<20))
	other := HostRegion("shm", make([]byte, 1<<20))
	gpu := &Region{Name: "gpu", Kind: Device, Device: 0x7f0000000000, Ordinal: dev.Ordinal(), Size: 1 << 20}
	far := &Region{Name: "gpu1", Kind: Device, Device: 0x7f0000000000, Ordinal: dev.Ordinal() + 1, Size: 1 << 20}
	c := &CUDA{dev: dev, hostR: host}
	dir, segs, err := c.lower(nil, []Desc{{Src: host, SrcOff: 4096, Dst: gpu, DstOff: 128, Len: 512}, {Src: host, Dst: gpu, Len: 0}})
	if err != nil || dir != cuda.HostToDevice || len(segs) != 1 || segs[0] != (cuda.Segment{HostOff: 4096, Dev: 0x7f0000000000 + 128, Len: 512}) {
		t.Fatalf("restore: %v %v %v", dir, segs, err)
	}
	dir, segs, err = c.lower(nil, []Desc{{Src: gpu, SrcOff: 64, Dst: host, DstOff: 8192, Len: 256}})
	if err != nil || dir != cuda.DeviceToHost || segs[0] != (cuda.Segment{HostOff: 8192, Dev: 0x7f0000000000 + 64, Len: 256}) {
		t.Fatalf("save: %v %v %v", dir, segs, err)
	}
	for name, batch := range map[string][]Desc{
		"host to host":     {{Src: host, Dst: other, Len: 1}},
		"unregistered":     {{Src: other, Dst: gpu, Len: 1}},
		"other device":     {{Src: host, Dst: far, Len: 1}},
		"mixed directions": {{Src: host, Dst: gpu, Len: 1}, {Src: gpu, Dst: host, Len: 1}},
	} {
		if _, _, err := c.lower(nil, batch); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: want ErrUnsupported, got %v", name, err)
		}
	}
	if _, _, err := c.lower(nil, []Desc{{Src: host, SrcOff: 1 << 20, Dst: gpu, Len: 1}}); err == nil {
		t.Error("out-of-range descriptor accepted")
	}
	if n := c.bytes.Load(); n != 512+256 {
		t.Errorf("counted %d bytes, want %d", n, 512+256)
	}
	if err := (CUDAConfig{Copiers: 65}).Validate(); err == nil {
		t.Error("65 copiers accepted")
	}
}

// BenchmarkCUDALowering lowers an 8K-token restore of Qwen3-8B pages with
// 64-token blocks (128 pages × 72 scattered 128 KiB blocks = 9,216
// descriptors) into a reused segment list, as a copier slot does.
func BenchmarkCUDALowering(b *testing.B) {
	host := &Region{Name: "dram", Kind: Host, Size: 16 << 30}
	gpu := &Region{Name: "gpu", Kind: Device, Device: 0x7f0000000000, Size: 16 << 30}
	var batch []Desc
	for i := range uint64(9216) {
		batch = append(batch, Desc{Src: host, SrcOff: i << 17, Dst: gpu, DstOff: (i * 7919 % 9216) << 17, Len: 128 << 10})
	}
	var segs []cuda.Segment
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if _, segs, _, err = lowerCUDA(segs[:0], batch, host, 0); err != nil {
			b.Fatal(err)
		}
	}
}
