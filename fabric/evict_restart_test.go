package fabric

import (
	"os"
	"path/filepath"
	"testing"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// TestAdminSSDEvictSurvivesRestart (issue 34, item 6d): a page evicted
// from the SSD tier by the admin Evict must not be served after a restart.
// The catalog forgot it, but its slot kept a whole page: after an unclean
// stop (kill -9: no clean-shutdown marker) the header scan found the slot,
// which the catalog no longer named, and adopted the page again. A clean
// restart (no scan) must not serve it either, nor one whose catalog was
// deleted (the whole files are read).
func TestAdminSSDEvictSurvivesRestart(t *testing.T) {
	for _, stop := range []string{"kill", "clean", "catalog deleted"} {
		t.Run(stop, func(t *testing.T) {
			cfg := smallConfig(t.TempDir())
			tp := startPeer(t, cfg)
			e := tp.engine(tinyFlash)
			keys := randKeys(3)
			want := pagesOf(e, refs(keys, 0, 4))
			ssdOnly(t, tp, e, keys)
			r, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_SSD, Keys: keys[1:2]})
			if err != nil || r.EvictedPages != 1 {
				t.Fatalf("evict: %v, %v", r, err)
			}
			tp.shutdown()
			switch stop {
			case "kill": // what a kill -9 leaves: no marker
				if err := os.Remove(filepath.Join(cfg.DataDir, cleanMarkerName)); err != nil {
					t.Fatal(err)
				}
			case "catalog deleted":
				if err := os.RemoveAll(filepath.Join(cfg.DataDir, "catalog")); err != nil {
					t.Fatal(err)
				}
			}
			tp2 := startPeer(t, cfg)
			e2 := tp2.engine(tinyFlash)
			loadExpect(t, e2, [][]byte{keys[0], keys[2]}, 40, [][]byte{want[0], want[2]}, "pages not evicted")
			st, err := e2.Load(ctx(t), refs(keys[1:2], 40, 4))
			if err != nil {
				t.Fatal(err)
			}
			if c := st.Pages[0].Code; c != pb.PageCode_PAGE_NOT_FOUND {
				t.Fatalf("the evicted page after a %s restart: %v, want PAGE_NOT_FOUND", stop, c)
			}
		})
	}
}
