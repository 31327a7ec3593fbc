package hbm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ErrBuffer reports an engine buffer that cannot be used as described.
var ErrBuffer = errors.New("engine kv buffer")

// Shared is an engine's shared-memory KV buffer mapped into the peer. It
// keeps the file open so Check can fstat the very file it mapped.
type Shared struct {
	Path string
	f    *os.File
	mem  []byte
	// stop ends the background populate; populated closes when it has ended.
	stop      chan struct{}
	populated chan struct{}
}

// populateChunk is how much of a mapping one populate step faults in: Close
// waits for at most one step.
const populateChunk = 64 << 20

// populate faults mem in, a chunk at a time, until done, stop closes, or a
// chunk cannot be faulted in (the engine shrank the file). Swapped by tests
// to hold it mid-way.
var populate = func(mem []byte, stop <-chan struct{}) {
	for off := 0; off < len(mem); off += populateChunk {
		select {
		case <-stop:
			return
		default:
		}
		if !prefault(mem[off:min(off+populateChunk, len(mem))]) {
			return // copies fault pages in themselves, and Check reports a shrink
		}
	}
}

// prefault maps a chunk's pages writable without writing them (their bytes
// are the engine's); where MADV_POPULATE_WRITE is missing (Linux < 5.14), it
// reads a byte of each page instead. False: pages past the file's end (it
// shrank under the mapping), which a read would have turned into a SIGBUS.
func prefault(chunk []byte) bool {
	err := unix.Madvise(chunk, unix.MADV_POPULATE_WRITE)
	if err == nil {
		return true
	}
	if !errors.Is(err, unix.EINVAL) {
		return false
	}
	return readPages(chunk)
}

// readPages reads a byte of every page of chunk; a fault (a page past the
// file's end) ends it with false instead of crashing the peer.
func readPages(chunk []byte) (ok bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	var sum byte
	for i := 0; i < len(chunk); i += 4096 {
		sum += chunk[i]
	}
	readSink.Store(uint32(sum)) // kept: the loads are the point
	return true
}

// readSink keeps readPages' loads from being optimized away.
var readSink atomic.Uint32

// MapShared maps size bytes of the file at path, read-write and shared, so
// the peer's copies land in the engine's memory.
func MapShared(path string, size uint64) (*Shared, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%w: path %q is not absolute", ErrBuffer, path)
	}
	if size == 0 {
		return nil, fmt.Errorf("%w: %s: size 0", ErrBuffer, path)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open: %v", ErrBuffer, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: stat %s: %v", ErrBuffer, path, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrBuffer, path)
	}
	if uint64(st.Size()) < size {
		f.Close()
		return nil, fmt.Errorf("%w: %s has %d bytes, described as %d", ErrBuffer, path, st.Size(), size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: map %s (%d bytes): %v", ErrBuffer, path, size, err)
	}
	// Every page is faulted in behind the registration, so copies do not pay a
	// fault per 4 KiB (measured: faults held loads to 2.5 GB/s). Not before it
	// returns: a fresh 4 GiB pool took longer than an engine's 5-s open
	// deadline to populate, and each retried open mapped it again.
	s := &Shared{Path: path, f: f, mem: mem, stop: make(chan struct{}), populated: make(chan struct{})}
	go func() {
		defer close(s.populated)
		populate(mem, s.stop)
	}()
	return s, nil
}

// Populated is closed once the background populate has ended: every page
// faulted in, or Close stopped it.
func (s *Shared) Populated() <-chan struct{} { return s.populated }

// Check fails when the mapped file no longer covers the mapping: the engine
// shrank or truncated it, so a copy into the missing tail would fault. It
// costs one fstat; a copy racing a shrink is caught by the copy's own fault
// guard (transfer.FaultError).
func (s *Shared) Check() error {
	st, err := s.f.Stat()
	if err != nil {
		return fmt.Errorf("%w: stat %s: %v", ErrBuffer, s.Path, err)
	}
	if n := uint64(len(s.mem)); uint64(st.Size()) < n {
		return fmt.Errorf("%w: %s shrank to %d bytes under its %d-byte registration: the engine must keep its KV buffer file at its size (reopen the session)",
			ErrBuffer, s.Path, st.Size(), n)
	}
	return nil
}

// Bytes returns the mapped memory.
func (s *Shared) Bytes() []byte { return s.mem }

// Close unmaps the buffer; it is idempotent.
func (s *Shared) Close() error {
	if s.mem == nil {
		return nil
	}
	close(s.stop)
	<-s.populated // at most one chunk's populate: never unmap under it
	err := unix.Munmap(s.mem)
	s.mem = nil
	return errors.Join(err, s.f.Close())
}
