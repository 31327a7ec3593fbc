//go:build cgo && linux

package cuda

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// Qwen3-8B geometry: one (layer, K|V) segment of a 64-token page is
// 64 tokens × 8 kv heads × 128 dims × 2 bytes; a page has 36 × 2 of them.
const (
	testSeg    = 64 * 8 * 128 * 2
	testPlanes = 36 * 2
	testGap    = 4096 // sentinel bytes after every block and every host page
	sentinel   = 0xA5
)

// scatter is a device pool of testPlanes planes × blocks blocks, each block
// followed by a sentinel gap, and pages placed into random blocks from
// random host slots.
type scatter struct {
	blocks int
	pool   *DeviceMem
	host   *HostRegion
	slots  []int      // host slot of page i
	block  []int      // device block of page i
	want   [][32]byte // digest of page i plane p: want[i*testPlanes+p]
}

func (s *scatter) blockStride() uint64 { return testSeg + testGap }
func (s *scatter) planeBytes() uint64  { return uint64(s.blocks) * s.blockStride() }
func (s *scatter) devOff(plane, block int) uint64 {
	return uint64(plane)*s.planeBytes() + uint64(block)*s.blockStride()
}
func hostStride() uint64 { return testPlanes*testSeg + testGap }

func newScatter(t *testing.T, d *Device, r *rand.Rand, pages, slots, blocks int) *scatter {
	return newScatterAt(t, d, r, slots, blocks, r.Perm(slots)[:pages], r.Perm(blocks)[:pages])
}

// newScatterAt places page i in host slot slotOf[i] and device block
// blockOf[i].
func newScatterAt(t *testing.T, d *Device, r *rand.Rand, slots, blocks int, slotOf, blockOf []int) *scatter {
	s := &scatter{blocks: blocks}
	s.pool = allocDevice(t, d, testPlanes*s.planeBytes())
	s.host = registerHost(t, d, slots*int(hostStride()))
	s.slots, s.block = slotOf, blockOf
	pages := len(slotOf)
	hb := s.host.Bytes()
	for i := range hb {
		hb[i] = sentinel
	}
	for i := range pages {
		base := uint64(s.slots[i]) * hostStride()
		fillRandom(r, hb[base:base+testPlanes*testSeg])
		for p := range testPlanes {
			off := base + uint64(p)*testSeg
			s.want = append(s.want, sha256.Sum256(hb[off:off+testSeg]))
		}
	}
	return s
}

// segments lists page i plane p: host slot → device block, in a shuffled
// order; with r nil, in page-then-plane order (as the peer plans a page: its
// planes at one constant stride on each side, the runs a pitched copy folds).
func (s *scatter) segments(r *rand.Rand, slotOf func(page int) int) []Segment {
	var segs []Segment
	for i := range s.block {
		for p := range testPlanes {
			segs = append(segs, Segment{
				HostOff: uint64(slotOf(i))*hostStride() + uint64(p)*testSeg,
				Dev:     s.pool.Ptr + DevicePtr(s.devOff(p, s.block[i])),
				Len:     testSeg,
			})
		}
	}
	if r != nil {
		r.Shuffle(len(segs), func(a, b int) { segs[a], segs[b] = segs[b], segs[a] })
	}
	return segs
}

// verifyDevice reads the whole pool back and returns the (page, plane)
// pairs whose digest differs, failing the test if any byte outside the
// restored blocks lost its sentinel.
func (s *scatter) verifyDevice(t *testing.T, d *Device) []string {
	t.Helper()
	buf := make([]byte, s.pool.Size)
	if err := d.CopyFromDevice(buf, s.pool.Ptr); err != nil {
		t.Fatal(err)
	}
	pageAt := map[int]int{}
	for i, b := range s.block {
		pageAt[b] = i
	}
	sent := bytes.Repeat([]byte{sentinel}, testSeg)
	var bad []string
	for p := range testPlanes {
		for b := range s.blocks {
			off := s.devOff(p, b)
			data, gap := buf[off:off+testSeg], buf[off+testSeg:off+s.blockStride()]
			if !bytes.Equal(gap, sent[:testGap]) {
				t.Fatalf("sentinel gap after plane %d block %d overwritten", p, b)
			}
			i, used := pageAt[b]
			if !used {
				if !bytes.Equal(data, sent) {
					t.Fatalf("untouched plane %d block %d overwritten", p, b)
				}
				continue
			}
			if sha256.Sum256(data) != s.want[i*testPlanes+p] {
				bad = append(bad, fmt.Sprintf("page %d plane %d", i, p))
			}
		}
	}
	return bad
}

// verifySaved checks that save slot slotOf(i) holds page i and that every
// host gap kept its sentinel.
func (s *scatter) verifySaved(t *testing.T, h *HostRegion, slotOf func(int) int) []string {
	t.Helper()
	hb := h.Bytes()
	var bad []string
	for i := range s.block {
		base := uint64(slotOf(i)) * hostStride()
		for p := range testPlanes {
			off := base + uint64(p)*testSeg
			if sha256.Sum256(hb[off:off+testSeg]) != s.want[i*testPlanes+p] {
				bad = append(bad, fmt.Sprintf("page %d plane %d", i, p))
			}
		}
		gap := hb[base+testPlanes*testSeg : base+hostStride()]
		if !bytes.Equal(gap, bytes.Repeat([]byte{sentinel}, testGap)) {
			t.Fatalf("host gap after save slot %d overwritten", slotOf(i))
		}
	}
	return bad
}

func TestRestoreSaveScattered(t *testing.T) {
	d := requireDevice(t)
	r := rand.New(rand.NewPCG(1, 2))
	const pages, slots, blocks = 8, 12, 24
	s := newScatter(t, d, r, pages, slots, blocks)
	saved := registerHost(t, d, pages*int(hostStride()))
	for _, tc := range []struct {
		name    string
		cfg     CopierConfig
		ordered bool // planes in page order (runs), not shuffled
	}{
		{"per-segment", CopierConfig{Method: MethodPerSegment}, false},
		{"streams", CopierConfig{Method: MethodStreams, Streams: 4}, false},
		{"batch", CopierConfig{Method: MethodBatch}, false},
		{"batch-2-streams", CopierConfig{Method: MethodBatch, Streams: 2}, false},
		{"batch, restores read in any order", CopierConfig{Method: MethodBatch, BatchSrcAnyOrder: true}, false},
		{"kernel", CopierConfig{Method: MethodKernel}, false},
		{"pitched, shuffled (rows)", CopierConfig{Method: MethodPitched}, false},
		{"pitched, page order (runs)", CopierConfig{Method: MethodPitched}, true},
		{"pitched-3-streams, page order", CopierConfig{Method: MethodPitched, Streams: 3}, true},
		{"auto", CopierConfig{}, false},
		{"auto, page order", CopierConfig{}, true},
		{"auto, page order, restores pitched only past its rows", CopierConfig{RestorePitchMinRow: 1 << 30}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := d.NewCopier(tc.cfg)
			if err != nil {
				skipOrFail(t, "copier %s: %v", tc.name, err)
			}
			defer c.Close()
			if err := d.Memset(s.pool.Ptr, sentinel, s.pool.Size); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			order := r
			if tc.ordered {
				order = nil
			}
			slotOf := func(i int) int { return s.slots[i] }
			if err := c.Restore(ctx, s.host, s.segments(order, slotOf)); err != nil {
				t.Fatalf("restore with %v: %v", c.Method(), err)
			}
			if bad := s.verifyDevice(t, d); len(bad) > 0 {
				t.Fatalf("restore with %v: digests differ for %v", c.Method(), bad)
			}
			sb := saved.Bytes()
			for i := range sb {
				sb[i] = sentinel
			}
			perm := r.Perm(pages)
			saveSlot := func(i int) int { return perm[i] }
			if err := c.Save(context.Background(), saved, s.segments(order, saveSlot)); err != nil {
				t.Fatalf("save with %v: %v", c.Method(), err)
			}
			if bad := s.verifySaved(t, saved, saveSlot); len(bad) > 0 {
				t.Fatalf("save with %v: digests differ for %v", c.Method(), bad)
			}
		})
	}
}

// A corrupted source byte must show up in exactly its (page, plane) digest.
func TestRestoreDetectsCorruptSource(t *testing.T) {
	d := requireDevice(t)
	r := rand.New(rand.NewPCG(3, 4))
	s := newScatter(t, d, r, 6, 8, 16)
	c, err := d.NewCopier(CopierConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := d.Memset(s.pool.Ptr, sentinel, s.pool.Size); err != nil {
		t.Fatal(err)
	}
	const page, plane = 3, 17
	hb := s.host.Bytes()
	hb[uint64(s.slots[page])*hostStride()+plane*testSeg+12345] ^= 0x40
	if err := c.Restore(context.Background(), s.host, s.segments(r, func(i int) int { return s.slots[i] })); err != nil {
		t.Fatal(err)
	}
	bad := s.verifyDevice(t, d)
	if want := fmt.Sprintf("page %d plane %d", page, plane); len(bad) != 1 || bad[0] != want {
		t.Fatalf("digest check found %v, want exactly [%s]", bad, want)
	}
}

// Segments the kernel cannot move (unaligned) fall back to the copy engines.
func TestKernelUnalignedFallback(t *testing.T) {
	d := requireDevice(t)
	c, err := d.NewCopier(CopierConfig{Method: MethodKernel})
	if err != nil {
		skipOrFail(t, "kernel copier: %v", err)
	}
	defer c.Close()
	const n = 1 << 20
	dev := allocDevice(t, d, n)
	if err := d.Memset(dev.Ptr, 0, n); err != nil {
		t.Fatal(err)
	}
	h := registerHost(t, d, n)
	fillRandom(rand.New(rand.NewPCG(5, 6)), h.Bytes())
	segs := []Segment{{HostOff: 3, Dev: dev.Ptr + 1000, Len: 1001}, {HostOff: 70001, Dev: dev.Ptr + 5, Len: 777}}
	if err := c.Restore(context.Background(), h, segs); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := d.CopyFromDevice(got, dev.Ptr); err != nil {
		t.Fatal(err)
	}
	for _, sg := range segs {
		off := uint64(sg.Dev - dev.Ptr)
		if !bytes.Equal(got[off:off+sg.Len], h.Bytes()[sg.HostOff:sg.HostOff+sg.Len]) {
			t.Fatalf("segment %+v not copied", sg)
		}
	}
}

func TestCopierRejectsBadSegments(t *testing.T) {
	d := requireDevice(t)
	c, err := d.NewCopier(CopierConfig{Method: MethodPerSegment, MaxSegments: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := registerHost(t, d, 1<<16)
	dev := allocDevice(t, d, 1<<16)
	if err := c.Restore(context.Background(), h, []Segment{{HostOff: 1 << 16, Dev: dev.Ptr, Len: 1}}); err == nil {
		t.Fatal("segment past the region accepted")
	}
	three := []Segment{{0, dev.Ptr, 16}, {64, dev.Ptr + 256, 16}, {128, dev.Ptr + 1024, 16}}
	if err := c.Restore(context.Background(), h, three); err == nil {
		t.Fatal("batch over MaxSegments accepted")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Restore(context.Background(), h, three[:1]); err != ErrClosed {
		t.Fatalf("restore after close = %v, want ErrClosed", err)
	}
}

// TestPendingAdd: copies added behind an in-flight copy-engine batch land
// with the first part's; a kernel batch (its descriptor buffer busy) and a
// batch already waited for take none; MethodAuto goes pitched for a batch in
// page order and by cuMemcpyBatchAsync for a shuffled one (the kernel only
// where the driver has no batched copies).
func TestPendingAdd(t *testing.T) {
	d := requireDevice(t)
	r := rand.New(rand.NewPCG(11, 12))
	s := newScatter(t, d, r, 8, 12, 24)
	slotOf := func(i int) int { return s.slots[i] }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name string
		cfg  CopierConfig
	}{
		{"pitched", CopierConfig{Method: MethodPitched}},
		{"batch", CopierConfig{Method: MethodBatch}},
		{"streams", CopierConfig{Method: MethodStreams, Streams: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := d.NewCopier(tc.cfg)
			if err != nil {
				skipOrFail(t, "copier %s: %v", tc.name, err)
			}
			defer c.Close()
			if err := d.Memset(s.pool.Ptr, sentinel, s.pool.Size); err != nil {
				t.Fatal(err)
			}
			segs := s.segments(nil, slotOf)
			third := len(segs) / 3
			p, err := c.Start(HostToDevice, s.host, segs[:third])
			if err != nil {
				t.Fatal(err)
			}
			for _, part := range [][]Segment{segs[third : 2*third], segs[2*third:]} {
				if err := p.Add(part); err != nil {
					t.Fatalf("add: %v", err)
				}
			}
			if err := p.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if bad := s.verifyDevice(t, d); len(bad) > 0 {
				t.Fatalf("restore in three parts with %v: digests differ for %v", c.Method(), bad)
			}
			if err := p.Add(segs[:1]); err == nil {
				t.Fatal("a batch already waited for took more copies")
			}
		})
	}
	k, err := d.NewCopier(CopierConfig{Method: MethodKernel})
	if err != nil {
		skipOrFail(t, "kernel copier: %v", err)
	}
	defer k.Close()
	segs := s.segments(nil, slotOf)
	p, err := k.Start(HostToDevice, s.host, segs[:8])
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Add(segs[8:16]); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("add to a kernel batch: %v, want ErrNotSupported", err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := d.NewCopier(CopierConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	scattered := MethodBatch // auto keeps copies off the SMs where the driver batches
	if !HasBatchCopy() {
		scattered = MethodKernel
	}
	for _, tc := range []struct {
		order *rand.Rand
		want  Method
	}{{nil, MethodPitched}, {r, scattered}} {
		p, err := a.Start(HostToDevice, s.host, s.segments(tc.order, slotOf))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if p.Method() != tc.want {
			t.Fatalf("auto went by %v for %s segments, want %v", p.Method(), map[bool]string{true: "page-ordered", false: "shuffled"}[tc.order == nil], tc.want)
		}
		if bad := s.verifyDevice(t, d); len(bad) > 0 {
			t.Fatalf("auto restore: digests differ for %v", bad)
		}
	}
}
