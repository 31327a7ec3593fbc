package saturation

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/bench/serving"
	"github.com/orbitkv/orbitkv/internal/engineclient"
)

// TestSatMixSteps: fresh prompts are never handed out twice, even to
// concurrent streams; a revisit names only a prompt whose save finished and
// that is among the last window saved; none before the first save; the
// probability 0 and 1 ends revisit never and always.
func TestSatMixSteps(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reuse  float64
		window int
	}{{"never", 0, 4}, {"half", 0.5, 4}, {"always", 1, 4}, {"window of one", 1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			m := newSatMix(tc.reuse, tc.window)
			var mu sync.Mutex
			fresh := map[int64]bool{}
			var saved []int64 // in the order saved calls happened
			revisits := 0
			var wg sync.WaitGroup
			for st := range 4 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(7, uint64(st)))
					for range 200 {
						mu.Lock() // one step at a time, so the model's window is the mix's
						s := m.step(rng)
						if fresh[s.fresh] {
							t.Errorf("prompt %d handed out twice", s.fresh)
						}
						fresh[s.fresh] = true
						last := saved[max(0, len(saved)-tc.window):]
						switch {
						case s.revisit >= 0 && !slices.Contains(last, s.revisit):
							t.Errorf("revisit of %d, not among the last %d saved %v", s.revisit, tc.window, last)
						case s.revisit < 0 && tc.reuse == 1 && len(saved) > 0:
							t.Errorf("no revisit with probability 1 and %d saved", len(saved))
						case s.revisit >= 0:
							revisits++
						}
						m.saved(s.fresh)
						saved = append(saved, s.fresh)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			switch n := len(fresh); {
			case tc.reuse == 0 && revisits != 0:
				t.Errorf("%d revisits with probability 0", revisits)
			case tc.reuse == 1 && revisits != n-1:
				t.Errorf("%d revisits of %d steps with probability 1 (the first has none to revisit)", revisits, n)
			case tc.reuse == 0.5 && (revisits < n/3 || revisits > 2*n/3):
				t.Errorf("%d revisits of %d steps with probability 0.5 (seeded)", revisits, n)
			}
		})
	}
}

func TestSatKeysAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	for id := int64(0); id < 300; id++ {
		for j := range 300 {
			k := satKey(id, j)
			if len(k) != 16 || seen[string(k)] {
				t.Fatalf("key of prompt %d page %d: %x (len %d, seen before: %v)", id, j, k, len(k), seen[string(k)])
			}
			seen[string(k)] = true
		}
	}
}

func tinySatBench(t *testing.T) *satBench {
	return &satBench{dir: t.TempDir(), shmDir: t.TempDir(), allowMemoryFS: true,
		flash:     engineclient.Flash{Layers: 2, BlockTokens: 16, PageTokens: 64, KVHeads: 8, HeadDim: 128, ElemBytes: 2},
		dramBytes: 32 << 20, ssdBytes: 128 << 20, seconds: 1, streams: 4, batch: 8, reuse: 0.5, seed: 1}
}

func TestSatValidate(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		edit       func(b *satBench)
	}{
		{"tiny is valid", "", func(*satBench) {}},
		{"no seconds", "seconds", func(b *satBench) { b.seconds = 0 }},
		{"no streams", "streams", func(b *satBench) { b.streams = 0 }},
		{"too many streams", "streams", func(b *satBench) { b.streams = 65 }},
		{"no batch", "batch", func(b *satBench) { b.batch = 0 }},
		{"reuse above 1", "reuse", func(b *satBench) { b.reuse = 1.5 }},
		{"reuse below 0", "reuse", func(b *satBench) { b.reuse = -0.1 }},
		{"no layers", "layers", func(b *satBench) { b.flash.Layers = 0 }},
		{"dram below 4 pages", "dram-bytes", func(b *satBench) { b.dramBytes = 1 << 20 }},
		{"ssd below a region", "ssd-bytes", func(b *satBench) { b.ssdBytes = 1 << 20 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tinySatBench(t)
			tc.edit(b)
			err := b.validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("validate: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// TestSatRefusesTmpfs: a --dir in memory is refused (the SSD tier would
// write to memory), unless a test allows it.
func TestSatRefusesTmpfs(t *testing.T) {
	if benchutil.MemoryFS("/dev/shm") == "" {
		t.Skip("/dev/shm is not tmpfs here: no memory file system to refuse")
	}
	b := tinySatBench(t)
	b.dir, b.allowMemoryFS = "/dev/shm/orbitkv-sat-test", false
	if err := b.validate(); err == nil || !strings.Contains(err.Error(), "tmpfs") {
		t.Fatalf("validate with --dir on tmpfs: %v, want a refusal naming tmpfs", err)
	}
	b.allowMemoryFS = true
	if err := b.validate(); err != nil {
		t.Fatalf("validate with tmpfs allowed: %v", err)
	}
}

// TestSatCheckCatchesOtherBytes: a loaded page passes only with its own
// key's bytes: the reference page, its key in the stamp.
func TestSatCheckCatchesOtherBytes(t *testing.T) {
	b := tinySatBench(t)
	b.flash.NumBlocks = 2 * b.streams * b.batch * 4
	d := &satDriver{b: b, be: &benchutil.Engine{Shm: &engineclient.Shm{Mem: make([]byte, b.flash.Size())}}, per: 4}
	d.fill(3)
	key, other := satKey(5, 2), satKey(6, 2)
	load := func() { // what a correct load of page 2 of prompt 5 into stream 1's page 2 writes
		for l := range b.flash.Layers {
			for p := range 2 {
				copy(d.run(l, p, d.loadBlock(1, 2)), d.run(l, p, d.stagingBlock(3, 2)))
			}
		}
		copy(d.run(0, 0, d.loadBlock(1, 2)), key)
	}
	load()
	if err := d.check(1, 2, key); err != nil {
		t.Fatalf("the page's own bytes: %v", err)
	}
	if err := d.check(1, 2, other); err == nil {
		t.Error("another page's stamp passed")
	}
	d.run(1, 1, d.loadBlock(1, 2))[100] ^= 1
	if err := d.check(1, 2, key); err == nil {
		t.Error("a flipped byte passed")
	}
	load()
	copy(d.run(0, 0, d.loadBlock(1, 2))[satStamp:], d.run(0, 0, d.stagingBlock(0, 3))[satStamp:])
	if err := d.check(1, 2, key); err == nil {
		t.Error("page 3's bytes under page 2's stamp passed")
	}
}

func TestBlockedTime(t *testing.T) {
	prof := "--- contention:\ncycles/second=1000000000\n" +
		"2000000000 3 @ 0x1 0x2\n#\t0x1\tsync.(*Mutex).Lock+0x1\t/x.go:1\n#\t0x2\tgithub.com/orbitkv/orbitkv/fabric/store.(*Store).allocDRAMAs+0x2\t/e.go:2\n" +
		"#\t0x3\tgithub.com/orbitkv/orbitkv/fabric/store.(*Store).saveChunkOf.func1+0x3\t/s.go:3\n\n" +
		"500000000 1 @ 0x1 0x4\n#\t0x1\tsync.(*Mutex).Lock+0x1\t/x.go:1\n#\t0x4\tgithub.com/orbitkv/orbitkv/fabric/store.(*Store).allocDRAMAs+0x2\t/e.go:2\n" +
		"#\t0x5\tgithub.com/orbitkv/orbitkv/fabric/store.(*Store).readFromSSD+0x3\t/l.go:3\n\n" +
		"250000000 1 @ 0x6\n#\t0x6\tgithub.com/orbitkv/orbitkv/fabric/store.(*Store).commitSaves+0x1\t/s.go:9\n"
	got := blockedTime(prof, satBlockedIn)
	if got["alloc"] != 2*time.Second || got["commit"] != 250*time.Millisecond {
		t.Fatalf("blocked %v, want alloc 2s (a load's allocation left out), commit 250ms", got)
	}
}

func TestParseMetrics(t *testing.T) {
	sample, err := serving.ParseMetrics(strings.NewReader("# HELP x y\n# TYPE x counter\nx 3\n" +
		`orbitkv_tiers_readmitted_pages_total{result="attached"} 12` + "\nh_bucket{le=\"+Inf\"} 1e+06\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := sample.Values
	if m["x"] != 3 || m[`orbitkv_tiers_readmitted_pages_total{result="attached"}`] != 12 || m[`h_bucket{le="+Inf"}`] != 1e6 {
		t.Fatalf("parsed %v", m)
	}
}

// TestPrintSaturation: the table sets the baseline beside the result, one
// row per kind of refused page either saw, and says when fio was skipped.
func TestPrintSaturation(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var out []time.Duration
		for _, n := range ns {
			out = append(out, time.Duration(n)*time.Millisecond)
		}
		return out
	}
	a := satResult{label: "A: DRAM", elapsed: 2 * time.Second, pageBytes: 1e6, tally: newSatTally()}
	a.tally.save.lat = ms(1, 2, 3, 4)
	a.tally.save.pages["ok dram"] = 4000
	a.tally.checked = 1000
	a.peer = satPeer{metrics: map[string]float64{}}
	b := satResult{label: "B: DRAM + SSD", ssd: true, elapsed: 2 * time.Second, pageBytes: 1e6, tally: newSatTally(), peer: satPeer{
		metrics:     map[string]float64{`orbitkv_tiers_readmitted_pages_total{result="attached"}`: 77, "orbitkv_tiers_demoted_pages_total": 500},
		diskWritten: 3e9, allocBlocked: 1500 * time.Millisecond}}
	b.tally.save.lat = ms(10, 20, 30, 400)
	b.tally.save.pages["ok dram"] = 1000
	b.tally.save.pages["no_space: dram slot: no space"] = 7
	var out bytes.Buffer
	printSaturation(&out, []satResult{a, b}, satFio{skipped: "fio not found"})
	table := cells(out.String())
	for _, want := range []string{
		"| A: DRAM | B: DRAM + SSD |",
		"save GB/s accepted (new pages stored) | 2.00 | 0.50 |",
		"save latency ms p50 / p99 / max (saves) | 3.0 / 4.0 / 4.0 (4) | 30.0 / 400.0 / 400.0 (4) |",
		"re-save latency ms p50 / p99 / max | - (0) | - (0) |",
		"save pages refused: no_space: dram slot: no space | 0 | 7 |",
		"re-save pages refused | 0 | 0 |",
		"load GB/s (pages restored, every byte checked) | 0.50 | 0.00 |",
		"peer: readmitted attached | 0 | 77 |",
		"peer: demoted pages (DRAM -> SSD) | 0 | 500 |",
		"disk write GB/s over the run | 0.00 | 1.50 |",
		"save alloc blocked s (block profile) | 0.00 | 1.50 |",
		"B / A: save GB/s 0.25, save latency p50 10.00, p99 100.00",
		"disk: B wrote 1.50 GB/s; fio sequential O_DIRECT write: skipped (fio not found)",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("report lacks %q:\n%s", want, table)
		}
	}
	out.Reset()
	printSaturation(&out, []satResult{a, b}, satFio{gbps: 1.23, bytes: 1 << 30})
	if !strings.Contains(out.String(), "fio sequential O_DIRECT write on the same directory: 1.23 GB/s (1GiB, fresh file)") {
		t.Errorf("fio's rate missing:\n%s", out.String())
	}
}

// cells marks the table's column gaps (two spaces or more) with " | ".
func cells(s string) string {
	return regexp.MustCompile(` {2,}`).ReplaceAllString(s, " | ")
}

// TestBenchSaturationSmoke: a one-second run at a test's size completes on
// both peers, every loaded page's bytes were checked, the counters that
// must move did, and the run leaves nothing behind.
func TestBenchSaturationSmoke(t *testing.T) {
	b := tinySatBench(t)
	var out bytes.Buffer
	rs, err := b.run(context.Background(), &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if len(rs) != 2 || rs[0].ssd || !rs[1].ssd {
		t.Fatalf("results %+v, want A (DRAM) then B (SSD)", rs)
	}
	checked := 0
	for _, r := range rs {
		loaded := r.tally.load.pages.ok()
		if r.tally.save.pages.ok() == 0 || r.peer.metrics["orbitkv_fabric_saved_pages_total"] == 0 {
			t.Errorf("%s: no page saved", r.label)
		}
		if r.tally.checked != loaded {
			t.Errorf("%s: %d pages loaded, %d checked", r.label, loaded, r.tally.checked)
		}
		checked += r.tally.checked
	}
	if checked == 0 {
		t.Error("no page loaded in either run")
	}
	bm := rs[1].peer
	if bm.metrics["orbitkv_tiers_demoted_pages_total"] == 0 || bm.diskWritten == 0 {
		t.Errorf("B wrote nothing to its SSD: demoted %v, %d bytes written", bm.metrics["orbitkv_tiers_demoted_pages_total"], bm.diskWritten)
	}
	if rs[0].peer.metrics["orbitkv_tiers_demoted_pages_total"] != 0 {
		t.Error("A, with no SSD tier, demoted pages")
	}
	for _, dir := range []string{b.dir, b.shmDir} {
		if got := entries(t, dir); len(got) != 0 {
			t.Errorf("%s after the run holds %v", dir, got)
		}
	}
	if !strings.Contains(out.String(), "save GB/s accepted") {
		t.Errorf("no table printed:\n%s", out.String())
	}
	if _, err := os.Stat(b.scratch); !os.IsNotExist(err) {
		t.Errorf("scratch %s still there: %v", b.scratch, err)
	}
}

// entries lists dir's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
