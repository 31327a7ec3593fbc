package fabric

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/catalog"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
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
