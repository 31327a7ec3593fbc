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
