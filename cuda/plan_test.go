package cuda

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

func TestCheckSegments(t *testing.T) {
	for _, tc := range []struct {
		name string
		segs []Segment
		ok   bool
	}{
		{"fits", []Segment{{HostOff: 0, Dev: 0x1000, Len: 100}, {HostOff: 900, Dev: 0x2000, Len: 124}}, true},
		{"ends at region end", []Segment{{HostOff: 1000, Dev: 1, Len: 24}}, true},
		{"empty", []Segment{{HostOff: 0, Dev: 0x1000, Len: 0}}, false},
		{"nil device", []Segment{{HostOff: 0, Dev: 0, Len: 8}}, false},
		{"past end", []Segment{{HostOff: 1000, Dev: 1, Len: 25}}, false},
		{"offset past end", []Segment{{HostOff: 2000, Dev: 1, Len: 1}}, false},
		{"overflowing length", []Segment{{HostOff: 8, Dev: 1, Len: ^uint64(0)}}, false},
		{"device wraps", []Segment{{HostOff: 0, Dev: DevicePtr(^uint64(0) - 4), Len: 8}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkSegments(tc.segs, 1024)
			if (err == nil) != tc.ok {
				t.Fatalf("checkSegments = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrBadSegment) {
				t.Fatalf("error %v does not wrap ErrBadSegment", err)
			}
		})
	}
}

func TestCoalesce(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []Segment
		want []Segment
	}{
		{"empty", nil, nil},
		{"adjacent both sides", []Segment{{0, 100, 10}, {10, 110, 10}, {20, 120, 5}}, []Segment{{0, 100, 25}}},
		{"host adjacent only", []Segment{{0, 100, 10}, {10, 500, 10}}, []Segment{{0, 100, 10}, {10, 500, 10}}},
		{"device adjacent only", []Segment{{0, 100, 10}, {50, 110, 10}}, []Segment{{0, 100, 10}, {50, 110, 10}}},
		{"out of order is kept", []Segment{{10, 110, 10}, {0, 100, 10}}, []Segment{{10, 110, 10}, {0, 100, 10}}},
		{"two runs", []Segment{{0, 0x100, 8}, {8, 0x108, 8}, {64, 0x400, 8}, {72, 0x408, 8}}, []Segment{{0, 0x100, 16}, {64, 0x400, 16}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := coalesce(nil, tc.in)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("coalesce = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLower(t *testing.T) {
	segs := []Segment{{HostOff: 16, Dev: 0x9000, Len: 32}}
	if got, want := lower(nil, HostToDevice, 0x1000, segs), []cSeg{{Src: 0x1010, Dst: 0x9000, Len: 32}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("restore: %v, want %v", got, want)
	}
	if got, want := lower(nil, DeviceToHost, 0x1000, segs), []cSeg{{Src: 0x9000, Dst: 0x1010, Len: 32}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("save: %v, want %v", got, want)
	}
}

func TestKernelFits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		segs   []cSeg
		chunk  uint64
		chunks uint32
		ok     bool
	}{
		{"one chunk", []cSeg{{0x1000, 0x2000, 4096}}, 65536, 1, true},
		{"128 KiB in 64 KiB chunks", []cSeg{{0x1000, 0x2000, 131072}, {0, 16, 16}}, 65536, 2, true},
		{"partial last chunk", []cSeg{{0, 0, 65536 + 16}}, 65536, 2, true},
		{"unaligned src", []cSeg{{8, 0x2000, 4096}}, 65536, 0, false},
		{"unaligned len", []cSeg{{0, 0, 4100}}, 65536, 0, false},
		{"too many chunks", []cSeg{{0, 0, 65536 * 16 * 65536}}, 16, 0, false},
		{"empty batch", nil, 65536, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chunks, ok := kernelFits(tc.segs, tc.chunk)
			if ok != tc.ok || chunks != tc.chunks {
				t.Fatalf("kernelFits = %d, %v; want %d, %v", chunks, ok, tc.chunks, tc.ok)
			}
		})
	}
}

func TestSplitEven(t *testing.T) {
	for _, tc := range []struct {
		n, k int
		want [][2]int
	}{
		{10, 3, [][2]int{{0, 4}, {4, 7}, {7, 10}}},
		{2, 4, [][2]int{{0, 1}, {1, 2}}},
		{5, 1, [][2]int{{0, 5}}},
		{0, 4, [][2]int{}},
	} {
		if got := splitEven(tc.n, tc.k); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("splitEven(%d, %d) = %v, want %v", tc.n, tc.k, got, tc.want)
		}
	}
}

func TestCopierConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  CopierConfig
		ok   bool
	}{
		{"defaults", CopierConfig{}, true},
		{"streams", CopierConfig{Method: MethodStreams, Streams: 8}, true},
		{"too many streams", CopierConfig{Streams: 65}, false},
		{"bad method", CopierConfig{Method: 9}, false},
		{"odd threads", CopierConfig{KernelThreads: 100}, false},
		{"chunk not a multiple", CopierConfig{KernelThreads: 256, KernelChunk: 1000}, false},
	} {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestParseMethod(t *testing.T) {
	for m := MethodAuto; m <= MethodKernel; m++ {
		got, err := ParseMethod(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMethod(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := ParseMethod("dma"); err == nil {
		t.Error("ParseMethod(dma) succeeded")
	}
}

func TestRects(t *testing.T) {
	const w = 128
	row := func(src, dst uint64) cSeg { return cSeg{Src: src, Dst: dst, Len: w} }
	for _, tc := range []struct {
		name string
		in   []cSeg
		want []cRect
	}{
		{"empty", nil, nil},
		{"one copy", []cSeg{row(0, 1000)}, []cRect{{0, 1000, w, 1, w, w}}},
		{"a page's planes", []cSeg{row(0, 1000), row(w, 5000), row(2*w, 9000), row(3*w, 13000)},
			[]cRect{{0, 1000, w, 4, w, 4000}}},
		{"two pages, two runs", []cSeg{row(0, 1000), row(w, 5000), row(1<<20, 2000), row(1<<20+w, 6000)},
			[]cRect{{0, 1000, w, 2, w, 4000}, {1 << 20, 2000, w, 2, w, 4000}}},
		{"stride changes mid-run", []cSeg{row(0, 1000), row(w, 5000), row(2*w, 6000)},
			[]cRect{{0, 1000, w, 2, w, 4000}, {2 * w, 6000, w, 1, w, w}}},
		{"descending device: rows", []cSeg{row(0, 9000), row(w, 5000)},
			[]cRect{{0, 9000, w, 1, w, w}, {w, 5000, w, 1, w, w}}},
		{"overlapping rows are not a pitch", []cSeg{row(0, 1000), row(w/2, 5000)},
			[]cRect{{0, 1000, w, 1, w, w}, {w / 2, 5000, w, 1, w, w}}},
		{"pitch past the limit", []cSeg{row(0, 1000), row(w, 1000+1<<20)},
			[]cRect{{0, 1000, w, 1, w, w}, {w, 1000 + 1<<20, w, 1, w, w}}},
		// Blocks at device 1000 and 50000, planes 4000 apart; in the blob,
		// plane-major then block.
		{"a page of two blocks: two interleaved runs", []cSeg{row(0, 1000), row(w, 50000), row(2*w, 5000), row(3*w, 54000), row(4*w, 9000), row(5*w, 58000)},
			[]cRect{{0, 1000, w, 3, 2 * w, 4000}, {w, 50000, w, 3, 2 * w, 4000}}},
		{"interleaved runs, one ends early", []cSeg{row(0, 1000), row(w, 50000), row(2*w, 5000), row(3*w, 54000), row(4*w, 9000), row(5*w, 99)},
			[]cRect{{0, 1000, w, 2, 2 * w, 4000}, {w, 50000, w, 2, 2 * w, 4000}, {4 * w, 9000, w, 1, w, w}, {5 * w, 99, w, 1, w, w}}},
		{"one arithmetic run beats an interleaving", []cSeg{row(0, 1000), row(w, 3000), row(2*w, 5000), row(3*w, 7000)},
			[]cRect{{0, 1000, w, 4, w, 2000}}},
		{"unequal lengths", []cSeg{row(0, 1000), {Src: w, Dst: 5000, Len: w / 2}},
			[]cRect{{0, 1000, w, 1, w, w}, {w, 5000, w / 2, 1, w / 2, w / 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rects(nil, tc.in, 1<<16)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("rects = %+v, want %+v", got, tc.want)
			}
			// Every input copy is exactly one row of the output.
			var rows []cSeg
			for _, r := range got {
				for k := range r.Height {
					rows = append(rows, cSeg{Src: r.Src + k*r.SrcPitch, Dst: r.Dst + k*r.DstPitch, Len: r.Width})
				}
			}
			byAddr := func(a, b cSeg) int { return cmp.Compare(a.Src, b.Src) }
			in := slices.SortedFunc(slices.Values(tc.in), byAddr)
			slices.SortFunc(rows, byAddr)
			if len(rows) != len(in) || (len(rows) > 0 && !reflect.DeepEqual(rows, in)) {
				t.Fatalf("rows %+v, want the input %+v", rows, tc.in)
			}
		})
	}
}

// TestRectsFoldsPages checks rects on planned pages: whatever the blocks per
// page and placement, every copy is one row of exactly one rectangle, pitches
// stay in [width, maxPitch], and a page's planes fold into one rectangle per
// block.
func TestRectsFoldsPages(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const planes, bb = 72, 4096
	for _, perPage := range []int{1, 2, 4, 8} {
		const blocks = 64
		planeBytes := uint64(blocks * bb)
		pages := 6
		perm := r.Perm(blocks)
		var segs []cSeg
		for pg := range pages {
			base := uint64(pg) * planes * uint64(perPage) * bb
			for pl := range planes {
				for j := range perPage {
					b := uint64(perm[pg*perPage+j])
					segs = append(segs, cSeg{Src: base + uint64(pl*perPage+j)*bb, Dst: 1<<40 + uint64(pl)*planeBytes + b*bb, Len: bb})
				}
			}
		}
		got := rects(nil, segs, 1<<31)
		if len(got) != pages*perPage {
			t.Errorf("%d blocks per page: %d rectangles, want %d (one per block)", perPage, len(got), pages*perPage)
		}
		seen := map[cSeg]int{}
		for _, rc := range got {
			if rc.Height > 1 && (rc.SrcPitch < rc.Width || rc.DstPitch < rc.Width || rc.SrcPitch > 1<<31 || rc.DstPitch > 1<<31) {
				t.Fatalf("bad pitches %+v", rc)
			}
			for k := range rc.Height {
				seen[cSeg{Src: rc.Src + k*rc.SrcPitch, Dst: rc.Dst + k*rc.DstPitch, Len: rc.Width}]++
			}
		}
		for _, s := range segs {
			if seen[s] != 1 {
				t.Fatalf("%d blocks per page: copy %+v is %d rows", perPage, s, seen[s])
			}
		}
		if len(seen) != len(segs) {
			t.Fatalf("%d rows for %d copies", len(seen), len(segs))
		}
	}
}

// TestLowerPeerSegments: peer segments become shim copies with runs
// adjacent on both sides merged, in order; empty, null or wrapping ones
// are refused.
func TestLowerPeerSegments(t *testing.T) {
	got, err := lowerPeer(nil, []PeerSegment{
		{Src: 0x1000, Dst: 0x9000, Len: 0x100},
		{Src: 0x1100, Dst: 0x9100, Len: 0x100}, // adjacent both sides: merged
		{Src: 0x1200, Dst: 0xa000, Len: 0x100}, // adjacent at the source only
		{Src: 0x0800, Dst: 0xa100, Len: 0x10},  // adjacent at the destination only
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []cSeg{{0x1000, 0x9000, 0x200}, {0x1200, 0xa000, 0x100}, {0x0800, 0xa100, 0x10}}
	if len(got) != len(want) {
		t.Fatalf("lowered %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("lowered %v, want %v", got, want)
		}
	}
	for name, s := range map[string]PeerSegment{
		"empty":       {Src: 0x1000, Dst: 0x2000},
		"null source": {Dst: 0x2000, Len: 16},
		"null dest":   {Src: 0x1000, Len: 16},
		"wraps":       {Src: ^DevicePtr(0) - 4, Dst: 0x2000, Len: 16},
	} {
		if _, err := lowerPeer(nil, []PeerSegment{s}); !errors.Is(err, ErrBadSegment) {
			t.Errorf("%s: %v, want ErrBadSegment", name, err)
		}
	}
}

// TestRestorePitchMinRow: MethodAuto's choice for a batch of scattered
// 16-token blocks (32-KiB rows that fold by the page's planes) and of whole
// 64-token blocks (128-KiB rows): pitched everywhere by default; with
// RestorePitchMinRow at 64 KiB the narrow rows restore by batched copies
// while saves and the wide rows stay pitched.
func TestRestorePitchMinRow(t *testing.T) {
	const planes, pages = 72, 4
	batch := func(perPage int) []Segment {
		bb := uint64(128<<10) / uint64(perPage)
		var segs []Segment
		for pg := range pages {
			for pl := range planes {
				for j := range perPage {
					back := uint64(perPage - 1 - j) // a page's blocks in reverse: no two merge
					segs = append(segs, Segment{
						HostOff: uint64(pg*planes*perPage+pl*perPage+j) * bb,
						Dev:     DevicePtr(1<<40 + uint64(pl)<<30 + uint64(pg)<<20 + back*bb),
						Len:     bb,
					})
				}
			}
		}
		return segs
	}
	host := &HostRegion{}
	for _, tc := range []struct {
		perPage int
		minRow  uint64
		dir     Direction
		want    bool
	}{
		{4, 0, HostToDevice, true},
		{4, 64 << 10, HostToDevice, false},
		{4, 64 << 10, DeviceToHost, true},
		{4, 32 << 10, HostToDevice, true},
		{1, 64 << 10, HostToDevice, true},
	} {
		c := &Copier{cfg: CopierConfig{RestorePitchMinRow: tc.minRow}, maxPitch: 1 << 31}
		c.mu.merged = coalesce(nil, batch(tc.perPage))
		if got := c.folds(tc.dir, host); got != tc.want {
			t.Errorf("%d blocks per page, min row %d, %v: pitched %v, want %v (mean row %d B over %d rectangles)",
				tc.perPage, tc.minRow, tc.dir, got, tc.want, meanRow(c.mu.rects), len(c.mu.rects))
		}
	}
}
