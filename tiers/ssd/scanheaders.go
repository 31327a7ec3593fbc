package ssd

import (
	"context"
	"fmt"
	"sync"

	"github.com/orbitkv/orbitkv/internal/page"
)

// scanWorkers is how many region runs ScanHeaders reads at once.
const scanWorkers = 16

// ScanHeaders finds, like Scan, the slots whose header block decodes and
// lies on the allocator's grid for its page size, but reads header blocks
// only, never page data: it is the start-up check of an intact catalog
// (fabric/store/recover.go), whose reads then cost one block per slot, not
// the tier's bytes. Found pages are not verified: their data is checked
// where it is read (Read checks every byte against the caller's checksum),
// and a caller adopting a page the catalog did not name verifies it first
// (VerifySlot).
//
// A region's slot size comes from named, the slots the caller's catalog
// names (Reserve rebuilds regions the same way), else from the header at
// the region's start: the allocator hands out a region's slots lowest
// first, so a region that held a page has one at its start unless that
// write never reached the disk. Each slot of that size in the region run
// has its header block read. Call it before the first Write, like Scan.
func (s *Store) ScanHeaders(named []Loc, fn func(Found)) (ScanStats, error) {
	type run struct {
		file      uint32
		chunk     int
		slotBytes uint64 // 0: read the region's first header to learn it
	}
	sizeAt := map[[2]uint64]uint64{} // (file, first chunk) -> slot bytes
	a := newAllocator(RegionBytes, s.sizes)
	for _, l := range named {
		if start, _, err := a.regionOf(l); err == nil {
			sizeAt[[2]uint64{uint64(l.File), uint64(start)}] = l.Bytes
		}
	}
	var runs []run
	for f, size := range s.sizes {
		chunks := int(size / RegionBytes)
		for c := 0; c < chunks; {
			sb := sizeAt[[2]uint64{uint64(f), uint64(c)}]
			runs = append(runs, run{file: uint32(f), chunk: c, slotBytes: sb})
			if sb == 0 {
				c++
				continue
			}
			c += a.chunksFor(sb)
		}
	}
	results := make([][]Found, len(runs))
	stats := make([]ScanStats, len(runs))
	errs := make([]error, len(runs))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(scanWorkers, len(runs)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := alignedBytes(page.HeaderSize)
			for i := range next {
				r := runs[i]
				results[i], errs[i] = s.scanRun(a, r.file, r.chunk, r.slotBytes, buf, &stats[i])
			}
		}()
	}
	for i := range runs {
		next <- i
	}
	close(next)
	wg.Wait()
	var st ScanStats
	for i := range runs {
		st.BytesRead += stats[i].BytesRead
		if errs[i] != nil {
			return st, errs[i]
		}
		for _, f := range results[i] {
			st.Pages++
			fn(f)
		}
	}
	return st, nil
}

// scanRun reads the header blocks of one region run's slots of slotBytes
// (learnt from the run's first header when 0). a is the tier's grid, only
// read (regionOf), so the workers share it.
func (s *Store) scanRun(a *allocator, f uint32, chunk int, slotBytes uint64, buf []byte, st *ScanStats) ([]Found, error) {
	onGrid := func(loc Loc) bool { _, _, err := a.regionOf(loc); return err == nil } // a is only read
	base := uint64(chunk) * RegionBytes
	// read returns the header block at off, ok when it decodes.
	read := func(off uint64) (page.Header, bool, error) {
		if err := pread(s.files[f].Fd(), buf, off); err != nil {
			return page.Header{}, false, fmt.Errorf("scan %s headers at %d: %w", FileName(int(f)), off, err)
		}
		st.BytesRead += page.HeaderSize
		h, err := page.Decode(buf)
		return h, err == nil, nil
	}
	var out []Found
	if slotBytes == 0 {
		h, ok, err := read(base)
		if err != nil {
			return nil, err
		}
		loc := Loc{File: f, Offset: base, Bytes: SlotBytes(h.Length)}
		if !ok || !onGrid(loc) {
			return nil, nil
		}
		out = append(out, Found{Loc: loc, Header: h})
		slotBytes = loc.Bytes
		base += slotBytes
	}
	k := (slotBytes + RegionBytes - 1) / RegionBytes
	end := min(uint64(chunk)*RegionBytes+k*RegionBytes, s.sizes[f])
	for off := base; off+slotBytes <= end; off += slotBytes {
		h, ok, err := read(off)
		if err != nil {
			return nil, err
		}
		if loc := (Loc{File: f, Offset: off, Bytes: SlotBytes(h.Length)}); ok && onGrid(loc) {
			out = append(out, Found{Loc: loc, Header: h})
		}
	}
	return out, nil
}

// VerifySlot reads the page at loc and checks it against want (key,
// layout, length, generation, checksum) and its data against that
// checksum, as Read does: nil when the slot holds that page whole.
func (s *Store) VerifySlot(ctx context.Context, loc Loc, want page.Header) error {
	buf := alignedBytes(int(page.AlignUp(want.Length)))
	return s.Read(ctx, []ReadReq{{Loc: loc, Want: want, Dst: buf}})[0]
}
