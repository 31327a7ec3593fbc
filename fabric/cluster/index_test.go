package cluster

import (
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
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

// TestStaleConfirmationAskedAgain: at its filter's capacity a member evicts
// a confirmed run whose keys' bits other keys still set, so its filter
// still claims them. Once the confirmation expires (confirmTTL) the next
// lookup asks again and counts none.
func TestStaleConfirmationAskedAgain(t *testing.T) {
	s := catalog.NewSummary(0)
	held := seededKeys(6, s.Capacity())
	for _, k := range held {
		s.Add(k, nil)
	}
	x := newIndex()
	now := time.Unix(1000, 0)
	x.now = func() time.Time { return now }
	if err := x.sums.Replace(5, s.Filter()); err != nil {
		t.Fatal(err)
	}
	var flips []catalog.Flip
	for _, k := range held[:300] {
		flips = s.Remove(k, flips)
	}
	after := s.Filter()
	var chain []pagekey.Key
	for _, k := range held[:300] {
		if after.Has(k) && len(chain) < 6 {
			chain = append(chain, k)
		}
	}
	if len(chain) < 6 {
		t.Fatalf("only %d evicted keys still claimed", len(chain))
	}
	m := &fakeMembers{asked: map[int]int{}, holds: map[int]int{5: len(chain)}}
	x.members = m
	layout, size := pagekey.Fingerprint{7}, uint64(4096)
	if got := x.Extend(chain, layout, size, nil); len(got) != len(chain) || m.asked[5] != 1 {
		t.Fatalf("before the eviction: %v, asked %v", got, m.asked)
	}
	if err := x.sums.Apply(5, flips); err != nil {
		t.Fatal(err)
	}
	m.holds[5] = 0
	now = now.Add(confirmTTL)
	if got := x.Extend(chain, layout, size, nil); len(got) != 0 || m.asked[5] != 2 || m.falseClaims != 1 {
		t.Fatalf("after the eviction and the confirmation's expiry: %v, asked %v, false claims %d; want none, asked again, 1 false",
			got, m.asked, m.falseClaims)
	}
}

// TestRefutationClearedByNewKeys: a member holds 2 pages of a chain whose
// third its filter claims falsely; a lookup counts 2 and refutes the
// third. The member then saves the other 4 (their set bits arrive as
// flips), and the next lookup counts all 6.
func TestRefutationClearedByNewKeys(t *testing.T) {
	s := catalog.NewSummary(0)
	for _, k := range seededKeys(7, s.Capacity()*3/4) {
		s.Add(k, nil)
	}
	chain := seededKeys(8, 2)
	for _, k := range chain {
		s.Add(k, nil)
	}
	f := s.Filter()
	var claimed, unclaimed []pagekey.Key
	for _, k := range seededKeys(9, 400) {
		if f.Has(k) {
			claimed = append(claimed, k)
		} else {
			unclaimed = append(unclaimed, k)
		}
	}
	if len(claimed) < 1 || len(unclaimed) < 3 {
		t.Fatalf("%d claimed and %d unclaimed candidates", len(claimed), len(unclaimed))
	}
	chain = append(chain, claimed[0], unclaimed[0], unclaimed[1], unclaimed[2])
	x := newIndex()
	if err := x.sums.Replace(5, f); err != nil {
		t.Fatal(err)
	}
	m := &fakeMembers{asked: map[int]int{}, holds: map[int]int{5: 2}}
	x.members = m
	layout, size := pagekey.Fingerprint{7}, uint64(4096)
	if got := x.Extend(chain, layout, size, nil); len(got) != 2 || m.falseClaims != 1 {
		t.Fatalf("holding 2: %v, false claims %d", got, m.falseClaims)
	}
	c := &Cluster{remote: x}
	o := &origin{id: 5, compact: true}
	var flips []catalog.Flip
	for _, k := range chain[2:] {
		flips = s.Add(k, flips)
	}
	for _, a := range flipAnnouncements(flips) {
		c.applyFlipLocked(o, a)
	}
	m.holds[5] = len(chain)
	if got := x.Extend(chain, layout, size, nil); len(got) != len(chain) {
		t.Fatalf("after the member saved the rest (%d flips): %v, asked %v", len(flips), got, m.asked)
	}
}
