package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/orbitkv/orbitkv/catalog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	"github.com/orbitkv/orbitkv/internal/page"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// Start-up reads (issue 34, finding 2): every start used to read the whole
// SSD tier before serving. These tests count what a start reads from the
// page files: the scan's bytes (its log line) and the page reads through
// the SSD tier's fault seam (tiers/ssd/fs.go), never wall-clock time.

// lockedBuffer is a log sink safe for the peer's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// startCounted starts a peer as startPeer does, logging into a buffer and
// counting the page data bytes its SSD tier reads through the fault seam.
// It returns the start's "recovered ssd pages" log line and the data bytes
// read before the peer served.
func startCounted(t *testing.T, cfg Config) (*testPeer, map[string]any, uint64) {
	t.Helper()
	var read atomic.Uint64
	cfg.SSDFS = ssd.WithFaults(ssd.OS, func(_ string, op *ssd.Op) error {
		if op.Point == ssd.AfterRead {
			read.Add(op.Bytes)
		}
		return nil
	})
	logs := &lockedBuffer{}
	p, err := New(cfg, zerolog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	atStart := read.Load()
	ctx, cancel := context.WithCancel(context.Background())
	tp := &testPeer{t: t, p: p, cfg: p.cfg, stop: cancel, done: make(chan error, 1)}
	go func() { tp.done <- p.Run(ctx) }()
	select {
	case <-p.ready:
	case err := <-tp.done:
		t.Fatalf("peer stopped before serving: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("peer not serving within 20s")
	}
	if tp.conn, err = engineclient.Dial(p.cfg.Socket); err != nil {
		t.Fatal(err)
	}
	tp.admin = pb.NewAdminServiceClient(tp.conn)
	t.Cleanup(tp.shutdown)
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, l := range strings.Split(logs.b.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["message"] == "recovered ssd pages" {
			return tp, m, atStart
		}
	}
	t.Fatalf("no recovery line in the start's log:\n%s", logs.b.String())
	return nil, nil, 0
}

// scannedBytes is the recovery line's scanned_bytes (0 when it scanned
// nothing).
func scannedBytes(line map[string]any) uint64 {
	n, _ := line["scanned_bytes"].(float64)
	return uint64(n)
}

// TestCleanRestartReadsNoPageFile: after a clean shutdown the start reads
// nothing of the page files (no scan, no page read) and still serves every
// page byte-exact, verified where it is read. After an unclean stop (no
// marker, as after kill -9) the scan reads header blocks only: one per
// slot of the region in use and one for the unused region, no page data.
// Before the fix both starts read the whole 128 MiB tier.
func TestCleanRestartReadsNoPageFile(t *testing.T) {
	s := stoppedWithSSDPages(t, 4)
	cfg, _, _, keys, want, ents := s.cfg, s.tp, s.e, s.keys, s.want, s.ents

	tp2, line, dataRead := startCounted(t, cfg)
	if n := scannedBytes(line); n != 0 || dataRead != 0 {
		t.Fatalf("start after a clean shutdown read %d bytes scanning and %d of page data (log %v), want none", n, dataRead, line)
	}
	loadExpect(t, tp2.engine(tinyFlash), keys, 40, want, "after a clean restart")
	tp2.shutdown()

	if err := os.Remove(filepath.Join(cfg.DataDir, cleanMarkerName)); err != nil {
		t.Fatal(err) // the clean shutdown wrote it
	}
	tp3, line, dataRead := startCounted(t, cfg)
	slot := ents[0].SSD.Bytes
	headers := (ssd.RegionBytes/slot + 1) * page.HeaderSize // the used region's slots, the other region's first block
	if n := scannedBytes(line); n == 0 || n > headers || dataRead != 0 {
		t.Fatalf("start without a marker read %d bytes scanning (want 1..%d: header blocks) and %d of page data (want 0); log %v",
			n, headers, dataRead, line)
	}
	if line["scan"] != "headers" {
		t.Fatalf("scan %v, want headers", line["scan"])
	}
	loadExpect(t, tp3.engine(tinyFlash), keys, 40, want, "after an unclean restart")
	if _, err := os.Stat(filepath.Join(cfg.DataDir, cleanMarkerName)); !os.IsNotExist(err) {
		t.Fatalf("clean-shutdown marker while the peer serves: %v", err)
	}
}

// TestMissingPageFile000StillScans: page file 000 deleted while the peer
// was down (after a clean shutdown, marker and all) must not leave the
// catalog naming its pages: the start scans, finds their slots gone and
// drops them, so they answer not found rather than corrupt. Before the fix
// a missing file 000 skipped the scan and trusted the catalog: the lookup
// hit all four pages and the load failed them as corrupt.
func TestMissingPageFile000StillScans(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	tp := startPeer(t, cfg)
	e := tp.engine(tinyFlash)
	keys := randKeys(4)
	ents := ssdOnly(t, tp, e, keys)
	for _, en := range ents {
		if en.SSD.File != 0 {
			t.Fatalf("page in file %d, want all in file 0", en.SSD.File)
		}
	}
	tp.shutdown()
	if err := os.Remove(filepath.Join(cfg.DataDir, "ssd", ssd.FileName(0))); err != nil {
		t.Fatal(err)
	}

	tp2, line, _ := startCounted(t, cfg)
	if scannedBytes(line) == 0 {
		t.Fatalf("start with page file 000 missing did not scan: %v", line)
	}
	e2 := tp2.engine(tinyFlash)
	look, err := e2.Lookup(ctx(t), keys, false)
	if err != nil || look.HitPages != 0 {
		t.Fatalf("lookup after file 000 went: %v %v, want no hit", look, err)
	}
	st, err := e2.Load(ctx(t), refs(keys, 40, 4))
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range st.Pages {
		if p.Code != pb.PageCode_PAGE_NOT_FOUND {
			t.Fatalf("page %d: %v (%s), want PAGE_NOT_FOUND", i, p.Code, p.Message)
		}
	}
	if got := tp2.metric("orbitkv_catalog_dropped_pages_total"); !strings.HasSuffix(got, " 4") {
		t.Fatalf("dropped %q, want 4", got)
	}
}

// TestUncleanRestartKeepsAckedDropsForgedAndTorn: a start after an unclean
// stop (no marker), or after a clean one whose catalog was changed since,
// reads headers only, yet keeps every acknowledged page, drops a slot
// forged behind the catalog's back, rebuilds a page the catalog lost after
// reading it whole, and does not rebuild one whose data is torn (not
// found, never corrupt). The only page data it reads is those two
// candidates'.
func TestUncleanRestartKeepsAckedDropsForgedAndTorn(t *testing.T) {
	for _, unclean := range []bool{true, false} {
		t.Run(map[bool]string{true: "no marker", false: "catalog changed since the marker"}[unclean], func(t *testing.T) {
			s := stoppedWithSSDPages(t, 5)
			cfg, tp, _, keys, want, ents := s.cfg, s.tp, s.e, s.keys, s.want, s.ents
			if unclean {
				if err := os.Remove(filepath.Join(cfg.DataDir, cleanMarkerName)); err != nil {
					t.Fatal(err)
				}
			}
			rewriteSlot(t, tp, ents[1].SSD)     // forged: contradicts its entry
			deleteCatalogEntry(t, cfg, ents[2]) // a commit the catalog lost: rebuilt
			deleteCatalogEntry(t, cfg, ents[3]) // lost too, and torn: not rebuilt
			flipByte(t, filepath.Join(cfg.DataDir, "ssd"), ents[3].SSD.File, int64(ents[3].SSD.Offset+page.HeaderSize+3))

			tp2, line, dataRead := startCounted(t, cfg)
			if line["scan"] != "headers" {
				t.Fatalf("scan %v (%v), want headers", line["scan"], line["scan_reason"])
			}
			if two := 2 * ents[2].SSD.Bytes; dataRead != two {
				t.Fatalf("start read %d bytes of page data, want %d (the two rebuilt candidates)", dataRead, two)
			}
			e2 := tp2.engine(tinyFlash)
			kept := [][]byte{keys[0], keys[2], keys[4]}
			loadExpect(t, e2, kept, 40, [][]byte{want[0], want[2], want[4]}, "acknowledged and rebuilt pages")
			st, err := e2.Load(ctx(t), refs([][]byte{keys[1], keys[3]}, 40, 4))
			if err != nil {
				t.Fatal(err)
			}
			if c := st.Pages[0].Code; c != pb.PageCode_PAGE_NOT_FOUND && c != pb.PageCode_PAGE_CORRUPT {
				t.Fatalf("forged page: %v", c)
			}
			if c := st.Pages[1].Code; c != pb.PageCode_PAGE_NOT_FOUND {
				t.Fatalf("torn page the catalog lost: %v (%s), want PAGE_NOT_FOUND", c, st.Pages[1].Message)
			}
			for _, k := range [][]byte{keys[1], keys[3]} {
				if _, ok := tp2.p.cat.Get(mustKey(t, k)); ok {
					t.Errorf("page %x in the catalog after the start", k)
				}
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
		})
	}
}

// ssdSetup is what stoppedWithSSDPages made.
type ssdSetup struct {
	cfg  Config
	tp   *testPeer
	e    *engine
	keys [][]byte
	want [][]byte
	ents []catalog.Entry
}

// stoppedWithSSDPages starts a small peer, saves n pages and moves them to
// the SSD tier only, then stops it cleanly: the set-up of the start-up
// recovery tests. want holds the first four pages' bytes.
func stoppedWithSSDPages(t *testing.T, n int) ssdSetup {
	t.Helper()
	s := ssdSetup{cfg: smallConfig(t.TempDir())}
	s.tp = startPeer(t, s.cfg)
	s.e = s.tp.engine(tinyFlash)
	s.keys = randKeys(n)
	s.want = pagesOf(s.e, refs(s.keys, 0, 4))
	s.ents = ssdOnly(t, s.tp, s.e, s.keys)
	s.tp.shutdown()
	return s
}
