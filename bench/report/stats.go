package report

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Interval is a point estimate with a confidence interval.
type Interval struct {
	Est, Lo, Hi float64
	N           int // independent units (process pairs)
}

// bootstrapSeed fixes the resampling so a report is reproducible.
const bootstrapSeed = 20260921

// RatioCI is the geometric mean of ratios (candidate/baseline per
// independent pair) with a percentile bootstrap interval at level (e.g.
// 0.95) from reps resamples of the pairs. Non-positive ratios are skipped.
// One pair gives no interval (Lo and Hi are NaN): resampling one value
// would print its own value as a zero-width interval.
func RatioCI(ratios []float64, level float64, reps int) Interval {
	var logs []float64
	for _, r := range ratios {
		if r > 0 && !math.IsInf(r, 0) && !math.IsNaN(r) {
			logs = append(logs, math.Log(r))
		}
	}
	iv := Interval{N: len(logs), Est: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	if len(logs) == 0 {
		return iv
	}
	iv.Est = math.Exp(mean(logs))
	if len(logs) < 2 {
		return iv
	}
	r := rand.New(rand.NewPCG(bootstrapSeed, uint64(len(logs))))
	means := make([]float64, reps)
	for i := range means {
		s := 0.0
		for range logs {
			s += logs[r.IntN(len(logs))]
		}
		means[i] = s / float64(len(logs))
	}
	slices.Sort(means)
	a := (1 - level) / 2
	iv.Lo = math.Exp(pick(means, a))
	iv.Hi = math.Exp(pick(means, 1-a))
	return iv
}

// pick is the q-quantile of sorted by linear interpolation.
func pick(sorted []float64, q float64) float64 {
	pos := q * float64(len(sorted)-1)
	i := int(math.Floor(pos))
	if i+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	f := pos - float64(i)
	return sorted[i]*(1-f) + sorted[i+1]*f
}

// HasCI is whether the interval was computed (two pairs or more).
func (iv Interval) HasCI() bool { return iv.N >= 2 && !math.IsNaN(iv.Lo) }

// CIText is "lo – hi", or why there is no interval.
func (iv Interval) CIText(prec int) string {
	if !iv.HasCI() {
		return fmt.Sprintf("none (%d pair)", iv.N)
	}
	return fmt.Sprintf("%.*f – %.*f", prec, iv.Lo, prec, iv.Hi)
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
