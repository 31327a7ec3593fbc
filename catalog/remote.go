package catalog

import (
	"hash/maphash"
	"sync"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// RemotePage is what the index knows of one page held elsewhere.
type RemotePage struct {
	Layout  pagekey.Fingerprint
	Size    uint64
	Holders Holders
}

const remoteShards = 64

// remoteEntry is a RemotePage as the index stores it: without pointers, so
// that the collector skips the maps of entries. Its holders are inline
// (Holders.small), or, marked spilled, in its shard's big map.
type remoteEntry struct {
	layout pagekey.Fingerprint
	size   uint64
	small  [smallHolders]uint16
}

// spilled, in an entry's last small slot, marks holders in its shard's big
// map: neither an inline list's id+1 (at most MaxOrigins) nor inline bits
// (bitsFlag set).
const spilled = bitsFlag - 1

// Remote indexes the pages other peers announced. It is safe for
// concurrent use.
type Remote struct {
	seed   maphash.Seed
	shards [remoteShards]remoteShard
}

type remoteShard struct {
	sync.RWMutex
	m   map[pagekey.Key]remoteEntry
	big map[pagekey.Key][]uint64 // the holders of m's spilled entries (Holders.big, never written)
}

// NewRemote returns an empty index.
func NewRemote() *Remote {
	r := &Remote{seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i].m = map[pagekey.Key]remoteEntry{}
		r.shards[i].big = map[pagekey.Key][]uint64{}
	}
	return r
}

// pageLocked returns what the shard holds of k.
func (s *remoteShard) pageLocked(k pagekey.Key) (RemotePage, bool) {
	e, ok := s.m[k]
	if !ok {
		return RemotePage{}, false
	}
	return s.pageOfLocked(k, e), true
}

// pageOfLocked returns k's entry e as a RemotePage.
func (s *remoteShard) pageOfLocked(k pagekey.Key, e remoteEntry) RemotePage {
	p := RemotePage{Layout: e.layout, Size: e.size}
	if e.small[smallHolders-1] == spilled {
		p.Holders.big = s.big[k]
	} else {
		p.Holders.small = e.small
	}
	return p
}

// putLocked stores p as k's entry, or deletes k when p has no holder.
func (s *remoteShard) putLocked(k pagekey.Key, p RemotePage) {
	if p.Holders.Empty() {
		delete(s.m, k)
		delete(s.big, k)
		return
	}
	e := remoteEntry{layout: p.Layout, size: p.Size, small: p.Holders.small}
	if p.Holders.big != nil {
		e.small = [smallHolders]uint16{smallHolders - 1: spilled}
		s.big[k] = p.Holders.big
	} else {
		delete(s.big, k)
	}
	s.m[k] = e
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
	p, ok := s.pageLocked(k)
	if !ok || p.Layout != layout || p.Size != size {
		p = RemotePage{Layout: layout, Size: size}
	}
	if err := p.Holders.Add(origin); err != nil {
		return err
	}
	s.putLocked(k, p)
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
	p, ok := s.pageLocked(k)
	if !ok {
		return
	}
	p.Holders.Remove(origin)
	s.putLocked(k, p)
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
		for k, e := range s.m {
			p := s.pageOfLocked(k, e)
			if !p.Holders.Has(origin) {
				continue
			}
			n++
			p.Holders.Remove(origin)
			s.putLocked(k, p)
		}
		s.Unlock()
	}
	return n
}

// Get returns what the index knows of k.
func (r *Remote) Get(k pagekey.Key) (RemotePage, bool) {
	s := &r.shards[r.shard(k)]
	s.RLock()
	e, ok := s.m[k]
	var big []uint64
	if ok && e.small[smallHolders-1] == spilled {
		big = s.big[k]
	}
	s.RUnlock()
	if !ok {
		return RemotePage{}, false
	}
	if big != nil {
		return RemotePage{Layout: e.layout, Size: e.size, Holders: Holders{big: big}}, true
	}
	return RemotePage{Layout: e.layout, Size: e.size, Holders: Holders{small: e.small}}, true
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
		for k, e := range s.m {
			if p := s.pageOfLocked(k, e); p.Holders.Has(origin) {
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
			o = pick(&p.Holders, usable)
		}
		if o < 0 {
			break
		}
		from = append(from, o)
		prev = o
	}
	return from
}

func pick(h *Holders, usable func(int) bool) int {
	for o := h.First(); o >= 0; o = h.Next(o) {
		if usable == nil || usable(o) {
			return o
		}
	}
	return -1
}
