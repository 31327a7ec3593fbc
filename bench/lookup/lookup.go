// Package lookup is `orbitkv bench lookup`: the catalog's lookup latency
// with many entries, beside DESIGN.md §6's target. It measures the public
// catalog API; the peer's ask hand-off (fabric/store/readmit.go) is not
// exported, so Run rebuilds it here from tiers.Frequency, the public
// sketch it feeds, to time the lookup as the peer makes it.
package lookup

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers"
)

// lookupTargetP99 is the catalog target of DESIGN.md §6: a 128-page chain
// looked up among 10 M entries in at most 50 µs at p99.
const lookupTargetP99 = 50 * time.Microsecond

// Config is a lookup bench's size.
type Config struct {
	Entries int // catalog entries (pages)
	Chain   int // pages per looked-up chain
	Iters   int // timed lookups
}

// DefaultConfig is the size of the target: 10 M entries, 128-page chains.
func DefaultConfig() Config { return Config{Entries: 10_000_000, Chain: 128, Iters: 100_000} }

// Run builds an in-memory catalog of entries pages, laid out as
// entries/chain prompt chains of chain pages (half the pages in DRAM, half
// on SSD), then times iters lookups of chain-long key chains: 50% full hits,
// 40% partial hits (a stored prefix of random length followed by pages
// never saved) and 10% misses. It prints the size, build time, heap in use
// and the latency percentiles next to the target.
func Run(_ context.Context, cfg Config, w io.Writer) error {
	entries, chain, iters := cfg.Entries, cfg.Chain, cfg.Iters
	if entries <= 0 || chain <= 0 || iters <= 0 || entries < chain {
		return fmt.Errorf("bench lookup: need entries >= chain > 0 and iters > 0, got %d, %d, %d", entries, chain, iters)
	}
	fp := pagekey.Layout{Model: "bench", PageTokens: 64}.Fingerprint()
	nChains := entries / chain
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	start := time.Now()
	c, err := catalog.Open(catalog.Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	rng := rand.New(rand.NewPCG(7, 11))
	batch := make([]catalog.Entry, chain)
	for id := range nChains {
		for p, k := range benchChain(fp, id, chain) {
			e := catalog.Entry{Key: k, Layout: fp, Size: 9 << 20, Generation: uint64(id*chain + p), DRAMSlot: -1}
			if rng.IntN(2) == 0 {
				e.DRAMSlot = int64(id*chain + p)
			} else {
				e.OnSSD, e.SSD = true, catalog.SSDLoc{Offset: uint64(p) << 23, Bytes: 9 << 20}
			}
			batch[p] = e
		}
		if err := c.Put(batch...); err != nil {
			return fmt.Errorf("bench lookup: build: %w", err)
		}
	}
	build := time.Since(start)
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)

	lat, hits := benchLookupRun(c, nil, fp, rand.New(rand.NewPCG(13, 17)), nChains, chain, iters)
	// The peer's lookups also record their keys in the readmission sketch
	// (fabric/store/readmit.go): the same queries again with it, sized as
	// for a 16 GiB pool, counted on the lookup's path and, as the peer
	// does, handed to a goroutine that counts them.
	f := tiers.NewFrequency(16 << 30 / tiers.FreqPageBytes)
	onPath, _ := benchLookupRun(c, f.Record, fp, rand.New(rand.NewPCG(13, 17)), nChains, chain, iters)
	handOff, stop, dropped := benchAskHandOff(f)
	offPath, _ := benchLookupRun(c, handOff, fp, rand.New(rand.NewPCG(13, 17)), nChains, chain, iters)
	stop()
	for _, l := range [][]time.Duration{lat, onPath, offPath} {
		slices.Sort(l)
	}
	pctOf := func(l []time.Duration, p float64) time.Duration { return l[min(len(l)-1, int(p*float64(len(l))))] }
	pct := func(p float64) time.Duration { return pctOf(lat, p) }
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	heap := float64(after.HeapAlloc-min(after.HeapAlloc, before.HeapAlloc)) / (1 << 30)

	fmt.Fprintf(w, "catalog lookup: %d entries (%d chains × %d pages), built in %s, heap %.2f GiB (%.0f B/entry)\n",
		c.Len(), nChains, chain, build.Round(time.Millisecond), heap, heap*(1<<30)/float64(c.Len()))
	fmt.Fprintf(w, "  %d lookups of %d-key chains, mean hit %.1f pages: p50 %.1f µs  p90 %.1f µs  p99 %.1f µs  max %.1f µs\n",
		iters, chain, float64(hits)/float64(iters), us(pct(0.50)), us(pct(0.90)), us(pct(0.99)), us(lat[len(lat)-1]))
	for _, r := range []struct {
		name string
		l    []time.Duration
	}{{"ask sketch counted on the path (16 GiB pool):", onPath}, {"ask sketch counted off the path (the peer's):", offPath}} {
		fmt.Fprintf(w, "  the same with the %-46s p50 %.1f µs  p90 %.1f µs  p99 %.1f µs  max %.1f µs\n",
			r.name, us(pctOf(r.l, 0.50)), us(pctOf(r.l, 0.90)), us(pctOf(r.l, 0.99)), us(r.l[len(r.l)-1]))
	}
	fmt.Fprintf(w, "  off the path, %d of %d lookups' keys dropped (queue full)\n", dropped(), iters)
	verdict := "PASS"
	if pct(0.99) > lookupTargetP99 {
		verdict = "FAIL"
	}
	peerVerdict, peer99 := "PASS", pctOf(offPath, 0.99)
	if peer99 > lookupTargetP99 {
		peerVerdict = "FAIL"
	}
	fmt.Fprintf(w, "  target p99 ≤ %.0f µs: catalog %s (p99/target %.2f), the peer's lookup with its sketch off the path %s (%.2f)\n",
		us(lookupTargetP99), verdict, float64(pct(0.99))/float64(lookupTargetP99), peerVerdict, float64(peer99)/float64(lookupTargetP99))
	return nil
}

// benchAskHandOff is the peer's NoteAsked and RunAsks (fabric/store/readmit.go)
// over f: a lookup's keys cloned into a bounded queue, dropped when it is
// full, counted by a goroutine until stop.
func benchAskHandOff(f *tiers.Frequency) (handOff func([]pagekey.Key), stop func(), dropped func() int64) {
	q := make(chan []pagekey.Key, 256) // fabric/store's askQueue
	var drops atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for keys := range q {
			f.Record(keys)
		}
	}()
	handOff = func(keys []pagekey.Key) {
		select {
		case q <- slices.Clone(keys):
		default:
			drops.Add(1)
		}
	}
	return handOff, func() { close(q); <-done }, drops.Load
}

// benchLookupRun times iters lookups and returns their latencies and the
// total pages hit. Query chains are made before the clock starts. With asks,
// each lookup first hands its keys there, as the peer's do.
func benchLookupRun(c *catalog.Catalog, asks func([]pagekey.Key), fp pagekey.Fingerprint, rng *rand.Rand, nChains, chain, iters int) ([]time.Duration, int) {
	lat := make([]time.Duration, iters)
	hits := 0
	for i := range iters {
		id := rng.IntN(nChains)
		q := benchChain(fp, id, chain)
		switch r := rng.IntN(10); {
		case r < 4: // partial hit: a stored prefix, then pages never saved
			n := 1 + rng.IntN(chain-1+1)
			prev := q[n-1]
			for p := n; p < chain; p++ {
				prev = pagekey.Next(fp, prev, []uint32{^uint32(0), uint32(p)})
				q[p] = prev
			}
		case r < 5: // miss: another layout's chain
			q = benchChain(pagekey.Fingerprint{1}, id, chain)
		}
		t0 := time.Now()
		if asks != nil {
			asks(q)
		}
		res := c.Lookup(q, t0.UnixNano())
		lat[i] = time.Since(t0)
		hits += res.Hit
	}
	return lat, hits
}

// benchChain returns the keys of chain pages of prompt id.
func benchChain(fp pagekey.Fingerprint, id, chain int) []pagekey.Key {
	keys := make([]pagekey.Key, chain)
	var prev pagekey.Key
	for p := range keys {
		prev = pagekey.Next(fp, prev, []uint32{uint32(id), uint32(p)})
		keys[p] = prev
	}
	return keys
}
