package catalog

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// Options configures a Catalog.
type Options struct {
	// Dir is the Pebble directory. "" keeps the catalog in memory only:
	// nothing is persisted and nothing is recovered.
	Dir string
	// NoSync commits without waiting for the WAL to reach the disk. For
	// benchmarks only: an acknowledged SSD page may be lost by a crash.
	NoSync bool
	// OnChange, if set, is called after each committed change, in commit
	// order, with the entry as stored (Added, Updated) or as it was before
	// removal (Deleted). It is the hook for the gossip change feed. It runs
	// synchronously with the catalog's writer lock held: it must be quick
	// (enqueue and return) and must not call Put, Update, Delete or Close.
	// Reads (Get, Lookup, Range) are allowed.
	OnChange func(e Entry, ch Change)
}

// Change says what a commit did to an entry.
type Change uint8

// Changes reported to Options.OnChange.
const (
	Added   Change = iota + 1 // the key was absent
	Updated                   // the key was present and stays
	Deleted                   // the key left the catalog
)

// Errors returned by the catalog.
var (
	ErrClosed       = errors.New("catalog closed")
	ErrInvalidEntry = errors.New("invalid catalog entry")
)

// Catalog is the index of the pages this peer holds. It is safe for
// concurrent use.
type Catalog struct {
	shards  [numShards]shard
	hash    hasher
	layouts layoutTable
	count   atomic.Int64

	onChange func(Entry, Change)
	store    *store // nil when in memory only

	// writer serializes Put, Update, Delete and Close: the Pebble commit
	// and the in-memory change of one call happen before the next call's.
	writer struct {
		sync.Mutex
		closed bool
	}

	recovered int
	corrupt   int
	commits   atomic.Uint64
}

// Stats is a snapshot of the catalog's counters.
type Stats struct {
	Entries        int    // entries in the index
	Layouts        int    // distinct layout fingerprints seen
	Recovered      int    // entries recovered at Open
	CorruptRecords int    // persisted records skipped as corrupt at Open
	Commits        uint64 // Pebble batches committed since Open
}

// Open opens a catalog. With opts.Dir set it opens (or creates) the Pebble
// store there and recovers every persisted entry, with DRAMSlot = -1: after
// a restart the catalog holds exactly the SSD-resident pages. Records that
// fail to decode are skipped and counted in Stats().CorruptRecords.
func Open(opts Options) (*Catalog, error) {
	c := &Catalog{onChange: opts.OnChange, hash: newHasher()}
	if opts.Dir == "" {
		return c, nil
	}
	s, err := openStore(opts.Dir, opts.NoSync)
	if err != nil {
		return nil, err
	}
	corrupt, err := s.recover(func(e Entry) {
		h := c.hash.hash(e.Key)
		if c.shards[shardOf(h)].setLocked(c.hash, h, e.Key, toRecord(e, &c.layouts)) {
			c.count.Add(1)
			c.recovered++
		}
	})
	if err != nil {
		return nil, errors.Join(err, s.close())
	}
	c.store, c.corrupt = s, corrupt
	return c, nil
}

// Get returns k's entry.
func (c *Catalog) Get(k pagekey.Key) (Entry, bool) {
	h := c.hash.hash(k)
	s := &c.shards[shardOf(h)]
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.getLocked(h, k)
	if !ok {
		return Entry{}, false
	}
	return r.entry(k, &c.layouts), true
}

// Len returns the number of entries.
func (c *Catalog) Len() int { return int(c.count.Load()) }

// Range calls fn for every entry, in no particular order, until fn returns
// false. Each shard is copied under its read lock and fn runs without any
// lock held, so fn may call any method; the iteration is a snapshot per
// shard, not of the whole catalog at one instant.
func (c *Catalog) Range(fn func(Entry) bool) {
	var buf []Entry
	for i := range c.shards {
		buf = c.shards[i].snapshot(buf[:0], &c.layouts)
		for _, e := range buf {
			if !fn(e) {
				return
			}
		}
	}
}

func (s *shard) snapshot(dst []Entry, layouts *layoutTable) []Entry {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i := range s.mu.slots {
		if c := &s.mu.slots[i]; c.rec.used {
			dst = append(dst, c.rec.entry(c.key, layouts))
		}
	}
	return dst
}

// Stats returns a snapshot of the catalog's counters.
func (c *Catalog) Stats() Stats {
	return Stats{
		Entries:        c.Len(),
		Layouts:        c.layouts.len(),
		Recovered:      c.recovered,
		CorruptRecords: c.corrupt,
		Commits:        c.commits.Load(),
	}
}

// Close closes the Pebble store. Later writes fail with ErrClosed; reads
// keep answering from memory. Close is idempotent.
func (c *Catalog) Close() error {
	c.writer.Lock()
	defer c.writer.Unlock()
	if c.writer.closed {
		return nil
	}
	c.writer.closed = true
	if c.store != nil {
		return c.store.close()
	}
	return nil
}
