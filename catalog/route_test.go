package catalog

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// TestRemoteLeading: only a run from page 0 counts; a holder of pages 1..k
// holds no leading page, however many it has.
func TestRemoteLeading(t *testing.T) {
	keys := make([]pagekey.Key, 6)
	for i := range keys {
		keys[i] = key(i + 1)
	}
	fp := pagekey.Fingerprint{1}
	tests := []struct {
		name  string
		holds map[int][]int // origin -> page indexes
		want  string
	}{
		{"nobody", nil, "[]"},
		{"leading run beats a longer run from page 1", map[int][]int{3: {0, 1, 2}, 4: {1, 2, 3, 4, 5}}, "[{3 3}]"},
		{"a gap ends the run", map[int][]int{3: {0, 1, 3, 4, 5}, 9: {0}}, "[{3 2} {9 1}]"},
		{"several holders of the whole chain", map[int][]int{1: {0, 1, 2, 3, 4, 5}, 127: {0, 1, 2, 3, 4, 5}}, "[{1 6} {127 6}]"},
		{"runs of different lengths", map[int][]int{0: {0, 1, 2, 3}, 64: {0, 1}, 65: {0, 1, 2, 3, 4}}, "[{0 4} {64 2} {65 5}]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRemote()
			for o, pages := range tt.holds {
				for _, i := range pages {
					must(t, r.Add(o, keys[i], fp, 100))
				}
			}
			if got := fmt.Sprint(r.Leading(keys)); got != tt.want {
				t.Errorf("Leading = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestRuns(t *testing.T) {
	tests := []struct {
		name  string
		tiers []Tier
		want  []Run
	}{
		{"none", nil, nil},
		{"one tier", []Tier{TierDRAM, TierDRAM}, []Run{{TierDRAM, 2}}},
		{"dram then ssd then dram", []Tier{TierDRAM, TierSSD, TierSSD, TierDRAM}, []Run{{TierDRAM, 1}, {TierSSD, 2}, {TierDRAM, 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Runs(tt.tiers); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Runs = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPeekTouchesNothing: a route query reports tiers like Lookup but
// leaves the access time and hit count eviction reads alone.
func TestPeekTouchesNothing(t *testing.T) {
	c := mustOpen(t, Options{})
	if err := c.Put(dramEntry(0), ssdEntry(1), dramEntry(2)); err != nil {
		t.Fatal(err)
	}
	got := c.Peek([]pagekey.Key{key(0), key(1), key(9), key(2)})
	if want := []Tier{TierDRAM, TierSSD}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Peek = %v, want %v", got, want)
	}
	if e, _ := c.Get(key(0)); e.Hits != 0 || e.LastAccess != dramEntry(0).LastAccess {
		t.Fatalf("Peek touched entry 0: %+v", e)
	}
}
