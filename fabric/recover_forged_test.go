package fabric

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/page"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// TestForgedSSDSlotDroppedAtStart (issue 34, finding 1): a slot rewritten
// consistently while the peer is down (data, data checksum and header CRC
// changed together, so the scan finds it whole) contradicts the intact
// catalog entry that names it. The start drops the page and counts it; it
// never adopts the header's checksum, which would let the read-time check
// pass the wrong bytes. A page whose catalog entry is missing is still
// rebuilt from its header. Before the fix the forged page loaded OK with
// the forged bytes.
func TestForgedSSDSlotDroppedAtStart(t *testing.T) {
	s := stoppedWithSSDPages(t, 4)
	cfg, tp, _, keys, want, ents := s.cfg, s.tp, s.e, s.keys, s.want, s.ents

	rewriteSlot(t, tp, ents[1].SSD)
	deleteCatalogEntry(t, cfg, ents[2])

	tp2 := startPeer(t, cfg)
	e2 := tp2.engine(tinyFlash)
	kept := [][]byte{keys[0], keys[2], keys[3]}
	loadExpect(t, e2, kept, 40, [][]byte{want[0], want[2], want[3]}, "kept and rebuilt pages")
	st, err := e2.Load(ctx(t), refs(keys[1:2], 40, 4))
	if err != nil {
		t.Fatal(err)
	}
	if c := st.Pages[0].Code; c != pb.PageCode_PAGE_NOT_FOUND && c != pb.PageCode_PAGE_CORRUPT {
		t.Fatalf("forged page: %v (%s), want PAGE_NOT_FOUND or PAGE_CORRUPT", c, st.Pages[0].Message)
	}
	if _, ok := tp2.p.cat.Get(mustKey(t, keys[1])); ok {
		t.Error("the forged page is in the catalog after the start")
	}
	for name, n := range map[string]string{
		"orbitkv_catalog_contradicting_slots_total": "1",
		"orbitkv_catalog_dropped_pages_total":       "1",
		"orbitkv_catalog_rebuilt_pages_total":       "1",
	} {
		if got := tp2.metric(name); !strings.HasSuffix(got, " "+n) {
			t.Errorf("%s = %q, want %s", name, got, n)
		}
	}
}

// deleteCatalogEntry removes e from the stopped peer's persisted catalog,
// as a catalog that lost the record would.
func deleteCatalogEntry(t *testing.T, cfg Config, e catalog.Entry) {
	t.Helper()
	cat, err := catalog.Open(catalog.Options{Dir: filepath.Join(cfg.DataDir, "catalog")})
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.Delete(e.Key); err != nil {
		t.Fatal(err)
	}
	if err := cat.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestForgedNewerGenerationDroppedAtStart (issue 34, finding 1): a slot
// forged while the peer is down with a generation far above any the store
// handed out is dropped at the next start, whether the catalog still names
// the slot (a newer generation there used to pass for a save whose commit
// the catalog lost) or lost the page's record (the header alone used to
// rebuild it). It is counted as contradicting and never served; the other
// pages load. Before the fix both starts adopted the forged page and
// served its bytes.
func TestForgedNewerGenerationDroppedAtStart(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(map[bool]string{false: "slot named by its entry", true: "entry lost"}[lost], func(t *testing.T) {
			s := stoppedWithSSDPages(t, 3)
			if err := os.Remove(filepath.Join(s.cfg.DataDir, cleanMarkerName)); err != nil {
				t.Fatal(err) // as after kill -9: the start reads the slot headers
			}
			forgeSlot(t, s.cfg, s.ents[1].SSD, s.ents[1].Generation+1<<32)
			if lost {
				deleteCatalogEntry(t, s.cfg, s.ents[1])
			}

			tp2 := startPeer(t, s.cfg)
			e2 := tp2.engine(tinyFlash)
			loadExpect(t, e2, [][]byte{s.keys[0], s.keys[2]}, 40, [][]byte{s.want[0], s.want[2]}, "the other pages")
			st, err := e2.Load(ctx(t), refs(s.keys[1:2], 40, 4))
			if err != nil {
				t.Fatal(err)
			}
			if c := st.Pages[0].Code; c != pb.PageCode_PAGE_NOT_FOUND {
				t.Fatalf("forged page: %v (%s), want PAGE_NOT_FOUND", c, st.Pages[0].Message)
			}
			if got := tp2.metric("orbitkv_catalog_contradicting_slots_total"); !strings.HasSuffix(got, " 1") {
				t.Errorf("orbitkv_catalog_contradicting_slots_total = %q, want 1", got)
			}
		})
	}
}

// forgeSlot rewrites the slot at loc consistently, as rewriteSlot does,
// and gives its header generation gen.
func forgeSlot(t *testing.T, cfg Config, loc catalog.SSDLoc, gen uint64) {
	t.Helper()
	path := filepath.Join(cfg.DataDir, "ssd", ssd.FileName(int(loc.File)))
	slot := make([]byte, loc.Bytes)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(slot, int64(loc.Offset)); err != nil {
		t.Fatal(err)
	}
	h, err := page.Decode(slot[:page.HeaderSize])
	if err != nil {
		t.Fatal(err)
	}
	data := slot[page.HeaderSize:]
	data[h.Length/2] ^= 0x5a
	h.Checksum, h.Generation = page.Checksum(data[:h.Length]), gen
	h.Encode(slot[:page.HeaderSize])
	if _, err := f.WriteAt(slot, int64(loc.Offset)); err != nil {
		t.Fatal(err)
	}
}
