package cluster

import (
	"testing"

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
