package ssd

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// FS is how a Store reaches the filesystem: it opens the page files, and
// each open File sees every page operation on it at the named Points. OS
// is the real one. Tests wrap it (WithFaults), in the manner of pebble's
// vfs/errorfs, to fail, stall, short-write or corrupt an operation at a
// named point; production code never special-cases a fault.
//
// The page I/O itself runs through the Store's io_uring on File.Fd, not
// through FS methods, which is why a File is told of each operation
// (Intercept) rather than asked to perform it.
type FS interface {
	// MkdirAll creates dir and its missing parents, owner-only.
	MkdirAll(dir string) error
	// OpenPageFile opens the page file at path for O_DIRECT reads and
	// writes, creating it if absent, and preallocates size bytes.
	OpenPageFile(path string, size uint64) (File, error)
}

// File is an open page file.
type File interface {
	// Fd is the descriptor the Store's io_uring reads and writes.
	Fd() int
	// Intercept is called at each Point of an operation on the file, from
	// the goroutine of the Store call that runs it (never the reaper), so
	// it may block to stall that call; the call's ctx does not interrupt
	// it. A non-nil error fails that page (or, at a sync point, every page
	// of the call in this file) with the error wrapped. The real file's
	// Intercept does nothing.
	Intercept(op *Op) error
	// Close closes the file.
	Close() error
}

// Point names where in an operation File.Intercept is called.
type Point uint8

const (
	// BeforeWrite: one page write (the header block then the data, one
	// writev at the slot's offset) is about to be submitted. Op.Header is
	// the encoded header block as it will reach the disk and may be
	// changed; Op.Data is the caller's buffer, to read, never to change
	// (it is the page's DRAM copy). Lowering Op.Bytes, by whole
	// page.Alignment blocks and above zero, writes only that prefix of the
	// slot: a torn write, which the Store reports as io.ErrShortWrite. An
	// error fails the page without I/O.
	BeforeWrite Point = iota + 1
	// BeforeSync: an fdatasync of the file is about to be submitted (only
	// under SyncBatch). An error fails it without I/O.
	BeforeSync
	// AfterSync: an fdatasync of the file succeeded: the call's pages in
	// it are durable but the caller does not know yet, so nothing names
	// them (a stall here holds a page durable but not in the catalog, for
	// crash tests). An error fails the sync after the fact: the pages are
	// on disk, yet reported failed.
	AfterSync
	// Preallocate: WithFaults only: a page file was opened and
	// preallocated (Op.Bytes is its size). An error makes OpenPageFile fail
	// as a failed fallocate does, with the file left on disk.
	Preallocate
	// AfterRead: one page read completed without an errno (a read that
	// failed in the kernel skips this point); Op.Bytes is what it
	// transferred. Intercept may change Op.Header and Op.Data (what the
	// disk "returned"), lower Op.Bytes (a short read), or return an error
	// (an I/O error). The Store verifies the page after this point.
	AfterRead
)

func (p Point) String() string {
	switch p {
	case BeforeWrite:
		return "before-write"
	case BeforeSync:
		return "before-sync"
	case AfterSync:
		return "after-sync"
	case Preallocate:
		return "preallocate"
	case AfterRead:
		return "after-read"
	}
	return fmt.Sprintf("Point(%d)", int(p))
}

// Op is one page-file operation as File.Intercept sees it.
type Op struct {
	Point  Point
	Loc    Loc    // the slot (zero at the sync points and Preallocate)
	Header []byte // the slot's header block, page.HeaderSize bytes (nil at the sync points and Preallocate)
	Data   []byte // the page data, padded (nil at the sync points and Preallocate)
	Bytes  uint64 // bytes to write (BeforeWrite), read (AfterRead), or the file's size (Preallocate)
}

// OS is the real filesystem.
var OS FS = osFS{}

type osFS struct{}

func (osFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o700) }

func (osFS) OpenPageFile(path string, size uint64) (File, error) {
	return openPageFile(path, size, "preallocate", func(fd int) error { return unix.Fallocate(fd, 0, 0, int64(size)) })
}

// SparseOS is OS with page files left sparse: a file shorter than its
// size is extended (ftruncate) instead of preallocated, and the disk's
// blocks are taken as pages are written. For benchmarks of tiers larger
// than the free disk only (orbitkv serve --ssd-sparse): a disk that fills
// fails page writes (ENOSPC) instead of the start, and the write path
// allocates blocks a preallocated file already has.
var SparseOS FS = sparseFS{}

type sparseFS struct{ osFS }

func (sparseFS) OpenPageFile(path string, size uint64) (File, error) {
	return openPageFile(path, size, "extend sparse to", func(fd int) error {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || uint64(st.Size) >= size {
			return err // never shortened: a longer file holds pages beyond the tier
		}
		return unix.Ftruncate(fd, int64(size))
	})
}

// openPageFile opens path for O_DIRECT page I/O, creating it if absent,
// and gives it size bytes with sizeFile (how: for the error).
func openPageFile(path string, size uint64, how string, sizeFile func(fd int) error) (File, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s with O_DIRECT: %w", path, err)
	}
	if err := sizeFile(fd); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s %d bytes for %s: %w", how, size, path, err)
	}
	return osFile(fd), nil
}

type osFile int

func (f osFile) Fd() int           { return int(f) }
func (osFile) Intercept(*Op) error { return nil }
func (f osFile) Close() error      { return unix.Close(int(f)) }

// WithFaults wraps fs so that inject is called, with the file's path, at
// every Point of every operation on the files it opens, after the inner
// file's own Intercept. It is the seam fault tests use; inject must be safe
// for concurrent use.
func WithFaults(fs FS, inject func(path string, op *Op) error) FS {
	return faultFS{FS: fs, inject: inject}
}

type faultFS struct {
	FS
	inject func(path string, op *Op) error
}

func (f faultFS) OpenPageFile(path string, size uint64) (File, error) {
	inner, err := f.FS.OpenPageFile(path, size)
	if err != nil {
		return nil, err
	}
	if err := f.inject(path, &Op{Point: Preallocate, Bytes: size}); err != nil {
		inner.Close()
		return nil, fmt.Errorf("preallocate %d bytes for %s: %w", size, path, err)
	}
	return faultFile{File: inner, path: path, inject: f.inject}, nil
}

type faultFile struct {
	File
	path   string
	inject func(path string, op *Op) error
}

func (f faultFile) Intercept(op *Op) error {
	if err := f.File.Intercept(op); err != nil {
		return err
	}
	return f.inject(f.path, op)
}
