package catalog

import (
	"errors"
	"hash/maphash"
	"math/bits"
	"sync"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// MaxOrigins is how many peers a Remote index tells apart. Origin ids are
// 0..MaxOrigins-1; the fabric assigns them to members and reuses the ids of
// peers that left.
const MaxOrigins = 128

// ErrOrigin reports an origin id out of range.
var ErrOrigin = errors.New("origin id out of range")

// Holders is a set of origin ids.
type Holders [MaxOrigins / 64]uint64

func (h *Holders) add(o int)     { h[o>>6] |= 1 << (o & 63) }
func (h *Holders) remove(o int)  { h[o>>6] &^= 1 << (o & 63) }
func (h Holders) Has(o int) bool { return o >= 0 && o < MaxOrigins && h[o>>6]&(1<<(o&63)) != 0 }
func (h Holders) Empty() bool    { return h == Holders{} }
func (h Holders) Count() (n int) {
	for _, w := range h {
		n += bits.OnesCount64(w)
	}
	return n
}

// First returns the lowest origin in h, or -1.
func (h Holders) First() int {
	for i, w := range h {
		if w != 0 {
			return i*64 + bits.TrailingZeros64(w)
		}
	}
	return -1
}

// Next returns the lowest origin in h above o, or -1.
func (h Holders) Next(o int) int {
	for o++; o < MaxOrigins; o++ {
		if h.Has(o) {
			return o
		}
	}
	return -1
}

// RemotePage is what the index knows of one page held elsewhere.
type RemotePage struct {
	Layout  pagekey.Fingerprint
	Size    uint64
	Holders Holders
}

const remoteShards = 64

// Remote indexes the pages other peers announced. It is safe for
// concurrent use.
type Remote struct {
	seed   maphash.Seed
	shards [remoteShards]struct {
		sync.RWMutex
		m map[pagekey.Key]RemotePage
	}
}

// NewRemote returns an empty index.
func NewRemote() *Remote {
	r := &Remote{seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i].m = map[pagekey.Key]RemotePage{}
	}
	return r
}

func (r *Remote) shard(k pagekey.Key) int {
	return int(maphash.Comparable(r.seed, k) % remoteShards)
}

// Add records that origin holds k with the given layout and size. A key
// announced with another layout or size than the holders already known
// replaces them: keys chain the layout, so this only happens for a peer
// reporting garbage, and the newest announcement wins.
func (r *Remote) Add(origin int, k pagekey.Key, layout pagekey.Fingerprint, size uint64) error {
	if origin < 0 || origin >= MaxOrigins {
		return ErrOrigin
	}
	s := &r.shards[r.shard(k)]
	s.Lock()
	defer s.Unlock()
	p, ok := s.m[k]
	if !ok || p.Layout != layout || p.Size != size {
		p = RemotePage{Layout: layout, Size: size}
	}
	p.Holders.add(origin)
	s.m[k] = p
	return nil
}

// Remove records that origin no longer holds k.
func (r *Remote) Remove(origin int, k pagekey.Key) {
	if origin < 0 || origin >= MaxOrigins {
		return
	}
	s := &r.shards[r.shard(k)]
	s.Lock()
	defer s.Unlock()
	p, ok := s.m[k]
	if !ok {
		return
	}
	p.Holders.remove(origin)
	if p.Holders.Empty() {
		delete(s.m, k)
		return
	}
	s.m[k] = p
}

// DropOrigin forgets every page origin announced; it returns how many.
func (r *Remote) DropOrigin(origin int) int {
	if origin < 0 || origin >= MaxOrigins {
		return 0
	}
	n := 0
	for i := range r.shards {
		s := &r.shards[i]
		s.Lock()
		for k, p := range s.m {
			if !p.Holders.Has(origin) {
				continue
			}
			n++
			p.Holders.remove(origin)
			if p.Holders.Empty() {
				delete(s.m, k)
			} else {
				s.m[k] = p
			}
		}
		s.Unlock()
	}
	return n
}

// Get returns what the index knows of k.
func (r *Remote) Get(k pagekey.Key) (RemotePage, bool) {
	s := &r.shards[r.shard(k)]
	s.RLock()
	defer s.RUnlock()
	p, ok := s.m[k]
	return p, ok
}

// Len returns how many keys the index holds.
func (r *Remote) Len() int {
	n := 0
	for i := range r.shards {
		s := &r.shards[i]
		s.RLock()
		n += len(s.m)
		s.RUnlock()
	}
	return n
}

// Count returns how many pages origin announced.
func (r *Remote) Count(origin int) int {
	n := 0
	for i := range r.shards {
		s := &r.shards[i]
		s.RLock()
		for _, p := range s.m {
			if p.Holders.Has(origin) {
				n++
			}
		}
		s.RUnlock()
	}
	return n
}

// Extend returns the longest prefix of keys held elsewhere with the given
// layout and size, and for each of its pages the origin to fetch it from:
// the origin of the previous page when it holds this one too (so a run of
// pages comes from one peer in one request), else the lowest holder that
// usable allows (usable nil allows all).
func (r *Remote) Extend(keys []pagekey.Key, layout pagekey.Fingerprint, size uint64, usable func(origin int) bool) []int {
	var from []int
	prev := -1
	for _, k := range keys {
		p, ok := r.Get(k)
		if !ok || p.Layout != layout || p.Size != size {
			break
		}
		o := -1
		if prev >= 0 && p.Holders.Has(prev) {
			o = prev
		} else {
			o = pick(p.Holders, usable)
		}
		if o < 0 {
			break
		}
		from = append(from, o)
		prev = o
	}
	return from
}

func pick(h Holders, usable func(int) bool) int {
	for i, w := range h {
		for ; w != 0; w &= w - 1 {
			o := i*64 + bits.TrailingZeros64(w)
			if usable == nil || usable(o) {
				return o
			}
		}
	}
	return -1
}
