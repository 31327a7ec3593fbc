package catalog

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// TestHoldersAgainstModel: a Holders under random adds and removes of ids
// across the whole range, against a plain set: membership, count, order,
// the inline form for small sets, and copies that later changes leave
// alone (the spilled words are shared).
func TestHoldersAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(38, 3))
	// Ids crowd in a few places, so that sets grow past the inline form
	// and shrink back: low ids, the old cap's edge, 1,000 hosts, the cap.
	pool := []int{0, 1, 2, 63, 64, 65, 127, 128, 129, 500, 998, 999, 1000, 2047, 2048, MaxOrigins - 2, MaxOrigins - 1}
	var h Holders
	model := map[int]bool{}
	type snapshot struct {
		h    Holders
		want string
	}
	var snaps []snapshot
	for step := range 20_000 {
		o := pool[r.IntN(len(pool))]
		if r.IntN(2) == 0 {
			if err := h.Add(o); err != nil {
				t.Fatalf("step %d: Add(%d): %v", step, o, err)
			}
			model[o] = true
		} else {
			h.Remove(o)
			delete(model, o)
		}
		want := slices.Sorted(func(yield func(int) bool) {
			for o := range model {
				if !yield(o) {
					return
				}
			}
		})
		if got := h.String(); got != fmt.Sprint(want) {
			t.Fatalf("step %d: holders %s, want %v", step, got, want)
		}
		if h.Count() != len(want) || h.Empty() != (len(want) == 0) {
			t.Fatalf("step %d: count %d empty %v, want %d", step, h.Count(), h.Empty(), len(want))
		}
		for _, o := range pool {
			if h.Has(o) != model[o] {
				t.Fatalf("step %d: Has(%d) = %v", step, o, h.Has(o))
			}
		}
		if got, want := form(h), wantForm(want); got != want {
			t.Fatalf("step %d: holders %v in form %s, want %s", step, h, got, want)
		}
		if step%500 == 0 {
			snaps = append(snaps, snapshot{h, h.String()})
		}
	}
	for i, s := range snaps {
		if got := s.h.String(); got != s.want {
			t.Fatalf("copy %d changed after it was taken: %s, was %s", i, got, s.want)
		}
	}
}

// form names h's form.
func form(h Holders) string {
	switch {
	case h.big != nil:
		return "words"
	case h.isBits():
		return "bits"
	case h.Empty():
		return "empty"
	}
	return "list"
}

// wantForm is the form of the set of ids (ascending) by the rule written
// at Holders.
func wantForm(ids []int) string {
	switch {
	case len(ids) == 0:
		return "empty"
	case ids[len(ids)-1] < 127:
		return "bits"
	case len(ids) <= 8:
		return "list"
	}
	return "words"
}

func TestHoldersRange(t *testing.T) {
	if spilled <= MaxOrigins || spilled&bitsFlag != 0 {
		t.Fatalf("the spilled mark %#x is an inline list's id or inline bits", spilled)
	}
	var h Holders
	for _, o := range []int{-1, MaxOrigins, MaxOrigins + 64} {
		if err := h.Add(o); !errors.Is(err, ErrOrigin) {
			t.Errorf("Add(%d) = %v, want ErrOrigin", o, err)
		}
		if h.Has(o) {
			t.Errorf("Has(%d)", o)
		}
	}
	if !h.Empty() {
		t.Fatalf("a refused id was added: %s", h)
	}
	if _, err := HoldersOf(1, MaxOrigins); !errors.Is(err, ErrOrigin) {
		t.Errorf("HoldersOf past the cap = %v", err)
	}
	h, err := HoldersOf(MaxOrigins-1, 0, 1000, 128, 129)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.String(); got != fmt.Sprint([]int{0, 128, 129, 1000, MaxOrigins - 1}) {
		t.Fatalf("holders %s", got)
	}
	if h.First() != 0 || h.Next(129) != 1000 || h.Next(1000) != MaxOrigins-1 || h.Next(MaxOrigins-1) != -1 {
		t.Fatalf("iteration: first %d, after 129 %d", h.First(), h.Next(129))
	}
}

// TestRemoteOriginsPastOldCap: the index keeps origins far past 128 apart,
// inline and spilled, and a page read before a change keeps what it had.
func TestRemoteOriginsPastOldCap(t *testing.T) {
	r := NewRemote()
	fp := pagekey.Fingerprint{1}
	k := key(1)
	origins := []int{200, 1000, 129, MaxOrigins - 1, 3, 2048, 777, 5, 6, 7}
	for i, o := range origins {
		must(t, r.Add(o, k, fp, 100))
		if p, _ := r.Get(k); i < 8 && form(p.Holders) != "list" || i >= 8 && form(p.Holders) != "words" {
			t.Fatalf("%d holders in form %s", i+1, form(p.Holders))
		}
	}
	all := fmt.Sprint([]int{3, 5, 6, 7, 129, 200, 777, 1000, 2048, MaxOrigins - 1})
	before, _ := r.Get(k)
	if got := before.Holders.String(); got != all {
		t.Fatalf("holders %s", got)
	}
	if r.Count(1000) != 1 || r.Count(128) != 0 {
		t.Fatalf("count(1000) %d, count(128) %d", r.Count(1000), r.Count(128))
	}
	r.Remove(2048, k)
	if n := r.DropOrigin(MaxOrigins - 1); n != 1 {
		t.Fatalf("DropOrigin(%d) = %d", MaxOrigins-1, n)
	}
	if got := before.Holders.String(); got != all {
		t.Fatalf("a page read before changed under its reader: %s", got)
	}
	after, _ := r.Get(k)
	if got := after.Holders.String(); got != "[3 5 6 7 129 200 777 1000]" {
		t.Fatalf("holders after removals %s", got)
	}
	s := &r.shards[r.shard(k)]
	if form(after.Holders) != "list" || len(s.big) != 0 {
		t.Fatalf("8 holders left in form %s, %d spilled entries", form(after.Holders), len(s.big))
	}
	for _, o := range []int{5, 6, 7, 3} {
		r.Remove(o, k)
	}
	if got := fmt.Sprint(r.Extend([]pagekey.Key{k}, fp, 100, func(o int) bool { return o > 500 })); got != "[777]" {
		t.Fatalf("Extend = %s", got)
	}
	for _, o := range []int{200, 777, 1000} {
		r.Remove(o, k)
	}
	must(t, r.Add(5, k, fp, 100))
	r.Remove(129, k) // ids below 127 only: bits
	if p, _ := r.Get(k); form(p.Holders) != "bits" || p.Holders.String() != "[5]" {
		t.Fatalf("holders %s in form %s", p.Holders, form(p.Holders))
	}
	r.Remove(5, k)
	if r.Len() != 0 || len(s.big) != 0 {
		t.Fatalf("%d entries, %d spilled, after every holder left", r.Len(), len(s.big))
	}
	if err := r.Add(MaxOrigins, k, fp, 100); !errors.Is(err, ErrOrigin) {
		t.Fatalf("Add(MaxOrigins) = %v", err)
	}
}

// TestRemoteLeadingManyOrigins: 1,000 origins, each holding a leading run
// of its own length (some none, some with a gap), ranked as a per-origin
// scan of the pages counts them.
func TestRemoteLeadingManyOrigins(t *testing.T) {
	const origins, pages = 1000, 12
	r := NewRemote()
	fp := pagekey.Fingerprint{1}
	keys := make([]pagekey.Key, pages)
	for i := range keys {
		keys[i] = key(i + 1)
	}
	rng := rand.New(rand.NewPCG(38, 4))
	held := make([][]bool, origins)
	for o := range origins {
		held[o] = make([]bool, pages)
		for i := range pages {
			held[o][i] = rng.IntN(8) > 0
			if held[o][i] {
				must(t, r.Add(o, keys[i], fp, 100))
			}
		}
	}
	var want []Held
	for o := range origins {
		n := 0
		for n < pages && held[o][n] {
			n++
		}
		if n > 0 {
			want = append(want, Held{Origin: o, Pages: n})
		}
	}
	got := r.Leading(keys)
	if !slices.Equal(got, want) {
		t.Fatalf("Leading: %d holders, want %d; first difference at %v", len(got), len(want), firstDiff(got, want))
	}
	if want[len(want)-1].Origin < 900 {
		t.Fatalf("the test's origins stop at %d", want[len(want)-1].Origin)
	}
}

func firstDiff(a, b []Held) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("%d: %+v vs %+v", i, a[i], b[i])
		}
	}
	return "the end of the shorter"
}

// TestSummariesFarOrigins: filters of origins 1,000 and the cap's last id
// are kept, claimed and dropped; the table grows with the highest origin,
// and shrinks back when it leaves.
func TestSummariesFarOrigins(t *testing.T) {
	r := rand.New(rand.NewPCG(38, 5))
	chain := make([]pagekey.Key, 6)
	for i := range chain {
		chain[i] = randomKey(r)
	}
	var sums Summaries
	for origin, n := range map[int]int{1000: 6, MaxOrigins - 1: 2, 7: 4} {
		s := NewSummary(64)
		for _, k := range chain[:n] {
			s.Add(k, nil)
		}
		if err := sums.Replace(origin, s.Filter()); err != nil {
			t.Fatal(err)
		}
	}
	if sums.Len() != 3 || !sums.Has(1000) || !sums.Has(MaxOrigins-1) || sums.Has(999) {
		t.Fatalf("len %d, has 1000 %v, has %d %v", sums.Len(), sums.Has(1000), MaxOrigins-1, sums.Has(MaxOrigins-1))
	}
	if !sums.Claims(1000, chain[5]) || sums.Pages(1000) != 6 {
		t.Fatalf("origin 1000: claims page 5 %v, pages %d", sums.Claims(1000, chain[5]), sums.Pages(1000))
	}
	got := sums.Leading(chain, nil)
	if len(got) != 3 || got[0].Origin != 7 || got[0].Pages < 4 || got[1] != (Held{Origin: 1000, Pages: 6}) || got[2].Origin != MaxOrigins-1 || got[2].Pages < 2 {
		t.Fatalf("leading %+v", got)
	}
	must(t, sums.Apply(1000, []Flip{{Bit: 0, Set: true}}))
	if !sums.Drop(MaxOrigins-1) || sums.Has(MaxOrigins-1) || len(sums.f) != 1001 {
		t.Fatalf("after dropping the last origin: has it %v, table of %d", sums.Has(MaxOrigins-1), len(sums.f))
	}
	if !sums.Drop(1000) || len(sums.f) != 8 || sums.Drop(1000) {
		t.Fatalf("after dropping origin 1000: table of %d", len(sums.f))
	}
	if !errors.Is(sums.Replace(MaxOrigins, Filter{}), ErrOrigin) || !errors.Is(sums.Apply(2000, []Flip{{Bit: 0, Set: true}}), ErrFilter) {
		t.Fatal("an origin past the cap accepted, or a flip to an origin without a filter")
	}
	if sums.Claims(2000, chain[0]) || sums.Pages(2000) != 0 || sums.Has(-1) {
		t.Fatal("an origin without a filter claims something")
	}
}
