package store

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

func TestReconcile(t *testing.T) {
	key := func(i byte) pagekey.Key { return pagekey.Key{i} }
	found := func(k byte, gen, off uint64) ssd.Found {
		return ssd.Found{Loc: ssd.Loc{Offset: off, Bytes: 8192}, Header: page.Header{Key: key(k), Length: 4096, Checksum: uint32(gen), Generation: gen}}
	}
	entry := func(f ssd.Found) catalog.Entry { e := entryOfFound(f); e.LastAccess, e.Hits = 7, 3; return e }
	type want struct {
		key       byte
		gens      []uint64 // candidates' generations, best first
		inCatalog bool
		vouched   bool
	}
	for _, tc := range []struct {
		name    string
		entries []catalog.Entry
		found   []ssd.Found
		scanned bool
		want    []want
	}{
		{"confirmed entry, not its stale copy", []catalog.Entry{entry(found(1, 5, 0))},
			[]ssd.Found{found(1, 2, 8192), found(1, 5, 0)}, true, []want{{1, []uint64{5}, true, true}}},
		{"confirmed entry first, a newer copy after", []catalog.Entry{entry(found(1, 5, 0))},
			[]ssd.Found{found(1, 7, 8192), found(1, 5, 0)}, true, []want{{1, []uint64{5, 7}, true, true}}},
		{"entry whose slot lost its page: no older copy", []catalog.Entry{entry(found(1, 5, 0))},
			[]ssd.Found{found(1, 2, 8192)}, true, []want{{1, nil, true, false}}},
		{"entry whose slot lost its page: a newer copy the catalog lost", []catalog.Entry{entry(found(1, 5, 0))},
			[]ssd.Found{found(1, 2, 8192), found(1, 7, 16384)}, true, []want{{1, []uint64{7}, true, false}}},
		{"entry with nothing on disk is dropped", []catalog.Entry{entry(found(1, 5, 0))},
			nil, true, []want{{1, nil, true, false}}},
		{"pages the catalog lost, newest first", nil,
			[]ssd.Found{found(2, 3, 0), found(3, 9, 8192), found(2, 4, 16384)}, true,
			[]want{{3, []uint64{9}, false, false}, {2, []uint64{4, 3}, false, false}}},
		{"confirmed keys before rebuilt ones", []catalog.Entry{entry(found(1, 1, 0))},
			[]ssd.Found{found(2, 8, 8192), found(1, 1, 0)}, true,
			[]want{{1, []uint64{1}, true, true}, {2, []uint64{8}, false, false}}},
		{"without a scan the catalog is trusted", []catalog.Entry{entry(found(1, 5, 0))},
			nil, false, []want{{1, []uint64{5}, true, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := reconcile(tc.entries, tc.found, tc.scanned)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d choices %+v, want %d", len(got), got, len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.key != key(w.key) || g.inCatalog != w.inCatalog || g.vouched != w.vouched || len(g.cands) != len(w.gens) {
					t.Fatalf("choice %d = %+v, want %+v", i, g, w)
				}
				for j, gen := range w.gens {
					if g.cands[j].Generation != gen {
						t.Fatalf("choice %d candidate %d generation %d, want %d", i, j, g.cands[j].Generation, gen)
					}
					if w.inCatalog && (g.cands[j].LastAccess != 7 || g.cands[j].Hits != 3) {
						t.Fatalf("candidate lost the entry's access time: %+v", g.cands[j])
					}
				}
			}
		})
	}
}

// TestContradicting: a slot the catalog names holding, at the entry's
// generation or an older one, anything but the entry's page (another
// checksum, as a consistent rewrite leaves; another key) contradicts the
// catalog and is set aside; the entry's own page, a newer generation there
// and slots the catalog does not name are usable.
func TestContradicting(t *testing.T) {
	at := func(k byte, gen, sum, off uint64) ssd.Found {
		return ssd.Found{Loc: ssd.Loc{Offset: off, Bytes: 8192},
			Header: page.Header{Key: pagekey.Key{k}, Length: 4096, Checksum: uint32(sum), Generation: gen}}
	}
	entries := []catalog.Entry{entryOfFound(at(1, 5, 5, 0)), entryOfFound(at(2, 6, 6, 8192)),
		entryOfFound(at(3, 7, 7, 16384)), entryOfFound(at(4, 8, 8, 24576))}
	found := []ssd.Found{
		at(1, 5, 99, 0),    // the entry's slot and generation, another checksum: contradicts
		at(9, 4, 4, 8192),  // another key, older, in key 2's slot: contradicts
		at(5, 9, 9, 16384), // a newer generation in key 3's slot: the catalog lost its commit
		at(4, 8, 8, 24576), // key 4's own page
		at(6, 1, 1, 32768), // a slot the catalog does not name
	}
	usable, bad := contradicting(entries, found, 0)
	if len(bad) != 2 || bad[0].Found != found[0] || bad[0].Entry.Key != (pagekey.Key{1}) ||
		bad[1].Found != found[1] || bad[1].Entry.Key != (pagekey.Key{2}) {
		t.Fatalf("contradicting slots %+v, want the first two found with their entries", bad)
	}
	if len(usable) != 3 || usable[0] != found[2] || usable[1] != found[3] || usable[2] != found[4] {
		t.Fatalf("usable %+v, want the last three found", usable)
	}
}

// TestContradictingAboveLimit: with a generation limit recorded, a slot
// above it is nobody's save and is set aside, named or not, newer than its
// entry or not; only the exact entry naming the slot is kept above it (a
// save whose limit could not be recorded, vouched for by its record).
// Such slots never push the generations a start hands out.
func TestContradictingAboveLimit(t *testing.T) {
	at := func(k byte, gen, off uint64) ssd.Found {
		return ssd.Found{Loc: ssd.Loc{Offset: off, Bytes: 8192},
			Header: page.Header{Key: pagekey.Key{k}, Length: 4096, Checksum: uint32(gen), Generation: gen}}
	}
	const limit = 100
	entries := []catalog.Entry{entryOfFound(at(1, 5, 0)), entryOfFound(at(2, 150, 8192))}
	found := []ssd.Found{
		at(1, 1<<40, 0),   // newer than its entry, above the limit: forged
		at(2, 150, 8192),  // exactly its entry, above the limit: vouched
		at(3, 101, 16384), // no entry, above the limit: forged
		at(4, 100, 24576), // no entry, within the limit: a lost commit
	}
	usable, bad := contradicting(entries, found, limit)
	if len(bad) != 2 || bad[0].Found != found[0] || !bad[0].AboveLimit || bad[0].Entry.Key != (pagekey.Key{1}) ||
		bad[1].Found != found[2] || !bad[1].AboveLimit || bad[1].Entry.OnSSD {
		t.Fatalf("set aside %+v, want the first and third found, above the limit", bad)
	}
	if len(usable) != 2 || usable[0] != found[1] || usable[1] != found[3] {
		t.Fatalf("usable %+v, want the second and fourth found", usable)
	}
	if _, bad := contradicting(entries, found, 0); len(bad) != 0 {
		t.Fatalf("without a limit recorded set aside %+v, want none", bad)
	}
	if g := newestGen(entries, found, limit); g != 150 {
		t.Fatalf("newest generation %d, want 150 (the catalog's; no slot above the limit)", g)
	}
}

// TestGenLimitCoversHandedOut: the limit on disk is at or above every
// generation handed out, raised a block at a time; a file that does not
// read back whole is no limit.
func TestGenLimitCoversHandedOut(t *testing.T) {
	s := testStore(t, 64<<20)
	if _, ok := readGenLimit(s.opts.SSDDir); ok {
		t.Fatal("a limit before any generation was handed out")
	}
	for range genBlock + 2 {
		g := s.nextGen()
		if l, ok := readGenLimit(s.opts.SSDDir); !ok || l < g {
			t.Fatalf("generation %d handed out with the limit %d (%v) on disk", g, l, ok)
		}
	}
	if l, _ := readGenLimit(s.opts.SSDDir); l != 2*genBlock+2 {
		t.Fatalf("limit %d, want %d: raised when generation %d passed the first", l, 2*genBlock+2, genBlock+2)
	}
	path := filepath.Join(s.opts.SSDDir, genLimitName)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 1
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if l, ok := readGenLimit(s.opts.SSDDir); ok {
		t.Fatalf("damaged limit file read as %d", l)
	}
}
