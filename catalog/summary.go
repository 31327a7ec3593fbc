package catalog

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"sync"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Compact summaries: instead of every page, a member may publish a filter
// of its page keys, a blocked Bloom filter of SummaryBitsPerPage bits per
// page. A filter may claim a page its member does not hold (a false
// positive, about 10-15% per member and key at full capacity), never the
// reverse while it is current. Whoever acts on a claim asks the member
// first (PeerService.Holds): a false positive costs that question, never a
// wrong page.
//
// The bit positions of a key depend on the key and the filter's size only
// (no per-process seed): every peer computes the same.

// Filter geometry.
const (
	// SummaryBitsPerPage is the filter's size per page of its capacity.
	SummaryBitsPerPage = 4
	filterK            = 3 // bits set per key, all in one block
	blockWords         = 8 // 512-bit blocks: one cache line per probe
	minFilterPages     = 1024
	// MaxFilterBits bounds a filter (bit indices fit in 31 bits).
	MaxFilterBits = 1<<31 - 512
)

// ErrFilter reports a filter or a flip that does not fit.
var ErrFilter = errors.New("bad summary filter")

// positions returns the block and the filterK bits in it of k in a filter
// of blocks blocks.
func positions(k pagekey.Key, blocks int) (block int, bit [filterK]uint32) {
	h1 := mix(binary.LittleEndian.Uint64(k[:8]))
	h2 := mix(binary.LittleEndian.Uint64(k[8:]) ^ h1)
	hi, _ := bits.Mul64(h1, uint64(blocks))
	for i := range bit {
		bit[i] = uint32(h2>>(9*i)) & 511
	}
	return int(hi), bit
}

// mix is splitmix64's finalizer: keys come from clients, so their bits are
// spread before they pick a block.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// filterWords is the size in words of a filter for pages pages.
func filterWords(pages int) int {
	pages = max(pages, minFilterPages)
	blocks := (pages*SummaryBitsPerPage + 511) / 512
	return min(blocks, MaxFilterBits/512) * blockWords
}

// Filter is a blocked Bloom filter of page keys, as a member published it.
type Filter []uint64

// Has says whether the filter claims k.
func (f Filter) Has(k pagekey.Key) bool {
	if len(f) < blockWords {
		return false
	}
	b, bit := positions(k, len(f)/blockWords)
	blk := f[b*blockWords : (b+1)*blockWords]
	for _, x := range bit {
		if blk[x>>6]&(1<<(x&63)) == 0 {
			return false
		}
	}
	return true
}

// Pages estimates how many keys f holds from the bits it sets.
func (f Filter) Pages() int {
	set := 0
	for _, w := range f {
		set += bits.OnesCount64(w)
	}
	m := float64(len(f) * 64)
	if m == 0 || float64(set) >= m {
		return 0
	}
	return int(math.Round(-m / filterK * math.Log(1-float64(set)/m)))
}

// Flip is one change of a published filter: bit Bit set (Set) or cleared.
type Flip struct {
	Bit uint32
	Set bool
}

// Apply applies flips to f in order.
func (f Filter) Apply(flips []Flip) error {
	for _, fl := range flips {
		if int(fl.Bit) >= len(f)*64 {
			return ErrFilter
		}
		if fl.Set {
			f[fl.Bit>>6] |= 1 << (fl.Bit & 63)
		} else {
			f[fl.Bit>>6] &^= 1 << (fl.Bit & 63)
		}
	}
	return nil
}

// Summary is the filter of this peer's own pages, with a count per bit so
// that a page's removal clears the bits no other page sets. Counts
// saturate: a bit counted 255 times stays set for good (a false positive
// more, never a missing page). It is not safe for concurrent use.
type Summary struct {
	f      Filter
	counts []uint8
	pages  int
}

// NewSummary returns an empty summary sized for pages pages.
func NewSummary(pages int) *Summary {
	w := filterWords(pages)
	return &Summary{f: make(Filter, w), counts: make([]uint8, w*64)}
}

// Capacity is how many pages the summary was sized for.
func (s *Summary) Capacity() int { return len(s.f) * 64 / SummaryBitsPerPage }

// Pages is how many keys were added and not removed.
func (s *Summary) Pages() int { return s.pages }

// Add counts k in and appends the bits that became set to flips.
func (s *Summary) Add(k pagekey.Key, flips []Flip) []Flip {
	s.pages++
	for _, b := range s.bits(k) {
		if s.counts[b] == 0 {
			s.f[b>>6] |= 1 << (b & 63)
			flips = append(flips, Flip{Bit: b, Set: true})
		}
		if s.counts[b] < math.MaxUint8 {
			s.counts[b]++
		}
	}
	return flips
}

// Remove counts k out and appends the bits that became clear to flips.
func (s *Summary) Remove(k pagekey.Key, flips []Flip) []Flip {
	s.pages = max(0, s.pages-1)
	for _, b := range s.bits(k) {
		switch s.counts[b] {
		case 0, math.MaxUint8:
			continue
		case 1:
			s.f[b>>6] &^= 1 << (b & 63)
			flips = append(flips, Flip{Bit: b, Set: false})
		}
		s.counts[b]--
	}
	return flips
}

func (s *Summary) bits(k pagekey.Key) [filterK]uint32 {
	b, bit := positions(k, len(s.f)/blockWords)
	var out [filterK]uint32
	for i, x := range bit {
		out[i] = uint32(b*512) + x
	}
	return out
}

// Filter returns a copy of the summary's filter.
func (s *Summary) Filter() Filter { return append(Filter(nil), s.f...) }

// Summaries holds the filters members published, by origin id. It is safe
// for concurrent use.
type Summaries struct {
	mu sync.RWMutex
	f  []Filter // by origin id, as long as the highest origin with a filter needs
}

// getLocked returns origin's filter, nil for none.
func (s *Summaries) getLocked(origin int) Filter {
	if origin < 0 || origin >= len(s.f) {
		return nil
	}
	return s.f[origin]
}

// Replace installs origin's filter (a snapshot), replacing any before.
func (s *Summaries) Replace(origin int, f Filter) error {
	if origin < 0 || origin >= MaxOrigins {
		return ErrOrigin
	}
	if len(f)%blockWords != 0 || len(f)*64 > MaxFilterBits {
		return ErrFilter
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if origin >= len(s.f) {
		if f == nil {
			return nil
		}
		s.f = append(s.f, make([]Filter, origin+1-len(s.f))...)
	}
	s.f[origin] = f
	return nil
}

// Apply applies flips to origin's filter.
func (s *Summaries) Apply(origin int, flips []Flip) error {
	if origin < 0 || origin >= MaxOrigins {
		return ErrOrigin
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.getLocked(origin).Apply(flips)
}

// Drop forgets origin's filter; it says whether there was one.
func (s *Summaries) Drop(origin int) bool {
	if origin < 0 || origin >= MaxOrigins {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	had := s.getLocked(origin) != nil
	if had {
		s.f[origin] = nil
		n := len(s.f)
		for n > 0 && s.f[n-1] == nil {
			n--
		}
		clear(s.f[n:])
		s.f = s.f[:n]
	}
	return had
}

// Has says whether origin published a filter.
func (s *Summaries) Has(origin int) bool {
	if origin < 0 || origin >= MaxOrigins {
		return false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.getLocked(origin) != nil
}

// Pages estimates how many pages origin's filter holds.
func (s *Summaries) Pages(origin int) int {
	if origin < 0 || origin >= MaxOrigins {
		return 0
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.getLocked(origin).Pages()
}

// Bytes is the memory of every filter held.
func (s *Summaries) Bytes() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, f := range s.f {
		n += len(f) * 8
	}
	return n
}

// Leading returns, for every origin whose filter claims keys[0], how many
// leading keys of the chain it claims, in origin order (Remote.Leading's
// shape). skip, when set, drops a claim known false (a page the origin
// said it does not hold).
func (s *Summaries) Leading(keys []pagekey.Key, skip func(origin int, k pagekey.Key) bool) []Held {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []Held
	for o, f := range s.f {
		if f == nil {
			continue
		}
		n := 0
		for _, k := range keys {
			if !f.Has(k) || skip != nil && skip(o, k) {
				break
			}
			n++
		}
		if n > 0 {
			out = append(out, Held{Origin: o, Pages: n})
		}
	}
	return out
}

// Claims says whether origin's filter claims k.
func (s *Summaries) Claims(origin int, k pagekey.Key) bool {
	if origin < 0 || origin >= MaxOrigins {
		return false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.getLocked(origin).Has(k)
}

// Len is how many origins published a filter.
func (s *Summaries) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, f := range s.f {
		if f != nil {
			n++
		}
	}
	return n
}
