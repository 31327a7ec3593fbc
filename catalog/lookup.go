package catalog

import (
	"math/bits"
	"sync/atomic"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Result is the answer to a Lookup.
type Result struct {
	Hit   int    // length of the longest prefix of the chain held locally
	Tiers []Tier // len Hit: the fastest tier of each page of the prefix
	// Pages of the prefix per tier. Remote is always 0 here; the fabric
	// counts it when it extends a result with other peers' pages.
	DRAM, SSD, Remote int
}

// lookupChunk is how many keys Lookup probes under one set of shard locks.
// Locked instructions are full fences on x86: taking a lock per key would
// serialize the cache misses of the probes. Probing a chunk between one
// round of lock acquisitions lets the CPU overlap them.
const lookupChunk = 32

// Lookup returns the longest prefix of keys whose pages are present, i.e.
// have an entry held by DRAM or SSD; an entry with TierNone ends the prefix
// like an absent one. It stamps now (unix ns) into LastAccess and counts a
// hit on every page of the prefix. Keys are probed in chunks, each under
// the read locks of its shards, so concurrent writers may make a result that
// no single instant saw; callers lease the pages before using them.
func (c *Catalog) Lookup(keys []pagekey.Key, now int64) Result {
	var res Result
	var tiers [lookupChunk]Tier
	for start := 0; start < len(keys); start += lookupChunk {
		chunk := keys[start:min(len(keys), start+lookupChunk)]
		n := c.lookupChunk(chunk, now, &tiers)
		if n > 0 && res.Tiers == nil {
			res.Tiers = make([]Tier, 0, len(keys)-start)
		}
		for _, t := range tiers[:n] {
			res.Tiers = append(res.Tiers, t)
			if t == TierDRAM {
				res.DRAM++
			} else {
				res.SSD++
			}
		}
		if n < len(chunk) {
			break
		}
	}
	res.Hit = len(res.Tiers)
	return res
}

// lookupChunk probes up to lookupChunk keys, fills tiers with the tiers of
// the leading present pages, touches them and returns how many there are.
//
// It runs in passes so that the cache misses of different keys overlap:
// hash every key, lock the shards, load the home cell of every key (the
// loads are independent, so the CPU issues them together), then probe the
// now cached cells in chain order, then touch the hits with atomics (fences).
func (c *Catalog) lookupChunk(keys []pagekey.Key, now int64, tiers *[lookupChunk]Tier) int {
	var hs [lookupChunk]uint64
	var set shardSet
	for i, k := range keys {
		hs[i] = c.hash.hash(k)
		set.add(shardOf(hs[i]))
	}
	c.rlock(&set)
	defer c.runlock(&set)

	var first [lookupChunk]byte
	for i := range keys {
		if slots := c.shards[shardOf(hs[i])].mu.slots; len(slots) > 0 {
			first[i] = slots[home(hs[i], len(slots))].key[0]
		}
	}
	var recs [lookupChunk]*record
	n := len(keys)
	for i, k := range keys {
		r, ok := c.probe(hs[i], k, first[i])
		if !ok {
			n = i
			break
		}
		if tiers[i] = r.tier(); tiers[i] == TierNone {
			n = i
			break
		}
		recs[i] = r
	}
	for _, r := range recs[:n] {
		atomic.StoreInt64(&r.lastAccess, now)
		atomic.AddUint64(&r.hits, 1)
	}
	return n
}

// probe finds k in its shard, whose lock the caller holds. first is the
// first key byte of k's home cell, loaded earlier: when it differs from k's
// and the cell is empty, k is absent without touching the table again.
func (c *Catalog) probe(h uint64, k pagekey.Key, first byte) (*record, bool) {
	s := &c.shards[shardOf(h)]
	if len(s.mu.slots) == 0 || first != k[0] && !s.mu.slots[home(h, len(s.mu.slots))].rec.used {
		return nil, false
	}
	return s.getLocked(h, k)
}

// shardSet is a set of shard indexes.
type shardSet [numShards / 64]uint64

func (s *shardSet) add(i uint8) { s[i>>6] |= 1 << (i & 63) }

// rlock read-locks the shards of set in increasing order. Holders of several
// shard locks all take them in that order and writers hold one at a time,
// so this cannot deadlock even with writers queued.
func (c *Catalog) rlock(set *shardSet) {
	for w, word := range set {
		for ; word != 0; word &= word - 1 {
			c.shards[w*64+bits.TrailingZeros64(word)].mu.RLock()
		}
	}
}

func (c *Catalog) runlock(set *shardSet) {
	for w, word := range set {
		for ; word != 0; word &= word - 1 {
			c.shards[w*64+bits.TrailingZeros64(word)].mu.RUnlock()
		}
	}
}
