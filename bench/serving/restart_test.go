package serving

import "testing"

// steady returns completion times at rate per second over [from, to).
func steady(from, to, rate float64) []float64 {
	var out []float64
	for t := from; t < to; t += 1 / rate {
		out = append(out, t)
	}
	return out
}

func TestRecoveryFindsWhenTheRateIsBack(t *testing.T) {
	// 10/s until the restart at 30 s, nothing until ready at 40 s, 2/s for 6 s (cold), then 10/s.
	ends := append(steady(0, 30, 10), steady(40, 46, 2)...)
	ends = append(ends, steady(46, 80, 10)...)
	rs := recovery(ends, 30, 40)
	if rs.BeforeRPS < 9.9 || rs.BeforeRPS > 10.1 {
		t.Fatalf("before = %.2f/s, want 10", rs.BeforeRPS)
	}
	// the first 5-s window at ≥ 9/s starts at 46 − 0.5 s at the latest (4.5 s of 10/s + 0.5 s of 2/s = 46 ≥ 45)
	if rs.RecoveredS < 10 || rs.RecoveredS > 11.1 {
		t.Errorf("recovered after %.2f s, want about 10.5-11 (6 s cold + a 5-s window)", rs.RecoveredS)
	}
	if len(rs.PerSecond) != 80 || rs.PerSecond[10] != 10 || rs.PerSecond[35] != 0 || rs.PerSecond[41] != 2 {
		t.Errorf("per second: %v", rs.PerSecond)
	}
}

func TestRecoveryThatNeverComesIsMinusOne(t *testing.T) {
	ends := append(steady(0, 30, 10), steady(40, 80, 5)...) // back at half the rate only
	if rs := recovery(ends, 30, 40); rs.RecoveredS != -1 {
		t.Errorf("recovered = %.2f, want -1", rs.RecoveredS)
	}
	if rs := recovery(ends, 30, 40); rs.Unmeasured != "" {
		t.Errorf("measured but said unmeasured: %q", rs.Unmeasured)
	}
	if rs := recovery(nil, 30, 40); rs.RecoveredS != -1 || rs.BeforeRPS != 0 || rs.Unmeasured == "" {
		t.Errorf("no completions: %+v", rs)
	}
	if rs := recovery(steady(0, 42, 10), 30, 40); rs.RecoveredS != -1 || rs.Unmeasured == "" {
		t.Errorf("2 s after ready: %+v", rs)
	}
}
