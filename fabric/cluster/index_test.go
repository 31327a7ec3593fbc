package cluster

import (
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// TestLongClaimAskedInPieces: a claim longer than one Holds may ask
// (holdsMaxKeys) is confirmed in pieces and counted whole.
func TestLongClaimAskedInPieces(t *testing.T) {
	keys := seededKeys(4, 2*holdsMaxKeys+100)
	x := newIndex()
	if err := x.sums.Replace(5, claimingAll(64)); err != nil {
		t.Fatal(err)
	}
	m := &fakeMembers{asked: map[int]int{}, holds: map[int]int{5: len(keys)}}
	x.members = m
	if got := len(x.Extend(keys, pagekey.Fingerprint{7}, 4096, nil)); got != len(keys) {
		t.Fatalf("extend counts %d of %d claimed and held pages (asked %v)", got, len(keys), m.asked)
	}
	if m.asked[5] != 3 || m.held != 1 || m.falseClaims != 0 {
		t.Fatalf("asked %v, held %d, false %d: want 3 pieces of one true claim", m.asked, m.held, m.falseClaims)
	}
}

// TestSilentClaimantsSkipped: three members claim the chain and never
// answer. The first lookup asks each once (maxAsks), all within one
// deadline; the next asks nobody until silentTTL has passed.
func TestSilentClaimantsSkipped(t *testing.T) {
	keys := seededKeys(5, 6)
	x := newIndex()
	now := time.Unix(1000, 0)
	x.now = func() time.Time { return now }
	m := &fakeMembers{asked: map[int]int{}, silent: map[int]bool{}, deadlines: map[time.Time]bool{}}
	for _, o := range []int{2, 3, 4} {
		if err := x.sums.Replace(o, claimingAll(64)); err != nil {
			t.Fatal(err)
		}
		m.silent[o] = true
	}
	x.members = m
	asks := func() int { return m.asked[2] + m.asked[3] + m.asked[4] }
	layout, size := pagekey.Fingerprint{7}, uint64(4096)
	if got := x.Extend(keys, layout, size, nil); len(got) != 0 || asks() != 3 || len(m.deadlines) != 1 {
		t.Fatalf("first lookup: %v, %d asked (%v) within %d deadlines, want nothing from 3 questions within 1",
			got, asks(), m.asked, len(m.deadlines))
	}
	if got := x.Extend(keys, layout, size, nil); len(got) != 0 || asks() != 3 {
		t.Fatalf("second lookup: %v, asked %v: silent members asked again", got, m.asked)
	}
	now = now.Add(silentTTL)
	m.silent[3] = false
	m.holds = map[int]int{3: len(keys)}
	if got := x.Extend(keys, layout, size, nil); len(got) != len(keys) || m.asked[3] != 2 {
		t.Fatalf("after silentTTL: %v, asked %v, want all %d pages from 3", got, m.asked, len(keys))
	}
}
