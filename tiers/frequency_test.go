package tiers

import (
	"sync"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

func TestFrequencyCountsAsks(t *testing.T) {
	f := NewFrequency(64)
	hot, warm, cold := key(1), key(2), key(3)
	for range 5 {
		f.Record([]pagekey.Key{hot})
	}
	f.Record([]pagekey.Key{warm, warm})
	if got := f.Estimate(hot); got != 5 {
		t.Errorf("hot asked 5 times: estimate %d", got)
	}
	if got := f.Estimate(warm); got != 2 {
		t.Errorf("warm asked twice: estimate %d", got)
	}
	if got := f.Estimate(cold); got != 0 {
		t.Errorf("cold never asked: estimate %d", got)
	}
	if !f.Hotter(hot, warm) || f.Hotter(warm, hot) || f.Hotter(cold, cold) {
		t.Error("Hotter is not strict by estimate")
	}
}

func TestFrequencySaturatesAndHalves(t *testing.T) {
	f := NewFrequency(64) // 4,096 counters a row, halved every 640 records
	if f.sample != 640 {
		t.Fatalf("sample %d, want 640", f.sample)
	}
	k := key(7)
	for range 40 {
		f.Record([]pagekey.Key{k})
	}
	if got := f.Estimate(k); got != FreqMax {
		t.Fatalf("asked 40 times: estimate %d, want the cap %d", got, FreqMax)
	}
	// The record that reaches 640 halves every counter, itself included.
	other := key(8)
	for range 598 {
		f.Record([]pagekey.Key{other})
	}
	if got := f.Estimate(k); got != FreqMax {
		t.Fatalf("after 638 records: %d, halved too early", got)
	}
	f.Record([]pagekey.Key{other, other})
	if got, o := f.Estimate(k), f.Estimate(other); got != FreqMax/2 || o != FreqMax/2 {
		t.Errorf("after the halving: %d and %d, want %d and %d", got, o, FreqMax/2, FreqMax/2)
	}
	// The count starts again after a halving.
	f.Record([]pagekey.Key{k})
	if got := f.Estimate(k); got != FreqMax/2+1 {
		t.Errorf("one more ask after the halving: %d", got)
	}
}

// TestFrequencyHalvesEachCounterOfAWord: eight counters share a word; a
// halving shifts the word, and no counter's low bit may fall into its
// neighbour's top bit.
func TestFrequencyHalvesEachCounterOfAWord(t *testing.T) {
	f := NewFrequency(64)
	f.rows[0][0] = 0x0f0b_0907_0503_0100 // 15 11 9 7 5 3 1 0, high byte first
	f.halveLocked()
	if got := f.rows[0][0]; got != 0x0705_0403_0201_0000 {
		t.Fatalf("halved word %#016x, want %#016x", got, uint64(0x0705_0403_0201_0000))
	}
}

// TestFrequencyKeepsManyKeysApart: with rows sized for the pages, keys that
// differ in a byte or two (small ids, like these) stay apart: nearly every
// estimate is exact and none undercounts.
func TestFrequencyKeepsManyKeysApart(t *testing.T) {
	const n = 4096
	f := NewFrequency(n)
	for i := range n {
		ks := make([]pagekey.Key, 1+i%3)
		for j := range ks {
			ks[j] = key(i)
		}
		f.Record(ks)
	}
	over := 0
	for i := range n {
		want := uint8(1 + i%3)
		switch got := f.Estimate(key(i)); {
		case got < want:
			t.Fatalf("key %d asked %d times: estimate %d undercounts", i, want, got)
		case got > want:
			over++
		}
	}
	if over > n/100 {
		t.Errorf("%d of %d estimates too high: the rows collide", over, n)
	}
}

func TestFrequencyIsSafeForConcurrentUse(t *testing.T) {
	f := NewFrequency(4096) // no halving in these 1,600 records
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				f.Record([]pagekey.Key{key(g), key(100 + i%5)})
				_ = f.Estimate(key(g))
			}
		})
	}
	wg.Wait()
	for g := range 4 {
		if got := f.Estimate(key(g)); got != FreqMax {
			t.Errorf("a key recorded 200 times reads %d, want the cap %d", got, FreqMax)
		}
	}
}

// BenchmarkFrequencyRecord128 is one lookup's worth of asks (128 pages)
// on a sketch sized as the peer sizes one for a 16 GiB pool.
func BenchmarkFrequencyRecord128(b *testing.B) {
	f := NewFrequency(16 << 30 / FreqPageBytes)
	keys := make([]pagekey.Key, 128)
	for i := range keys {
		keys[i] = key(i)
		keys[i][5] = byte(i * 7)
	}
	for b.Loop() {
		f.Record(keys)
	}
}

// TestFrequencyAgesByThePagesHeld: SetPages sets the period to ten records
// a page, within the rows' fill bound and at least ten times 64; the most
// pages it was given hold, in whatever order the calls come.
func TestFrequencyAgesByThePagesHeld(t *testing.T) {
	for _, c := range []struct{ pages, want int }{{10, 640}, {100, 1000}, {50, 1000}, {1 << 20, 40960}} {
		f := NewFrequency(4096) // rows of 256 Ki counters: at most 40,960 records a period
		if f.SetPages(c.pages); f.sample != min(c.want, 10*max(c.pages, 64)) {
			t.Errorf("SetPages(%d) alone: period %d", c.pages, f.sample)
		}
	}
	f := NewFrequency(4096)
	for _, c := range []struct{ pages, want int }{{10, 640}, {100, 1000}, {50, 1000}, {1 << 20, 40960}} {
		if f.SetPages(c.pages); f.sample != c.want {
			t.Errorf("SetPages(%d) after larger: period %d, want %d", c.pages, f.sample, c.want)
		}
	}
	if small := NewFrequency(1); small.sample != 640 || small.maxSample != 640 {
		t.Errorf("a sketch for one page: period %d, bound %d; want 640, 640", small.sample, small.maxSample)
	}
	f = NewFrequency(4096)
	f.SetPages(100)
	k := key(3)
	for range 999 {
		f.Record([]pagekey.Key{k})
	}
	if got := f.Estimate(k); got != FreqMax {
		t.Fatalf("after 999 records: %d", got)
	}
	f.Record([]pagekey.Key{k})
	if got := f.Estimate(k); got != FreqMax/2 {
		t.Fatalf("the 1,000th record of a 100-page tier: %d, want the halving's %d", got, FreqMax/2)
	}
}
