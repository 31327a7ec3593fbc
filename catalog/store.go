package catalog

import (
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// store is the Pebble database behind a persistent catalog. Nothing of
// Pebble's leaves this file's callers inside the package. Every call into
// Pebble goes through guarded (pebble.go).
type store struct {
	dir string
	fs  vfs.FS
	db  *pebble.DB
	wo  *pebble.WriteOptions
	ev  *pebbleEvents
}

func openStore(fs vfs.FS, dir string, noSync bool) (*store, error) {
	s := &store{dir: dir, fs: fs, wo: pebble.Sync, ev: &pebbleEvents{}}
	if noSync {
		s.wo = pebble.NoSync
	}
	opts := &pebble.Options{FS: fs, Logger: pebbleLogger{s.ev}, EventListener: s.ev.listener()}
	err := guarded(func() (err error) {
		s.db, err = pebble.Open(dir, opts)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open catalog store %s: %w", dir, err)
	}
	return s, nil
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

// freeBytes returns the bytes available on the store's filesystem.
func (s *store) freeBytes() (uint64, error) {
	u, err := s.fs.GetDiskUsage(s.dir)
	if err != nil {
		return 0, fmt.Errorf("disk usage of %s: %w", s.dir, err)
	}
	return u.AvailBytes, nil
}

// batch collects one commit's record writes.
type batch struct {
	b    *pebble.Batch
	buf  []byte
	sets int
}

func (s *store) newBatch() *batch { return &batch{b: s.db.NewBatch()} }

func (b *batch) set(e Entry) error {
	b.sets++
	b.buf = appendRecordKey(b.buf[:0], e.Key)
	b.buf = appendRecord(b.buf, e)
	return b.b.Set(b.buf[:recordKeyLen], b.buf[recordKeyLen:], nil)
}

func (b *batch) delete(k pagekey.Key) error {
	b.buf = appendRecordKey(b.buf[:0], k)
	return b.b.Delete(b.buf, nil)
}

func (b *batch) empty() bool { return b.b.Empty() }

// commit commits the batch. A failure leaves the store unusable: Pebble's
// commit pipeline does not survive a failed WAL write.
func (s *store) commit(b *batch) error {
	if err := s.failure(); err != nil {
		return err
	}
	return guarded(func() error { return b.b.Commit(s.wo) })
}

func (b *batch) close() { _ = guarded(func() error { return b.b.Close() }) }

// closeTimeout bounds Close of a failed store: Pebble may never finish
// closing a DB whose background goroutine died in Fatalf.
const closeTimeout = 5 * time.Second

func (s *store) close() error {
	done := make(chan error, 1)
	go func() { done <- guarded(s.db.Close) }()
	select {
	case err := <-done:
		return err
	case <-time.After(closeTimeout):
		return fmt.Errorf("close catalog store %s: not done after %v; abandoned", s.dir, closeTimeout)
	}
}
