package catalog

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// model is the deliberately naive catalog the property test checks against:
// a slice of entries searched linearly.
type model struct{ entries []Entry }

func (m *model) find(k pagekey.Key) int {
	for i := range m.entries {
		if m.entries[i].Key == k {
			return i
		}
	}
	return -1
}

func (m *model) put(e Entry) {
	if i := m.find(e.Key); i >= 0 {
		m.entries[i] = e
		return
	}
	m.entries = append(m.entries, e)
}

func (m *model) delete(k pagekey.Key) {
	if i := m.find(k); i >= 0 {
		m.entries = append(m.entries[:i], m.entries[i+1:]...)
	}
}

func (m *model) lookup(keys []pagekey.Key, now int64) Result {
	var r Result
	for _, k := range keys {
		i := m.find(k)
		if i < 0 || m.entries[i].Tier() == TierNone {
			break
		}
		e := &m.entries[i]
		e.LastAccess, e.Hits = now, e.Hits+1
		r.Tiers = append(r.Tiers, e.Tier())
		r.Hit++
		switch e.Tier() {
		case TierDRAM:
			r.DRAM++
		case TierSSD:
			r.SSD++
		}
	}
	return r
}

func TestLookupTable(t *testing.T) {
	c := mustOpen(t, Options{})
	none := dramEntry(3)
	none.DRAMSlot = -1
	if err := c.Put(dramEntry(0), ssdEntry(1), dramEntry(2), none, dramEntry(4)); err != nil {
		t.Fatal(err)
	}
	chain := func(ids ...int) []pagekey.Key {
		var ks []pagekey.Key
		for _, i := range ids {
			ks = append(ks, key(i))
		}
		return ks
	}
	tests := []struct {
		name  string
		keys  []pagekey.Key
		tiers []Tier
	}{
		{"empty chain", nil, nil},
		{"miss first", chain(9, 0, 1), nil},
		{"full hit", chain(0, 1, 2), []Tier{TierDRAM, TierSSD, TierDRAM}},
		{"gap ends prefix", chain(0, 1, 9, 2), []Tier{TierDRAM, TierSSD}},
		{"tierless entry ends prefix", chain(2, 3, 4), []Tier{TierDRAM}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := c.Lookup(tt.keys, 42)
			if r.Hit != len(tt.tiers) || !reflect.DeepEqual(r.Tiers, tt.tiers) {
				t.Fatalf("Lookup = %+v, want tiers %v", r, tt.tiers)
			}
		})
	}
	if e, _ := c.Get(key(0)); e.Hits != 2 || e.LastAccess != 42 {
		t.Fatalf("entry 0 after lookups: hits %d, last access %d", e.Hits, e.LastAccess)
	}
	if e, _ := c.Get(key(3)); e.Hits != 0 {
		t.Fatalf("tierless entry was touched: %+v", e)
	}
}

// TestLookupModel runs random chains, saves, tier moves and deletions
// against the catalog and the naive model and compares every answer.
func TestLookupModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// A universe of chains; chains share prefixes like real prompts do.
	const nChains, chainLen = 40, 24
	chains := make([][]pagekey.Key, nChains)
	for i := range chains {
		var prev pagekey.Key
		start := 0
		if i > 0 && rng.IntN(2) == 0 { // fork an earlier chain
			src := chains[rng.IntN(i)]
			start = rng.IntN(chainLen)
			chains[i] = append(chains[i], src[:start]...)
			if start > 0 {
				prev = src[start-1]
			}
		}
		for p := start; p < chainLen; p++ {
			prev = pagekey.Next(layoutA, prev, []uint32{uint32(i), uint32(p)})
			chains[i] = append(chains[i], prev)
		}
	}
	randEntry := func(k pagekey.Key) Entry {
		e := Entry{Key: k, Layout: pagekey.Fingerprint{byte(rng.IntN(3))}, Size: rng.Uint64(),
			Generation: rng.Uint64(), DRAMSlot: -1, Hits: uint64(rng.IntN(5))}
		switch rng.IntN(4) {
		case 0:
			e.DRAMSlot = rng.Int64N(1000)
		case 1:
			e.OnSSD = true
		case 2:
			e.DRAMSlot, e.OnSSD = rng.Int64N(1000), true
		} // case 3: no tier
		return e
	}

	c := mustOpen(t, Options{})
	var m model
	for step := range 5000 {
		ch := chains[rng.IntN(nChains)]
		switch op := rng.IntN(10); {
		case op < 3: // save a prefix or a stretch of a chain
			from, n := rng.IntN(chainLen), 1+rng.IntN(chainLen)
			var batch []Entry
			for _, k := range ch[from:min(chainLen, from+n)] {
				batch = append(batch, randEntry(k))
			}
			if err := c.Put(batch...); err != nil {
				t.Fatal(err)
			}
			for _, e := range batch {
				m.put(e)
			}
		case op < 4: // delete a few pages
			var keys []pagekey.Key
			for range 1 + rng.IntN(3) {
				keys = append(keys, ch[rng.IntN(chainLen)])
			}
			if err := c.Delete(keys...); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				m.delete(k)
			}
		case op < 5: // move a page between tiers, or drop it
			k := ch[rng.IntN(chainLen)]
			ne := randEntry(k)
			keep := rng.IntN(4) > 0
			_, ok, err := c.Update(k, func(e *Entry) bool { e.DRAMSlot, e.OnSSD = ne.DRAMSlot, ne.OnSSD; return keep })
			if err != nil {
				t.Fatal(err)
			}
			if i := m.find(k); (i >= 0) != ok {
				t.Fatalf("step %d: Update found=%v, model disagrees", step, ok)
			} else if ok && keep {
				m.entries[i].DRAMSlot, m.entries[i].OnSSD = ne.DRAMSlot, ne.OnSSD
			} else if ok {
				m.delete(k)
			}
		default: // look up a prefix of a chain, sometimes with a foreign tail
			q := append([]pagekey.Key(nil), ch[:1+rng.IntN(chainLen)]...)
			if rng.IntN(3) == 0 {
				q = append(q, chains[rng.IntN(nChains)][rng.IntN(chainLen):]...)
			}
			now := int64(step)
			got, want := c.Lookup(q, now), m.lookup(q, now)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d: Lookup = %+v, model %+v", step, got, want)
			}
		}
		if c.Len() != len(m.entries) {
			t.Fatalf("step %d: Len = %d, model %d", step, c.Len(), len(m.entries))
		}
	}
	for _, e := range m.entries {
		if got, ok := c.Get(e.Key); !ok || got != e {
			t.Fatalf("Get(%s) = %+v, %v; model %+v", e.Key, got, ok, e)
		}
	}
}
