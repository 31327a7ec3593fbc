package report

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/orbitkv/orbitkv/bench/serving"
)

// Options of one report.
type Options struct {
	Output   string  // directory for report.md and the PNGs
	Baseline string  // config label the others are divided by ("" = "native" if present, else the first)
	Ceiling  string  // config label of the ceiling run ("" = "ceiling"): the fraction recovered is (X − baseline)/(ceiling − baseline)
	Level    float64 // confidence level of the intervals
	Reps     int     // bootstrap resamples
	Command  []string
}

// Metric is one per-run number the report compares.
type Metric struct {
	Name, Unit string
	Get        func(*Run) float64
	Higher     bool // higher is better
	Rate       bool // a rate over the window: not compared for probe runs
	Optional   bool // 0 means not measured (a probe phase a run lacks): the pair is left out
}

// Metrics are compared in this order.
var Metrics = []Metric{
	{"throughput", "req/s", func(r *Run) float64 { return r.Summary.ThroughputRPS }, true, true, false},
	{"output tokens/s", "tok/s", func(r *Run) float64 { return r.Summary.OutputTokPS }, true, true, false},
	{"TTFT p50", "ms", func(r *Run) float64 { return r.Summary.TTFTMS.P50 }, false, false, false},
	{"TTFT p90", "ms", func(r *Run) float64 { return r.Summary.TTFTMS.P90 }, false, false, false},
	{"ITL p50", "ms", func(r *Run) float64 { return r.Summary.ITLMS.P50 }, false, false, false},
	{"ITL p90", "ms", func(r *Run) float64 { return r.Summary.ITLMS.P90 }, false, false, false},
	{"latency p50", "ms", func(r *Run) float64 { return r.Summary.LatencyMS.P50 }, false, false, false},
	{"latency p90", "ms", func(r *Run) float64 { return r.Summary.LatencyMS.P90 }, false, false, false},
}

// Comparison is candidate/baseline for one metric over process pairs.
type Comparison struct {
	Metric              Metric
	Candidate, Baseline string
	BaseMean, CandMean  float64 // mean over runs
	Ratio               Interval
}

// Report is what Build computed.
type Report struct {
	Runs        []*Run
	Configs     []string // baseline first
	Comparisons []Comparison
	Recovered   []Recovery                 // one per config other than the baseline and the ceiling, when a ceiling ran
	Pairs       map[string]map[string]*Run // pair → config → run
	Notes       []string
	Plots       []string
}

// Build validates dirs and, when every run is accepted, writes report.md and
// the plots into opt.Output.
func Build(dirs []string, opt Options) (*Report, error) {
	if len(dirs) == 0 {
		return nil, fmt.Errorf("bench report needs at least one run directory")
	}
	runs, rej := Validate(dirs)
	if len(rej) > 0 {
		return nil, &RejectedError{Rejections: rej}
	}
	if opt.Level == 0 {
		opt.Level = 0.95
	}
	if opt.Reps == 0 {
		opt.Reps = 10000
	}
	rep := &Report{Runs: runs, Pairs: map[string]map[string]*Run{}}
	rep.group(opt.Baseline)
	rep.compare(opt)
	rep.recover(opt.Ceiling)
	rep.noteBudgetCuts()
	if err := os.MkdirAll(opt.Output, 0o755); err != nil {
		return nil, fmt.Errorf("create report dir: %w", err)
	}
	if err := rep.plot(opt.Output); err != nil {
		return nil, err
	}
	md := rep.markdown(opt)
	if err := os.WriteFile(filepath.Join(opt.Output, "report.md"), []byte(md), 0o644); err != nil {
		return nil, fmt.Errorf("write report.md: %w", err)
	}
	return rep, nil
}

func (rep *Report) group(baseline string) {
	set := map[string]bool{}
	for _, r := range rep.Runs {
		c, p := r.Label("config"), r.Label("pair")
		set[c] = true
		if rep.Pairs[p] == nil {
			rep.Pairs[p] = map[string]*Run{}
		}
		rep.Pairs[p][c] = r
	}
	for c := range set {
		rep.Configs = append(rep.Configs, c)
	}
	sort.Strings(rep.Configs)
	if baseline == "" && set["native"] {
		baseline = "native"
	}
	if i := slices.Index(rep.Configs, baseline); i > 0 {
		rep.Configs = append([]string{baseline}, slices.Delete(rep.Configs, i, i+1)...)
	} else if i < 0 && baseline != "" {
		rep.Notes = append(rep.Notes, fmt.Sprintf("baseline %q has no runs; using %q", baseline, rep.Configs[0]))
	}
}

// probes is whether the runs are probe runs (all runs share one workload).
func (rep *Report) isProbes() bool {
	return len(rep.Runs) > 0 && rep.Runs[0].Manifest.Config.Workload == serving.WorkloadProbes
}

// Nondeterministic are the runs labelled non-deterministic.
func (rep *Report) Nondeterministic() []*Run {
	var out []*Run
	for _, r := range rep.Runs {
		if !r.Manifest.IsDeterministic() {
			out = append(out, r)
		}
	}
	return out
}

// phaseMetrics are a probe report's metrics: each phase's TTFT p50 (cold,
// resident, evicted, restart; those the runs measured), since a whole
// probe run's TTFT mixes the fillers' recomputes with the restores, then
// ITL. A pair where either run lacks the phase is left out of its ratio.
func (rep *Report) phaseMetrics() []Metric {
	var out []Metric
	for _, ph := range []string{serving.PhaseCold, serving.PhaseResident, serving.PhaseEvicted, serving.PhaseRestart} {
		for _, r := range rep.Runs {
			if _, ok := r.Summary.Phases[ph]; ok {
				out = append(out, Metric{Name: "TTFT p50 " + ph, Unit: "ms", Optional: true,
					Get: func(r *Run) float64 { return r.Summary.Phases[ph].P50 }})
				break
			}
		}
	}
	for _, m := range Metrics {
		if strings.HasPrefix(m.Name, "ITL") {
			out = append(out, m)
		}
	}
	return out
}

func (rep *Report) compare(opt Options) {
	base := rep.Configs[0]
	metrics := Metrics
	if rep.isProbes() {
		rep.Notes = append(rep.Notes, "probe runs: TTFT by phase, no throughput ratio (their requests are serial, with fillers and a restart in the window)")
		metrics = rep.phaseMetrics()
	}
	for _, cand := range rep.Configs[1:] {
		incomplete := 0
		for _, m := range metrics {
			var ratios, bs, cs []float64
			for _, byCfg := range rep.Pairs {
				b, c := byCfg[base], byCfg[cand]
				if b == nil || c == nil {
					continue
				}
				if m.Optional && (m.Get(b) <= 0 || m.Get(c) <= 0) {
					continue // a phase one of the pair's runs did not measure
				}
				bs, cs = append(bs, m.Get(b)), append(cs, m.Get(c))
				if m.Get(b) > 0 {
					ratios = append(ratios, m.Get(c)/m.Get(b))
				}
			}
			rep.Comparisons = append(rep.Comparisons, Comparison{Metric: m, Candidate: cand, Baseline: base,
				BaseMean: meanOr(bs), CandMean: meanOr(cs), Ratio: RatioCI(ratios, opt.Level, opt.Reps)})
		}
		for p, byCfg := range rep.Pairs {
			if byCfg[base] == nil || byCfg[cand] == nil {
				incomplete++
				rep.Notes = append(rep.Notes, fmt.Sprintf("pair %s lacks %s or %s: left out of %s/%s ratios", p, base, cand, cand, base))
			}
		}
	}
	orders := map[string]int{}
	for _, byCfg := range rep.Pairs {
		if b := byCfg[base]; b != nil {
			orders[b.Label("order")]++
		}
	}
	if orders["AB"] != orders["BA"] {
		rep.Notes = append(rep.Notes, fmt.Sprintf("pair orders are unbalanced (pairs by order label: %v); AB/BA pairs cancel drift only when balanced", orders))
	}
	if n := len(rep.Pairs); n < 5 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("only %d process pair(s): a bootstrap over so few pairs has few distinct resamples, so the intervals are coarse and likely too narrow", n))
	}
}

func meanOr(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return mean(xs)
}

// peerHitFrac is lookup hit pages / looked-up pages over the window, or NaN.
func peerHitFrac(r *Run) float64 {
	w := r.Metrics["peer"]
	if w == nil {
		return math.NaN()
	}
	h, m := w.Delta["orbitkv_fabric_lookup_hit_pages_total"], w.Delta["orbitkv_fabric_lookup_miss_pages_total"]
	if h+m == 0 {
		return math.NaN()
	}
	return h / (h + m)
}

// budgetCutMetric counts pages the peer held but a lookup left out of its hit
// because the query budget was spent: misses that are not misses.
const budgetCutMetric = "orbitkv_fabric_lookup_budget_cut_pages_total"

// peerDelta is a peer counter's change over the window, or NaN when the run
// has no peer metrics or the peer does not export the counter.
func peerDelta(r *Run, name string) float64 {
	w := r.Metrics["peer"]
	if w == nil {
		return math.NaN()
	}
	v, ok := w.Delta[name]
	if !ok {
		return math.NaN()
	}
	return v
}

// noteBudgetCuts says which runs had lookups cut by the query budget.
func (rep *Report) noteBudgetCuts() {
	for _, r := range rep.Runs {
		if v := peerDelta(r, budgetCutMetric); v > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: the query budget cut %.0f stored pages from lookups (%s), counted at every lookup: "+
				"a request deferred and asked again counts each time, and a cut it waited out was restored after all; the others were recomputed",
				filepath.Base(r.Dir), v, budgetCutMetric))
		}
	}
}

// restoredFrac is Σ restored tokens / Σ prompt tokens of completed requests.
func restoredFrac(r *Run) float64 {
	var restored, prompt int
	for _, row := range r.Rows {
		if row.Error == "" {
			restored, prompt = restored+row.RestoredTokens, prompt+row.PromptTokens
		}
	}
	if prompt == 0 {
		return math.NaN()
	}
	return float64(restored) / float64(prompt)
}

// ttfts are the TTFTs of completed requests of a config, in ms.
func (rep *Report) ttfts(cfg string) []float64 {
	var out []float64
	for _, r := range rep.Runs {
		if r.Label("config") != cfg {
			continue
		}
		for _, row := range r.Rows {
			if row.Error == "" && row.Phase != serving.PhaseFiller {
				out = append(out, row.TTFTMS)
			}
		}
	}
	return out
}

func (rep *Report) runsOf(cfg string) []*Run {
	var out []*Run
	for _, r := range rep.Runs {
		if r.Label("config") == cfg {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *Run) int { return strings.Compare(a.Label("pair"), b.Label("pair")) })
	return out
}
