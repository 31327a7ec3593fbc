package ssd

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
)

// TestScanFindsWrittenPages writes pages of two sizes, tears one, and
// checks that Scan reports exactly the whole ones with their headers.
func TestScanFindsWrittenPages(t *testing.T) {
	dir := testDir(t)
	s := openTest(t, dir, 2*RegionBytes)
	rng := rand.New(rand.NewPCG(1, 2))
	var pages []testPage
	for i := range 12 {
		length := uint64(5000)
		if i%3 == 0 {
			length = 3 * page.Alignment
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
	// Tear page 4: its last data block is overwritten behind the tier's back.
	torn := pages[4]
	fd, err := unix.Open(filepath.Join(dir, FileName(int(torn.loc.File))), unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, []byte{0xff, 0xfe}, int64(torn.loc.Offset+page.HeaderSize+10)); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)

	found := map[Loc]page.Header{}
	st, err := s.Scan(func(f Found) { found[f.Loc] = f.Header })
	if err != nil {
		t.Fatal(err)
	}
	if st.Pages != len(pages)-1 || st.Torn != 1 || len(found) != len(pages)-1 {
		t.Fatalf("Scan = %+v, %d found; want %d pages and 1 torn", st, len(found), len(pages)-1)
	}
	for i, p := range pages {
		h, ok := found[p.loc]
		if i == 4 {
			if ok {
				t.Fatal("torn page reported")
			}
			continue
		}
		if !ok || h != p.hdr {
			t.Fatalf("page %d at %+v: found %+v %v, want %+v", i, p.loc, h, ok, p.hdr)
		}
	}
}

// TestFailedPreallocationThroughTheSeam is the same check without root: the
// fault seam fails the second file's preallocation (leaving it on disk, as
// a failed fallocate does), and Open must remove both files it created.
func TestFailedPreallocationThroughTheSeam(t *testing.T) {
	dir := testDir(t)
	fs := WithFaults(OS, func(path string, op *Op) error {
		if op.Point == Preallocate && filepath.Base(path) == FileName(1) {
			return unix.ENOSPC
		}
		return nil
	})
	if _, err := Open(Config{Dir: dir, CapacityBytes: 2 * RegionBytes, FileBytes: RegionBytes, FS: fs}); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Open = %v, want ENOSPC", err)
	}
	for i := range 2 {
		if _, err := os.Stat(filepath.Join(dir, FileName(i))); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("failed Open left %s: %v", FileName(i), err)
		}
	}
}

// mountTmpfs mounts a tmpfs of size bytes on a fresh directory, or skips
// saying why.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: mounting a small filesystem needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("skipping: mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestFailedPreallocationLeavesNoFiles: Open on a filesystem too small for
// the tier fails and removes the page files it created, but never a file
// that was there before.
func TestFailedPreallocationLeavesNoFiles(t *testing.T) {
	dir := mountTmpfs(t, "8m")
	if _, err := Open(Config{Dir: dir, CapacityBytes: 2 * RegionBytes, FileBytes: RegionBytes}); err == nil {
		t.Fatal("Open of 128 MiB of page files on an 8 MiB filesystem succeeded")
	}
	if des, _ := os.ReadDir(dir); len(des) != 0 {
		t.Fatalf("failed Open left %d files: %v", len(des), des)
	}
	keep := filepath.Join(dir, FileName(0))
	if err := os.WriteFile(keep, []byte("pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: dir, CapacityBytes: 2 * RegionBytes, FileBytes: RegionBytes}); err == nil {
		t.Fatal("Open succeeded")
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("failed Open removed a file it did not create: %v", err)
	}
}

// TestScanBeyondFindsPagesOutsideTheTier: pages a former, larger
// configuration wrote outside a smaller tier (past a file's new size, in a
// file it no longer uses) are found by ScanBeyond, and only those; with
// the tier disabled every page is.
func TestScanBeyondFindsPagesOutsideTheTier(t *testing.T) {
	for _, c := range []struct {
		name           string
		fileBytes      uint64 // of the writing configuration (2 regions in all)
		tierCap, tierF uint64 // of the smaller one; 0: disabled
	}{
		{"fewer files", RegionBytes, RegionBytes, RegionBytes},
		{"shorter files", 2 * RegionBytes, RegionBytes, RegionBytes},
		{"tier disabled", RegionBytes, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := testDir(t)
			s, err := Open(Config{Dir: dir, CapacityBytes: 2 * RegionBytes, FileBytes: c.fileBytes, QueueDepth: 8})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			var pages []testPage
			for _, length := range []uint64{5000, 3 * page.Alignment, 5000, 3 * page.Alignment} {
				pages = append(pages, newPage(t, s, rng, length)) // each size claims its own region
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
			s.Close()
			var tier *Store
			if c.tierCap > 0 {
				tier, err = Open(Config{Dir: dir, CapacityBytes: c.tierCap, FileBytes: c.tierF, QueueDepth: 8})
				if err != nil {
					t.Fatal(err)
				}
				defer tier.Close()
			}
			found := map[Loc]page.Header{}
			if _, err := ScanBeyond(dir, tier, func(f Found) { found[f.Loc] = f.Header }); err != nil {
				t.Fatal(err)
			}
			outside := 0
			for i, p := range pages {
				h, ok := found[p.loc]
				out := tier == nil || !tier.Holds(p.loc)
				if out {
					outside++
				}
				if ok != out || ok && h != p.hdr {
					t.Fatalf("page %d at %+v: found %v (%+v), want found %v", i, p.loc, ok, h, out)
				}
			}
			if outside == 0 || len(found) != outside {
				t.Fatalf("found %d pages, %d outside the tier; want some, all found", len(found), outside)
			}
		})
	}
}

// TestRemoveCreatedKeepsFilesThatExisted: a start given up after Open (a
// refused configuration) removes the page files Open made, and only those.
func TestRemoveCreatedKeepsFilesThatExisted(t *testing.T) {
	dir := testDir(t)
	s, err := Open(Config{Dir: dir, CapacityBytes: RegionBytes, FileBytes: RegionBytes})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s, err = Open(Config{Dir: dir, CapacityBytes: 3 * RegionBytes, FileBytes: RegionBytes}) // makes 001 and 002
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if err := s.RemoveCreated(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		_, err := os.Stat(filepath.Join(dir, FileName(i)))
		if exists := err == nil; exists != want {
			t.Errorf("%s exists %v after RemoveCreated, want %v", FileName(i), exists, want)
		}
	}
}
