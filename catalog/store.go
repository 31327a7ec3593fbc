package catalog

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// store is the Pebble database behind a persistent catalog. Nothing of
// Pebble's leaves this file's callers inside the package.
type store struct {
	db *pebble.DB
	wo *pebble.WriteOptions
}

func openStore(dir string, noSync bool) (*store, error) {
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}})
	if err != nil {
		return nil, fmt.Errorf("open catalog store %s: %w", dir, err)
	}
	wo := pebble.Sync
	if noSync {
		wo = pebble.NoSync
	}
	return &store{db: db, wo: wo}, nil
}

// recover calls fn with every decodable record and returns the number of
// records skipped as corrupt.
func (s *store) recover(fn func(Entry)) (corrupt int, err error) {
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

// batch collects one commit's record writes.
type batch struct {
	b   *pebble.Batch
	buf []byte
}

func (s *store) newBatch() *batch { return &batch{b: s.db.NewBatch()} }

func (b *batch) set(e Entry) error {
	b.buf = appendRecordKey(b.buf[:0], e.Key)
	b.buf = appendRecord(b.buf, e)
	return b.b.Set(b.buf[:recordKeyLen], b.buf[recordKeyLen:], nil)
}

func (b *batch) delete(k pagekey.Key) error {
	b.buf = appendRecordKey(b.buf[:0], k)
	return b.b.Delete(b.buf, nil)
}

// commit commits the batch if it holds anything and reports whether it did.
func (s *store) commit(b *batch) (bool, error) {
	if b.b.Empty() {
		return false, nil
	}
	if err := b.b.Commit(s.wo); err != nil {
		return false, err
	}
	return true, nil
}

func (b *batch) close() { _ = b.b.Close() }

func (s *store) close() error { return s.db.Close() }

// quietLogger drops Pebble's informational chatter; low layers do not log
// (STYLE.md). Errors still reach the standard logger, and Fatalf still ends
// the process as Pebble expects.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)              {}
func (quietLogger) Errorf(format string, args ...any) { pebble.DefaultLogger.Errorf(format, args...) }
func (quietLogger) Fatalf(format string, args ...any) { pebble.DefaultLogger.Fatalf(format, args...) }
