package catalog

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// numShards is the number of index shards; a key's shard is the top byte of
// its seeded hash.
const numShards = 256

// record is an Entry without its key. It holds no pointers, so the garbage
// collector never scans the index. lastAccess and hits are touched by Lookup
// under the shard's read lock and so are only accessed atomically.
type record struct {
	size       uint64
	generation uint64
	dramSlot   int64
	ssdOffset  uint64
	ssdBytes   uint64
	lastAccess int64  // atomic
	hits       uint64 // atomic
	checksum   uint32
	ssdFile    uint32
	layout     uint32 // id in the layout table
	onSSD      bool
	demoted    bool
	used       bool // the slot holds an entry
}

func (r *record) tier() Tier {
	switch {
	case r.dramSlot >= 0:
		return TierDRAM
	case r.onSSD:
		return TierSSD
	}
	return TierNone
}

// slot is one cell of a shard's table: a key with its record inline, so a
// probe that finds the key has the record in the same or the next cache line.
type slot struct {
	key pagekey.Key
	rec record
}

// hasher mixes a key with per-catalog random seeds. Keys come from clients,
// so the table must not be floodable by keys chosen to collide.
type hasher struct{ s0, s1 uint64 }

func newHasher() hasher { return hasher{rand.Uint64() | 1, rand.Uint64() | 1} }

func (h hasher) hash(k pagekey.Key) uint64 {
	hi, lo := bits.Mul64(binary.LittleEndian.Uint64(k[:8])^h.s0, binary.LittleEndian.Uint64(k[8:])^h.s1)
	hi, lo = bits.Mul64(hi^lo^h.s0, h.s1^0x9e3779b97f4a7c15)
	return hi ^ lo
}

func shardOf(h uint64) uint8 { return uint8(h >> 56) }

// home maps a hash to a cell of a table of n cells (the bits below the shard
// byte, scaled to n).
func home(h uint64, n int) int {
	hi, _ := bits.Mul64(h<<8, uint64(n))
	return int(hi)
}

// Table load limits: grow by half past maxLoad, shrink below minLoad.
const (
	maxLoadNum, maxLoadDen = 4, 5
	minTable               = 16
)

// shard is one slice of the index: an open-addressing table with linear
// probing and backward-shift deletion (no tombstones).
type shard struct {
	mu struct {
		sync.RWMutex
		slots []slot // len is the capacity; always has an empty cell
		n     int    // cells in use
	}
	_ [72]byte // keep neighbouring shards' locks off one cache line
}

// findLocked returns the cell holding k, or the empty cell ending its probe
// sequence; the caller holds mu and slots is not empty.
func (s *shard) findLocked(h uint64, k pagekey.Key) (int, bool) {
	slots := s.mu.slots
	for i := home(h, len(slots)); ; {
		switch c := &slots[i]; {
		case !c.rec.used:
			return i, false
		case c.key == k:
			return i, true
		}
		if i++; i == len(slots) {
			i = 0
		}
	}
}

// getLocked returns k's record; the caller holds mu (read or write).
func (s *shard) getLocked(h uint64, k pagekey.Key) (*record, bool) {
	if len(s.mu.slots) == 0 {
		return nil, false
	}
	i, ok := s.findLocked(h, k)
	return &s.mu.slots[i].rec, ok
}

// setLocked inserts or replaces k's record; the caller holds mu for writing.
// It reports whether k is new.
func (s *shard) setLocked(hs hasher, h uint64, k pagekey.Key, r record) (added bool) {
	if (s.mu.n+1)*maxLoadDen > len(s.mu.slots)*maxLoadNum {
		s.resizeLocked(hs, max(minTable, len(s.mu.slots)*3/2))
	}
	r.used = true
	i, ok := s.findLocked(h, k)
	s.mu.slots[i] = slot{key: k, rec: r}
	if !ok {
		s.mu.n++
	}
	return !ok
}

// deleteLocked removes k; the caller holds mu for writing. It reports
// whether k was present.
func (s *shard) deleteLocked(hs hasher, h uint64, k pagekey.Key) bool {
	if len(s.mu.slots) == 0 {
		return false
	}
	i, ok := s.findLocked(h, k)
	if !ok {
		return false
	}
	// Backward shift: pull later cells of the cluster into the hole unless
	// their home lies cyclically in (hole, cell].
	slots, n := s.mu.slots, len(s.mu.slots)
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		if !slots[j].rec.used {
			break
		}
		if hj := home(hs.hash(slots[j].key), n); i <= j && i < hj && hj <= j || i > j && (i < hj || hj <= j) {
			continue
		}
		slots[i] = slots[j]
		i = j
	}
	slots[i] = slot{}
	s.mu.n--
	switch {
	case s.mu.n == 0:
		s.mu.slots = nil
	case len(slots) > 4*minTable && s.mu.n*5 < len(slots):
		s.resizeLocked(hs, s.mu.n*2)
	}
	return true
}

func (s *shard) resizeLocked(hs hasher, n int) {
	old := s.mu.slots
	s.mu.slots = make([]slot, n)
	for i := range old {
		if old[i].rec.used {
			j, _ := s.findLocked(hs.hash(old[i].key), old[i].key)
			s.mu.slots[j] = old[i]
		}
	}
}

// entry returns the Entry of k and r; the caller holds the shard's lock.
func (r *record) entry(k pagekey.Key, layouts *layoutTable) Entry {
	return Entry{
		Key:        k,
		Layout:     layouts.get(r.layout),
		Size:       r.size,
		Checksum:   r.checksum,
		Generation: r.generation,
		DRAMSlot:   r.dramSlot,
		OnSSD:      r.onSSD,
		Demoted:    r.demoted,
		SSD:        SSDLoc{File: r.ssdFile, Offset: r.ssdOffset, Bytes: r.ssdBytes},
		LastAccess: atomic.LoadInt64(&r.lastAccess),
		Hits:       atomic.LoadUint64(&r.hits),
	}
}

// layoutTable interns layout fingerprints: records store a 4-byte id. A
// peer serves a handful of layouts, so ids are never freed. Readers load the
// published slice without locking; intern appends under mu and republishes.
// Elements below a published length are never written again, so sharing the
// backing array with older readers is safe.
type layoutTable struct {
	mu struct {
		sync.Mutex
		ids map[pagekey.Fingerprint]uint32
	}
	list atomic.Pointer[[]pagekey.Fingerprint]
}

func (t *layoutTable) intern(fp pagekey.Fingerprint) uint32 {
	if l := t.list.Load(); l != nil {
		// Fast path: most writes reuse the layout of the previous write.
		if n := len(*l); n > 0 && (*l)[n-1] == fp {
			return uint32(n - 1)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.mu.ids[fp]; ok {
		return id
	}
	if t.mu.ids == nil {
		t.mu.ids = make(map[pagekey.Fingerprint]uint32)
	}
	var list []pagekey.Fingerprint
	if l := t.list.Load(); l != nil {
		list = *l
	}
	id := uint32(len(list))
	list = append(list, fp)
	t.list.Store(&list)
	t.mu.ids[fp] = id
	return id
}

func (t *layoutTable) get(id uint32) pagekey.Fingerprint {
	return (*t.list.Load())[id]
}

func (t *layoutTable) len() int {
	if l := t.list.Load(); l != nil {
		return len(*l)
	}
	return 0
}

// toRecord converts e, interning its layout.
func toRecord(e Entry, layouts *layoutTable) record {
	return record{
		size:       e.Size,
		generation: e.Generation,
		dramSlot:   e.DRAMSlot,
		ssdOffset:  e.SSD.Offset,
		ssdBytes:   e.SSD.Bytes,
		lastAccess: e.LastAccess,
		hits:       e.Hits,
		checksum:   e.Checksum,
		ssdFile:    e.SSD.File,
		layout:     layouts.intern(e.Layout),
		onSSD:      e.OnSSD,
		demoted:    e.Demoted && e.OnSSD, // the mark is of an SSD copy
	}
}
