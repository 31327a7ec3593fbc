package store

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Restore or recompute: a page found only on SSD is worth restoring only if
// the peer reads it faster than the engine recomputes its tokens. On an
// H200, Qwen3-8B prefill produces KV at ~25 K tokens/s = 3.7 GB/s; a disk
// that reads 1 GB/s makes every SSD restore ~3.5× slower than recomputing
// (measured: docs/journal/2026-11-30-gpu-h200.md, "Sustained, 60 s
// windows"). A session that
// declares its engine's prefill rate (OpenSessionRequest.recompute_tokens_per_s)
// gets lookups that stop at the first SSD-only page while the measured SSD
// read rate is below that break-even.

// SSDRateTTL is how long a measured SSD read rate is trusted. Past it one
// lookup (a probe) includes one SSD page past the DRAM prefix, so that its
// read measures the disk anew, while the others keep to the last rate:
// about one slow page read per TTL when the disk stays slow, and a disk
// that got faster is noticed. Before any read every lookup includes SSD pages.
const SSDRateTTL = 10 * time.Second

// SSDProbeEvery is how often a stale rate lets a probe through: a probe's
// lookup may never lead to a read (the engine computes the prompt after
// all), so another one goes after this long.
const SSDProbeEvery = time.Second

// ssdRate is an exponentially weighted average of the SSD tier's read
// throughput, bytes per second, over read batches.
type ssdRate struct {
	bits  atomic.Uint64 // math.Float64bits of the rate
	at    atomic.Int64  // unix nanoseconds of the last sample; 0 = none
	probe atomic.Int64  // unix nanoseconds of the last probe let through
}

// note records a read batch of n bytes that took d, ending at now.
func (r *ssdRate) note(n uint64, d time.Duration, now time.Time) {
	if n == 0 || d <= 0 {
		return
	}
	sample := float64(n) / d.Seconds()
	// Blend with a fresh average; a stale one (a probe after a quiet spell)
	// is replaced, so a disk that got faster is believed at once.
	if old, fresh := r.get(now); fresh && old > 0 {
		sample = 0.7*old + 0.3*sample
	}
	r.bits.Store(math.Float64bits(sample))
	r.at.Store(now.UnixNano())
}

// get returns the rate and whether it is fresh at now.
func (r *ssdRate) get(now time.Time) (float64, bool) {
	at := r.at.Load()
	if at == 0 || now.Sub(time.Unix(0, at)) > SSDRateTTL {
		return 0, false
	}
	return math.Float64frombits(r.bits.Load()), true
}

// verdict is what a lookup does with the pages held only on SSD.
type verdict int

const (
	judgeRate  verdict = iota // compare the rate with the engine's prefill rate
	includeAll                // nothing measured yet: restore them, measuring the disk
	probeOne                  // stale rate: restore one of them to measure the disk anew
)

// forLookup returns the rate a lookup should judge by and what to do with
// SSD-only pages: before any measurement, include them; once the rate is
// stale, one lookup per SSDProbeEvery is a probe that restores a single SSD
// page (a read of one page measures the disk; an 8K-token prefix read from
// a slow disk would hold the engine's restore admission for seconds).
func (r *ssdRate) forLookup(at time.Time) (float64, verdict) {
	if rate, fresh := r.get(at); fresh {
		return rate, judgeRate
	}
	if r.at.Load() == 0 {
		return 0, includeAll
	}
	now := at.UnixNano()
	if p := r.probe.Load(); now-p > int64(SSDProbeEvery) && r.probe.CompareAndSwap(p, now) {
		return 0, probeOne
	}
	return math.Float64frombits(r.bits.Load()), judgeRate
}

// CutSlowSSD returns how many leading pages of a hit chain the session
// should restore (cut) and how many of those are the chain's DRAM prefix:
// all of them, unless the engine's prefill rate (recompute, tokens/s:
// measured by the engine and sent with the lookup, or declared by the
// session) is known and the fresh SSD read rate makes an SSD-only page
// slower to restore than to recompute; then up to the first SSD-only page
// (one past it for a probe). dram is meaningful only when cut < len(chain).
func (s *Store) CutSlowSSD(sess *Engine, recompute float64, chain []pagekey.Key) (cut, dram int) {
	if recompute <= 0 || len(chain) == 0 || s.ssd == nil {
		return len(chain), len(chain) // no rate to judge by, or no SSD tier: no catalog walk
	}
	dram = s.dramPrefix(chain) // the first page held only on SSD
	cut = s.cutSlowSSDAt(sess, recompute, len(chain), dram)
	return cut, min(cut, dram)
}

// dramPrefix is the number of leading pages of chain held in DRAM.
func (s *Store) dramPrefix(chain []pagekey.Key) int {
	for i, k := range chain {
		if e, ok := s.cat.Get(k); !ok || e.DRAMSlot < 0 {
			return i
		}
	}
	return len(chain)
}

// cutSlowSSDAt decides the cut of a hit of n pages whose first `first` are in DRAM.
func (s *Store) cutSlowSSDAt(sess *Engine, recompute float64, n, first int) int {
	if first == n {
		return n // all in DRAM: nothing to judge (and no probe spent)
	}
	rate, v := s.ssdReads.forLookup(s.now())
	switch {
	case v == includeAll:
		return n
	case v == probeOne:
		return first + 1
	case float64(sess.PageBytes)/rate <= float64(sess.Layout.PageTokens)/recompute:
		return n
	}
	return first
}
