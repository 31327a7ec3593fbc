package fabric

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/catalog"
)

// TestFailedDemotionFailsFast: an allocation whose own demotion moves
// nothing (the SSD full, nothing on it that may go) fails at once with no
// space, even while another demotion is writing, instead of waiting out its
// deadline. The peer is not Run, so no flusher makes room behind the test.
func TestFailedDemotionFailsFast(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	cfg.SSDBytes, cfg.SSDFileBytes = 64<<20, 64<<20
	p, err := New(cfg, zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ps := p.pages
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
		k := mustKey(t, randKeys(1)[0])
		if err := ps.cat.Put(catalog.Entry{Key: k, Size: page, Generation: uint64(i + 1), DRAMSlot: int64(sl), LastAccess: now()}); err != nil {
			t.Fatal(err)
		}
		ps.mu.dram.Touch(k)
	}
	ps.demoting.Add(1) // as if another demotion were writing
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err = ps.allocDRAM(c, page)
	if !errors.Is(err, errNoSpace) || time.Since(start) > time.Second {
		t.Fatalf("allocDRAM = %v after %v; want no space at once", err, time.Since(start))
	}
}
