package ssd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// testDir returns a temporary directory that supports O_DIRECT, or skips.
func testDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	fd, err := unix.Open(filepath.Join(dir, "probe"), unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT, 0o600)
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("skipping: %s does not support O_DIRECT (tmpfs?); set TMPDIR to a disk filesystem", dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	return dir
}

func openTest(t *testing.T, dir string, capacity uint64) *Store {
	t.Helper()
	s, err := Open(Config{Dir: dir, CapacityBytes: capacity, FileBytes: RegionBytes, QueueDepth: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testPage is a page with its slot and contents.
type testPage struct {
	loc  Loc
	hdr  page.Header
	data []byte // aligned, padded
}

func newPage(t *testing.T, s *Store, rng *rand.Rand, length uint64) testPage {
	t.Helper()
	loc, err := s.Alloc(length)
	if err != nil {
		t.Fatal(err)
	}
	data := alignedBytes(int(page.AlignUp(length)))
	for i := range data[:length] {
		data[i] = byte(rng.Uint32())
	}
	h := page.Header{Length: length, Checksum: page.Checksum(data[:length]), Generation: rng.Uint64()}
	h.Key[0], h.Key[1], h.Key[2] = byte(loc.File), byte(loc.Offset>>12), byte(loc.Offset>>20)
	h.Layout = pagekey.Fingerprint{0: byte(length)}
	return testPage{loc: loc, hdr: h, data: data}
}

func writeAll(t *testing.T, s *Store, pages []testPage) {
	t.Helper()
	reqs := make([]WriteReq, len(pages))
	for i, p := range pages {
		reqs[i] = WriteReq{Loc: p.loc, Header: p.hdr, Data: p.data}
	}
	for i, err := range s.Write(context.Background(), reqs) {
		if err != nil {
			t.Fatalf("write page %d: %v", i, err)
		}
	}
}

// readAll reads pages back and compares their bytes when the read succeeds.
func readAll(t *testing.T, s *Store, pages []testPage) []error {
	t.Helper()
	reqs := make([]ReadReq, len(pages))
	for i, p := range pages {
		reqs[i] = ReadReq{Loc: p.loc, Want: p.hdr, Dst: alignedBytes(len(p.data))}
	}
	errs := s.Read(context.Background(), reqs)
	for i, err := range errs {
		if err == nil && string(reqs[i].Dst[:pages[i].hdr.Length]) != string(pages[i].data[:pages[i].hdr.Length]) {
			t.Fatalf("page %d: read success with different bytes", i)
		}
	}
	return errs
}

func mustRead(t *testing.T, s *Store, pages []testPage) {
	t.Helper()
	for i, err := range readAll(t, s, pages) {
		if err != nil {
			t.Fatalf("read page %d: %v", i, err)
		}
	}
}

var lengths = []uint64{1, 4096, 70001, 1<<20 + 5, 3 << 20}

func TestRoundTripConcurrent(t *testing.T) {
	s := openTest(t, testDir(t), 4*RegionBytes)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			var pages []testPage
			for range 12 {
				pages = append(pages, newPage(t, s, rng, lengths[rng.IntN(len(lengths))]))
			}
			writeAll(t, s, pages[:5])
			writeAll(t, s, pages[5:])
			mustRead(t, s, pages)
		})
	}
	wg.Wait()
	st := s.Stats()
	if st.Writes != 72 || st.Reads != 72 || st.InFlight != 0 || st.UsedBytes == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestReopenReserve(t *testing.T) {
	dir := testDir(t)
	s := openTest(t, dir, 6*RegionBytes) // a region per length
	rng := rand.New(rand.NewPCG(3, 3))
	var pages []testPage
	for i := range 20 {
		pages = append(pages, newPage(t, s, rng, lengths[i%len(lengths)]))
	}
	writeAll(t, s, pages)
	used := s.Stats().UsedBytes
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, 6*RegionBytes)
	for _, p := range pages {
		if err := s.Reserve(p.loc); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Stats().UsedBytes; got != used {
		t.Fatalf("used %d after Reserve, want %d", got, used)
	}
	mustRead(t, s, pages)
	fresh := newPage(t, s, rng, 4096)
	for _, p := range pages {
		if p.loc == fresh.loc {
			t.Fatalf("Alloc after Reserve returned live slot %+v", p.loc)
		}
	}
}

// flip xors one byte of a page file, bypassing the Store.
func flip(t *testing.T, dir string, loc Loc, at uint64) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, FileName(int(loc.File))), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, int64(loc.Offset+at)); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x20
	if _, err := f.WriteAt(b, int64(loc.Offset+at)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// rewriteConsistently changes a data byte of a page on disk and rewrites
// its header with the checksum of the changed data, bypassing the Store:
// the slot is self-consistent but no longer the page that was written.
func rewriteConsistently(t *testing.T, dir string, loc Loc) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, FileName(int(loc.File))), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	slot := make([]byte, loc.Bytes)
	if _, err := f.ReadAt(slot, int64(loc.Offset)); err != nil {
		t.Fatal(err)
	}
	if err := reseal(slot[:page.HeaderSize], slot[page.HeaderSize:]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(slot, int64(loc.Offset)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// reseal flips a data byte and re-encodes the header block with the new
// data's checksum.
func reseal(block, data []byte) error {
	h, err := page.Decode(block)
	if err != nil {
		return err
	}
	data[h.Length/2] ^= 0x5a
	h.Checksum = page.Checksum(data[:h.Length])
	h.Encode(block)
	return nil
}

func TestReadRejectsBadPages(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, dir string, p *testPage)
	}{
		{"flipped data byte", func(t *testing.T, dir string, p *testPage) { flip(t, dir, p.loc, page.HeaderSize+777) }},
		{"flipped header byte", func(t *testing.T, dir string, p *testPage) { flip(t, dir, p.loc, 30) }},
		// Issue 9, finding 6: the slot checks out against its own header,
		// but not against the checksum the caller (the catalog) recorded.
		{"rewritten consistently", func(t *testing.T, dir string, p *testPage) { rewriteConsistently(t, dir, p.loc) }},
		{"wrong key", func(t *testing.T, _ string, p *testPage) { p.hdr.Key[15] ^= 1 }},
		{"wrong generation", func(t *testing.T, _ string, p *testPage) { p.hdr.Generation++ }},
		{"wrong layout", func(t *testing.T, _ string, p *testPage) { p.hdr.Layout[3] ^= 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testDir(t)
			s := openTest(t, dir, RegionBytes)
			rng := rand.New(rand.NewPCG(4, 4))
			pages := []testPage{newPage(t, s, rng, 9000), newPage(t, s, rng, 9000), newPage(t, s, rng, 9000)}
			writeAll(t, s, pages)
			tc.mutate(t, dir, &pages[1])
			errs := readAll(t, s, pages)
			var ce *page.CorruptError
			if errs[0] != nil || errs[2] != nil || !errors.As(errs[1], &ce) {
				t.Fatalf("errs %v; want only page 1 corrupt", errs)
			}
		})
	}
}

func TestFull(t *testing.T) {
	s := openTest(t, testDir(t), RegionBytes)
	for range 3 { // 16 MiB + 4 KiB slots: 3 fit a 64 MiB region
		if _, err := s.Alloc(16 << 20); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []uint64{16 << 20, 4096} {
		if _, err := s.Alloc(n); !errors.Is(err, ErrFull) {
			t.Fatalf("Alloc(%d) = %v, want ErrFull", n, err)
		}
	}
	if _, err := s.Alloc(RegionBytes); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Alloc(region) = %v, want ErrTooLarge", err)
	}
}

func TestExpiredDeadline(t *testing.T) {
	s := openTest(t, testDir(t), RegionBytes)
	rng := rand.New(rand.NewPCG(5, 5))
	pages := []testPage{newPage(t, s, rng, 1<<20), newPage(t, s, rng, 1<<20)}
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	start := time.Now()
	w := s.Write(ctx, []WriteReq{{pages[0].loc, pages[0].hdr, pages[0].data}, {pages[1].loc, pages[1].hdr, pages[1].data}})
	r := s.Read(ctx, []ReadReq{{pages[0].loc, pages[0].hdr, alignedBytes(1 << 20)}})
	for _, err := range append(w, r...) {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want DeadlineExceeded", err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("expired calls took %v", d)
	}
	if st := s.Stats(); st.InFlight != 0 || st.Writes != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCancelMidFlight(t *testing.T) {
	s := openTest(t, testDir(t), 2*RegionBytes)
	rng := rand.New(rand.NewPCG(6, 6))
	var reqs []WriteReq
	for range 40 {
		p := newPage(t, s, rng, 1<<20)
		reqs = append(reqs, WriteReq{p.loc, p.hdr, p.data})
	}
	ctx, cancel := context.WithCancel(context.Background())
	go cancel()
	for i, err := range s.Write(ctx, reqs) {
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("req %d: %v", i, err)
		}
	}
	if st := s.Stats(); st.InFlight != 0 {
		t.Fatalf("in flight %d after return", st.InFlight)
	}
}

func TestInvalidAndClosed(t *testing.T) {
	s := openTest(t, testDir(t), RegionBytes)
	rng := rand.New(rand.NewPCG(7, 7))
	p := newPage(t, s, rng, 8192)
	unaligned := alignedBytes(8192 + 16)[16:]
	stale := p.loc
	stale.Offset += 2 * stale.Bytes
	for name, req := range map[string]WriteReq{
		"short buffer": {p.loc, p.hdr, p.data[:4096]},
		"unaligned":    {p.loc, p.hdr, unaligned},
		"unallocated":  {stale, p.hdr, p.data},
		"slot size":    {Loc{p.loc.File, p.loc.Offset, p.loc.Bytes + 4096}, p.hdr, p.data},
	} {
		if err := s.Write(context.Background(), []WriteReq{req})[0]; !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Read(context.Background(), []ReadReq{{p.loc, p.hdr, p.data}})[0]; !errors.Is(err, ErrClosed) {
		t.Fatalf("read after Close: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{},
		{Dir: "x", CapacityBytes: RegionBytes - 1},
		{Dir: "x", CapacityBytes: RegionBytes, FileBytes: RegionBytes + 4096},
		{Dir: "x", CapacityBytes: RegionBytes, QueueDepth: -1},
		{Dir: "x", CapacityBytes: RegionBytes, Sync: 7},
	} {
		if c.Validate() == nil {
			t.Errorf("%+v validated", c)
		}
	}
	c := Config{Dir: "x", CapacityBytes: 5*RegionBytes + 1, FileBytes: 2 * RegionBytes}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(c.withDefaults().fileSizes()); got != fmt.Sprint([]uint64{2 * RegionBytes, 2 * RegionBytes, RegionBytes}) {
		t.Fatalf("file sizes %s", got)
	}
}

func TestConfigFlags(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"-ssd-dir=d", "-ssd-capacity-bytes=134217728", "-ssd-sync=none"}); err != nil {
		t.Fatal(err)
	}
	if c.Dir != "d" || c.CapacityBytes != 2*RegionBytes || c.Sync != SyncNone || c.Validate() != nil {
		t.Fatalf("parsed %+v", c)
	}
	if fs.Parse([]string{"-ssd-sync=always"}) == nil {
		t.Fatal("bad sync policy accepted")
	}
}

// TestShrunkConfiguration: a Store opened smaller than the one that wrote
// the files knows which slots it no longer holds, lists the files it does
// not use, and trims longer files to its size.
func TestShrunkConfiguration(t *testing.T) {
	dir := testDir(t)
	big, err := Open(Config{Dir: dir, CapacityBytes: 3 * 2 * RegionBytes, FileBytes: 2 * RegionBytes})
	if err != nil {
		t.Fatal(err)
	}
	big.Close()
	s := openTest(t, dir, 2*RegionBytes) // two files of one region
	for _, c := range []struct {
		loc  Loc
		want bool
	}{
		{Loc{File: 0, Offset: 0, Bytes: 8192}, true},
		{Loc{File: 1, Offset: RegionBytes - 8192, Bytes: 8192}, true},
		{Loc{File: 1, Offset: RegionBytes - 4096, Bytes: 8192}, false},
		{Loc{File: 0, Offset: RegionBytes, Bytes: 8192}, false},
		{Loc{File: 2, Offset: 0, Bytes: 8192}, false},
		{Loc{File: 0, Offset: 1 << 63, Bytes: 1 << 63}, false},
	} {
		if got := s.Holds(c.loc); got != c.want {
			t.Errorf("Holds(%+v) = %v, want %v", c.loc, got, c.want)
		}
	}
	stray, err := Stray(dir, 2)
	if err != nil || len(stray) != 1 || filepath.Base(stray[0]) != FileName(2) {
		t.Fatalf("stray files %v %v, want only %s", stray, err, FileName(2))
	}
	if err := s.Trim(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		st, err := os.Stat(filepath.Join(dir, FileName(i)))
		if err != nil || st.Size() != RegionBytes {
			t.Fatalf("file %d after trim: %v, want %d bytes", i, err, RegionBytes)
		}
	}
}
