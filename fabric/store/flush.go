package store

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Flushing: with an SSD tier, a background flusher keeps part of the DRAM
// pool free by evicting ahead of need (clean copies dropped, the others
// demoted in batches), so a save finds a free slot instead of waiting for
// the disk to take older pages. Measured without it on the H200 machine's
// 1–1.6 GB/s disk: DRAM saves spent 23 s of a 60-s window waiting for
// demotions (docs/benchmarks.md). A save that still finds the pool full —
// the disk slower than the saves for long — evicts inline, as before.

// flushReserve is the fraction of the DRAM pool the flusher keeps free:
// an 8K-token prompt of Qwen3-8B is 1.2 GB, 1/8 of a 10 GB pool.
const flushReserve = 8

// flushTick is how often the flusher looks when nobody woke it.
const flushTick = 50 * time.Millisecond

// flushLow reports whether free DRAM is below the reserve.
func (s *Store) flushLow() bool {
	return s.pool.FreeBytes() < s.pool.Stats().CapacityBytes/flushReserve
}

// wakeFlusher nudges the flusher; it never blocks.
func (s *Store) wakeFlusher() {
	select {
	case s.flushWake <- struct{}{}:
	default:
	}
}

// RunFlusher evicts until ctx ends. The peer's Run owns it; without an SSD
// tier it returns at once (evicting means dropping, which costs nothing to
// do at the last moment).
func (s *Store) RunFlusher(ctx context.Context) {
	if s.ssd == nil {
		return
	}
	s.registerBehind()
	t := time.NewTicker(flushTick)
	defer t.Stop()
	wake := s.flushWake
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-t.C:
		}
		wake = s.flushWake
		start := s.now()
		for ctx.Err() == nil && s.flushLow() {
			if !s.flushOnce(ctx) {
				wake = nil // every candidate pinned, or the SSD refused: wait for the tick
				break
			}
		}
		s.m.flusherBusy.Add(s.now().Sub(start).Seconds())
	}
}

// fillWaitLimit is how long, within a second, DRAM-acknowledged saves may
// wait for demotions before the disk counts as behind the saves: a burst
// the disk absorbs waits a few milliseconds; on the H200 (4 GiB DRAM, a
// disk writing 1.3 GB/s, saves coming at 1.5 GB/s) they waited 460 ms of
// every second.
const fillWaitLimit = 100 * time.Millisecond

// fillProtect is how recently used a DRAM-only page must not have been for
// a cache fill to drop it: the pages of the save itself and of the requests
// beside it stay (a save larger than the free pool demotes its own older
// pages rather than dropping them).
const fillProtect = time.Second

// registerBehind exports behind as orbitkv_tiers_disk_behind, once (the
// flusher's start; a second start finds it registered).
func (s *Store) registerBehind() {
	_ = s.opts.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "orbitkv", Subsystem: "tiers",
		Name: "disk_behind", Help: "1 while the disk counts as behind the saves (cache fills waited over 100 ms for demotions in the " +
			"current or last second), when cache fills drop clean copies and pages unused for a second before they demote."},
		func() float64 {
			if s.behind() {
				return 1
			}
			return 0
		}))
}

// behind reports whether the disk has fallen behind the saves: cache fills
// waited for it more than fillWaitLimit in this second or the last.
func (s *Store) behind() bool {
	return s.fillWaits.over(s.now(), fillWaitLimit)
}

// flushOnce makes room once: drops the oldest clean DRAM copy, or demotes a
// batch of the oldest others. It reports whether anything moved.
func (s *Store) flushOnce(ctx context.Context) bool {
	s.mu.Lock()
	dropped, demote := s.pickVictimsLocked(allocDemote)
	s.mu.Unlock()
	if dropped {
		return true
	}
	if len(demote) == 0 {
		return false
	}
	defer s.demoting.Add(-1) // counted by pickVictimsLocked
	// Checksum pending victims on this goroutine alone (background work,
	// like the sealer's), so demoteBatch finds them sealed.
	demote = s.sealEntries(demote, func(n int, fn func(i int)) {
		for i := range n {
			fn(i)
		}
	})
	return s.demoteBatch(ctx, demote) > 0
}
