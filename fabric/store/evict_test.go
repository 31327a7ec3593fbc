package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/orbitkv/orbitkv/catalog"
)

// TestFailedDemotionFailsFast: an allocation whose own demotion moves
// nothing (the SSD full, nothing on it that may go) fails at once with no
// space, even while another demotion is writing, instead of waiting out its
// deadline. No flusher runs, so nothing makes room behind the test.
func TestFailedDemotionFailsFast(t *testing.T) {
	ps := testStore(t, 64<<20)
	const page = 512 << 10
	for { // the SSD full of slots no catalog entry names: nothing there can be evicted
		if _, err := ps.ssd.Alloc(page); err != nil {
			break
		}
	}
	// DRAM full of pages held there only: the victims a demotion would take.
	for i := 0; ; i++ {
		sl, err := ps.pool.Alloc(page)
		if err != nil {
			break
		}
		k := randKey(t)
		if err := ps.cat.Put(catalog.Entry{Key: k, Size: page, Generation: uint64(i + 1), DRAMSlot: int64(sl), LastAccess: now()}); err != nil {
			t.Fatal(err)
		}
		ps.mu.dram.Touch(k)
	}
	ps.demoting.Add(1) // as if another demotion were writing
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err := ps.allocDRAM(c, page)
	if !errors.Is(err, ErrNoSpace) || time.Since(start) > time.Second {
		t.Fatalf("allocDRAM = %v after %v; want no space at once", err, time.Since(start))
	}
}

// TestCacheFillDropsInsteadOfDemoting: a DRAM-acknowledged save that finds
// the pool full while the disk is behind (the flusher demoting for longer
// than flushBehind) takes the slot of the oldest DRAM-only page by dropping
// it — no SSD write on the engine's path — while an allocation for an
// SSD-bound save still demotes, and so does a cache fill while the disk
// keeps up. No flusher runs, so nothing makes room behind the test.
func TestCacheFillDropsInsteadOfDemoting(t *testing.T) {
	ps := testStore(t, 64<<20)
	const page = 512 << 10
	var keys []catalog.Entry
	for i := 0; ; i++ { // DRAM full of pages held there only, oldest first
		sl, err := ps.pool.Alloc(page)
		if err != nil {
			break
		}
		e := catalog.Entry{Key: randKey(t), Size: page, Generation: uint64(i + 1), DRAMSlot: int64(sl), LastAccess: now()}
		if err := ps.cat.Put(e); err != nil {
			t.Fatal(err)
		}
		ps.mu.dram.Touch(e.Key)
		keys = append(keys, e)
	}
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ps.flushBusySince.Store(time.Now().Add(-2 * flushBehind).UnixNano()) // the disk behind
	if _, err := ps.allocCacheFill(c, page); err != nil {
		t.Fatal(err)
	}
	if _, ok := ps.cat.Get(keys[0].Key); ok {
		t.Fatal("the oldest DRAM-only page should have been dropped for the cache fill")
	}
	if got := counterValue(t, ps.m.unflushedDrops); got != 1 {
		t.Fatalf("unflushed drops = %v, want 1", got)
	}
	if got := counterValue(t, ps.m.demotedPages); got != 0 {
		t.Fatalf("a cache fill demoted %v pages; want none", got)
	}
	if _, err := ps.allocDRAM(c, page); err != nil {
		t.Fatal(err)
	}
	if e, ok := ps.cat.Get(keys[1].Key); !ok || !e.OnSSD || e.DRAMSlot >= 0 {
		t.Fatalf("an SSD-bound allocation should demote the next oldest page: %+v, %v", e, ok)
	}
	if got := counterValue(t, ps.m.unflushedDrops); got != 1 {
		t.Fatalf("unflushed drops = %v after a demoting allocation, want still 1", got)
	}
	ps.flushBusySince.Store(time.Now().UnixNano()) // demoting, but not for long: a burst
	if _, err := ps.allocCacheFill(c, page); err != nil {
		t.Fatal(err)
	}
	if e, ok := ps.cat.Get(keys[2].Key); !ok || !e.OnSSD {
		t.Fatalf("a cache fill while the disk keeps up should demote: %+v, %v", e, ok)
	}
	if got := counterValue(t, ps.m.unflushedDrops); got != 1 {
		t.Fatalf("unflushed drops = %v, want still 1", got)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
