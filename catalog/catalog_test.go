package catalog

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

var (
	layoutA = pagekey.Fingerprint{0xa}
	layoutB = pagekey.Fingerprint{0xb}
)

// key returns a distinct key per i, spread over the shards like real keys.
func key(i int) pagekey.Key {
	return pagekey.Next(layoutA, pagekey.Key{}, []uint32{uint32(i)})
}

func dramEntry(i int) Entry {
	return Entry{Key: key(i), Layout: layoutA, Size: 4096, Checksum: uint32(i), Generation: uint64(i), DRAMSlot: int64(i)}
}

func ssdEntry(i int) Entry {
	return Entry{
		Key: key(i), Layout: layoutB, Size: 4096, Checksum: uint32(i), Generation: uint64(i),
		DRAMSlot: -1, OnSSD: true, SSD: SSDLoc{File: uint32(i % 3), Offset: uint64(i) * 8192, Bytes: 4160},
		LastAccess: int64(i) * 1000, Hits: uint64(i),
	}
}

func mustOpen(t *testing.T, opts Options) *Catalog {
	t.Helper()
	c, err := Open(opts)
	if err != nil {
		t.Fatalf("Open(%+v): %v", opts, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestTier(t *testing.T) {
	tests := []struct {
		name string
		e    Entry
		want Tier
	}{
		{"none", Entry{DRAMSlot: -1}, TierNone},
		{"dram", Entry{DRAMSlot: 0}, TierDRAM},
		{"ssd", Entry{DRAMSlot: -1, OnSSD: true}, TierSSD},
		{"dram and ssd", Entry{DRAMSlot: 7, OnSSD: true}, TierDRAM},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.e.Tier(); got != tt.want {
				t.Fatalf("Tier() = %v, want %v", got, tt.want)
			}
		})
	}
	names := map[Tier]string{TierNone: "none", TierDRAM: "dram", TierSSD: "ssd", TierRemote: "remote", 9: "tier(9)"}
	for tier, want := range names {
		if got := tier.String(); got != want {
			t.Errorf("Tier(%d).String() = %q, want %q", tier, got, want)
		}
	}
}

func TestPutGetUpdateDelete(t *testing.T) {
	for _, dir := range []string{"memory", "pebble"} {
		t.Run(dir, func(t *testing.T) {
			opts := Options{}
			if dir == "pebble" {
				opts.Dir = t.TempDir()
			}
			c := mustOpen(t, opts)
			tests := []struct {
				name    string
				run     func() error
				key     pagekey.Key
				want    Entry
				present bool
			}{
				{"put dram", func() error { return c.Put(dramEntry(1)) }, key(1), dramEntry(1), true},
				{"put ssd", func() error { return c.Put(ssdEntry(2)) }, key(2), ssdEntry(2), true},
				{"replace", func() error { return c.Put(ssdEntry(1)) }, key(1), ssdEntry(1), true},
				{"last wins", func() error { return c.Put(dramEntry(3), ssdEntry(3)) }, key(3), ssdEntry(3), true},
				{"update", func() error {
					_, ok, err := c.Update(key(2), func(e *Entry) bool { e.DRAMSlot = 9; return true })
					if !ok {
						return errors.New("absent")
					}
					return err
				}, key(2), func() Entry { e := ssdEntry(2); e.DRAMSlot = 9; return e }(), true},
				{"update absent", func() error {
					_, ok, err := c.Update(key(99), func(*Entry) bool { panic("called") })
					if ok {
						return errors.New("found absent key")
					}
					return err
				}, key(99), Entry{}, false},
				{"update delete", func() error {
					_, _, err := c.Update(key(3), func(*Entry) bool { return false })
					return err
				}, key(3), Entry{}, false},
				{"delete", func() error { return c.Delete(key(1), key(98)) }, key(1), Entry{}, false},
			}
			for _, tt := range tests {
				if err := tt.run(); err != nil {
					t.Fatalf("%s: %v", tt.name, err)
				}
				got, ok := c.Get(tt.key)
				if ok != tt.present || got != tt.want {
					t.Fatalf("%s: Get = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.present)
				}
			}
			if c.Len() != 1 {
				t.Fatalf("Len = %d, want 1", c.Len())
			}
		})
	}
}

func TestInvalidEntry(t *testing.T) {
	c := mustOpen(t, Options{})
	e := dramEntry(1)
	e.DRAMSlot = -2
	if err := c.Put(dramEntry(2), e); !errors.Is(err, ErrInvalidEntry) {
		t.Fatalf("Put(DRAMSlot -2) = %v, want ErrInvalidEntry", err)
	}
	if c.Len() != 0 {
		t.Fatalf("a rejected Put changed the catalog: Len = %d", c.Len())
	}
}

func TestRange(t *testing.T) {
	c := mustOpen(t, Options{})
	want := map[pagekey.Key]Entry{}
	for i := range 1000 {
		e := dramEntry(i)
		if i%2 == 0 {
			e = ssdEntry(i)
		}
		want[e.Key] = e
		if err := c.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	got := map[pagekey.Key]Entry{}
	c.Range(func(e Entry) bool { got[e.Key] = e; return true })
	if len(got) != len(want) {
		t.Fatalf("Range saw %d entries, want %d", len(got), len(want))
	}
	for k, e := range want {
		if got[k] != e {
			t.Fatalf("Range %s = %+v, want %+v", k, got[k], e)
		}
	}
	n := 0
	c.Range(func(Entry) bool { n++; return n < 10 })
	if n != 10 {
		t.Fatalf("Range did not stop: %d calls", n)
	}
	if s := c.Stats(); s.Entries != 1000 || s.Layouts != 2 {
		t.Fatalf("Stats = %+v", s)
	}
}

func TestOnChange(t *testing.T) {
	type ev struct {
		k  pagekey.Key
		ch Change
	}
	var got []ev
	c := mustOpen(t, Options{Dir: t.TempDir(), OnChange: func(e Entry, ch Change) {
		got = append(got, ev{e.Key, ch})
	}})
	if err := c.Put(dramEntry(1), ssdEntry(2)); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ssdEntry(2)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Update(key(1), func(e *Entry) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(key(2), key(3)); err != nil {
		t.Fatal(err)
	}
	want := []ev{{key(1), Added}, {key(2), Added}, {key(2), Updated}, {key(1), Deleted}, {key(2), Deleted}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("OnChange calls = %v, want %v", got, want)
	}
}

func TestCloseIdempotent(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		c, err := Open(Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Put(ssdEntry(1)); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if err := c.Close(); err != nil {
				t.Fatalf("Close #%d: %v", i, err)
			}
		}
		if err := c.Put(ssdEntry(2)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Put after Close = %v, want ErrClosed", err)
		}
		if err := c.Delete(key(1)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Delete after Close = %v, want ErrClosed", err)
		}
		if _, ok := c.Get(key(1)); !ok {
			t.Fatal("Get after Close lost the entry")
		}
	}
}

// TestConcurrent runs lookups against writers; it is meant for -race.
func TestConcurrent(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir(), NoSync: true})
	chain := make([]pagekey.Key, 64)
	for i := range chain {
		chain[i] = key(i)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := c.Lookup(chain, 1)
				if r.Hit != len(r.Tiers) || r.DRAM+r.SSD != r.Hit {
					t.Errorf("inconsistent result %+v", r)
					return
				}
				c.Range(func(Entry) bool { return true })
			}
		}()
	}
	for round := range 20 {
		for i := range chain {
			e := dramEntry(i)
			if (i+round)%3 == 0 {
				e = ssdEntry(i)
			}
			if err := c.Put(e); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := c.Update(key(round), func(e *Entry) bool { e.Hits++; return true }); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(key(round * 3 % 64)); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

// TestTableChurn grows, shrinks and refills the shard tables (backward-shift
// deletion, resizes in both directions) and checks every key after each
// phase against a plain map.
func TestTableChurn(t *testing.T) {
	c := mustOpen(t, Options{})
	want := map[pagekey.Key]Entry{}
	check := func(phase string) {
		t.Helper()
		if c.Len() != len(want) {
			t.Fatalf("%s: Len = %d, want %d", phase, c.Len(), len(want))
		}
		for k, e := range want {
			if got, ok := c.Get(k); !ok || got != e {
				t.Fatalf("%s: Get(%s) = %+v, %v; want %+v", phase, k, got, ok, e)
			}
		}
		n := 0
		c.Range(func(Entry) bool { n++; return true })
		if n != len(want) {
			t.Fatalf("%s: Range saw %d entries, want %d", phase, n, len(want))
		}
	}
	const n = 60_000
	for i := range n {
		e := dramEntry(i)
		want[e.Key] = e
		if err := c.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	check("filled")
	for i := range n {
		if i%10 != 0 {
			if err := c.Delete(key(i)); err != nil {
				t.Fatal(err)
			}
			delete(want, key(i))
		}
	}
	check("thinned")
	for i := n; i < n+20_000; i++ {
		e := ssdEntry(i)
		want[e.Key] = e
		if err := c.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	check("refilled")
	for k := range want {
		if err := c.Delete(k); err != nil {
			t.Fatal(err)
		}
		delete(want, k)
	}
	check("emptied")
}
