package ssd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// ErrClosed reports a call on a closed Store.
var ErrClosed = errors.New("ssd store closed")

// ErrInvalid reports a request that is malformed: a misaligned buffer, a
// length that does not match its slot, a slot that is not allocated.
var ErrInvalid = errors.New("invalid ssd request")

// Loc names a slot: Bytes bytes at Offset in page file File. Bytes is the
// slot length, SlotBytes(data length); the header block comes first.
type Loc struct {
	File   uint32
	Offset uint64
	Bytes  uint64
}

// Store is the SSD tier of a peer: preallocated page files read and written
// with O_DIRECT through one io_uring. It is safe for concurrent use.
type Store struct {
	cfg   Config
	files []File
	sizes []uint64
	ring  *uring
	mu    struct {
		sync.Mutex
		alloc  *allocator
		closed bool
	}
	created                             []string       // page files Open made (RemoveCreated)
	calls                               sync.WaitGroup // Read and Write calls running
	reads, writes, bytesRead, bytesWrit atomic.Uint64
}

// Stats is a snapshot of a Store's counters.
type Stats struct {
	CapacityBytes, UsedBytes               uint64 // bytes in the files; in allocated slots
	Reads, Writes, BytesRead, BytesWritten uint64 // completed page operations and their slot bytes
	InFlight                               int64  // operations in the kernel now; 0 when idle
}

// FileName returns the name of page file i.
func FileName(i int) string { return fmt.Sprintf("orbitkv-%03d.pages", i) }

// Open creates or reopens the page files in cfg.Dir, preallocated to their
// size, and sets up the ring. Reopened files keep their bytes; the caller
// Reserves the slots its catalog names before it Allocs. When Open fails
// (a preallocation on a full disk) it removes the files it created, so a
// failed start leaves no page files behind; files that existed stay.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.FS.MkdirAll(cfg.Dir); err != nil {
		return nil, fmt.Errorf("create ssd dir: %w", err)
	}
	s := &Store{cfg: cfg, sizes: cfg.fileSizes()}
	var created []string // files this Open made: removed again if it fails
	fail := func(err error) (*Store, error) {
		s.closeFiles()
		for _, p := range created {
			_ = os.Remove(p)
		}
		return nil, err
	}
	for i, size := range s.sizes {
		path := filepath.Join(cfg.Dir, FileName(i))
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			created = append(created, path)
		}
		f, err := cfg.FS.OpenPageFile(path, size)
		if err != nil {
			return fail(err)
		}
		s.files = append(s.files, f)
	}
	ring, err := newURing(cfg.QueueDepth)
	if err != nil {
		return fail(err)
	}
	s.ring = ring
	s.mu.alloc = newAllocator(RegionBytes, s.sizes)
	s.created = created
	return s, nil
}

// RemoveCreated removes the page files this Store's Open created (none
// existed before it), for a start that is given up after Open: call it
// after Close. Files that existed stay as they were.
func (s *Store) RemoveCreated() error {
	var errs []error
	for _, p := range s.created {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
		}
	}
	s.created = nil
	return errors.Join(errs...)
}

func (s *Store) closeFiles() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.Close())
	}
	s.files = nil
	return errors.Join(errs...)
}

// Alloc returns a free slot for a page of dataLen bytes: ErrFull when none
// is left, ErrTooLarge when the page cannot fit in a file.
func (s *Store) Alloc(dataLen uint64) (Loc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.alloc.alloc(SlotBytes(dataLen))
}

// Reserve marks a slot named by the catalog as allocated, at recovery. It
// fails when loc is misaligned, out of range, or overlaps an allocated
// slot or a region of another slot size.
func (s *Store) Reserve(loc Loc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.alloc.reserve(loc)
}

// Free releases a slot. Freeing a slot that is not allocated does nothing.
func (s *Store) Free(loc Loc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.mu.alloc.free(loc)
}

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	capacity, used := s.mu.alloc.capacity, s.mu.alloc.used
	s.mu.Unlock()
	return Stats{
		CapacityBytes: capacity, UsedBytes: used,
		Reads: s.reads.Load(), Writes: s.writes.Load(),
		BytesRead: s.bytesRead.Load(), BytesWritten: s.bytesWrit.Load(),
		InFlight: s.ring.inFlight.Load(),
	}
}

// Close stops new calls, waits for the running ones (and so for every
// operation in flight), then releases the ring and the files. It is
// idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.closed = true
	s.mu.Unlock()
	s.calls.Wait()
	s.ring.close()
	return s.closeFiles()
}

// begin registers a Read or Write call; false when the Store is closed.
func (s *Store) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return false
	}
	s.calls.Add(1)
	return true
}
