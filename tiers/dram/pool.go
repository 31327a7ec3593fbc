package dram

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
)

// ErrFull reports that no slot of the asked size is free.
var ErrFull = errors.New("dram pool full")

// ErrTooLarge reports a page larger than a slab.
var ErrTooLarge = errors.New("page larger than a dram slab")

// Config sizes the pool.
type Config struct {
	// Bytes is the pool's capacity in bytes, rounded down to whole slabs.
	Bytes uint64
	// SlabBytes is the unit bound to one slot size, in bytes (default 64 MiB).
	// A page larger than a slab cannot be stored.
	SlabBytes uint64
	// NoPrefault skips touching every page at start (tests only).
	NoPrefault bool
}

// DefaultSlabBytes is the slab size when Config.SlabBytes is 0.
const DefaultSlabBytes = 64 << 20

// Validate checks the config.
func (c *Config) Validate() error {
	if c.SlabBytes == 0 {
		c.SlabBytes = DefaultSlabBytes
	}
	if c.SlabBytes%page.Alignment != 0 {
		return fmt.Errorf("dram slab %d bytes is not a multiple of %d", c.SlabBytes, page.Alignment)
	}
	if c.Bytes < c.SlabBytes {
		return fmt.Errorf("dram pool %d bytes is smaller than one slab (%d bytes)", c.Bytes, c.SlabBytes)
	}
	return nil
}

// Slot identifies an allocated slot: slab index in the high 32 bits, slot
// index within the slab in the low 32.
type Slot int64

func slotID(slab, idx int) Slot { return Slot(int64(slab)<<32 | int64(idx)) }
func (s Slot) slab() int        { return int(s >> 32) }
func (s Slot) index() int       { return int(s & 0xffffffff) }

// Stats is a snapshot of the pool.
type Stats struct {
	CapacityBytes uint64
	UsedBytes     uint64 // bytes of allocated slots
	Slots         int    // allocated slots
}

// Pool is the DRAM tier's memory. It is safe for concurrent use.
type Pool struct {
	mem       []byte
	slabBytes uint64
	mu        struct {
		sync.Mutex
		slabs   []slab
		free    []int            // slab indexes with no size
		classes map[uint64][]int // slot size -> slabs of that size with a free slot
		stats   Stats
	}
}

type slab struct {
	slotBytes uint64 // 0 = unassigned
	free      []int  // free slot indexes (stack)
	used      int
}

// New allocates and pre-faults the pool.
func New(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := cfg.Bytes / cfg.SlabBytes
	size := n * cfg.SlabBytes
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("map dram pool of %d bytes: %w", size, err)
	}
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE) // best effort, before the first touch: fewer TLB misses
	if !cfg.NoPrefault {
		prefault(mem)
	}
	p := &Pool{mem: mem, slabBytes: cfg.SlabBytes}
	p.mu.slabs = make([]slab, n)
	p.mu.classes = make(map[uint64][]int)
	for i := int(n) - 1; i >= 0; i-- {
		p.mu.free = append(p.mu.free, i)
	}
	p.mu.stats.CapacityBytes = size
	return p, nil
}

// prefault touches every page so no save pays for first touch.
func prefault(mem []byte) {
	if unix.Madvise(mem, unix.MADV_POPULATE_WRITE) == nil {
		return
	}
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 0
	}
}

// Region returns the whole pool's memory, for transport registration.
func (p *Pool) Region() []byte { return p.mem }

// SlotBytes is the slot size that holds dataLen bytes of page data.
func SlotBytes(dataLen uint64) uint64 { return page.AlignUp(dataLen) }

// FreeBytes is what the pool can still hand out: whole free slabs, and the
// free slots of slabs already cut into one slot size. Unlike Capacity less
// Used it leaves out slab tails too small for a slot (with pages over half a
// slab, up to half the pool).
func (p *Pool) FreeBytes() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := uint64(len(p.mu.free)) * p.slabBytes
	for sz, slabs := range p.mu.classes {
		for _, si := range slabs {
			n += uint64(len(p.mu.slabs[si].free)) * sz
		}
	}
	return n
}

// Alloc returns a free slot for dataLen bytes of page data.
func (p *Pool) Alloc(dataLen uint64) (Slot, error) {
	sz := SlotBytes(dataLen)
	if sz == 0 || sz > p.slabBytes {
		return 0, fmt.Errorf("%w: %d bytes, slab %d", ErrTooLarge, dataLen, p.slabBytes)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	avail := p.mu.classes[sz]
	if len(avail) == 0 {
		if len(p.mu.free) == 0 {
			return 0, ErrFull
		}
		si := p.mu.free[len(p.mu.free)-1]
		p.mu.free = p.mu.free[:len(p.mu.free)-1]
		p.assignLocked(si, sz)
		avail = append(avail, si)
	}
	si := avail[len(avail)-1]
	s := &p.mu.slabs[si]
	idx := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.used++
	if len(s.free) == 0 {
		avail = avail[:len(avail)-1]
	}
	p.mu.classes[sz] = avail
	p.mu.stats.UsedBytes += sz
	p.mu.stats.Slots++
	return slotID(si, idx), nil
}

func (p *Pool) assignLocked(si int, sz uint64) {
	s := &p.mu.slabs[si]
	s.slotBytes = sz
	n := int(p.slabBytes / sz)
	s.free = make([]int, 0, n)
	for i := n - 1; i >= 0; i-- {
		s.free = append(s.free, i)
	}
}

// Free returns a slot to the pool. Freeing a slot that is not allocated
// panics: it is a bookkeeping bug that would otherwise corrupt pages.
func (p *Pool) Free(sl Slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	si, idx := sl.slab(), sl.index()
	s := p.checkLocked(sl)
	s.free = append(s.free, idx)
	s.used--
	p.mu.stats.UsedBytes -= s.slotBytes
	p.mu.stats.Slots--
	if len(s.free) == 1 {
		p.mu.classes[s.slotBytes] = append(p.mu.classes[s.slotBytes], si)
	}
	if s.used == 0 {
		p.mu.classes[s.slotBytes] = removeInt(p.mu.classes[s.slotBytes], si)
		*s = slab{}
		p.mu.free = append(p.mu.free, si)
	}
}

func (p *Pool) checkLocked(sl Slot) *slab {
	si, idx := sl.slab(), sl.index()
	if si < 0 || si >= len(p.mu.slabs) {
		panic(fmt.Sprintf("dram: slot %#x: no slab %d", int64(sl), si))
	}
	s := &p.mu.slabs[si]
	if s.slotBytes == 0 || idx >= int(p.slabBytes/s.slotBytes) {
		panic(fmt.Sprintf("dram: slot %#x out of range", int64(sl)))
	}
	for _, f := range s.free {
		if f == idx {
			panic(fmt.Sprintf("dram: slot %#x is not allocated", int64(sl)))
		}
	}
	return s
}

// Bytes returns the memory of an allocated slot (its whole, aligned length).
func (p *Pool) Bytes(sl Slot) []byte {
	p.mu.Lock()
	sz := p.mu.slabs[sl.slab()].slotBytes
	p.mu.Unlock()
	off := uint64(sl.slab())*p.slabBytes + uint64(sl.index())*sz
	return p.mem[off : off+sz : off+sz]
}

// Offset returns the slot's byte offset within Region.
func (p *Pool) Offset(sl Slot) uint64 {
	p.mu.Lock()
	sz := p.mu.slabs[sl.slab()].slotBytes
	p.mu.Unlock()
	return uint64(sl.slab())*p.slabBytes + uint64(sl.index())*sz
}

// CanAlloc reports whether Alloc(dataLen) would succeed now.
func (p *Pool) CanAlloc(dataLen uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.mu.classes[SlotBytes(dataLen)]) > 0 || len(p.mu.free) > 0
}

// Stats returns a snapshot.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.stats
}

// Close unmaps the pool. No slot may be used afterwards.
func (p *Pool) Close() error {
	if p.mem == nil {
		return nil
	}
	err := unix.Munmap(p.mem)
	p.mem = nil
	return err
}

func removeInt(s []int, v int) []int {
	for i, x := range s {
		if x == v {
			return append(s[:i], s[i+1:]...)
		}
	}
	return s
}

// FreeSlabs is the number of slabs not yet bound to a slot size.
func (p *Pool) FreeSlabs() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.mu.free)
}
