package report

import (
	"fmt"
	"math"
)

// Recovery is how much of the gap between the baseline (an engine with no
// cache beyond its capped HBM) and the ceiling (the same engine with HBM
// holding the whole working set) a configuration closes, on throughput:
// (X − baseline) / (ceiling − baseline). 1 is the ceiling; 0 is no better
// than the baseline; below 0 is worse.
type Recovery struct {
	Config   string
	Fraction float64   // from the configs' mean throughputs over all their runs
	PerPair  []float64 // from pairs that ran all three configs
}

// recover fills rep.Recovered when a ceiling config ran beside the baseline.
func (rep *Report) recover(ceiling string) {
	if ceiling == "" {
		ceiling = "ceiling"
	}
	base := rep.Configs[0]
	ceil := rep.runsOf(ceiling)
	if len(ceil) == 0 || base == ceiling || rep.isProbes() {
		return
	}
	tput := func(cfg string) float64 {
		var xs []float64
		for _, r := range rep.runsOf(cfg) {
			xs = append(xs, r.Summary.ThroughputRPS)
		}
		return meanOr(xs)
	}
	b, c := tput(base), tput(ceiling)
	if !(c > b) {
		rep.Notes = append(rep.Notes, fmt.Sprintf("ceiling %.2f req/s is not above %s's %.2f: no fraction recovered", c, base, b))
		return
	}
	for _, cfg := range rep.Configs[1:] {
		if cfg == ceiling {
			continue
		}
		rec := Recovery{Config: cfg, Fraction: RecoveredFraction(tput(cfg), b, c)}
		for _, byCfg := range rep.Pairs {
			pb, pc, px := byCfg[base], byCfg[ceiling], byCfg[cfg]
			if pb != nil && pc != nil && px != nil {
				rec.PerPair = append(rec.PerPair, RecoveredFraction(px.Summary.ThroughputRPS, pb.Summary.ThroughputRPS, pc.Summary.ThroughputRPS))
			}
		}
		rep.Recovered = append(rep.Recovered, rec)
	}
}

// RecoveredFraction is (x − base) / (ceiling − base), NaN when the ceiling is
// not above the base.
func RecoveredFraction(x, base, ceiling float64) float64 {
	if !(ceiling > base) {
		return math.NaN()
	}
	return (x - base) / (ceiling - base)
}

// recovery renders the fraction-recovered table.
func (rep *Report) recovery(p func(string, ...any)) {
	if len(rep.Recovered) == 0 {
		return
	}
	p("\n## Fraction of the ceiling recovered (throughput)\n\n(X − %s) / (ceiling − %s), from mean throughputs over all runs of each config; per pair where a pair ran all three.\n\n", rep.Configs[0], rep.Configs[0])
	p("| config | fraction recovered | per pair |\n|---|---|---|\n")
	for _, r := range rep.Recovered {
		per := "–"
		if len(r.PerPair) > 0 {
			per = ""
			for i, v := range r.PerPair {
				if i > 0 {
					per += ", "
				}
				per += f(v, 3)
			}
		}
		p("| %s | %s | %s |\n", r.Config, f(r.Fraction, 3), per)
	}
}
