package transfer

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"math/big"
	"math/rand/v2"
	"testing"
)

// flashGeometry describes a vLLM-FlashAttention-like buffer: per layer one
// (2, numBlocks, blockBytes) tensor laid out back to back in one buffer.
func flashGeometry(layers int, numBlocks uint32, blockBytes uint64, perPage int) Geometry {
	g := Geometry{NumBlocks: numBlocks, BlocksPerPage: perPage}
	plane := uint64(numBlocks) * blockBytes
	for l := 0; l < layers; l++ {
		for p := 0; p < 2; p++ {
			g.Segments = append(g.Segments, Segment{Offset: uint64(2*l+p) * plane, Stride: blockBytes, BlockBytes: blockBytes})
		}
	}
	return g
}

func TestGatherScatterRoundTrip(t *testing.T) {
	g := flashGeometry(3, 16, 96, 4)
	size := uint64(3 * 2 * 16 * 96)
	if err := g.Validate([]uint64{size}); err != nil {
		t.Fatal(err)
	}
	engine := HostRegion("engine", make([]byte, size))
	r := rand.New(rand.NewPCG(1, 1))
	for i := range engine.Host {
		engine.Host[i] = byte(r.Uint32())
	}
	blob := HostRegion("blob", make([]byte, g.PageBytes()))
	src := []uint32{9, 2, 3, 15}
	descs, err := g.Gather(nil, []*Region{engine}, src, blob, 0)
	if err != nil {
		t.Fatal(err)
	}
	crc, err := Local{}.CopyChecksum(context.Background(), descs)
	if err != nil {
		t.Fatal(err)
	}
	if want := crc32.Checksum(blob.Host, castagnoli); crc != want {
		t.Fatalf("checksum %08x, want %08x", crc, want)
	}
	// Blocks 2,3 are adjacent in every segment: 6 segments x 3 runs.
	if len(descs) != 6*3 {
		t.Fatalf("%d descriptors, want 18 after merging", len(descs))
	}
	dstBuf := HostRegion("engine2", make([]byte, size))
	sentinel := bytes.Repeat([]byte{0xAB}, int(size))
	copy(dstBuf.Host, sentinel)
	dstBlocks := []uint32{0, 5, 6, 11}
	descs, err = g.Scatter(nil, []*Region{dstBuf}, dstBlocks, blob, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := (Local{}).Copy(context.Background(), descs); err != nil {
		t.Fatal(err)
	}
	for si, s := range g.Segments {
		for i := uint32(0); i < g.NumBlocks; i++ {
			got := dstBuf.Host[s.Offset+uint64(i)*s.Stride:][:s.BlockBytes]
			want := sentinel[:s.BlockBytes]
			for j, b := range dstBlocks {
				if b == i {
					want = engine.Host[s.Offset+uint64(src[j])*s.Stride:][:s.BlockBytes]
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("segment %d block %d differs", si, i)
			}
		}
	}
}

// TestScatterSkipsBlocks: SkipBlock entries get no descriptor (whole-page
// and segment-range planning alike), the other blocks read their own blob
// offsets, and skipped blocks keep their bytes.
func TestScatterSkipsBlocks(t *testing.T) {
	g := flashGeometry(3, 16, 96, 4)
	size := uint64(3 * 2 * 16 * 96)
	blob := HostRegion("blob", make([]byte, g.PageBytes()))
	r := rand.New(rand.NewPCG(2, 2))
	for i := range blob.Host {
		blob.Host[i] = byte(r.Uint32())
	}
	blocks := []uint32{SkipBlock, SkipBlock, 7, 8}
	for _, segs := range [][2]int{{0, 6}, {2, 4}} {
		dst := HostRegion("engine", bytes.Repeat([]byte{0xAB}, int(size)))
		var descs []Desc
		var err error
		if segs == [2]int{0, 6} {
			descs, err = g.Scatter(nil, []*Region{dst}, blocks, blob, 0)
		} else {
			descs, err = g.ScatterSegments(nil, []*Region{dst}, blocks, blob, 0, segs[0], segs[1])
		}
		if err != nil {
			t.Fatal(err)
		}
		// Blocks 7, 8 are adjacent in the engine and in the blob: one run per segment.
		if n := segs[1] - segs[0]; len(descs) != n {
			t.Fatalf("segments %v: %d descriptors, want %d", segs, len(descs), n)
		}
		var copied uint64
		for _, d := range descs {
			copied += d.Len
		}
		if want := uint64(segs[1]-segs[0]) * 2 * 96; copied != want {
			t.Fatalf("segments %v: %d bytes planned, want %d", segs, copied, want)
		}
		if err := (Local{}).Copy(context.Background(), descs); err != nil {
			t.Fatal(err)
		}
		for si, s := range g.Segments {
			for b := uint32(0); b < g.NumBlocks; b++ {
				got := dst.Host[s.Offset+uint64(b)*s.Stride:][:s.BlockBytes]
				want := bytes.Repeat([]byte{0xAB}, int(s.BlockBytes))
				if j := int(b) - 5; si >= segs[0] && si < segs[1] && (b == 7 || b == 8) {
					// blob order: segment-major, then the page's 4 blocks
					at := (uint64(si)*4 + uint64(j)) * s.BlockBytes
					want = blob.Host[at:][:s.BlockBytes]
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("segments %v: segment %d block %d differs", segs, si, b)
				}
			}
		}
	}
	if _, err := g.Gather(nil, []*Region{HostRegion("e", make([]byte, size))}, blocks, blob, 0); !errors.Is(err, ErrGeometry) {
		t.Fatalf("gather with skips: want ErrGeometry, got %v", err)
	}
	all := []uint32{SkipBlock, SkipBlock, SkipBlock, SkipBlock}
	if err := g.CheckBlocks(all); !errors.Is(err, ErrGeometry) {
		t.Fatalf("page of only skips: want ErrGeometry, got %v", err)
	}
	if _, err := g.Scatter(nil, []*Region{HostRegion("e", make([]byte, size))}, all, blob, 0); !errors.Is(err, ErrGeometry) {
		t.Fatalf("scatter of only skips: want ErrGeometry, got %v", err)
	}
}

func TestPlanRejectsBadInput(t *testing.T) {
	g := flashGeometry(1, 4, 64, 2)
	engine := HostRegion("e", make([]byte, 2*4*64))
	blob := HostRegion("b", make([]byte, g.PageBytes()))
	for name, blocks := range map[string][]uint32{
		"too few blocks":  {1},
		"block past end":  {1, 4},
		"too many blocks": {0, 1, 2},
	} {
		if _, err := g.Gather(nil, []*Region{engine}, blocks, blob, 0); !errors.Is(err, ErrGeometry) {
			t.Errorf("%s: want ErrGeometry, got %v", name, err)
		}
	}
	small := HostRegion("b", make([]byte, g.PageBytes()-1))
	if _, err := g.Gather(nil, []*Region{engine}, []uint32{0, 1}, small, 0); !errors.Is(err, ErrGeometry) {
		t.Errorf("small blob: want ErrGeometry, got %v", err)
	}
	if err := g.Validate([]uint64{100}); !errors.Is(err, ErrGeometry) {
		t.Errorf("short buffer: want ErrGeometry, got %v", err)
	}
	if err := g.Validate(nil); !errors.Is(err, ErrGeometry) {
		t.Errorf("missing buffer: want ErrGeometry, got %v", err)
	}
}

func TestLocalHonorsDeadline(t *testing.T) {
	a := HostRegion("a", make([]byte, 4*chunk))
	b := HostRegion("b", make([]byte, 4*chunk))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Local{}.Copy(ctx, []Desc{{Src: a, Dst: b, Len: 4 * chunk}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
	dev := &Region{Name: "gpu", Kind: Device, Size: 10}
	if err := (Local{}).Copy(context.Background(), []Desc{{Src: dev, Dst: b, Len: 1}}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("want ErrUnsupported, got %v", err)
	}
}

// TestValidateRefusesWraparound: geometries whose ends or page size pass
// 2^64 are refused, however the arithmetic wraps.
func TestValidateRefusesWraparound(t *testing.T) {
	const max = ^uint64(0)
	for _, c := range []struct {
		name string
		g    Geometry
		size uint64
	}{
		{"strides wrap to a small end", Geometry{NumBlocks: 64, BlocksPerPage: 1,
			Segments: []Segment{{Stride: (1<<64 + 47) / 63, BlockBytes: 1}}}, 1 << 20},
		{"strides wrap exactly", Geometry{NumBlocks: 3, BlocksPerPage: 1,
			Segments: []Segment{{Stride: 1 << 63, BlockBytes: 1}}}, 1 << 20},
		{"offset plus span wraps", Geometry{NumBlocks: 2, BlocksPerPage: 1,
			Segments: []Segment{{Offset: max - 10, Stride: 16, BlockBytes: 16}}}, max},
		{"block bytes wrap", Geometry{NumBlocks: 1, BlocksPerPage: 1,
			Segments: []Segment{{Offset: 8, BlockBytes: max - 4}}}, max},
		{"page size wraps", Geometry{NumBlocks: 1, BlocksPerPage: 4,
			Segments: []Segment{{BlockBytes: 1 << 62}, {Offset: 1 << 62, BlockBytes: 1 << 62}}}, 1 << 63},
		{"segment sum wraps", Geometry{NumBlocks: 1, BlocksPerPage: 1,
			Segments: []Segment{{BlockBytes: max / 2}, {BlockBytes: max / 2}, {BlockBytes: 2}}}, max},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.g.Validate([]uint64{c.size}); !errors.Is(err, ErrGeometry) {
				t.Fatalf("want ErrGeometry, got %v", err)
			}
		})
	}
}

// FuzzValidate: a geometry Validate accepts has every block of every segment
// inside its buffer and a page size that does not wrap, by exact arithmetic.
func FuzzValidate(f *testing.F) {
	f.Add(uint32(64), uint8(4), uint64(0), uint64(96), uint64(96), uint64(1<<20))
	f.Add(uint32(64), uint8(1), uint64(0), uint64((1<<64+47)/63), uint64(1), uint64(1<<20))
	f.Add(uint32(1), uint8(4), uint64(1<<60), uint64(0), uint64(1<<60), uint64(1<<62))
	f.Fuzz(func(t *testing.T, blocks uint32, perPage uint8, off, stride, bb, size uint64) {
		g := Geometry{NumBlocks: blocks, BlocksPerPage: int(perPage),
			Segments: []Segment{{Offset: off, Stride: stride, BlockBytes: bb}, {Offset: off / 2, Stride: stride, BlockBytes: bb}}}
		if g.Validate([]uint64{size}) != nil {
			return
		}
		lim := new(big.Int).SetUint64(size)
		for _, s := range g.Segments {
			end := new(big.Int).Mul(big.NewInt(int64(blocks-1)), new(big.Int).SetUint64(s.Stride))
			end.Add(end, new(big.Int).SetUint64(s.Offset)).Add(end, new(big.Int).SetUint64(s.BlockBytes))
			if end.Cmp(lim) > 0 {
				t.Fatalf("accepted %+v ending at %v past %d", s, end, size)
			}
		}
		page := new(big.Int).SetUint64(bb)
		page.Mul(page, big.NewInt(2*int64(perPage)))
		if page.Cmp(new(big.Int).SetUint64(g.PageBytes())) != 0 {
			t.Fatalf("page size %d, want %v", g.PageBytes(), page)
		}
	})
}

// castagnoli is hash/crc32's table, the reference the tests check the
// peer's checksums (internal/crc32c) against.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)
