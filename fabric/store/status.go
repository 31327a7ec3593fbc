package store

import (
	"math"
	"time"

	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/transfer"
)

// What the rest of the peer reads of the store: its backlog (Drain, Status),
// health, the DRAM pool's region (the GPU registers it) and phase times.

// Backlog is work the store still holds: bytes leases pin against the query
// budget, DRAM pages awaiting their checksum, and pages in the SSD tier.
type Backlog struct {
	LeasedBytes   uint64
	UnsealedPages int
	SSDPages      int
}

// Backlog returns the store's backlog now.
func (s *Store) Backlog() Backlog {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Backlog{LeasedBytes: s.mu.leased, UnsealedPages: len(s.mu.unsealed), SSDPages: s.mu.ssd.Len()}
}

// Problem says why the SSD tier makes the peer unhealthy at now, "" when it
// does not (faults.go).
func (s *Store) Problem(now time.Time) string { return s.faults.problem(now) }

// DRAMRegion is the DRAM pool as a transfer region.
func (s *Store) DRAMRegion() *transfer.Region { return s.dramR }

// PoolStats returns the DRAM pool's counters.
func (s *Store) PoolStats() dram.Stats { return s.pool.Stats() }

// NoteEngineFault counts an engine buffer fault the engine API found
// before an operation (fabric_engine_buffer_faults_total; copies that
// fault count themselves, load.go).
func (s *Store) NoteEngineFault() { s.m.engineFaults.Inc() }

// SSDReadRate is the SSD tier's measured read rate, bytes per second, and
// whether it is fresh (ssdrate.go).
func (s *Store) SSDReadRate() (float64, bool) { return s.ssdReads.get(s.now()) }

// SetSSDReadRate sets the SSD tier's measured read rate as if measured
// now: tests and benchmarks of the restore-or-recompute decision use it
// where no disk of that speed is at hand.
func (s *Store) SetSSDReadRate(bytesPerS float64) {
	s.ssdReads.bits.Store(math.Float64bits(bytesPerS))
	s.ssdReads.at.Store(s.now().UnixNano())
}
