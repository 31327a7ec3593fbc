package catalog

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// store is the Pebble database behind a persistent catalog. Nothing of
// Pebble's leaves this file's callers inside the package. Every call into
// Pebble goes through guarded (pebble.go).
type store struct {
	dir  string
	fs   vfs.FS
	db   *pebble.DB
	lock *pebble.Lock // taken before Open, released after Close
	wo   *pebble.WriteOptions
	ev   *pebbleEvents
}

func openStore(fs vfs.FS, dir string, noSync bool) (*store, error) {
	if err := abandonedDir(dir); err != nil {
		return nil, err
	}
	s := &store{dir: dir, fs: fs, wo: pebble.Sync, ev: newPebbleEvents()}
	if noSync {
		s.wo = pebble.NoSync
	}
	var err error
	if err = fs.MkdirAll(dir, 0o700); err == nil {
		s.lock, err = pebble.LockDirectory(dir, fs)
	}
	if err != nil {
		return nil, fmt.Errorf("lock catalog store %s: %w", dir, err)
	}
	opts := &pebble.Options{FS: fs, Logger: pebbleLogger{s.ev}, EventListener: s.ev.listener(), Lock: s.lock}
	type opened struct {
		db  *pebble.DB
		err error
	}
	done := make(chan opened, 1)
	go func() {
		var o opened
		o.err = guarded(func() (err error) {
			o.db, err = pebble.Open(dir, opts)
			return err
		})
		done <- o
	}()
	// Open waits for the flush of the replayed WAL; a flush that dies in
	// Fatalf (a MANIFEST write on a full disk) never ends that wait, so a
	// fatal event ends it here. The goroutine left in Open is abandoned
	// with the DB it was opening (Repair builds a fresh directory).
	select {
	case o := <-done:
		if o.err != nil {
			_ = s.lock.Close()
			return nil, fmt.Errorf("open catalog store %s: %w", dir, o.err)
		}
		s.db = o.db
		return s, nil
	case <-s.ev.fatalc:
		// The abandoned Open waits on a flush that will never end, so it
		// never closes its hold on the lock: drop both holds, ours and
		// Open's, so that Repair can lock the directory again.
		_, _ = s.lock.Close(), s.lock.Close()
		return nil, fmt.Errorf("open catalog store %s: %w", dir, s.ev.fatal())
	}
}

// failure returns why the store must not be used any more: a Fatalf on one
// of Pebble's goroutines or on-disk corruption Pebble reported.
func (s *store) failure() error {
	if err := s.ev.fatal(); err != nil {
		return err
	}
	return s.ev.corruption()
}

// recover calls fn with every decodable record and returns the number of
// records skipped as corrupt. An error means the store cannot be read to
// the end (Pebble corruption, I/O).
func (s *store) recover(fn func(Entry)) (corrupt int, err error) {
	err = guarded(func() error {
		corrupt, err = s.iterate(fn)
		return err
	})
	if err == nil {
		err = s.failure()
	}
	return corrupt, err
}

func (s *store) iterate(fn func(Entry)) (corrupt int, err error) {
	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: []byte(recordPrefix),
		UpperBound: recordUpper,
	})
	if err != nil {
		return 0, fmt.Errorf("recover catalog: new iterator: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k, err := parseRecordKey(it.Key())
		if err != nil {
			corrupt++
			continue
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return corrupt, errors.Join(fmt.Errorf("recover catalog: read %s: %w", k, err), it.Close())
		}
		e, err := decodeRecord(k, v)
		if err != nil {
			corrupt++
			continue
		}
		fn(e)
	}
	if err := it.Close(); err != nil {
		return corrupt, fmt.Errorf("recover catalog: iterate: %w", err)
	}
	return corrupt, nil
}

// checkSpace fails with ErrNoSpace when dir's filesystem has less free
// space than the reserve: reserve bytes, or an eighth of the filesystem if
// that is less (a small filesystem is not forever "full"). A filesystem
// that cannot say is not taken as full; the writes will tell.
func checkSpace(fs vfs.FS, dir string, reserve uint64) error {
	u, err := fs.GetDiskUsage(dir)
	if err != nil {
		return nil
	}
	if u.TotalBytes > 0 {
		reserve = min(reserve, u.TotalBytes/8)
	}
	if u.AvailBytes < reserve {
		return fmt.Errorf("%w: %d bytes free on %s, %d reserved", ErrNoSpace, u.AvailBytes, dir, reserve)
	}
	return nil
}

// batch collects one commit's record writes.
type batch struct {
	b    *pebble.Batch
	buf  []byte
	sets int
	dels int
}

func (s *store) newBatch() *batch { return &batch{b: s.db.NewBatch()} }

func (b *batch) set(e Entry) error {
	b.sets++
	b.buf = appendRecordKey(b.buf[:0], e.Key)
	b.buf = appendRecord(b.buf, e)
	return b.b.Set(b.buf[:recordKeyLen], b.buf[recordKeyLen:], nil)
}

func (b *batch) delete(k pagekey.Key) error {
	b.dels++
	b.buf = appendRecordKey(b.buf[:0], k)
	return b.b.Delete(b.buf, nil)
}

func (b *batch) empty() bool { return b.b.Empty() }

// commit commits the batch, with sync waiting for the WAL to reach the disk
// (unless the store was opened with NoSync). A failure leaves the store
// unusable: Pebble's commit pipeline does not survive a failed WAL write.
func (s *store) commit(b *batch, sync bool) error {
	if err := s.failure(); err != nil {
		return err
	}
	wo := s.wo
	if !sync {
		wo = pebble.NoSync
	}
	return guarded(func() error { return b.b.Commit(wo) })
}

func (b *batch) close() { _ = guarded(func() error { return b.b.Close() }) }

// closeTimeout bounds Close of a failed store: Pebble may never finish
// closing a DB whose background goroutine died in Fatalf. A variable for
// tests.
var closeTimeout = 5 * time.Second

// ErrAbandoned wraps the refusal to open or clear a catalog directory whose
// former store this process abandoned: its Close did not finish within
// closeTimeout, so that DB may still own (and write) the directory's files.
// The directory is reused only once that Close has ended (issue 34, item
// 6b); until then the catalog stays in memory only, unavailable.
var ErrAbandoned = errors.New("a catalog store abandoned in this directory has not finished closing")

// abandoned are the directories of stores whose Close timed out and is
// still running, each with a channel closed when it ends.
var abandoned struct {
	sync.Mutex
	dirs map[string]chan struct{}
}

// abandonedDir fails with ErrAbandoned while a store abandoned in dir has
// not finished closing.
func abandonedDir(dir string) error {
	abandoned.Lock()
	defer abandoned.Unlock()
	if _, ok := abandoned.dirs[filepath.Clean(dir)]; ok {
		return fmt.Errorf("%w: %s (the directory is reused once that Close ends, or after a restart)", ErrAbandoned, dir)
	}
	return nil
}

// abandon records dir as held by a store whose Close runs on; the returned
// func, called when that Close ends, releases it.
func abandon(dir string) func() {
	dir = filepath.Clean(dir)
	abandoned.Lock()
	defer abandoned.Unlock()
	if abandoned.dirs == nil {
		abandoned.dirs = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	abandoned.dirs[dir] = ch
	return func() {
		abandoned.Lock()
		defer abandoned.Unlock()
		if abandoned.dirs[dir] == ch {
			delete(abandoned.dirs, dir)
		}
		close(ch)
	}
}

// abandonedDone returns a channel closed once no store abandoned in dir
// is still closing.
func abandonedDone(dir string) <-chan struct{} {
	abandoned.Lock()
	defer abandoned.Unlock()
	if ch, ok := abandoned.dirs[filepath.Clean(dir)]; ok {
		return ch
	}
	ch := make(chan struct{})
	close(ch)
	return ch
}

// closeInBackground closes s on its own goroutine, its directory counted
// as abandoned (not reused) until the Close ends: a failed store is let go
// without its writer waiting up to closeTimeout for Pebble.
func (s *store) closeInBackground() {
	release := abandon(s.dir)
	go func() {
		_ = errors.Join(guarded(s.db.Close), s.lock.Close()) // the failure was reported already
		release()
	}()
}

func (s *store) close() error {
	done := make(chan error, 1)
	go func() { done <- errors.Join(guarded(s.db.Close), s.lock.Close()) }()
	select {
	case err := <-done:
		return err
	case <-time.After(closeTimeout):
		release := abandon(s.dir)
		go func() { <-done; release() }()
		return fmt.Errorf("close catalog store %s: not done after %v; abandoned: %w", s.dir, closeTimeout, ErrAbandoned)
	}
}
