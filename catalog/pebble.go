package catalog

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/cockroachdb/pebble/v2"
)

// Pebble's own fault handling ends the process: its default DataCorruption
// handler and every "fatal" path (a failed WAL write at commit, a failed
// MANIFEST write) call Logger.Fatalf, which exits. A catalog is rebuildable
// (DESIGN.md §7), so none of that may decide the peer's life. This file
// turns Pebble's fatal calls into errors the catalog handles:
//
//   - Every call the catalog makes into Pebble runs inside guarded. A
//     Fatalf on that goroutine panics with a *fatalError, which guarded
//     recovers and returns. The store is then failed: no further call goes
//     to that *pebble.DB except Close; Repair reopens.
//   - A Fatalf on one of Pebble's own goroutines (a flush or compaction
//     failing to write the MANIFEST) cannot be returned to anyone. It marks
//     the store failed and ends that goroutine with runtime.Goexit, which
//     leaves the process running. Such a DB is abandoned, not reused.
//   - DataCorruption events and background errors are counted, never
//     logged here (low layers do not log, STYLE.md) and never fatal.

// fatalError is a Pebble Fatalf turned into an error. Its causes are the
// error arguments Pebble passed, so errors.Is(err, syscall.ENOSPC) works.
type fatalError struct {
	msg    string
	causes []error
}

func (e *fatalError) Error() string   { return e.msg }
func (e *fatalError) Unwrap() []error { return e.causes }

func newFatalError(format string, args []any) *fatalError {
	f := &fatalError{msg: fmt.Sprintf(format, args...)}
	for _, a := range args {
		if err, ok := a.(error); ok {
			f.causes = append(f.causes, err)
		}
	}
	return f
}

// pebbleEvents is what one store's Pebble reported on its own goroutines.
type pebbleEvents struct {
	corruptions atomic.Uint64 // DataCorruption events
	background  atomic.Uint64 // BackgroundError events
	fatalc      chan struct{} // closed by the first Fatalf off a guarded goroutine
	mu          struct {
		sync.Mutex
		fatal      error // a Fatalf outside guarded: the DB is unusable
		corruption error // the first DataCorruption seen
		lastBg     error // the last background error
	}
}

func newPebbleEvents() *pebbleEvents { return &pebbleEvents{fatalc: make(chan struct{})} }

func (ev *pebbleEvents) setFatal(err error) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.mu.fatal == nil {
		ev.mu.fatal = err
		close(ev.fatalc)
	}
}

func (ev *pebbleEvents) fatal() error {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return ev.mu.fatal
}

func (ev *pebbleEvents) corruption() error {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return ev.mu.corruption
}

func (ev *pebbleEvents) lastBackground() error {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return ev.mu.lastBg
}

// listener returns Pebble event handlers that count and remember instead of
// exiting.
func (ev *pebbleEvents) listener() *pebble.EventListener {
	return &pebble.EventListener{
		DataCorruption: func(info pebble.DataCorruptionInfo) {
			ev.corruptions.Add(1)
			ev.mu.Lock()
			if ev.mu.corruption == nil {
				ev.mu.corruption = fmt.Errorf("%w: %s", pebble.ErrCorruption, info)
			}
			ev.mu.Unlock()
		},
		BackgroundError: func(err error) {
			ev.background.Add(1)
			ev.mu.Lock()
			ev.mu.lastBg = err
			ev.mu.Unlock()
		},
	}
}

// pebbleLogger drops Pebble's chatter and turns Fatalf into a panic the
// guard recovers (on a guarded goroutine) or into a failed store.
type pebbleLogger struct{ ev *pebbleEvents }

func (pebbleLogger) Infof(string, ...any)  {}
func (pebbleLogger) Errorf(string, ...any) {}

func (l pebbleLogger) Fatalf(format string, args ...any) {
	err := newFatalError(format, args)
	if onGuardedGoroutine() {
		panic(err)
	}
	l.ev.setFatal(err)
	runtime.Goexit()
}

// guarded runs fn, a call into Pebble, and returns a Pebble Fatalf raised
// on this goroutine as an error instead of letting it end the process.
func guarded(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(*fatalError)
			if !ok {
				panic(r)
			}
			err = f
		}
	}()
	return guardedCall(fn)
}

// guardedCall is the frame onGuardedGoroutine looks for.
//
//go:noinline
func guardedCall(fn func() error) error { return fn() }

// onGuardedGoroutine reports whether guardedCall is on the current stack.
// It walks the whole stack; Fatalf is rare, so the cost does not matter.
func onGuardedGoroutine() bool {
	pcs := make([]uintptr, 1024)
	n := runtime.Callers(2, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, "/catalog.guardedCall") {
			return true
		}
		if !more {
			return false
		}
	}
}

// isResourceError reports an error that says the filesystem cannot take
// writes now (full, quota, read-only, permissions, descriptors), as opposed
// to damage: the catalog waits for it to pass instead of discarding files.
func isResourceError(err error) bool {
	for _, e := range []error{ErrNoSpace, syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS, syscall.EACCES,
		syscall.EPERM, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// isNoSpace reports an error that means the filesystem is full.
func isNoSpace(err error) bool {
	return errors.Is(err, ErrNoSpace) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
