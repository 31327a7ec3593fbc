package tiers

import (
	"encoding/binary"
	"math/bits"
	"sync"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Frequency estimates how often each page was asked for lately: a
// count-min sketch of small saturating counters (freqRows rows, each
// indexed by its own hash of the key),
// every counter halved once sample records have been added since the last
// halving, so that old popularity fades — the frequency filter of TinyLFU
// (Einziger, Friedman and Manes, 2017). An estimate never undercounts the
// records since the last halving, halved; collisions can only raise it.
//
// The peer uses it to judge readmissions (fabric/store/readmit.go): a page
// the SSD holds comes back into a full DRAM tier only when it has been asked
// for more often than the page it would push out. Unlike LRU it remembers
// pages that are in no tier at all.
//
// Frequency is safe for concurrent use.
type Frequency struct {
	mu    sync.Mutex
	rows  [freqRows][]uint64 // 8-bit counters, eight to a word (halved a word at a time)
	mask  uint64             // counters a row, less one
	added int                // records since the last halving
}

const (
	freqRows = 4
	// FreqMax is where a counter stops counting.
	FreqMax = 15
	// freqWidthPerPage is a row's counters per page the sketch is sized
	// for: the pages asked for between two halvings (ten times those a
	// tier holds, as the peer samples) then fill under a row's 2/3, so
	// that one in about 20 estimates is raised by a collision in every
	// row (the sim of the seeds' trace, 4 GiB DRAM and a slow SSD, served
	// 13.1% of its tokens from DRAM with 4 counters a page, 15.3% with 16,
	// 15.4% with 64).
	freqWidthPerPage = 16
	// minFreqWidth is the fewest counters a row has.
	minFreqWidth = 1024
	// maxFreqWidth bounds a row (4 MiB each).
	maxFreqWidth = 1 << 22
)

// NewFrequency returns an empty sketch sized for about pages pages in the
// tier it judges (rows of the next power of two at or above
// freqWidthPerPage×pages counters, within [1 Ki, 4 Mi]).
func NewFrequency(pages int) *Frequency {
	w := max(minFreqWidth, min(maxFreqWidth, freqWidthPerPage*pages))
	w = 1 << bits.Len(uint(w-1)) // next power of two
	f := &Frequency{mask: uint64(w - 1)}
	for i := range f.rows {
		f.rows[i] = make([]uint64, w/8)
	}
	return f
}

// Record counts one ask of each key, then halves every counter if sample
// (at least 1) records have been added since the last halving.
func (f *Frequency) Record(keys []pagekey.Key, sample int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		a, b := hashes(k)
		for i := range f.rows {
			j := (a + uint64(i)*b) & f.mask
			if w, sh := &f.rows[i][j>>3], 8*(j&7); (*w>>sh)&0xff < FreqMax {
				*w += 1 << sh
			}
		}
	}
	if f.added += len(keys); f.added >= max(sample, 1) {
		f.halveLocked()
	}
}

// Estimate is how often k was asked for lately (0 to FreqMax).
func (f *Frequency) Estimate(k pagekey.Key) uint8 {
	f.mu.Lock()
	defer f.mu.Unlock()
	est := uint8(FreqMax)
	a, b := hashes(k)
	for i := range f.rows {
		j := (a + uint64(i)*b) & f.mask
		est = min(est, uint8(f.rows[i][j>>3]>>(8*(j&7))))
	}
	return est
}

// Hotter reports whether a has been asked for more often lately than b.
func (f *Frequency) Hotter(a, b pagekey.Key) bool { return f.Estimate(a) > f.Estimate(b) }

// hashes are two mixed words of k; row i counts at a + i·b (double
// hashing, b odd). Page keys are hashes already; the mixing keeps keys that
// differ in a few bytes only (tests, small ids) apart as well.
func hashes(k pagekey.Key) (a, b uint64) {
	a = mix64(binary.LittleEndian.Uint64(k[:8]) ^ mix64(binary.LittleEndian.Uint64(k[8:])))
	return a, mix64(a^0x9e3779b97f4a7c15) | 1 // from all 64 bits of a: keys that share a row's slot part there
}

// mix64 is SplitMix64's finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func (f *Frequency) halveLocked() {
	for i := range f.rows {
		for j, w := range f.rows[i] {
			f.rows[i][j] = w >> 1 & 0x7f7f7f7f7f7f7f7f // each byte halved
		}
	}
	f.added = 0
}
