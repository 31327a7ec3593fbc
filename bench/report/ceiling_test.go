package report

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/bench/serving"
)

func fakeRun(cfg, pair string, rps float64) *Run {
	return &Run{Dir: cfg + "-" + pair, Manifest: serving.Manifest{Labels: map[string]string{"config": cfg, "pair": pair}},
		Summary: serving.Summary{ThroughputRPS: rps}}
}

// TestRecoveredFraction: the fraction is measured against the gap between the
// capped baseline and the ceiling, per pair where all three ran and from the
// means otherwise.
func TestRecoveredFraction(t *testing.T) {
	rep := &Report{Runs: []*Run{
		fakeRun("native", "1", 4), fakeRun("ceiling", "1", 12), fakeRun("orbitkv", "1", 11), fakeRun("offload", "1", 6),
		fakeRun("orbitkv", "2", 9), fakeRun("offload", "2", 8), // pair 2 has no native or ceiling
	}, Pairs: map[string]map[string]*Run{}}
	rep.group("")
	rep.recover("")
	got := map[string]Recovery{}
	for _, r := range rep.Recovered {
		got[r.Config] = r
	}
	if _, ok := got["ceiling"]; ok || len(got) != 2 {
		t.Fatalf("recovered %+v: want orbitkv and offload only", rep.Recovered)
	}
	// orbitkv: mean 10 → (10−4)/(12−4) = 0.75; pair 1: (11−4)/8 = 0.875.
	if o := got["orbitkv"]; math.Abs(o.Fraction-0.75) > 1e-9 || len(o.PerPair) != 1 || math.Abs(o.PerPair[0]-0.875) > 1e-9 {
		t.Errorf("orbitkv %+v", o)
	}
	// offload: mean 7 → 3/8; pair 1: 2/8.
	if o := got["offload"]; math.Abs(o.Fraction-0.375) > 1e-9 || math.Abs(o.PerPair[0]-0.25) > 1e-9 {
		t.Errorf("offload %+v", o)
	}
	var b strings.Builder
	rep.recovery(func(f string, a ...any) { b.WriteString(strings.TrimSpace(fmt.Sprintf(f, a...)) + "\n") })
	if !strings.Contains(b.String(), "| orbitkv | 0.750 | 0.875 |") {
		t.Errorf("table:\n%s", b.String())
	}
}

// TestRecoveredFractionNeedsAGap: a ceiling no faster than the baseline gives
// no fraction, and says why.
func TestRecoveredFractionNeedsAGap(t *testing.T) {
	rep := &Report{Runs: []*Run{fakeRun("native", "1", 5), fakeRun("ceiling", "1", 5), fakeRun("orbitkv", "1", 6)},
		Pairs: map[string]map[string]*Run{}}
	rep.group("")
	rep.recover("")
	if len(rep.Recovered) != 0 || len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "not above") {
		t.Errorf("recovered %+v notes %v", rep.Recovered, rep.Notes)
	}
	if !math.IsNaN(RecoveredFraction(1, 2, 2)) {
		t.Error("RecoveredFraction of an empty gap is a number")
	}
}
