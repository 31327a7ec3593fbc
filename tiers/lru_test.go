package tiers

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

func key(i int) pagekey.Key { var k pagekey.Key; k[0], k[1] = byte(i), byte(i>>8); return k }

func TestLRUOrderAndPins(t *testing.T) {
	l := NewLRU()
	for i := 0; i < 4; i++ {
		l.Touch(key(i))
	}
	l.Touch(key(0)) // order now 1 2 3 0
	if v, _ := l.Victim(); v != key(1) {
		t.Fatalf("victim %v, want key 1", v)
	}
	l.Pin(key(1))
	l.Pin(key(2))
	if v, _ := l.Victim(); v != key(3) {
		t.Fatalf("victim %v, want key 3 (1 and 2 pinned)", v)
	}
	l.Pin(key(3))
	l.Pin(key(0))
	if _, ok := l.Victim(); ok {
		t.Fatal("every page pinned: want no victim")
	}
	l.Unpin(key(2))
	if v, _ := l.Victim(); v != key(2) {
		t.Fatalf("victim %v, want key 2 after unpin", v)
	}
	l.Remove(key(2))
	if l.Contains(key(2)) || l.Len() != 3 {
		t.Fatal("remove did not remove")
	}
	if l.Pin(key(9)) {
		t.Fatal("pin of an untracked key must report false")
	}
}

// TestLRUAgainstModel drives the LRU and a naive slice model with the same
// random operations and compares victims.
func TestLRUAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	l := NewLRU()
	var order []pagekey.Key // oldest first
	pins := map[pagekey.Key]int{}
	for step := 0; step < 20000; step++ {
		k := key(r.IntN(64))
		switch r.IntN(5) {
		case 0, 1:
			l.Touch(k)
			if i := slices.Index(order, k); i >= 0 {
				order = slices.Delete(order, i, i+1)
			}
			order = append(order, k)
		case 2:
			l.Remove(k)
			if i := slices.Index(order, k); i >= 0 {
				order = slices.Delete(order, i, i+1)
			}
			delete(pins, k)
		case 3:
			if l.Pin(k) {
				pins[k]++
			}
		case 4:
			l.Unpin(k)
			if pins[k] > 0 {
				pins[k]--
			}
		}
		want, wantOK := pagekey.Key{}, false
		for _, o := range order {
			if pins[o] == 0 {
				want, wantOK = o, true
				break
			}
		}
		got, ok := l.Victim()
		if ok != wantOK || got != want {
			t.Fatalf("step %d: victim %v %v, model %v %v", step, got, ok, want, wantOK)
		}
	}
}

// TestSegmentedLRUAgainstModel drives a segmented LRU and a model of two
// slices (probationary, protected; oldest first) with the same random
// operations and compares victims and segments at every step.
func TestSegmentedLRUAgainstModel(t *testing.T) {
	const share = 0.5
	r := rand.New(rand.NewPCG(3, 4))
	l := NewSegmentedLRU(share)
	var prob, prot []pagekey.Key
	pins := map[pagekey.Key]int{}
	drop := func(s []pagekey.Key, k pagekey.Key) ([]pagekey.Key, bool) {
		if i := slices.Index(s, k); i >= 0 {
			return slices.Delete(s, i, i+1), true
		}
		return s, false
	}
	for step := 0; step < 20000; step++ {
		k := key(r.IntN(64))
		switch r.IntN(6) {
		case 0, 1: // Touch: newest of its own segment, new pages probationary
			l.Touch(k)
			var was bool
			if prot, was = drop(prot, k); was {
				prot = append(prot, k)
			} else {
				prob, _ = drop(prob, k)
				prob = append(prob, k)
			}
		case 2: // Promote: newest protected
			l.Promote(k)
			prob, _ = drop(prob, k)
			prot, _ = drop(prot, k)
			prot = append(prot, k)
		case 3:
			l.Remove(k)
			prob, _ = drop(prob, k)
			prot, _ = drop(prot, k)
			delete(pins, k)
		case 4:
			if l.Pin(k) {
				pins[k]++
			}
		case 5:
			l.Unpin(k)
			if pins[k] > 0 {
				pins[k]--
			}
		}
		for len(prot) > 0 && float64(len(prot)) > share*float64(len(prob)+len(prot)) { // Victim rebalances first
			prob, prot = append(prob, prot[0]), prot[1:]
		}
		want, wantOK := pagekey.Key{}, false
		for _, o := range slices.Concat(prob, prot) {
			if pins[o] == 0 {
				want, wantOK = o, true
				break
			}
		}
		if got, ok := l.Victim(); ok != wantOK || got != want {
			t.Fatalf("step %d: victim %v %v, model %v %v", step, got, ok, want, wantOK)
		}
		for _, o := range prot {
			if !l.Protected(o) {
				t.Fatalf("step %d: %v should be protected", step, o)
			}
		}
		if l.Len() != len(prob)+len(prot) {
			t.Fatalf("step %d: %d pages, model %d", step, l.Len(), len(prob)+len(prot))
		}
	}
}

// TestSegmentedLRUKeepsReusedPagesFromAStreamOfNewOnes: pages used again
// survive any number of pages saved once, where a plain LRU loses them.
func TestSegmentedLRUKeepsReusedPagesFromAStreamOfNewOnes(t *testing.T) {
	for _, c := range []struct {
		name string
		l    *LRU
		kept bool
	}{{"plain", NewLRU(), false}, {"segmented", NewSegmentedLRU(0.8), true}} {
		const capacity = 10
		add := func(k pagekey.Key, reused bool) {
			c.l.Touch(k)
			if reused {
				c.l.Promote(k)
			}
			for c.l.Len() > capacity {
				v, _ := c.l.Victim()
				c.l.Remove(v)
			}
		}
		for i := 100; i < 110; i++ { // the tier of 10 full of pages saved once
			add(key(i), false)
		}
		for i := range 4 { // four pages, each used again
			add(key(i), true)
		}
		for i := 110; i < 200; i++ { // then a stream of pages saved once
			add(key(i), false)
		}
		for i := range 4 {
			if c.l.Contains(key(i)) != c.kept {
				t.Fatalf("%s: reused page %d kept %v, want %v", c.name, i, c.l.Contains(key(i)), c.kept)
			}
		}
	}
}

// TestOldestInPickOrder: Oldest walks the unpinned pages as Victim would
// pick them one after another — probationary oldest first, then protected,
// pinned pages skipped — at most n of each segment, stopping when told.
func TestOldestInPickOrder(t *testing.T) {
	l := NewSegmentedLRU(0.5)
	for i := range 6 {
		l.Touch(key(i))
	}
	l.Promote(key(1))
	l.Promote(key(4))
	l.Pin(key(2))
	walk := func(n int) []pagekey.Key {
		var got []pagekey.Key
		for k := range l.Oldest(n) {
			got = append(got, k)
		}
		return got
	}
	if got, want := walk(10), []pagekey.Key{key(0), key(3), key(5), key(1), key(4)}; !slices.Equal(got, want) {
		t.Fatalf("Oldest(10) = %v, want %v", got, want)
	}
	if got, want := walk(1), []pagekey.Key{key(0), key(1)}; !slices.Equal(got, want) {
		t.Fatalf("Oldest(1) = %v, want %v (one of each segment)", got, want)
	}
	if got, want := walk(2), []pagekey.Key{key(0), key(3), key(1), key(4)}; !slices.Equal(got, want) {
		t.Fatalf("Oldest(2) = %v, want %v (pinned key 2 skipped, not counted)", got, want)
	}
	// Over its share the protected segment hands its oldest back first, as
	// for Victim: with 0.5 of 6 pages, 4 protected become 3 again.
	l.Promote(key(5))
	l.Promote(key(3))
	if got, want := walk(10), []pagekey.Key{key(0), key(1), key(4), key(5), key(3)}; !slices.Equal(got, want) {
		t.Fatalf("Oldest(10) over the share = %v, want %v", got, want)
	}
	if l.Protected(key(1)) {
		t.Fatal("the protected segment's oldest should have gone back to probation")
	}
	n := 0
	for range l.Oldest(10) {
		if n++; n == 2 {
			break
		}
	}
	if v, _ := l.Victim(); v != key(0) || n != 2 {
		t.Fatalf("Victim %v after a walk cut at %d; want key 0 after 2", v, n)
	}
}
