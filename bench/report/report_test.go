package report

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/bench/serving"
)

// engine is a minimal SSE completion server; delay slows every request.
func engine(delay time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Prompt    []int `json:"prompt"`
			MaxTokens int   `json:"max_tokens"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		time.Sleep(delay)
		for i := range body.MaxTokens {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d\"}]}\n\n", (len(body.Prompt)+i)%7)
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"orbitkv_restored_tokens\":%d}}\n\n", len(body.Prompt), body.MaxTokens, len(body.Prompt)/4)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

const peerMetrics = `# TYPE orbitkv_fabric_lookup_hit_pages_total counter
orbitkv_fabric_lookup_hit_pages_total 12
# TYPE orbitkv_fabric_lookup_miss_pages_total counter
orbitkv_fabric_lookup_miss_pages_total 4
# TYPE orbitkv_fabric_leases gauge
orbitkv_fabric_leases 0
`

// makeRun writes a real run directory with serving.Run.
func makeRun(t *testing.T, root, cfgName, pair, order string, delay time.Duration) string {
	t.Helper()
	eng := httptest.NewServer(engine(delay))
	defer eng.Close()
	c := serving.DefaultConfig()
	c.Endpoint, c.Vocab, c.Prefixes, c.PrefixTokens = eng.URL, 64, 2, []int{8, 16}
	c.Concurrency, c.Duration, c.OutputTokens = 2, serving.Duration(150*time.Millisecond), 3
	c.Output = filepath.Join(root, cfgName+"-"+pair)
	if cfgName != "native" {
		peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, peerMetrics) }))
		defer peer.Close()
		c.PeerMetrics = peer.URL
	}
	m := serving.Manifest{Command: []string{"test"}, Labels: map[string]string{"config": cfgName, "pair": pair, "order": order}}
	if _, err := serving.Run(context.Background(), c, m, serving.Options{}); err != nil {
		t.Fatal(err)
	}
	return c.Output
}

var template struct {
	once sync.Once
	root string
	dirs []string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if template.root != "" {
		os.RemoveAll(template.root)
	}
	os.Exit(code)
}

// goodRuns are two AB/BA pairs (the candidate faster), made once and copied
// into a fresh directory for each test.
func goodRuns(t *testing.T) []string {
	template.once.Do(func() {
		root, err := os.MkdirTemp("", "orbitkv-report-test")
		if err != nil {
			t.Fatal(err)
		}
		template.root = root
		template.dirs = []string{
			makeRun(t, root, "native", "1", "AB", 20*time.Millisecond), makeRun(t, root, "orbitkv", "1", "AB", 5*time.Millisecond),
			makeRun(t, root, "orbitkv", "2", "BA", 5*time.Millisecond), makeRun(t, root, "native", "2", "BA", 20*time.Millisecond),
		}
	})
	root := t.TempDir()
	var out []string
	for _, d := range template.dirs {
		dst := filepath.Join(root, filepath.Base(d))
		copyDir(t, d, dst)
		out = append(out, dst)
	}
	return out
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(src)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReportAcceptsGoodRuns(t *testing.T) {
	dirs := goodRuns(t)
	out := filepath.Join(t.TempDir(), "report")
	rep, err := Build(dirs, Options{Output: out, Reps: 2000})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Configs[0] != "native" || len(rep.Pairs) != 2 {
		t.Fatalf("configs %v pairs %d", rep.Configs, len(rep.Pairs))
	}
	tp := rep.Comparisons[0]
	if tp.Metric.Name != "throughput" || tp.Ratio.N != 2 || !(tp.Ratio.Est > 1) || tp.Ratio.Lo > tp.Ratio.Est || tp.Ratio.Hi < tp.Ratio.Est {
		t.Errorf("throughput comparison %+v", tp)
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| throughput (req/s) |", "![ttft_cdf](ttft_cdf.png)", "0 of ", "pair"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	for _, p := range rep.Plots {
		f, err := os.Open(filepath.Join(out, p))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil || img.Bounds().Dx() != plotW {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func TestReportRejects(t *testing.T) {
	for _, tc := range []struct {
		name, kind string
		spoil      func(t *testing.T, dirs []string) []string
	}{
		{"truncated requests", "incomplete", func(t *testing.T, dirs []string) []string {
			p := filepath.Join(dirs[1], serving.RequestsFile)
			b, _ := os.ReadFile(p)
			_ = os.WriteFile(p, b[:len(b)-20], 0o644)
			return dirs
		}},
		{"missing summary", "incomplete", func(t *testing.T, dirs []string) []string {
			_ = os.Remove(filepath.Join(dirs[0], serving.SummaryFile))
			return dirs
		}},
		{"missing manifest", "incomplete", func(t *testing.T, dirs []string) []string {
			_ = os.Remove(filepath.Join(dirs[0], serving.ManifestFile))
			return dirs
		}},
		{"same dir twice", "duplicated", func(t *testing.T, dirs []string) []string {
			return append(dirs, dirs[2]+"/")
		}},
		{"copied run", "duplicated", func(t *testing.T, dirs []string) []string {
			cp := filepath.Join(t.TempDir(), "copy")
			copyDir(t, dirs[0], cp)
			return append(dirs, cp)
		}},
		{"request index twice", "duplicated", func(t *testing.T, dirs []string) []string {
			p := filepath.Join(dirs[1], serving.RequestsFile)
			b, _ := os.ReadFile(p)
			first, _, _ := strings.Cut(string(b), "\n")
			_ = os.WriteFile(p, append(b, []byte(first+"\n")...), 0o644)
			editSummary(t, dirs[1], func(s *serving.Summary) { s.Rows++ })
			return dirs
		}},
		{"undrained gauges", "out-of-budget", func(t *testing.T, dirs []string) []string {
			d := serving.Drain{Checked: true, OK: false, TimeoutS: 30, Gauges: map[string]float64{"orbitkv_fabric_query_bytes": 4096}}
			b, _ := json.Marshal(d)
			_ = os.WriteFile(filepath.Join(dirs[1], serving.DrainFile), b, 0o644)
			return dirs
		}},
		{"mismatches in a deterministic run", "mismatch", func(t *testing.T, dirs []string) []string {
			editSummary(t, dirs[1], func(s *serving.Summary) { s.Mismatches = 2 })
			return dirs
		}},
		{"mismatches in a run from before the label", "mismatch", func(t *testing.T, dirs []string) []string {
			editManifest(t, dirs[1], func(m map[string]any) { delete(m, "deterministic") })
			editSummary(t, dirs[1], func(s *serving.Summary) { s.Mismatches = 1 })
			return dirs
		}},
		{"failed run", "failed", func(t *testing.T, dirs []string) []string {
			editSummary(t, dirs[3], func(s *serving.Summary) { s.Status, s.Reasons = "failed", []string{"2 of 9 requests failed"} })
			return dirs
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dirs := tc.spoil(t, goodRuns(t))
			_, err := Build(dirs, Options{Output: filepath.Join(t.TempDir(), "r"), Reps: 100})
			var rej *RejectedError
			if !errors.As(err, &rej) {
				t.Fatalf("accepted a spoiled set: %v", err)
			}
			found := false
			for _, r := range rej.Rejections {
				found = found || r.Kind == tc.kind
			}
			if !found {
				t.Errorf("rejections %v; want kind %s", rej.Rejections, tc.kind)
			}
		})
	}
}

func editSummary(t *testing.T, dir string, edit func(*serving.Summary)) {
	t.Helper()
	p := filepath.Join(dir, serving.SummaryFile)
	var s serving.Summary
	b, _ := os.ReadFile(p)
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	edit(&s)
	b, _ = json.Marshal(s)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRatioCIOnKnownData(t *testing.T) {
	// Equal ratios: the interval collapses onto them.
	iv := RatioCI([]float64{2, 2, 2, 2}, 0.95, 1000)
	if math.Abs(iv.Est-2) > 1e-12 || math.Abs(iv.Lo-2) > 1e-12 || math.Abs(iv.Hi-2) > 1e-12 || iv.N != 4 {
		t.Fatalf("constant ratios: %+v", iv)
	}
	// Two pairs 1 and 4: geometric mean 2; resampled means are 1, 2 or 4.
	iv = RatioCI([]float64{1, 4}, 0.95, 4000)
	if math.Abs(iv.Est-2) > 1e-12 || math.Abs(iv.Lo-1) > 1e-9 || math.Abs(iv.Hi-4) > 1e-9 {
		t.Fatalf("{1,4}: %+v; want 2 in [1, 4]", iv)
	}
	// Log-symmetric data: the interval is symmetric in log space around the estimate.
	iv = RatioCI([]float64{0.5, 1, 2, 0.5, 1, 2, 0.5, 1, 2, 1}, 0.95, 20000)
	if math.Abs(iv.Est-1) > 1e-12 || math.Abs(math.Log(iv.Lo)+math.Log(iv.Hi)) > 0.05 || iv.Lo >= 1 || iv.Hi <= 1 {
		t.Fatalf("symmetric: %+v", iv)
	}
	// Deterministic: the same data give the same interval.
	if a, b := RatioCI([]float64{1.1, 1.3, 0.9}, 0.95, 500), RatioCI([]float64{1.1, 1.3, 0.9}, 0.95, 500); a != b {
		t.Fatalf("not reproducible: %+v vs %+v", a, b)
	}
	if iv := RatioCI([]float64{3}, 0.95, 10); iv.N != 1 || math.Abs(iv.Est-3) > 1e-12 || iv.HasCI() || !math.IsNaN(iv.Lo) || !math.IsNaN(iv.Hi) {
		t.Fatalf("one pair: %+v; want the ratio and no interval", iv)
	}
	if iv := RatioCI([]float64{0, math.NaN()}, 0.95, 10); iv.N != 0 || !math.IsNaN(iv.Est) {
		t.Fatalf("no usable ratios: %+v", iv)
	}
}

// TestReportShowsBudgetCuts: pages the query budget cut from lookups are
// shown per run and noted, not hidden among the misses.
func TestReportShowsBudgetCuts(t *testing.T) {
	dirs := goodRuns(t)
	p := filepath.Join(dirs[1], serving.MetricsFile) // orbitkv pair 1
	var m map[string]*serving.Window
	b, _ := os.ReadFile(p)
	if err := json.Unmarshal(b, &m); err != nil || m["peer"] == nil {
		t.Fatalf("metrics.json of %s: %v", dirs[1], err)
	}
	m["peer"].Delta["orbitkv_fabric_lookup_budget_cut_pages_total"] = 7
	b, _ = json.Marshal(m)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "report")
	if _, err := Build(dirs, Options{Output: out, Reps: 100}); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(out, "report.md"))
	for _, want := range []string{"| budget-cut pages |", "the query budget cut 7 stored pages"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q:\n%s", want, md)
		}
	}
}

// editManifest rewrites a run's manifest.json as a generic object, so a
// test can drop fields as an older writer would have.
func editManifest(t *testing.T, dir string, edit func(map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, serving.ManifestFile)
	var m map[string]any
	b, _ := os.ReadFile(p)
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, _ = json.Marshal(m)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestReportNondeterministicRunsAreSaidAtTheTop: mismatching runs labelled
// non-deterministic are compared, and the report opens by saying so.
func TestReportNondeterministicRunsAreSaidAtTheTop(t *testing.T) {
	dirs := goodRuns(t)
	for _, d := range dirs {
		editManifest(t, d, func(m map[string]any) { m["deterministic"] = false })
	}
	editSummary(t, dirs[1], func(s *serving.Summary) { s.Mismatches = 3 })
	out := filepath.Join(t.TempDir(), "report")
	rep, err := Build(dirs, Options{Output: out, Reps: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Nondeterministic()) != 4 {
		t.Fatalf("%d runs labelled non-deterministic, want 4", len(rep.Nondeterministic()))
	}
	md, _ := os.ReadFile(filepath.Join(out, "report.md"))
	head, _, _ := strings.Cut(string(md), "## Runs")
	if !strings.Contains(head, "**Not deterministic.** 4 of 4 runs") || !strings.Contains(head, "(3 of ") {
		t.Errorf("report.md does not open with the warning:\n%s", head)
	}
	// Unlabelled runs get no warning.
	out2 := filepath.Join(t.TempDir(), "report")
	if _, err := Build(goodRuns(t), Options{Output: out2, Reps: 100}); err != nil {
		t.Fatal(err)
	}
	if md, _ := os.ReadFile(filepath.Join(out2, "report.md")); strings.Contains(string(md), "Not deterministic") {
		t.Error("a deterministic report carries the warning")
	}
}

// TestReportNoIntervalFromOnePair: one process pair gives ratios but no
// confidence intervals, in report.md and in the comparisons.
func TestReportNoIntervalFromOnePair(t *testing.T) {
	dirs := goodRuns(t)[:2] // native-1, orbitkv-1
	out := filepath.Join(t.TempDir(), "report")
	rep, err := Build(dirs, Options{Output: out, Reps: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Comparisons {
		if c.Ratio.N != 1 || c.Ratio.HasCI() || math.IsNaN(c.Ratio.Est) {
			t.Errorf("%s: %+v; want an estimate and no interval", c.Metric.Name, c.Ratio)
		}
	}
	md, _ := os.ReadFile(filepath.Join(out, "report.md"))
	for _, l := range strings.Split(string(md), "\n") {
		if strings.HasPrefix(l, "| throughput (req/s) |") && !strings.Contains(l, "| none (1 pair) | 1 |") {
			t.Errorf("one pair printed an interval: %s", l)
		}
	}
}

// TestReportProbesGetNoThroughputRatio: probe runs are compared on TTFT and
// latency only.
func TestReportProbesGetNoThroughputRatio(t *testing.T) {
	dirs := goodRuns(t)
	for _, d := range dirs {
		editManifest(t, d, func(m map[string]any) { m["config"].(map[string]any)["workload"] = serving.WorkloadProbes })
	}
	out := filepath.Join(t.TempDir(), "report")
	rep, err := Build(dirs, Options{Output: out, Reps: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Comparisons {
		if c.Metric.Rate {
			t.Errorf("probe runs compared on %s", c.Metric.Name)
		}
	}
	if len(rep.Comparisons) == 0 {
		t.Fatal("no comparisons at all")
	}
	md, _ := os.ReadFile(filepath.Join(out, "report.md"))
	if strings.Contains(string(md), "| throughput (req/s) |") || strings.Contains(string(md), "throughput.png") {
		t.Errorf("report.md of probe runs has a throughput ratio or plot")
	}
}

// TestReportProbesCompareEachPhase: a probe report divides each phase's TTFT
// p50 by the baseline's (a restore is the evicted phase, not the whole run's
// TTFT, which mixes in the fillers' recomputes); a phase one run of a pair
// lacks leaves that pair out of that phase's ratio only.
func TestReportProbesCompareEachPhase(t *testing.T) {
	dirs := goodRuns(t)
	for _, d := range dirs {
		editManifest(t, d, func(m map[string]any) { m["config"].(map[string]any)["workload"] = serving.WorkloadProbes })
		cfg := filepath.Base(d)
		editSummary(t, d, func(s *serving.Summary) {
			s.Phases = map[string]serving.Stats{serving.PhaseCold: {N: 3, P50: 220}, serving.PhaseEvicted: {N: 3, P50: 220}}
			if strings.HasPrefix(cfg, "orbitkv") {
				s.Phases[serving.PhaseEvicted] = serving.Stats{N: 3, P50: 55}
			} else {
				s.Phases[serving.PhaseRestart] = serving.Stats{N: 3, P50: 220} // native only: no pair has it twice
			}
		})
	}
	rep, err := Build(dirs, Options{Output: filepath.Join(t.TempDir(), "report"), Reps: 100})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Comparison{}
	for _, c := range rep.Comparisons {
		got[c.Metric.Name] = c
	}
	if c, ok := got["TTFT p50 evicted"]; !ok || math.Abs(c.Ratio.Est-0.25) > 1e-9 || c.Ratio.N != len(rep.Pairs) {
		t.Errorf("evicted: %+v (ok %v), want ratio 0.25 over %d pairs", c.Ratio, ok, len(rep.Pairs))
	}
	if c := got["TTFT p50 cold"]; math.Abs(c.Ratio.Est-1) > 1e-9 {
		t.Errorf("cold ratio %v, want 1", c.Ratio.Est)
	}
	if c, ok := got["TTFT p50 restart"]; !ok || c.Ratio.N != 0 {
		t.Errorf("restart, measured by the baseline only: %+v (ok %v), want no pair", c.Ratio, ok)
	}
	if _, ok := got["TTFT p50"]; ok {
		t.Error("a probe report compared the whole run's TTFT p50")
	}
}

// TestProbesPoolEveryRequest: the probe table gives, beside the mean of the
// runs' p50s, the median of every answered request of a phase over a
// config's runs (failed requests left out).
func TestProbesPoolEveryRequest(t *testing.T) {
	run := func(cfg, pair string, ttfts ...float64) *Run {
		r := &Run{Manifest: serving.Manifest{Labels: map[string]string{"config": cfg, "pair": pair}}}
		r.Summary.Phases = map[string]serving.Stats{serving.PhaseEvicted: {N: len(ttfts), P50: ttfts[len(ttfts)/2]}}
		for _, v := range ttfts {
			r.Rows = append(r.Rows, serving.Row{Phase: serving.PhaseEvicted, TTFTMS: v})
		}
		r.Rows = append(r.Rows, serving.Row{Phase: serving.PhaseEvicted, TTFTMS: 1, Error: "HTTP 500"})
		return r
	}
	rep := &Report{Configs: []string{"offload", "dram"}, Runs: []*Run{
		run("offload", "1", 60, 66, 70), run("dram", "1", 55, 58, 63), run("dram", "2", 57, 64, 67),
	}}
	var b strings.Builder
	rep.probes(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) })
	for _, want := range []string{"| evicted | offload | 66.0 | 66.0 (n=3) | 3 |", "| evicted | dram | 61.0 | 60.5 (n=6) | 6 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("probe table lacks %q:\n%s", want, b.String())
		}
	}
}
