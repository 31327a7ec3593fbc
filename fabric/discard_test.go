package fabric

import (
	"bytes"
	"errors"
	"github.com/orbitkv/orbitkv/fabric/store"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// ssdFixture is a data dir whose SSD tier (two 64 MiB files) holds pages in
// both files: file 0 pages of one size, file 1 pages of another (each slot
// size claims its own region).
type ssdFixture struct {
	cfg    Config
	shm    map[engineclient.Flash]*engineclient.Shm
	pages  map[engineclient.Flash][]savedPage
	inFile map[uint32]int // pages per ssd file
}

type savedPage struct {
	key  []byte
	want []byte
}

var wideFlash = func() engineclient.Flash { f := tinyFlash; f.HeadDim = 32; return f }()

func newSSDFixture(t *testing.T) *ssdFixture {
	fx := &ssdFixture{cfg: smallConfig(t.TempDir()), shm: map[engineclient.Flash]*engineclient.Shm{},
		pages: map[engineclient.Flash][]savedPage{}, inFile: map[uint32]int{}}
	tp := startPeer(t, fx.cfg)
	// In this order: the first slot size claims file 0's region, the second
	// file 1's (a map's order would swap them at random).
	for _, fn := range []struct {
		f engineclient.Flash
		n int
	}{{tinyFlash, 3}, {wideFlash, 2}} {
		f, n := fn.f, fn.n
		e := tp.engine(f)
		fx.shm[f] = e.shm
		keys := randKeys(n)
		src := refs(keys, 0, 4)
		okOp(t)(e.Save(ctx(t), src, pb.Durability_DURABILITY_SSD))
		for i, k := range keys {
			fx.pages[f] = append(fx.pages[f], savedPage{key: k, want: e.page(src[i].Blocks)})
			ent, _ := tp.p.cat.Get(mustKey(t, k))
			fx.inFile[ent.SSD.File]++
		}
	}
	if fx.inFile[0] == 0 || fx.inFile[1] == 0 {
		t.Fatalf("pages per ssd file %v, want both files used", fx.inFile)
	}
	tp.shutdown()
	return fx
}

// check starts a peer on cfg and loads every saved page: those of the
// flashes in kept must come back byte-exact, the others be gone.
func (fx *ssdFixture) check(t *testing.T, cfg Config, kept ...engineclient.Flash) {
	t.Helper()
	tp := startPeer(t, cfg)
	defer tp.shutdown()
	for f, pages := range fx.pages {
		e, err := engineclient.Open(ctx(t), tp.conn, f.OpenRequest("m", fx.shm[f].Path))
		if err != nil {
			t.Fatal(err)
		}
		keep := false
		for _, k := range kept {
			keep = keep || k == f
		}
		for i, p := range pages {
			dst := refs([][]byte{p.key}, 40, 4)
			st, err := e.Load(ctx(t), dst)
			if err != nil {
				t.Fatal(err)
			}
			switch code := st.Pages[0].Code; {
			case keep && code != pb.PageCode_PAGE_OK:
				t.Fatalf("kept page %d (head dim %d): %v %s", i, f.HeadDim, code, st.Pages[0].Message)
			case keep && !bytes.Equal((&engine{f: f, shm: fx.shm[f]}).page(dst[0].Blocks), p.want):
				t.Fatalf("kept page %d (head dim %d) differs", i, f.HeadDim)
			case !keep && code != pb.PageCode_PAGE_NOT_FOUND:
				t.Fatalf("discarded page %d (head dim %d): %v, want not found", i, f.HeadDim, code)
			}
		}
	}
}

// TestSmallerSSDTierRefusesToStart: a restart whose SSD tier no longer
// covers pages the files hold (disabled, smaller, fewer files) refuses to
// start with a message naming --ssd-discard, and changes nothing: the old
// configuration then finds every page.
func TestSmallerSSDTierRefusesToStart(t *testing.T) {
	fx := newSSDFixture(t)
	for _, c := range []struct {
		name     string
		bytes    uint64
		fileSize uint64
		outside  int
	}{
		{"ssd tier disabled", 0, 64 << 20, fx.inFile[0] + fx.inFile[1]},
		{"ssd tier smaller", 64 << 20, 64 << 20, fx.inFile[1]},
		{"one larger file", 128 << 20, 128 << 20, fx.inFile[1]},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := fx.cfg
			cfg.SSDBytes, cfg.SSDFileBytes = bytesize.Size(c.bytes), bytesize.Size(c.fileSize)
			before := pageFileNames(t, cfg.DataDir)
			p, err := New(cfg, zerolog.New(io.Discard))
			// A refused start changes nothing on disk: no page file made, none removed.
			if after := pageFileNames(t, cfg.DataDir); !slices.Equal(before, after) {
				t.Errorf("page files %v before the refused start, %v after", before, after)
			}
			if err == nil {
				p.Close()
				t.Fatal("started with a tier that drops stored pages")
			}
			if !errors.Is(err, store.ErrWouldDiscard) || !strings.Contains(err.Error(), "--ssd-discard") ||
				!strings.Contains(err.Error(), strconv.Itoa(c.outside)+" pages") {
				t.Fatalf("refusal %q: want store.ErrWouldDiscard naming --ssd-discard and %d pages", err, c.outside)
			}
		})
	}
	fx.check(t, fx.cfg, tinyFlash, wideFlash)
}

// TestSSDDiscardDropsPagesOutsideTheTier: with --ssd-discard the pages
// outside the new tier are dropped from the catalog and their files
// removed; the pages inside it stay.
func TestSSDDiscardDropsPagesOutsideTheTier(t *testing.T) {
	fx := newSSDFixture(t)
	dir := filepath.Join(fx.cfg.DataDir, "ssd")
	smaller := fx.cfg
	smaller.SSDBytes, smaller.SSDDiscard = 64<<20, true
	fx.startDiscarding(t, smaller, fx.inFile[1])
	fx.check(t, smaller, tinyFlash)
	if _, err := os.Stat(filepath.Join(dir, ssd.FileName(1))); !os.IsNotExist(err) {
		t.Fatalf("page file 1 after discarding it: %v, want it removed", err)
	}
	fx.check(t, fx.cfg, tinyFlash) // the discarded pages stay gone

	off := fx.cfg
	off.SSDBytes, off.SSDDiscard = 0, true
	tp := startPeer(t, off)
	tp.shutdown()
	if left, _ := filepath.Glob(filepath.Join(dir, "*.pages")); len(left) != 0 {
		t.Fatalf("page files %v left after discarding the tier", left)
	}
	fx.check(t, fx.cfg)
}

// TestShrunkSSDTierWithoutCatalogRefusesToStart: with the catalog gone
// (deleted, or damaged and set aside) the pages beyond a smaller tier are
// known only from their slot headers. The start must still refuse, not
// rebuild the pages inside the tier and give the others up unseen; the old
// sizes then rebuild every page. With --ssd-discard the pages beyond go
// and those inside are rebuilt.
func TestShrunkSSDTierWithoutCatalogRefusesToStart(t *testing.T) {
	fx := newSSDFixture(t)
	catDir := filepath.Join(fx.cfg.DataDir, "catalog")
	smaller := fx.cfg
	smaller.SSDBytes = 64 << 20
	for _, c := range []struct {
		name    string
		cfg     Config
		outside int
	}{
		{"ssd tier smaller", smaller, fx.inFile[1]},
		{"ssd tier disabled", func() Config { c := fx.cfg; c.SSDBytes = 0; return c }(), fx.inFile[0] + fx.inFile[1]},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := os.RemoveAll(catDir); err != nil {
				t.Fatal(err)
			}
			p, err := New(c.cfg, zerolog.New(io.Discard))
			if err == nil {
				p.Close()
				t.Fatal("started over pages beyond the tier that only the page files name")
			}
			if !errors.Is(err, store.ErrWouldDiscard) || !strings.Contains(err.Error(), strconv.Itoa(c.outside)+" pages") {
				t.Fatalf("refusal %q: want store.ErrWouldDiscard naming %d pages", err, c.outside)
			}
		})
	}
	fx.check(t, fx.cfg, tinyFlash, wideFlash)

	if err := os.RemoveAll(catDir); err != nil {
		t.Fatal(err)
	}
	smaller.SSDDiscard = true
	fx.startDiscarding(t, smaller, fx.inFile[1])
	fx.check(t, smaller, tinyFlash)
}

// TestSSDDiscardTakesNoOlderCopyInside: a key whose current page lies
// beyond the smaller tier and an older copy inside it (a freed slot's
// bytes, the key evicted and saved again with another layout) is gone
// after --ssd-discard, catalog kept or deleted: recovery's rebuild from
// the slot headers must not bring the older copy back in its place.
func TestSSDDiscardTakesNoOlderCopyInside(t *testing.T) {
	for _, deleteCatalog := range []bool{false, true} {
		t.Run("catalog deleted "+strconv.FormatBool(deleteCatalog), func(t *testing.T) {
			cfg := smallConfig(t.TempDir())
			tp := startPeer(t, cfg)
			old, cur := tp.engine(tinyFlash), tp.engine(wideFlash)
			keys, filler := randKeys(1), randKeys(1) // filler holds file 0's region for old's slot size
			okOp(t)(old.Save(ctx(t), refs(append(keys, filler...), 0, 4), pb.Durability_DURABILITY_SSD))
			for _, tier := range []pb.Tier{pb.Tier_TIER_DRAM, pb.Tier_TIER_SSD} {
				if _, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: tier, Keys: keys}); err != nil {
					t.Fatal(err)
				}
			}
			okOp(t)(cur.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_SSD))
			if ent, _ := tp.p.cat.Get(mustKey(t, keys[0])); ent.SSD.File != 1 {
				t.Fatalf("re-saved page in ssd file %d, want file 1 (beyond the smaller tier)", ent.SSD.File)
			}
			tp.shutdown()
			if deleteCatalog {
				if err := os.RemoveAll(filepath.Join(cfg.DataDir, "catalog")); err != nil {
					t.Fatal(err)
				}
			}
			smaller := cfg
			smaller.SSDBytes, smaller.SSDDiscard = 64<<20, true
			tp = startPeer(t, smaller)
			defer tp.shutdown()
			e, err := engineclient.Open(ctx(t), tp.conn, tinyFlash.OpenRequest("m", old.shm.Path))
			if err != nil {
				t.Fatal(err)
			}
			st, err := e.Load(ctx(t), refs(keys, 40, 4))
			if err != nil {
				t.Fatal(err)
			}
			if code := st.Pages[0].Code; code != pb.PageCode_PAGE_NOT_FOUND {
				t.Fatalf("discarded key loads %v with its older layout, want not found (the older copy came back)", code)
			}
		})
	}
}

// pageFileNames lists the SSD page files under dataDir.
func pageFileNames(t *testing.T, dataDir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dataDir, "ssd", "orbitkv-*.pages"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// startDiscarding starts (and closes) a peer on cfg, which sets SSDDiscard,
// and checks its log says it discarded want pages.
func (fx *ssdFixture) startDiscarding(t *testing.T, cfg Config, want int) {
	t.Helper()
	var log bytes.Buffer
	p, err := New(cfg, zerolog.New(&log))
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if w := `"discarded_pages":` + strconv.Itoa(want); !strings.Contains(log.String(), w) {
		t.Fatalf("log %s\nwant %s", log.String(), w)
	}
}
