package serving

import "slices"

// Restart is what a sustained window's engine restart cost (--restart-at),
// in seconds from the window's start: when the restart began (the requests
// in flight done), when the engine answered again, the completion rate
// before it, and how long after the engine answered the rate was back.
type Restart struct {
	DrainedS   float64 `json:"drained_s"`            // in-flight requests done; --restart-cmd started
	ReadyS     float64 `json:"ready_s"`              // the engine answered again
	BeforeRPS  float64 `json:"before_rps"`           // completions/s over the second half of the time before the restart
	RecoveredS float64 `json:"recovered_s"`          // ready → end of the first window at ≥ 90% of BeforeRPS; -1: not within the run
	Unmeasured string  `json:"unmeasured,omitempty"` // why RecoveredS could not be judged
	WindowS    float64 `json:"recovery_window_s"`    // that window's length
	PerSecond  []int   `json:"completions_per_s"`    // completions in each second of the window
}

const (
	recoveryWindowS = 5.0  // the rate after the restart is judged over windows this long
	recoveryStepS   = 0.25 // and their starts step by this much
	recoveredFrac   = 0.9  // "back": at least this share of the rate before
)

// recovery computes Restart from the completion times (seconds from the
// window's start) of the window's completed requests.
func recovery(ends []float64, drained, ready float64) Restart {
	ends = slices.Clone(ends)
	slices.Sort(ends)
	rs := Restart{DrainedS: drained, ReadyS: ready, RecoveredS: -1, WindowS: recoveryWindowS}
	if n := len(ends); n > 0 {
		rs.PerSecond = make([]int, int(ends[n-1])+1)
		for _, e := range ends {
			rs.PerSecond[int(e)]++
		}
	}
	if drained > 0 {
		rs.BeforeRPS = float64(countIn(ends, drained/2, drained)) / (drained / 2)
	}
	if rs.BeforeRPS == 0 || len(ends) == 0 {
		rs.Unmeasured = "no completion before the restart"
		return rs
	}
	last := ends[len(ends)-1]
	if ready+recoveryWindowS > last {
		rs.Unmeasured = "less than one recovery window of the run after the engine was back"
		return rs
	}
	for t := ready; t+recoveryWindowS <= last; t += recoveryStepS {
		if float64(countIn(ends, t, t+recoveryWindowS))/recoveryWindowS >= recoveredFrac*rs.BeforeRPS {
			rs.RecoveredS = t + recoveryWindowS - ready
			break
		}
	}
	return rs
}

// countIn counts the sorted values in [lo, hi).
func countIn(sorted []float64, lo, hi float64) int {
	i, _ := slices.BinarySearch(sorted, lo)
	j, _ := slices.BinarySearch(sorted, hi)
	return j - i
}
