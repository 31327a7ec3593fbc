package ssd

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/orbitkv/orbitkv/internal/page"
)

// RegionBytes is the unit the files are carved into. A slot size claims a
// region (or, for slots larger than RegionBytes, a run of k regions aligned
// to k) on first use and packs it with slots of that one size.
const RegionBytes = 64 << 20

// ErrFull reports that no free slot of the requested size exists.
var ErrFull = errors.New("ssd tier full")

// ErrTooLarge reports a page that can never fit: its slot is larger than a
// file. Unlike ErrFull, evicting pages will not help.
var ErrTooLarge = errors.New("page larger than an ssd file")

// SlotBytes returns the slot length for a page of dataLen bytes: one header
// block plus the data rounded up to page.Alignment.
func SlotBytes(dataLen uint64) uint64 { return page.HeaderSize + page.AlignUp(dataLen) }

// region is a run of chunks holding slots of one size.
type region struct {
	file       uint32
	start      int // first chunk
	chunks     int
	slotBytes  uint64
	nslots     int
	free       int
	used       []uint64 // bitmap, bit i = slot i allocated
	partialIdx int      // index in its class's partial list, -1 if not there
}

// allocator decides where slots go. It is pure: no I/O, no locking; the
// Store guards it with its mutex.
type allocator struct {
	chunkBytes uint64
	files      [][]*region          // per file, per chunk: owning region or nil
	partial    map[uint64][]*region // slot size -> regions with a free slot
	used       uint64               // bytes in allocated slots
	capacity   uint64               // bytes in all files
}

// newAllocator returns an allocator over files of the given sizes (each a
// multiple of chunkBytes).
func newAllocator(chunkBytes uint64, fileBytes []uint64) *allocator {
	a := &allocator{chunkBytes: chunkBytes, partial: map[uint64][]*region{}}
	for _, n := range fileBytes {
		a.files = append(a.files, make([]*region, n/chunkBytes))
		a.capacity += n / chunkBytes * chunkBytes
	}
	return a
}

// chunksFor returns how many chunks a region of slotBytes slots spans.
func (a *allocator) chunksFor(slotBytes uint64) int {
	return int((slotBytes + a.chunkBytes - 1) / a.chunkBytes)
}

func (a *allocator) alloc(slotBytes uint64) (Loc, error) {
	if slotBytes < page.HeaderSize || slotBytes%page.Alignment != 0 {
		return Loc{}, fmt.Errorf("alloc slot of %d bytes: not a multiple of %d", slotBytes, page.Alignment)
	}
	if p := a.partial[slotBytes]; len(p) > 0 {
		return a.take(p[len(p)-1]), nil
	}
	k := a.chunksFor(slotBytes)
	if k > a.maxChunks() {
		return Loc{}, fmt.Errorf("alloc slot of %d bytes: %w", slotBytes, ErrTooLarge)
	}
	for f := range a.files {
		if start, ok := a.freeRun(f, k); ok {
			return a.take(a.newRegion(uint32(f), start, slotBytes)), nil
		}
	}
	return Loc{}, fmt.Errorf("alloc slot of %d bytes: %w", slotBytes, ErrFull)
}

func (a *allocator) maxChunks() int {
	m := 0
	for _, f := range a.files {
		m = max(m, len(f))
	}
	return m
}

// freeRun finds the first free run of k chunks starting at a multiple of k.
func (a *allocator) freeRun(f, k int) (int, bool) {
	chunks := a.files[f]
	for start := 0; start+k <= len(chunks); start += k {
		if a.runFree(f, start, k) {
			return start, true
		}
	}
	return 0, false
}

func (a *allocator) runFree(f, start, k int) bool {
	for _, r := range a.files[f][start : start+k] {
		if r != nil {
			return false
		}
	}
	return true
}

func (a *allocator) newRegion(f uint32, start int, slotBytes uint64) *region {
	k := a.chunksFor(slotBytes)
	n := int(uint64(k) * a.chunkBytes / slotBytes)
	r := &region{file: f, start: start, chunks: k, slotBytes: slotBytes, nslots: n, free: n,
		used: make([]uint64, (n+63)/64), partialIdx: -1}
	for i := start; i < start+k; i++ {
		a.files[f][i] = r
	}
	a.addPartial(r)
	return r
}

// take allocates the first free slot of r, which has one.
func (a *allocator) take(r *region) Loc {
	for w, word := range r.used {
		if word != ^uint64(0) {
			slot := w*64 + bits.TrailingZeros64(^word)
			a.mark(r, slot)
			return Loc{File: r.file, Offset: a.slotOffset(r, slot), Bytes: r.slotBytes}
		}
	}
	panic("ssd: take from a full region")
}

func (a *allocator) slotOffset(r *region, slot int) uint64 {
	return uint64(r.start)*a.chunkBytes + uint64(slot)*r.slotBytes
}

func (a *allocator) mark(r *region, slot int) {
	r.used[slot/64] |= 1 << (slot % 64)
	r.free--
	a.used += r.slotBytes
	if r.free == 0 {
		a.removePartial(r)
	}
}

func (a *allocator) addPartial(r *region) {
	p := a.partial[r.slotBytes]
	r.partialIdx = len(p)
	a.partial[r.slotBytes] = append(p, r)
}

func (a *allocator) removePartial(r *region) {
	p := a.partial[r.slotBytes]
	last := p[len(p)-1]
	p[r.partialIdx], last.partialIdx = last, r.partialIdx
	a.partial[r.slotBytes] = p[:len(p)-1]
	r.partialIdx = -1
}

// free releases the slot at loc; a region left empty goes back to the free
// chunks so that another slot size may claim it.
func (a *allocator) free(loc Loc) error {
	r, slot, err := a.find(loc)
	if err != nil {
		return err
	}
	if !r.isUsed(slot) {
		return fmt.Errorf("free %+v: slot not allocated", loc)
	}
	r.used[slot/64] &^= 1 << (slot % 64)
	r.free++
	a.used -= r.slotBytes
	if r.free == 1 {
		a.addPartial(r)
	}
	if r.free == r.nslots {
		a.removePartial(r)
		clear(a.files[r.file][r.start : r.start+r.chunks])
	}
	return nil
}

// isAllocated reports whether loc is exactly an allocated slot.
func (a *allocator) isAllocated(loc Loc) bool {
	r, slot, err := a.find(loc)
	return err == nil && r.isUsed(slot)
}

// reserve marks loc as allocated, claiming its region if no size owns it
// yet. Given the Locs of a previous run, it rebuilds that run's regions.
func (a *allocator) reserve(loc Loc) error {
	start, k, err := a.regionOf(loc)
	if err != nil {
		return err
	}
	chunks := a.files[loc.File]
	r := chunks[start]
	if r == nil && a.runFree(int(loc.File), start, k) {
		r = a.newRegion(loc.File, start, loc.Bytes)
	}
	r, slot, err := a.find(loc)
	if err != nil {
		return err
	}
	if r.isUsed(slot) {
		return fmt.Errorf("reserve %+v: overlaps an allocated slot", loc)
	}
	a.mark(r, slot)
	return nil
}

// regionOf checks loc's shape and returns the chunk run its region must
// occupy.
func (a *allocator) regionOf(loc Loc) (start, k int, err error) {
	if loc.Bytes < page.HeaderSize || loc.Bytes%page.Alignment != 0 || loc.Offset%page.Alignment != 0 {
		return 0, 0, fmt.Errorf("slot %+v: misaligned", loc)
	}
	if int(loc.File) >= len(a.files) {
		return 0, 0, fmt.Errorf("slot %+v: no file %d", loc, loc.File)
	}
	k = a.chunksFor(loc.Bytes)
	start = int(loc.Offset/a.chunkBytes) / k * k
	if start+k > len(a.files[loc.File]) {
		return 0, 0, fmt.Errorf("slot %+v: beyond the end of the file", loc)
	}
	rel := loc.Offset - uint64(start)*a.chunkBytes
	if rel%loc.Bytes != 0 || rel+loc.Bytes > uint64(k)*a.chunkBytes {
		return 0, 0, fmt.Errorf("slot %+v: not on a slot boundary", loc)
	}
	return start, k, nil
}

// find returns the region and slot index that loc names exactly.
func (a *allocator) find(loc Loc) (*region, int, error) {
	start, _, err := a.regionOf(loc)
	if err != nil {
		return nil, 0, err
	}
	r := a.files[loc.File][start]
	if r == nil || r.start != start || r.slotBytes != loc.Bytes {
		return nil, 0, fmt.Errorf("slot %+v: overlaps a region of another slot size", loc)
	}
	return r, int((loc.Offset - uint64(start)*a.chunkBytes) / r.slotBytes), nil
}

func (r *region) isUsed(slot int) bool { return r.used[slot/64]&(1<<(slot%64)) != 0 }
