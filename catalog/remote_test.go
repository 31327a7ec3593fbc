package catalog

import (
	"fmt"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

func TestRemoteExtendPrefersOneHolderPerRun(t *testing.T) {
	r := NewRemote()
	fp := pagekey.Fingerprint{1}
	keys := make([]pagekey.Key, 6)
	for i := range keys {
		keys[i] = key(i + 1)
	}
	// Origin 3 holds pages 0-3, origin 70 holds 2-5, origin 5 holds page 4 in
	// another size.
	for i := 0; i < 4; i++ {
		must(t, r.Add(3, keys[i], fp, 100))
	}
	for i := 2; i < 6; i++ {
		must(t, r.Add(70, keys[i], fp, 100))
	}
	if got := fmt.Sprint(r.Extend(keys, fp, 100, nil)); got != "[3 3 3 3 70 70]" {
		t.Errorf("Extend = %s", got)
	}
	if got := fmt.Sprint(r.Extend(keys, fp, 100, func(o int) bool { return o != 3 })); got != "[]" {
		t.Errorf("Extend without origin 3 = %s, want the run to stop at page 0", got)
	}
	if got := fmt.Sprint(r.Extend(keys, pagekey.Fingerprint{2}, 100, nil)); got != "[]" {
		t.Errorf("Extend with another layout = %s", got)
	}
	must(t, r.Add(5, keys[4], fp, 200)) // another size replaces the holders
	if got := fmt.Sprint(r.Extend(keys, fp, 100, nil)); got != "[3 3 3 3]" {
		t.Errorf("Extend after a conflicting announcement = %s", got)
	}
	r.Remove(3, keys[1])
	if got := fmt.Sprint(r.Extend(keys, fp, 100, nil)); got != "[3]" {
		t.Errorf("Extend after removing page 1 = %s", got)
	}
	if n := r.DropOrigin(70); n != 3 || r.Count(70) != 0 {
		t.Errorf("DropOrigin(70) = %d, count after %d", n, r.Count(70))
	}
	if n := r.Len(); n != 4 { // pages 0, 2, 3 (origin 3) and 4 (origin 5)
		t.Errorf("Len = %d", n)
	}
	if err := r.Add(MaxOrigins, keys[0], fp, 1); err == nil {
		t.Error("origin out of range accepted")
	}
	p, _ := r.Get(keys[0])
	if !p.Holders.Has(3) || p.Holders.Count() != 1 || p.Holders.First() != 3 {
		t.Errorf("holders %v", p.Holders)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
