package store

import (
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/tiers/ssd"
	"github.com/orbitkv/orbitkv/transfer"
)

// ErrNoSpace reports that no tier could make room: every page is pinned.
var ErrNoSpace = errors.New("no room: every page is pinned")

// Store moves pages between engine buffers and the local tiers and keeps
// the catalog, the DRAM pool, the SSD tier and their LRUs consistent. Every
// metadata change happens under mu; bytes move outside it, protected by pins.
type Store struct {
	cat   *catalog.Catalog
	pool  *dram.Pool
	ssd   *ssd.Store // nil when the SSD tier is disabled
	opts  Options
	local transfer.Local
	dramR *transfer.Region
	m     *metrics
	// sealWake nudges the sealer (seal.go) when pages await their checksum.
	sealWake chan struct{}
	// flushWake nudges the flusher (flush.go) when free DRAM runs low.
	flushWake chan struct{}
	// copying counts page copies in flight; the sealer waits for a gap.
	copying atomic.Int64
	// demoting counts demotions in flight, from their victims' pins to the
	// end of the write (evict.go): an allocation whose candidates they hold
	// waits for them instead of failing.
	demoting atomic.Int64
	// fillWaits is the time DRAM-acknowledged saves spent waiting for the
	// disk to take older pages, in one-second windows (flush.go, behind).
	fillWaits waitWindow
	// corrupt is the test-only hook that corrupts restores (testcorrupt.go).
	corrupt testCorrupt
	// phases times CUDA sessions' whole-request loads and saves (phases.go).
	phases phaseTable
	// freq is how often each page was asked for lately (tiers.Frequency):
	// what a readmission is judged by (readmit.go).
	freq *tiers.Frequency
	// freqPage is the smallest page size a lookup has named so far: the
	// sketch ages its counts by how many such pages the pool holds.
	freqPage atomic.Uint64
	// asks carries lookups' keys to the sketch off their path while
	// RunAsks runs (readmit.go); askers counts the RunAsks running.
	asks   chan []pagekey.Key
	askers atomic.Int32
	// ssdReads is the SSD tier's measured read rate (ssdrate.go).
	ssdReads ssdRate
	// members is nil when the peer runs standalone (remote.go).
	members Members
	// stages are the GPUs' HBM stages (hbmstage.go), sources for CUDA loads.
	stagesMu sync.Mutex
	stages   []*HBMStage
	// faults are the SSD tier's recent faults, for Status (faults.go).
	faults tierFaults
	log    zerolog.Logger
	mu     struct {
		sync.Mutex
		dram, ssd *tiers.LRU
		gen       uint64
		unsealed  map[pagekey.Key]struct{}    // DRAM pages whose checksum is pending
		sealPart  *partialSeal                // a page the sealer paused in (seal.go)
		retired   map[pagekey.Key][]dram.Slot // replaced DRAM copies still pinned (retire.go)
		leased    uint64                      // query budget in use by leases' pins (pins.go)
		// genLimit is the generation limit recorded on disk (genlimit.go);
		// genLimitFailed, that the last write of a higher one failed.
		genLimit       uint64
		genLimitFailed bool
		genLimitRetry  uint64 // after a failed write, the generation from which it is tried again
	}
}

// Options configure a Store beyond the tiers it is given.
type Options struct {
	// QueryBudget is the bytes all leases may pin at once (pins.go).
	QueryBudget uint64
	// SSDDir is the SSD tier's directory, scanned at start (recover.go),
	// where the generation limit is recorded (genlimit.go).
	SSDDir string
	// SSDDiscard lets a start drop the SSD pages the configured tier no
	// longer covers (discard.go); SSDBytes and SSDFileBytes are the
	// configured sizes, named in the refusal.
	SSDDiscard             bool
	SSDBytes, SSDFileBytes bytesize.Size
	// NoReadmit turns readmission off (readmit.go): a cache-fill save of a
	// page held only on SSD is answered "already stored".
	NoReadmit bool
	// ReadmitAll readmits every page readmittable, without judging it
	// against the DRAM page it would push out (readmit.go, admitsReadmit).
	ReadmitAll bool
	// Members fetches pages other members hold; nil runs standalone.
	Members Members
	// Registry takes the store's metrics.
	Registry *prometheus.Registry
	Log      zerolog.Logger
	// Now is the clock of the store's decisions (the SSD rate's age, tier
	// fault windows); nil is time.Now.
	Now func() time.Time
}

// askQueue is how many lookups' keys may wait for RunAsks (readmit.go).
const askQueue = 256

// New returns the store over an open catalog and tiers (st nil: no SSD tier).
func New(cat *catalog.Catalog, pool *dram.Pool, st *ssd.Store, opts Options) *Store {
	s := &Store{cat: cat, pool: pool, ssd: st, opts: opts, members: opts.Members, log: opts.Log,
		dramR: transfer.HostRegion("dram", pool.Region())}
	if s.opts.Now == nil {
		s.opts.Now = time.Now
	}
	if s.corrupt.every = testCorruptFromEnv(); s.corrupt.every > 0 {
		s.log.Warn().Int64("every", s.corrupt.every).Str("env", testCorruptEnv).
			Msg("TEST HOOK: one bit of the first page of every Nth load is flipped before it reaches the engine; never serve users with it")
	}
	s.mu.dram, s.mu.ssd = tiers.NewSegmentedLRU(tiers.DRAMProtectedShare), tiers.NewLRU()
	s.freq = tiers.NewFrequency(int(pool.Stats().CapacityBytes / tiers.FreqPageBytes))
	s.asks = make(chan []pagekey.Key, askQueue)
	s.mu.unsealed = make(map[pagekey.Key]struct{})
	s.mu.retired = make(map[pagekey.Key][]dram.Slot)
	s.sealWake = make(chan struct{}, 1)
	s.flushWake = make(chan struct{}, 1)
	s.m = newMetrics(opts.Registry, func() float64 {
		if st == nil {
			return 0
		}
		return float64(st.Stats().InFlight)
	})
	opts.Registry.MustRegister(s.phases.collectors()...)
	opts.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "orbitkv", Subsystem: "tiers",
		Name: "ssd_read_bytes_per_second", Help: "The SSD tier's measured read rate (moving average of read batches; 0 before the first)."},
		func() float64 { return math.Float64frombits(s.ssdReads.bits.Load()) }))
	return s
}

func ssdLoc(l catalog.SSDLoc) ssd.Loc { return ssd.Loc{File: l.File, Offset: l.Offset, Bytes: l.Bytes} }
func catLoc(l ssd.Loc) catalog.SSDLoc {
	return catalog.SSDLoc{File: l.File, Offset: l.Offset, Bytes: l.Bytes}
}

func header(e catalog.Entry) page.Header {
	return page.Header{Key: e.Key, Layout: e.Layout, Length: e.Size, Checksum: e.Checksum, Generation: e.Generation}
}

// UpdateGauges refreshes the tier gauges.
func (s *Store) UpdateGauges() {
	ps := s.pool.Stats()
	s.m.tierBytes.WithLabelValues("dram").Set(float64(ps.UsedBytes))
	s.m.tierPages.WithLabelValues("dram").Set(float64(ps.Slots))
	s.m.tierCapacity.WithLabelValues("dram").Set(float64(ps.CapacityBytes))
	if s.ssd != nil {
		st := s.ssd.Stats()
		s.m.tierBytes.WithLabelValues("ssd").Set(float64(st.UsedBytes))
		s.m.tierCapacity.WithLabelValues("ssd").Set(float64(st.CapacityBytes))
		s.mu.Lock()
		s.m.tierPages.WithLabelValues("ssd").Set(float64(s.mu.ssd.Len()))
		s.mu.Unlock()
	}
	s.m.catalogEntries.Set(float64(s.cat.Len()))
}

// partialSeal is a page the sealer (seal.go) paused in: its entry as taken, its
// bytes, how many of them are summed and their CRC so far. The sum is
// recorded only if the entry still names the same slot and generation,
// as for a page summed in one go.
type partialSeal struct {
	e    catalog.Entry
	buf  []byte
	done int
	crc  uint32
}

// now is the time of a decision (Options.Now).
func (s *Store) now() time.Time { return s.opts.Now() }

// copyWorkers is how many pages of one operation are copied at once: one
// per CPU (a single core's memcpy does not saturate memory bandwidth).
var copyWorkers = min(runtime.GOMAXPROCS(0), 8)

// parallel runs fn(0..n-1) on up to copyWorkers goroutines and waits.
func parallel(n int, fn func(i int)) {
	w := min(copyWorkers, n)
	if w <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < w; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		}()
	}
	wg.Wait()
}
