package ssd

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
)

// TestScanHeadersReadsHeadersOnly (issue 34, finding 2): ScanHeaders finds
// every written page, the regions named by the caller and those it is not
// told of, reading one header block per slot of the regions in use and one
// per unused region, never the pages' data: a page whose data was damaged
// is still reported (its data is verified where it is read: VerifySlot and
// Read fail it).
func TestScanHeadersReadsHeadersOnly(t *testing.T) {
	dir := testDir(t)
	s := openTest(t, dir, 4*RegionBytes)
	rng := rand.New(rand.NewPCG(3, 4))
	var pages []testPage
	for i := range 12 {
		length := uint64(5000) // 3 blocks a slot
		if i%3 == 0 {
			length = 3 * page.Alignment // 4 blocks a slot
		}
		pages = append(pages, newPage(t, s, rng, length))
	}
	var reqs []WriteReq
	for _, p := range pages {
		reqs = append(reqs, WriteReq{Loc: p.loc, Header: p.hdr, Data: p.data})
	}
	for i, err := range s.Write(context.Background(), reqs) {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	damaged := pages[4]
	fd, err := unix.Open(filepath.Join(dir, FileName(int(damaged.loc.File))), unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, []byte{0xff, 0xfe}, int64(damaged.loc.Offset+page.HeaderSize+10)); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)

	regions := map[[2]uint64]uint64{} // (file, region start) -> slot bytes
	for _, p := range pages {
		regions[[2]uint64{uint64(p.loc.File), p.loc.Offset / RegionBytes}] = p.loc.Bytes
	}
	if len(regions) != 2 {
		t.Fatalf("pages in %d regions, want 2", len(regions))
	}
	var wantBytes uint64 = (4 - 2) * page.HeaderSize // the unused regions' first blocks
	for _, sb := range regions {
		wantBytes += RegionBytes / sb * page.HeaderSize
	}
	for _, named := range [][]Loc{nil, {pages[0].loc}, {pages[0].loc, pages[1].loc}} {
		found := map[Loc]page.Header{}
		st, err := s.ScanHeaders(named, func(f Found) { found[f.Loc] = f.Header })
		if err != nil {
			t.Fatal(err)
		}
		if st.Pages != len(pages) || len(found) != len(pages) {
			t.Fatalf("named %d: ScanHeaders = %+v, %d found; want %d pages", len(named), st, len(found), len(pages))
		}
		for i, p := range pages {
			if h, ok := found[p.loc]; !ok || h != p.hdr {
				t.Fatalf("named %d: page %d at %+v: found %+v %v, want %+v", len(named), i, p.loc, h, ok, p.hdr)
			}
		}
		if st.BytesRead != wantBytes {
			t.Fatalf("named %d: read %d bytes, want %d (header blocks only)", len(named), st.BytesRead, wantBytes)
		}
	}
	var corrupt *page.CorruptError
	if err := s.VerifySlot(context.Background(), damaged.loc, damaged.hdr); !errors.As(err, &corrupt) {
		t.Fatalf("VerifySlot of the damaged page: %v, want a CorruptError", err)
	}
	if err := s.VerifySlot(context.Background(), pages[5].loc, pages[5].hdr); err != nil {
		t.Fatalf("VerifySlot of a whole page: %v", err)
	}
}
