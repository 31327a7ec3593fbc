package ssd

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
)

// Found is a page Scan found in the page files: its slot and header.
type Found struct {
	Loc    Loc
	Header page.Header
}

// ScanStats counts what a Scan read.
type ScanStats struct {
	BytesRead uint64 // bytes of page files read
	Pages     int    // whole pages found
	Torn      int    // headers whose data did not match their checksum
}

// Scan reads every page file from start to end and calls fn with each slot
// that holds a whole page: a header block that decodes (magic, version,
// own CRC), a slot on the allocator's grid for that page size (the offset
// a multiple of the slot length within its region run), and data matching
// the header's checksum. It is how a catalog is rebuilt from the page
// files (DESIGN.md §7): the slot headers are self-describing.
//
// Scan finds stale pages too (freed slots keep their bytes), so the caller
// decides, by generation, which copy of a key is current, and Reserves the
// slots it keeps. Call it before the first Write: it reads the files
// without the ring (pread on File.Fd, so File.Intercept does not see it),
// a region at a time, and does not lock out writers.
func (s *Store) Scan(fn func(Found)) (ScanStats, error) {
	var st ScanStats
	buf := alignedBytes(RegionBytes)
	for f, size := range s.sizes {
		for off := uint64(0); off < size; off += RegionBytes {
			if err := pread(s.files[f].Fd(), buf, off); err != nil {
				return st, fmt.Errorf("scan %s at %d: %w", FileName(f), off, err)
			}
			st.BytesRead += RegionBytes
			if err := s.scanRegion(uint32(f), off, buf, &st, fn); err != nil {
				return st, err
			}
		}
	}
	return st, nil
}

// scanRegion walks one region's header candidates, a block at a time,
// skipping the data of every page it accepts.
func (s *Store) scanRegion(f uint32, base uint64, buf []byte, st *ScanStats, fn func(Found)) error {
	for rel := uint64(0); rel < RegionBytes; {
		h, err := page.Decode(buf[rel : rel+page.HeaderSize])
		loc := Loc{File: f, Offset: base + rel, Bytes: SlotBytes(h.Length)}
		if err != nil || !s.onGrid(loc) {
			rel += page.HeaderSize
			continue
		}
		data, err := s.slotData(loc, base, buf)
		if err != nil {
			return err
		}
		if h.Verify(data[:h.Length]) != nil {
			st.Torn++
			rel += page.HeaderSize
			continue
		}
		st.Pages++
		fn(Found{Loc: loc, Header: h})
		rel += loc.Bytes
	}
	return nil
}

// onGrid reports whether loc is a slot the allocator could have handed
// out: inside a file, on a slot boundary of its region run.
func (s *Store) onGrid(loc Loc) bool {
	if loc.Bytes > s.sizes[loc.File] || loc.Offset+loc.Bytes > s.sizes[loc.File] {
		return false
	}
	a := allocator{chunkBytes: RegionBytes, files: [][]*region{make([]*region, s.sizes[loc.File]/RegionBytes)}}
	_, _, err := a.regionOf(Loc{File: 0, Offset: loc.Offset, Bytes: loc.Bytes})
	return err == nil
}

// slotData returns loc's data blocks: from the region buffer when the slot
// lies in it, else read on their own (a slot larger than what is left of
// the region).
func (s *Store) slotData(loc Loc, base uint64, buf []byte) ([]byte, error) {
	start := loc.Offset - base + page.HeaderSize
	end := loc.Offset - base + loc.Bytes
	if end <= uint64(len(buf)) {
		return buf[start:end], nil
	}
	data := alignedBytes(int(loc.Bytes - page.HeaderSize))
	if err := pread(s.files[loc.File].Fd(), data, loc.Offset+page.HeaderSize); err != nil {
		return nil, fmt.Errorf("scan %s at %d: %w", FileName(int(loc.File)), loc.Offset, err)
	}
	return data, nil
}

// pread fills buf from fd at off, retrying short reads and EINTR.
func pread(fd int, buf []byte, off uint64) error {
	for done := 0; done < len(buf); {
		n, err := unix.Pread(fd, buf[done:], int64(off)+int64(done))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return fmt.Errorf("read %d of %d bytes: end of file", done, len(buf))
		}
		done += n
	}
	return nil
}
