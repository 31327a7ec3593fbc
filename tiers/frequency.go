package tiers

import (
	"encoding/binary"
	"math/bits"
	"sync"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Frequency estimates how often each page was asked for lately: a
// count-min sketch of small saturating counters (freqRows rows, each
// indexed by its own hash of the key), every counter halved once ten times
// the pages it is sized for have been recorded since the last halving, so
// that old popularity fades — the frequency filter of TinyLFU
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
	mu        sync.Mutex
	rows      [freqRows][]uint64 // 8-bit counters, eight to a word (halved a word at a time)
	mask      uint64             // counters a row, less one
	sample    int                // records between two halvings
	maxSample int                // the most sample may be: the rows' fill bound
	pages     int                // the most pages SetPages was given
	added     int                // records since the last halving
}

// FreqPageBytes sizes the peer's sketch, and the sim's: a DRAM tier of n
// bytes is taken to hold n/FreqPageBytes pages, about what it holds of
// Qwen3-8B's 16-token pages (2.25 MiB); SetPages then ages the counts by
// the pages it really holds.
const FreqPageBytes = 2 << 20

const (
	freqRows = 4
	// FreqMax is where a counter stops counting.
	FreqMax = 15
	// freqSamplePerPage is how many records per page the sketch is sized
	// for go between two halvings.
	freqSamplePerPage = 10
	// freqWidthPerPage is a row's counters per page the sketch is sized
	// for: the distinct pages recorded between two halvings (at most the
	// records, freqSamplePerPage a page) then fill at most a sixth of a
	// row, so that about one estimate in a thousand at worst is raised by
	// a collision in every row. Width counts: in the sim of the seeds'
	// trace, 4 GiB of DRAM and a slow SSD, halving every 5,120 records,
	// rows of 2 Ki, 8 Ki and 32 Ki counters served 13.5%, 15.6% and 17.7%
	// of the tokens from DRAM; with vLLM's 16-token pages, 16 counters a
	// page 14.9% and 64 16.2%. A 16 GiB pool's sketch is 2 MiB.
	freqWidthPerPage = 64
	// minFreqWidth is the fewest counters a row has: enough for 64 pages,
	// so that a period is never under freqSamplePerPage×64 records.
	minFreqWidth = freqWidthPerPage * 64
	// maxFreqWidth bounds a row (4 MiB each).
	maxFreqWidth = 1 << 22
)

// NewFrequency returns an empty sketch sized for about pages pages in the
// tier it judges: rows of the next power of two at or above
// freqWidthPerPage×pages counters (within [4 Ki, 4 Mi]; at the cap, a pool
// of 128 GiB or more, one halving traverses 16 MiB, about 2 ms), halved
// every freqSamplePerPage records per page the rows are sized for until
// SetPages says how many the tier really holds. Collisions depend on the records between halvings
// against the rows, not on the tier's real page count.
func NewFrequency(pages int) *Frequency {
	w := max(minFreqWidth, min(maxFreqWidth, freqWidthPerPage*pages))
	w = 1 << bits.Len(uint(w-1)) // next power of two
	f := &Frequency{mask: uint64(w - 1), sample: freqSamplePerPage * w / freqWidthPerPage}
	f.maxSample = f.sample
	for i := range f.rows {
		f.rows[i] = make([]uint64, w/8)
	}
	return f
}

// SetPages ages the counts by the pages the judged tier really holds:
// halving every freqSamplePerPage×pages records, never more records than
// the rows were sized for (their fill bound) nor fewer than
// freqSamplePerPage×64. The largest count it is given holds, whatever the
// order of calls (several models: the one of most pages). A tier of pages larger than it was sized for
// otherwise ages its counts over several of its turnovers, which in the sim
// of the seeds' trace served 16.4% of the tokens from DRAM where halving by
// the pages held served 17.7%.
func (f *Frequency) SetPages(pages int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pages = max(f.pages, pages)
	f.sample = min(f.maxSample, freqSamplePerPage*max(f.pages, 64))
}

// Record counts one ask of each key, then halves every counter if the
// sketch's sample of records has been reached since the last halving.
func (f *Frequency) Record(keys []pagekey.Key) {
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
	if f.added += len(keys); f.added >= f.sample {
		f.halveLocked()
	}
}

// Estimate is how often k was asked for lately (0 to FreqMax).
func (f *Frequency) Estimate(k pagekey.Key) uint8 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.estimateLocked(k)
}

// Hotter reports whether a has been asked for more often lately than b
// (both estimated at one instant: no halving between them).
func (f *Frequency) Hotter(a, b pagekey.Key) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.estimateLocked(a) > f.estimateLocked(b)
}

func (f *Frequency) estimateLocked(k pagekey.Key) uint8 {
	est := uint8(FreqMax)
	a, b := hashes(k)
	for i := range f.rows {
		j := (a + uint64(i)*b) & f.mask
		est = min(est, uint8(f.rows[i][j>>3]>>(8*(j&7))))
	}
	return est
}

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
