package ssd

import (
	"errors"
	"math/rand/v2"
	"testing"
)

const (
	tChunk = 16 * 4096 // small regions keep the model cheap
	k4     = 4096
)

func TestAllocPacksAndReleases(t *testing.T) {
	a := newAllocator(tChunk, []uint64{2 * tChunk})
	var locs []Loc
	for range 4 { // 4 slots of 16 KiB fill one region
		loc, err := a.alloc(4 * k4)
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, loc)
	}
	other, err := a.alloc(2 * k4)
	if err != nil || other.Offset != tChunk {
		t.Fatalf("second size got %+v, %v; want the second region", other, err)
	}
	if _, err := a.alloc(8 * k4); !errors.Is(err, ErrFull) {
		t.Fatalf("third size: %v, want ErrFull", err)
	}
	for _, l := range locs {
		if err := a.free(l); err != nil {
			t.Fatal(err)
		}
	}
	if loc, err := a.alloc(8 * k4); err != nil || loc.Offset != 0 {
		t.Fatalf("after freeing region 0 got %+v, %v", loc, err)
	}
	if _, err := a.alloc(3 * tChunk); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversize: %v, want ErrTooLarge", err)
	}
}

func TestAllocLargeSlotsAligned(t *testing.T) {
	a := newAllocator(tChunk, []uint64{5 * tChunk})
	small, _ := a.alloc(k4)          // takes chunk 0
	big, err := a.alloc(tChunk + k4) // two chunks, must start at chunk 2
	if err != nil || small.Offset != 0 || big.Offset != 2*tChunk {
		t.Fatalf("got %+v %+v %v", small, big, err)
	}
	if _, err := a.alloc(tChunk + k4); !errors.Is(err, ErrFull) {
		t.Fatalf("chunk 4 alone cannot hold a 2-chunk region: %v", err)
	}
}

func TestReserveRejects(t *testing.T) {
	a := newAllocator(tChunk, []uint64{2 * tChunk})
	if err := a.reserve(Loc{File: 0, Offset: 0, Bytes: 2 * k4}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		loc  Loc
	}{
		{"same slot twice", Loc{0, 0, 2 * k4}},
		{"other size in region", Loc{0, 4 * k4, 4 * k4}},
		{"inside a slot", Loc{0, k4, 2 * k4}},
		{"misaligned offset", Loc{0, tChunk + 1, 2 * k4}},
		{"misaligned bytes", Loc{0, tChunk, 2*k4 + 1}},
		{"no such file", Loc{1, 0, 2 * k4}},
		{"past the end", Loc{0, 2 * tChunk, 2 * k4}},
		{"tail of region", Loc{0, tChunk + 3*(5*k4), 5 * k4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := a.reserve(tc.loc); err == nil {
				t.Fatalf("reserve %+v succeeded", tc.loc)
			}
		})
	}
	if l, err := a.alloc(tChunk); err != nil || l.Offset != tChunk {
		t.Fatalf("failed reserves leaked region 1: got %+v, %v", l, err)
	}
}

// model is the naive reference: the set of live slots, nothing else. Room
// for a size exists when some region implied by a live slot of that size
// has fewer live slots than it holds, or some aligned run of chunks is
// touched by no implied region.
type model struct {
	chunk uint64
	files []uint64
	live  map[Loc]bool
}

func (m *model) chunksFor(b uint64) uint64 { return (b + m.chunk - 1) / m.chunk }

// regionStart is the first byte of the region implied by l.
func (m *model) regionStart(l Loc) uint64 {
	k := m.chunksFor(l.Bytes)
	return l.Offset / m.chunk / k * k * m.chunk
}

func (m *model) hasRoom(b uint64) bool {
	k := m.chunksFor(b)
	for l := range m.live {
		if l.Bytes != b {
			continue
		}
		n := 0
		for o := range m.live {
			if o.Bytes == b && o.File == l.File && m.regionStart(o) == m.regionStart(l) {
				n++
			}
		}
		if uint64(n) < k*m.chunk/b {
			return true
		}
	}
	for f, size := range m.files {
		for start := uint64(0); start+k*m.chunk <= size; start += k * m.chunk {
			if m.runFree(uint32(f), start, start+k*m.chunk) {
				return true
			}
		}
	}
	return false
}

func (m *model) runFree(f uint32, lo, hi uint64) bool {
	for l := range m.live {
		s := m.regionStart(l)
		if l.File == f && s < hi && s+m.chunksFor(l.Bytes)*m.chunk > lo {
			return false
		}
	}
	return true
}

func (m *model) checkNew(t *testing.T, l Loc) {
	t.Helper()
	if l.Offset%k4 != 0 || l.Offset+l.Bytes > m.files[l.File] {
		t.Fatalf("slot %+v misaligned or out of file", l)
	}
	for o := range m.live {
		if o.File == l.File && o.Offset < l.Offset+l.Bytes && l.Offset < o.Offset+o.Bytes {
			t.Fatalf("slot %+v overlaps live %+v", l, o)
		}
	}
}

func TestAllocMatchesModel(t *testing.T) {
	sizes := []uint64{k4, 3 * k4, 5 * k4, tChunk, tChunk + k4, 3 * tChunk}
	files := []uint64{4 * tChunk, 7 * tChunk}
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		a := newAllocator(tChunk, files)
		m := &model{chunk: tChunk, files: files, live: map[Loc]bool{}}
		var live []Loc
		for step := range 3000 {
			if len(live) > 0 && rng.IntN(5) < 2 {
				i := rng.IntN(len(live))
				if err := a.free(live[i]); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				delete(m.live, live[i])
				live = append(live[:i], live[i+1:]...)
				continue
			}
			b := sizes[rng.IntN(len(sizes))]
			room := m.hasRoom(b)
			l, err := a.alloc(b)
			if room != (err == nil) {
				t.Fatalf("seed %d step %d: alloc %d: %+v, %v; model says room=%v", seed, step, b, l, err, room)
			}
			if err == nil {
				m.checkNew(t, l)
				m.live[l], live = true, append(live, l)
			}
		}
		checkRebuild(t, a, files, live)
	}
}

// checkRebuild reserves the live slots in a fresh allocator (a restart) and
// expects the same usage and every slot to be taken.
func checkRebuild(t *testing.T, a *allocator, files []uint64, live []Loc) {
	t.Helper()
	b := newAllocator(tChunk, files)
	for _, l := range live {
		if err := b.reserve(l); err != nil {
			t.Fatalf("rebuild: %v", err)
		}
	}
	if b.used != a.used {
		t.Fatalf("rebuilt used %d, want %d", b.used, a.used)
	}
	for _, l := range live {
		if !b.isAllocated(l) || b.reserve(l) == nil {
			t.Fatalf("rebuilt allocator lost %+v", l)
		}
	}
}
