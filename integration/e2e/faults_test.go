package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// metricValue scrapes one unlabelled series from the peer's /metrics.
func metricValue(t *testing.T, p *proc, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("metric %s not exported", name)
	return 0
}

func newShm(t *testing.T) *engineclient.Shm {
	t.Helper()
	shm, err := engineclient.CreateShm(filepath.Join(t.TempDir(), "kv"), flash.Size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Close() })
	return shm
}

// saveAcked saves rounds×4 fresh pages durably and records the
// acknowledged ones in acked.
func saveAcked(t *testing.T, ctx context.Context, e *engineProc, rounds int, acked map[string][32]byte) {
	t.Helper()
	for r := range rounds {
		if got := saveRound(t, ctx, e, r%4, 4, acked); len(got) != 4 {
			t.Fatalf("round %d: %d of 4 pages acknowledged on SSD", r, len(got))
		}
	}
}

// TestCatalogDamageRebuildsFromPageFiles damages each kind of catalog
// file (and the whole directory) of a stopped peer and restarts it: the
// peer must start and serve, and every page acknowledged on SSD must come
// back byte-exact, rebuilt from the page files' slot headers where the
// catalog lost it.
func TestCatalogDamageRebuildsFromPageFiles(t *testing.T) {
	newest := func(match func(string) bool) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			des, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var last string
			for _, de := range des {
				if match(de.Name()) {
					last = de.Name()
				}
			}
			if last == "" {
				t.Fatalf("no such file in %s: %v", dir, des)
			}
			t.Logf("damaging %s", last)
			damageTarget = filepath.Join(dir, last)
		}
	}
	suffix := func(s string) func(string) bool { return func(n string) bool { return strings.HasSuffix(n, s) } }
	prefix := func(s string) func(string) bool { return func(n string) bool { return strings.HasPrefix(n, s) } }
	flip := func(at float64) func(t *testing.T) {
		return func(t *testing.T) {
			b, err := os.ReadFile(damageTarget)
			if err != nil || len(b) == 0 {
				t.Fatalf("read %s: %d bytes, %v", damageTarget, len(b), err)
			}
			b[int(float64(len(b)-1)*at)] ^= 0x04
			if err := os.WriteFile(damageTarget, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	remove := func(t *testing.T) {
		if err := os.RemoveAll(damageTarget); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		pick   func(t *testing.T, dir string)
		damage func(t *testing.T)
	}{
		{"flip SST", newest(suffix(".sst")), flip(0.3)},
		{"delete SST", newest(suffix(".sst")), remove},
		{"flip WAL", newest(suffix(".log")), flip(0.2)},
		{"delete WAL", newest(suffix(".log")), remove},
		{"flip MANIFEST", newest(prefix("MANIFEST")), flip(0.5)},
		{"delete MANIFEST", newest(prefix("MANIFEST")), remove},
		{"flip OPTIONS", newest(prefix("OPTIONS")), flip(0.2)},
		{"delete OPTIONS", newest(prefix("OPTIONS")), remove},
		{"delete catalog", func(t *testing.T, dir string) { damageTarget = dir }, remove},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, shm := t.TempDir(), newShm(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			acked := map[string][32]byte{}
			// Two runs, each stopped cleanly: the second start flushes the
			// first run's WAL into an SST, so every file kind exists.
			for range 2 {
				p := startPeer(t, data)
				saveAcked(t, ctx, openEngine(t, p, shm), 6, acked)
				p.stop(t)
			}
			tc.pick(t, filepath.Join(data, "catalog"))
			tc.damage(t)

			p := startPeer(t, data)
			out, err := p.cli(t, "status")
			if err != nil || !strings.HasPrefix(out, "healthy") {
				t.Fatalf("status after damage: %v\n%s", err, out)
			}
			verifyAll(t, ctx, openEngine(t, p, shm), shm, acked)
			line, _ := p.log.find("recovered ssd pages")
			t.Logf("recovery: rebuilt %v, dropped %v, damage %v", line["rebuilt"], line["dropped"], line["catalog_damage"])
			if got := metricValue(t, p, "orbitkv_catalog_rebuilt_pages_total"); got != line["rebuilt"] {
				t.Fatalf("orbitkv_catalog_rebuilt_pages_total = %v, log says %v", got, line["rebuilt"])
			}
			// Healthy again, but status says what the start repaired.
			repaired := line["catalog_damage"] != nil || line["rebuilt"] != float64(0) || line["dropped"] != float64(0)
			if said := strings.Contains(out, "catalog repaired at start"); said != repaired {
				t.Fatalf("status says a repair: %v; the start repaired (log): %v\n%s", said, repaired, out)
			}
		})
	}
}

// damageTarget is the file the current subtest damages.
var damageTarget string

// mountTmpfs mounts a tmpfs of the given size on dir, or skips saying why.
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: mounting a small filesystem needs root")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("skipping: mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
}

// fill takes every free byte of dir's filesystem with one file and
// returns a function that frees it again.
func fill(t *testing.T, dir string) func() {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	free := int64(st.Bavail) * int64(st.Bsize)
	if err := unix.Fallocate(int(f.Fd()), 0, 0, free); err != nil {
		t.Fatalf("fill %s with %d bytes: %v", dir, free, err)
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
}

// saveCodes saves n fresh pages (page slots from base) and returns their
// refs, sums and per-page results.
func saveCodes(t *testing.T, ctx context.Context, e *engineProc, base, n int, d pb.Durability) ([]*pb.PageRef, [][32]byte, *pb.OpStatus) {
	t.Helper()
	sums := map[string][32]byte{}
	refs := writePages(e, base, n, sums)
	st, err := e.Save(ctx, refs, d)
	if err != nil {
		t.Fatal(err)
	}
	var out [][32]byte
	for _, r := range refs {
		out = append(out, sums[string(r.Key)])
	}
	return refs, out, st
}

// loadExact loads refs' keys into other blocks and checks every page is
// served with the bytes saved.
func loadExact(t *testing.T, ctx context.Context, e *engineProc, refs []*pb.PageRef, sums [][32]byte) {
	t.Helper()
	for i, r := range refs {
		dst := &pb.PageRef{Key: r.Key, Blocks: blocksOf(31)}
		st, err := e.Load(ctx, []*pb.PageRef{dst})
		if err != nil || engineclient.AllOK(st) != nil {
			t.Fatalf("load page %d: %v %v", i, st, err)
		}
		if sha256.Sum256(pageBytes(e.shm, dst.Blocks)) != sums[i] {
			t.Fatalf("page %d served with other bytes", i)
		}
	}
}

// TestCatalogDiskFull fills the catalog's filesystem under a running peer:
// saves to SSD must fail per page with PAGE_NO_SPACE while DRAM saves and
// every load keep working, status must say why it is unhealthy, and the
// peer must recover by itself when space returns. A restart on the full
// disk must reach serving without a flood of log lines, serve the pages
// already on SSD, and persist again once space returns.
func TestCatalogDiskFull(t *testing.T) {
	data, shm := t.TempDir(), newShm(t)
	catDir := filepath.Join(data, "catalog")
	mountTmpfs(t, catDir, "96m")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := startPeer(t, data)
	e := openEngine(t, p, shm)
	ssdRefs, ssdSums, st := saveCodes(t, ctx, e, 0, 4, pb.Durability_DURABILITY_SSD)
	if err := engineclient.AllOK(st); err != nil {
		t.Fatal(err)
	}

	free := fill(t, catDir)
	_, _, st = saveCodes(t, ctx, e, 1, 4, pb.Durability_DURABILITY_SSD)
	for i, pg := range st.Pages {
		if pg.Code != pb.PageCode_PAGE_NO_SPACE {
			t.Fatalf("SSD save %d on a full catalog disk: %v %s, want PAGE_NO_SPACE", i, pg.Code, pg.Message)
		}
	}
	dramRefs, dramSums, st := saveCodes(t, ctx, e, 2, 4, pb.Durability_DURABILITY_DRAM)
	if err := engineclient.AllOK(st); err != nil {
		t.Fatalf("DRAM save on a full catalog disk: %v", err)
	}
	loadExact(t, ctx, e, append(ssdRefs, dramRefs...), append(ssdSums, dramSums...))
	// More DRAM saves than the pool holds: the oldest DRAM-only pages make
	// room by being dropped (they cannot be demoted), never by failing.
	for r := range 80 {
		if _, _, st := saveCodes(t, ctx, e, 4, 4, pb.Durability_DURABILITY_DRAM); engineclient.AllOK(st) != nil {
			t.Fatalf("DRAM save %d beyond the pool on a full catalog disk: %v", r, engineclient.AllOK(st))
		}
	}
	if out, err := p.cli(t, "status"); err == nil || !strings.Contains(out, "unhealthy") || !strings.Contains(out, "full") {
		t.Fatalf("status on a full catalog disk: %v\n%s", err, out)
	}
	if v := metricValue(t, p, "orbitkv_catalog_healthy"); v != 0 {
		t.Fatalf("orbitkv_catalog_healthy = %v on a full disk", v)
	}

	free()
	waitFor(t, "healthy after space returned", 30*time.Second, func() bool {
		out, err := p.cli(t, "status")
		return err == nil && strings.HasPrefix(out, "healthy")
	})
	more, moreSums, st := saveCodes(t, ctx, e, 3, 4, pb.Durability_DURABILITY_SSD)
	if err := engineclient.AllOK(st); err != nil {
		t.Fatalf("SSD save after space returned: %v", err)
	}
	ssdRefs, ssdSums = append(ssdRefs, more...), append(ssdSums, moreSums...)

	// Killed on a full disk, restarted on it.
	free = fill(t, catDir)
	p.kill()
	p = startPeer(t, data)
	e = openEngine(t, p, shm)
	loadExact(t, ctx, e, ssdRefs, ssdSums)
	if out, err := p.cli(t, "status"); err == nil || !strings.Contains(out, "unhealthy") {
		t.Fatalf("status after a restart on a full disk: %v\n%s", err, out)
	}
	if n := p.log.count(); n > 20 {
		t.Fatalf("%d log lines by the time a restart on a full disk served a load", n)
	}
	free()
	waitFor(t, "healthy after space returned", 30*time.Second, func() bool {
		out, err := p.cli(t, "status")
		return err == nil && strings.HasPrefix(out, "healthy")
	})
	p.stop(t)
	p = startPeer(t, data)
	loadExact(t, ctx, openEngine(t, p, shm), ssdRefs, ssdSums)
}
