package catalog

import (
	"math/rand/v2"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

func randomKey(r *rand.Rand) pagekey.Key {
	var k pagekey.Key
	for i := range k {
		k[i] = byte(r.Uint32())
	}
	return k
}

// TestSummaryAgainstModel: a summary under random saves and drops, against
// a plain set: every page held is claimed (no false negative), a copy kept
// by applying the flips equals the summary's filter, and at capacity the
// filter falsely claims well under a fifth of absent keys.
func TestSummaryAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(38, 1))
	s := NewSummary(4096)
	copyOf := make(Filter, len(s.Filter()))
	held := map[pagekey.Key]bool{}
	var keys []pagekey.Key
	for step := range 40_000 {
		var flips []Flip
		if len(keys) < s.Capacity() && (len(keys) == 0 || r.IntN(3) > 0) {
			k := randomKey(r)
			keys, held[k] = append(keys, k), true
			flips = s.Add(k, nil)
		} else {
			i := r.IntN(len(keys))
			k := keys[i]
			keys[i], keys = keys[len(keys)-1], keys[:len(keys)-1]
			delete(held, k)
			flips = s.Remove(k, nil)
		}
		if err := copyOf.Apply(flips); err != nil {
			t.Fatal(err)
		}
		if step%5000 == 0 {
			for k := range held {
				if !copyOf.Has(k) {
					t.Fatalf("step %d: a held page is not claimed", step)
				}
			}
		}
	}
	if got := s.Filter(); !equalFilters(got, copyOf) {
		t.Fatal("the copy kept by flips differs from the summary")
	}
	if s.Pages() != len(held) {
		t.Fatalf("pages %d, held %d", s.Pages(), len(held))
	}
	falsePos := 0
	const probes = 20_000
	for range probes {
		if copyOf.Has(randomKey(r)) {
			falsePos++
		}
	}
	rate := float64(falsePos) / probes
	t.Logf("%d pages in a filter for %d (%d bytes): false positives %.1f%%", len(held), s.Capacity(), len(copyOf)*8, 100*rate)
	if rate > 0.2 {
		t.Errorf("false-positive rate %.3f", rate)
	}
	if est := copyOf.Pages(); est < len(held)*9/10 || est > len(held)*11/10 {
		t.Errorf("estimated %d pages, holds %d", est, len(held))
	}
}

func equalFilters(a, b Filter) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSummariesLeading: claims of a chain's leading run, by origin, as a
// linear scan of each filter would count them; refuted claims cut a run.
func TestSummariesLeading(t *testing.T) {
	r := rand.New(rand.NewPCG(38, 2))
	chain := make([]pagekey.Key, 8)
	for i := range chain {
		chain[i] = randomKey(r)
	}
	var sums Summaries
	for origin, n := range map[int]int{2: 8, 5: 3} {
		s := NewSummary(64)
		for _, k := range chain[:n] {
			s.Add(k, nil)
		}
		if err := sums.Replace(origin, s.Filter()); err != nil {
			t.Fatal(err)
		}
	}
	got := sums.Leading(chain, nil)
	// A filter may claim more than was added (a false positive), never less.
	if len(got) != 2 || got[0].Origin != 2 || got[0].Pages != 8 || got[1].Origin != 5 || got[1].Pages < 3 {
		t.Fatalf("leading %+v", got)
	}
	got = sums.Leading(chain, func(o int, k pagekey.Key) bool { return o == 2 && k == chain[4] })
	if got[0].Origin != 2 || got[0].Pages != 4 {
		t.Fatalf("a refuted claim must cut the run: %+v", got)
	}
	if !sums.Drop(2) || sums.Has(2) || len(sums.Leading(chain[3:], nil)) > 1 {
		t.Fatal("a dropped origin is still claimed")
	}
	if sums.Replace(MaxOrigins, nil) == nil || sums.Replace(1, make(Filter, 7)) == nil {
		t.Fatal("a bad origin or filter size was accepted")
	}
	if sums.Apply(5, []Flip{{Bit: 1 << 30, Set: true}}) == nil {
		t.Fatal("a flip past the filter was accepted")
	}
}
