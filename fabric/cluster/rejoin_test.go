package cluster

import (
	"slices"
	"testing"
	"time"
)

// TestRejoinSet: a failed member is tried after rejoinFirst, then with
// doubling waits up to rejoinMax, until it is up again or rejoinFor passed.
func TestRejoinSet(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type step struct {
		at   time.Duration
		do   func(r *rejoinSet, now time.Time)
		want []string // due at this time
	}
	fail := func(name, addr string) func(*rejoinSet, time.Time) {
		return func(r *rejoinSet, now time.Time) { r.failed(name, addr, now) }
	}
	up := func(name string) func(*rejoinSet, time.Time) { return func(r *rejoinSet, _ time.Time) { r.up(name) } }
	tests := []struct {
		name  string
		steps []step
	}{
		{"backoff doubles to its cap", []step{
			{0, fail("b", "10.0.0.2:7946"), nil},
			{rejoinFirst - time.Millisecond, nil, nil},
			{rejoinFirst, nil, []string{"10.0.0.2:7946"}},
			{rejoinFirst + 2*rejoinFirst - time.Millisecond, nil, nil},
			{3 * rejoinFirst, nil, []string{"10.0.0.2:7946"}},
			{7 * rejoinFirst, nil, []string{"10.0.0.2:7946"}},
			{15 * rejoinFirst, nil, []string{"10.0.0.2:7946"}},
			{15*rejoinFirst + rejoinMax, nil, []string{"10.0.0.2:7946"}},
			{15*rejoinFirst + 2*rejoinMax - time.Millisecond, nil, nil},
			{15*rejoinFirst + 2*rejoinMax, nil, []string{"10.0.0.2:7946"}},
		}},
		{"a member back up is not tried", []step{
			{0, fail("b", "b:1"), nil},
			{0, fail("c", "c:1"), nil},
			{time.Millisecond, up("b"), nil},
			{rejoinFirst, nil, []string{"c:1"}},
		}},
		{"given up after rejoinFor", []step{
			{0, fail("b", "b:1"), nil},
			{rejoinFor - time.Second, nil, []string{"b:1"}},
			{rejoinFor, nil, nil},
			{rejoinFor + rejoinMax, nil, nil},
		}},
		{"no address, nothing to try", []step{
			{0, fail("b", ""), nil},
			{rejoinFirst, nil, nil},
		}},
		{"failing again restarts the backoff", []step{
			{0, fail("b", "b:1"), nil},
			{rejoinFirst, nil, []string{"b:1"}},
			{2 * rejoinFirst, fail("b", "b:2"), nil},
			{3 * rejoinFirst, nil, []string{"b:2"}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r rejoinSet
			for i, s := range tc.steps {
				if s.do != nil {
					s.do(&r, at(s.at))
				}
				if got := r.due(at(s.at)); !slices.Equal(got, s.want) {
					t.Fatalf("step %d at %v: due %v, want %v", i, s.at, got, s.want)
				}
			}
		})
	}
}
