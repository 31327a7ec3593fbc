package store

import (
	"sync"
	"time"
)

// waitWindow sums waits in one-second windows: the current one and the one
// before it.
type waitWindow struct {
	mu        sync.Mutex
	start     time.Time
	cur, prev time.Duration
}

func (w *waitWindow) roll(now time.Time) {
	switch d := now.Sub(w.start); {
	case d < time.Second:
	case d < 2*time.Second:
		w.start, w.prev, w.cur = w.start.Add(time.Second), w.cur, 0
	default:
		w.start, w.prev, w.cur = now, 0, 0
	}
}

// add records a wait of d that ended at now.
func (w *waitWindow) add(now time.Time, d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	w.cur += d
}

// over reports whether the waits of the current or the last window exceed limit.
func (w *waitWindow) over(now time.Time, limit time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	return w.cur > limit || w.prev > limit
}
