package catalog

import (
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// benchEntries is the catalog size of the lookup benchmarks; set
// ORBITKV_BENCH_ENTRIES=10000000 for the DESIGN.md §6 target size.
func benchEntries(b *testing.B) int {
	if s := os.Getenv("ORBITKV_BENCH_ENTRIES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 128 {
			b.Fatalf("ORBITKV_BENCH_ENTRIES=%q: want an integer >= 128", s)
		}
		return n
	}
	return 1_000_000
}

func benchChainKeys(fp pagekey.Fingerprint, id, n int) []pagekey.Key {
	keys := make([]pagekey.Key, n)
	var prev pagekey.Key
	for p := range keys {
		prev = pagekey.Next(fp, prev, []uint32{uint32(id), uint32(p)})
		keys[p] = prev
	}
	return keys
}

// buildBenchCatalog stores entries pages as chains of 128, half in DRAM and
// half on SSD, and returns the number of chains.
func buildBenchCatalog(b *testing.B, c *Catalog, entries int) int {
	rng := rand.New(rand.NewPCG(1, 1))
	chains := entries / 128
	batch := make([]Entry, 128)
	for id := range chains {
		for p, k := range benchChainKeys(layoutA, id, 128) {
			batch[p] = Entry{Key: k, Layout: layoutA, Size: 9 << 20, DRAMSlot: -1}
			if rng.IntN(2) == 0 {
				batch[p].DRAMSlot = int64(id*128 + p)
			} else {
				batch[p].OnSSD = true
			}
		}
		if err := c.Put(batch...); err != nil {
			b.Fatal(err)
		}
	}
	return chains
}

// BenchmarkLookup times 128-key chain lookups: full hits, partial hits (a
// stored prefix of random length, then unknown pages) and misses, and
// reports the per-lookup p50/p99 next to the 50 µs p99 target.
func BenchmarkLookup(b *testing.B) {
	entries := benchEntries(b)
	c, err := Open(Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	chains := buildBenchCatalog(b, c, entries)
	rng := rand.New(rand.NewPCG(2, 2))
	queries := map[string][][]pagekey.Key{}
	for range 4096 { // 4096 chains × 128 pages: far more than the CPU caches hold
		id := rng.IntN(chains)
		q := benchChainKeys(layoutA, id, 128)
		queries["full"] = append(queries["full"], q)
		p := slices.Clone(q)
		for i := 1 + rng.IntN(127); i < 128; i++ {
			p[i] = pagekey.Next(layoutB, p[i-1], nil)
		}
		queries["partial"] = append(queries["partial"], p)
		queries["miss"] = append(queries["miss"], benchChainKeys(layoutB, id, 128))
	}
	for _, kind := range []string{"full", "partial", "miss"} {
		b.Run(kind, func(b *testing.B) {
			qs := queries[kind]
			lat := make([]time.Duration, 0, 1<<16)
			i := 0
			for b.Loop() {
				t0 := time.Now()
				c.Lookup(qs[i%len(qs)], 1)
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(t0))
				}
				i++
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			b.ReportMetric(50_000, "target-p99-ns")
			b.ReportMetric(float64(entries), "entries")
		})
	}
}
