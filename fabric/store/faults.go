package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// faultWindow is how long a tier fault keeps the peer unhealthy: Status
// reports a problem from a fault until faultWindow has passed with no new
// one (docs/operations.md, "Page integrity").
const faultWindow = time.Minute

// tierFaults remembers the SSD tier's recent faults for Status: I/O errors
// of reads and writes, and pages that failed verification on read. It is a
// pure record, its clock an argument; it is safe for concurrent use.
type tierFaults struct {
	mu struct {
		sync.Mutex
		since, last time.Time // first and latest fault of the current spell
		n           int       // faults in the current spell
		what        string    // the latest fault
	}
}

// note records a fault at time at and reports whether it starts a spell:
// the first fault, or one faultWindow or more after the previous one.
func (f *tierFaults) note(what string, at time.Time) (first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if first = f.mu.n == 0 || at.Sub(f.mu.last) >= faultWindow; first {
		f.mu.since, f.mu.n = at, 0
	}
	f.mu.n++
	f.mu.last, f.mu.what = at, what
	return first
}

// problem says why the peer is unhealthy at now, or "" when it is not: no
// fault within the last faultWindow.
func (f *tierFaults) problem(now time.Time) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mu.n == 0 || now.Sub(f.mu.last) >= faultWindow {
		return ""
	}
	return fmt.Sprintf("ssd tier: %d faults since %s, the last %s ago: %s", f.mu.n,
		f.mu.since.UTC().Format(time.RFC3339), now.Sub(f.mu.last).Round(time.Millisecond), f.mu.what)
}

// tierFault reports whether err, from an SSD tier call, is a fault of the
// tier (the device, the files, the bytes on them) rather than the end of
// the caller's context or a closed tier.
func tierFault(err error) bool {
	return err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, ssd.ErrClosed)
}

// noteSSDError counts a failed SSD operation (op "read" or "write") that is
// a tier fault, other than a page failing verification, and records it for
// Status; the first fault of a spell is logged (one line, not one per
// page). It reports whether err was a tier fault.
func (s *Store) noteSSDError(op string, err error) bool {
	if !tierFault(err) {
		return false
	}
	if !isCorrupt(err) {
		s.m.ssdErrors.WithLabelValues(op).Inc()
	}
	if s.faults.note(fmt.Sprintf("%s: %v", op, err), s.now()) {
		s.log.Warn().Err(err).Str("op", op).Dur("unhealthy_for", faultWindow).
			Msg("ssd tier fault: failed pages are dropped and counted; status is unhealthy until no fault for the window")
	}
	return true
}

func isCorrupt(err error) bool {
	var ce *page.CorruptError
	return errors.As(err, &ce)
}
