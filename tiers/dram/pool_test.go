package dram

import (
	"errors"
	"math/rand/v2"
	"testing"
)

func newPool(t *testing.T, slabs, slabBytes uint64) *Pool {
	t.Helper()
	p, err := New(Config{Bytes: slabs * slabBytes, SlabBytes: slabBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestAllocFillsAndFrees(t *testing.T) {
	p := newPool(t, 2, 64<<10)
	var slots []Slot
	for {
		s, err := p.Alloc(10000) // 12 KiB slots: 5 per slab
		if errors.Is(err, ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	if len(slots) != 10 {
		t.Fatalf("got %d slots, want 10", len(slots))
	}
	if got := p.Stats().UsedBytes; got != 10*12288 {
		t.Fatalf("used %d", got)
	}
	// Slots never overlap and are aligned.
	seen := map[uint64]bool{}
	for _, s := range slots {
		off := p.Offset(s)
		if off%4096 != 0 || seen[off] {
			t.Fatalf("slot %x offset %d misaligned or reused", s, off)
		}
		seen[off] = true
		if len(p.Bytes(s)) != 12288 {
			t.Fatal("slot length")
		}
	}
	// Another size class cannot be served until a whole slab is free.
	if _, err := p.Alloc(4096); !errors.Is(err, ErrFull) {
		t.Fatalf("want ErrFull, got %v", err)
	}
	for _, s := range slots[:5] {
		p.Free(s)
	}
	if _, err := p.Alloc(4096); err != nil {
		t.Fatalf("after freeing a slab: %v", err)
	}
}

func TestTooLarge(t *testing.T) {
	p := newPool(t, 1, 64<<10)
	if _, err := p.Alloc(64<<10 + 1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("want ErrTooLarge, got %v", err)
	}
}

func TestDoubleFreePanics(t *testing.T) {
	p := newPool(t, 1, 64<<10)
	s, _ := p.Alloc(100)
	p.Free(s)
	defer func() {
		if recover() == nil {
			t.Fatal("double free must panic")
		}
	}()
	p.Free(s)
}

// TestRandomAgainstModel allocates and frees at random with two sizes and
// checks that live slots never overlap and accounting matches.
func TestRandomAgainstModel(t *testing.T) {
	p := newPool(t, 8, 64<<10)
	r := rand.New(rand.NewPCG(3, 4))
	live := map[Slot]uint64{}
	for step := 0; step < 5000; step++ {
		if r.IntN(3) > 0 {
			size := []uint64{4096, 20000}[r.IntN(2)]
			s, err := p.Alloc(size)
			if errors.Is(err, ErrFull) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, dup := live[s]; dup {
				t.Fatalf("slot %x handed out twice", s)
			}
			live[s] = SlotBytes(size)
			b := p.Bytes(s)
			b[0], b[len(b)-1] = byte(step), byte(step)
		} else {
			for s := range live {
				p.Free(s)
				delete(live, s)
				break
			}
		}
		var used uint64
		type iv struct{ a, b uint64 }
		var ivs []iv
		for s, sz := range live {
			used += sz
			off := p.Offset(s)
			for _, o := range ivs {
				if off < o.b && o.a < off+sz {
					t.Fatalf("slots overlap at step %d", step)
				}
			}
			ivs = append(ivs, iv{off, off + sz})
		}
		if st := p.Stats(); st.UsedBytes != used || st.Slots != len(live) {
			t.Fatalf("stats %+v, model used %d slots %d", st, used, len(live))
		}
	}
}

// TestFreeBytes counts what can still be allocated: whole free slabs and
// free slots, never the tail of a slab too small for its slot size.
func TestFreeBytes(t *testing.T) {
	p := newPool(t, 3, 64<<10)
	if got := p.FreeBytes(); got != 3*64<<10 {
		t.Fatalf("empty pool: %d free, want %d", got, 3*64<<10)
	}
	big, err := p.Alloc(36 << 10) // 40 KiB slots: one per slab, 24 KiB of tail
	if err != nil {
		t.Fatal(err)
	}
	if got := p.FreeBytes(); got != 2*64<<10 {
		t.Fatalf("one big slot: %d free, want %d (its slab's tail is not free)", got, 2*64<<10)
	}
	small, err := p.Alloc(10000) // 12 KiB slots: 5 per slab
	if err != nil {
		t.Fatal(err)
	}
	if got := p.FreeBytes(); got != 64<<10+4*12288 {
		t.Fatalf("plus one small slot: %d free, want %d", got, 64<<10+4*12288)
	}
	p.Free(big)
	p.Free(small)
	if got := p.FreeBytes(); got != 3*64<<10 {
		t.Fatalf("all freed: %d free, want %d", got, 3*64<<10)
	}
}

// TestEffectivelyFull: pages whose slot does not divide a slab fill the
// pool while used bytes stay well below capacity; FreeBytes and FreeSlabs
// (orbitkv_tiers_dram_free_bytes, _free_slabs) say it is full.
func TestEffectivelyFull(t *testing.T) {
	p := newPool(t, 3, 64<<10)
	if p.FreeSlabs() != 3 {
		t.Fatalf("empty pool: %d free slabs", p.FreeSlabs())
	}
	for i := 0; i < 3; i++ { // 40 KiB slots: one per slab
		if _, err := p.Alloc(36 << 10); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Alloc(36 << 10); !errors.Is(err, ErrFull) {
		t.Fatalf("fourth page: %v, want ErrFull", err)
	}
	st := p.Stats()
	if used := float64(st.UsedBytes) / float64(st.CapacityBytes); used > 0.7 || p.FreeBytes() != 0 || p.FreeSlabs() != 0 {
		t.Fatalf("full pool: used %.0f%%, free bytes %d, free slabs %d; want ~62%%, 0, 0", 100*used, p.FreeBytes(), p.FreeSlabs())
	}
}
