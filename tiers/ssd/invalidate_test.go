package ssd

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// TestInvalidate: a slot whose header was invalidated is found by neither
// scan after a reopen, nor read as its page; its neighbours are.
func TestInvalidate(t *testing.T) {
	dir := testDir(t)
	s := openTest(t, dir, 2*RegionBytes)
	rng := rand.New(rand.NewPCG(5, 6))
	var pages []testPage
	for range 3 {
		pages = append(pages, newPage(t, s, rng, 5000))
	}
	writeAll(t, s, pages)
	if err := s.Invalidate([]Loc{pages[1].loc}); err != nil {
		t.Fatal(err)
	}
	if err := readAll(t, s, pages[1:2])[0]; err == nil {
		t.Fatal("an invalidated slot read as its page")
	}
	if err := s.Invalidate([]Loc{{File: 9, Offset: 0, Bytes: 8192}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Invalidate of a slot outside the files: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Invalidate([]Loc{pages[0].loc}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Invalidate on a closed store: %v", err)
	}
	want := map[Loc]bool{pages[0].loc: true, pages[2].loc: true}
	for _, scan := range []string{"full", "headers"} {
		s2 := openTest(t, dir, 2*RegionBytes)
		got := map[Loc]bool{}
		fn := func(f Found) { got[f.Loc] = true }
		var err error
		if scan == "full" {
			_, err = s2.Scan(fn)
		} else {
			_, err = s2.ScanHeaders([]Loc{pages[0].loc}, fn)
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) || !got[pages[0].loc] || !got[pages[2].loc] {
			t.Fatalf("%s scan found %v, want %v", scan, got, want)
		}
		s2.Close()
	}
}
