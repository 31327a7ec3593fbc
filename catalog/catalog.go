package catalog

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

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
	// ReserveBytes is the free space, in bytes, a commit that persists
	// records must leave on the catalog's filesystem (0: DefaultReserveBytes).
	// Below it such commits fail with ErrNoSpace before Pebble writes
	// anything, so Pebble's own flushes and deletions still find room.
	ReserveBytes uint64

	// fs is the filesystem Pebble uses; nil is the OS's. Tests wrap it to
	// inject faults (vfs/errorfs) or to report a full disk.
	fs vfs.FS
}

// DefaultReserveBytes is the default Options.ReserveBytes: 64 MiB.
const DefaultReserveBytes = 64 << 20

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
	// ErrNoSpace wraps every failure to persist because the catalog's
	// filesystem is full (or below Options.ReserveBytes).
	ErrNoSpace = errors.New("catalog filesystem full")
	// ErrUnavailable wraps every failure to persist because the Pebble store
	// is not open: it failed, or could not be opened. Repair reopens it.
	ErrUnavailable = errors.New("catalog store unavailable")
)

// Catalog is the index of the pages this peer holds. It is safe for
// concurrent use.
type Catalog struct {
	shards  [numShards]shard
	hash    hasher
	layouts layoutTable
	count   atomic.Int64

	onChange func(Entry, Change)
	opts     Options
	// store is nil when in memory only (opts.Dir == "") or while the store
	// is unavailable (persist.failed set). Guarded by writer.
	store *store
	// persist says whether the persisted state can be trusted (health.go).
	persist persistState

	// writer serializes Put, Update, Delete and Close: the Pebble commit
	// and the in-memory change of one call happen before the next call's.
	writer struct {
		sync.Mutex
		closed bool
		// dirty, while Repair rebuilds a store off the lock, holds every
		// key a commit changed since the rebuild began; nil otherwise.
		dirty map[pagekey.Key]struct{}
	}
	// repair serializes Repair and Close: Close waits for a rebuild
	// running off the writer lock. Taken before writer.
	repair sync.Mutex

	// onRepairCopy, a test seam, is called by Repair's rebuild after each
	// entry it copied into the fresh store (copied so far).
	onRepairCopy func(copied int)

	recovered int
	corrupt   int
	damage    Damage
	commits   atomic.Uint64
	syncs     atomic.Uint64
}

// Damage says what Open found wrong with the persisted catalog and where it
// put the damaged files. The zero value means nothing was wrong.
type Damage struct {
	Reason     string // why the store could not be read ("" when it could)
	MovedAside string // the directory the damaged store was renamed to
}

// Stats is a snapshot of the catalog's counters.
type Stats struct {
	Entries        int    // entries in the index
	Layouts        int    // distinct layout fingerprints seen
	Recovered      int    // entries recovered at Open
	CorruptRecords int    // persisted records skipped as corrupt at Open
	Commits        uint64 // Pebble batches committed since Open
	Syncs          uint64 // of those, commits that waited for the WAL to reach the disk (none with NoSync)
	Damage         Damage // what Open set aside
	Rebuilds       uint64 // stores rewritten from memory by Repair
	// Background is the number of errors Pebble reported on its own
	// goroutines (failed flushes or compactions, retried by Pebble).
	Background uint64
}

// Open opens a catalog. With opts.Dir set it opens (or creates) the Pebble
// store there and recovers every persisted entry, with DRAMSlot = -1: after
// a restart the catalog holds exactly the SSD-resident pages. Records that
// fail to decode are skipped and counted in Stats().CorruptRecords.
//
// Open fails only on a bad directory path. A store that cannot be read
// (Pebble corruption in any of its files) is moved aside, into
// <Dir>/corrupt-<time>/, and replaced by an empty one, reported in Stats().Damage; a store that cannot be opened
// for want of resources (a full disk, permissions) leaves the catalog in
// memory only, reported by Health, until Repair succeeds, and so does a
// directory whose former store this process abandoned while it still
// closes (ErrAbandoned). Either way the
// caller rebuilds the entries from the SSD tier (Adopt).
func Open(opts Options) (*Catalog, error) {
	if opts.ReserveBytes == 0 {
		opts.ReserveBytes = DefaultReserveBytes
	}
	if opts.fs == nil {
		opts.fs = vfs.Default
	}
	c := &Catalog{onChange: opts.OnChange, hash: newHasher(), opts: opts}
	if opts.Dir == "" {
		return c, nil
	}
	if err := opts.fs.MkdirAll(opts.Dir, 0o700); err != nil && !isResourceError(err) {
		return nil, fmt.Errorf("create catalog dir: %w", err)
	}
	s, err := c.openAndRecover()
	if err != nil && !isResourceError(err) && !errors.Is(err, ErrAbandoned) {
		c.reset()
		c.damage.Reason = err.Error()
		if c.damage.MovedAside, err = moveAside(opts.fs, opts.Dir); err == nil {
			s, err = c.openAndRecover()
		}
	}
	if err != nil {
		c.persist.fail(err)
		return c, nil
	}
	c.store = s
	return c, nil
}

// openAndRecover opens the store and loads its records into the index. A
// filesystem below the reserve is not opened: Pebble's open writes (a new
// WAL, a flush of the replayed one) and would fail half way.
func (c *Catalog) openAndRecover() (*store, error) {
	if err := abandonedDir(c.opts.Dir); err != nil {
		return nil, err // a live DB's files are neither read nor moved aside
	}
	if err := checkSpace(c.opts.fs, c.opts.Dir, c.opts.ReserveBytes); err != nil {
		return nil, err
	}
	s, err := openStore(c.opts.fs, c.opts.Dir, c.opts.NoSync)
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
	c.corrupt = corrupt
	return s, nil
}

// reset empties the index after a partial recovery.
func (c *Catalog) reset() {
	for i := range c.shards {
		c.shards[i].mu.slots, c.shards[i].mu.n = nil, 0
	}
	c.count.Store(0)
	c.recovered, c.corrupt = 0, 0
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
		Syncs:          c.syncs.Load(),
		Damage:         c.damage,
		Rebuilds:       c.persist.rebuilds.Load(),
		Background:     c.persist.background.Load(),
	}
}

// Close closes the Pebble store. Later writes fail with ErrClosed; reads
// keep answering from memory. Close is idempotent.
func (c *Catalog) Close() error {
	c.repair.Lock()
	defer c.repair.Unlock()
	c.writer.Lock()
	defer c.writer.Unlock()
	if c.writer.closed {
		return nil
	}
	c.writer.closed = true
	if c.store != nil {
		c.persist.countBackground(c.store)
		return c.store.close()
	}
	if c.opts.Dir != "" { // a store dropped in the background may still close
		select {
		case <-abandonedDone(c.opts.Dir):
		case <-time.After(closeTimeout):
			if err := abandonedDir(c.opts.Dir); err != nil {
				return fmt.Errorf("close catalog: %w", err)
			}
		}
	}
	return nil
}
