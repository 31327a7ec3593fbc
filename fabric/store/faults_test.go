package store

import (
	"strings"
	"testing"
	"time"
)

// TestTierFaultsWindow: a fault makes the peer unhealthy until faultWindow
// passes with no new one; faults within the window extend it and count
// into one spell, and a fault after a healthy gap starts a new spell.
func TestTierFaultsWindow(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	var f tierFaults
	steps := []struct {
		name  string
		note  string        // a fault at this step, if not ""
		at    time.Duration // since t0
		wants string        // in the problem; "" = healthy
		first bool          // the fault starts a spell (logged)
	}{
		{name: "no fault yet", at: 0},
		{name: "first fault", note: "read: EIO", at: time.Second, wants: "1 faults since 2026-12-01T10:00:01Z", first: true},
		{name: "just inside the window", at: time.Second + faultWindow - time.Millisecond, wants: "read: EIO"},
		{name: "window over", at: time.Second + faultWindow},
		{name: "a new spell", note: "write: EIO", at: 2 * faultWindow, wants: "1 faults", first: true},
		{name: "a second fault extends it", note: "read: short", at: 2*faultWindow + 30*time.Second, wants: "2 faults since 2026-12-01T10:02:00Z"},
		{name: "counted from the latest", at: 3*faultWindow + 29*time.Second, wants: "the last 59s ago: read: short"},
		{name: "healthy again", at: 3*faultWindow + 30*time.Second},
	}
	for _, st := range steps {
		now := t0.Add(st.at)
		if st.note != "" {
			if first := f.note(st.note, now); first != st.first {
				t.Fatalf("%s: starts a spell %v, want %v", st.name, first, st.first)
			}
		}
		got := f.problem(now)
		if st.wants == "" && got != "" || st.wants != "" && !strings.Contains(got, st.wants) {
			t.Fatalf("%s: problem %q, want %q", st.name, got, st.wants)
		}
	}
}
