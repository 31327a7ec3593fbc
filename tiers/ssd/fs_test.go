package ssd

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
)

// injector fails, shortens or changes the operations at one point of one
// page (by slot offset; any page when at is nil), at most once.
type injector struct {
	point Point
	at    *Loc
	fault func(op *Op) error
	hits  atomic.Int32
}

func (in *injector) inject(_ string, op *Op) error {
	if op.Point != in.point || (in.at != nil && op.Loc != *in.at) || in.hits.Add(1) > 1 {
		return nil
	}
	return in.fault(op)
}

func openFaulty(t *testing.T, dir string, in *injector) *Store {
	t.Helper()
	s, err := Open(Config{Dir: dir, CapacityBytes: RegionBytes, FileBytes: RegionBytes, QueueDepth: 8,
		FS: WithFaults(OS, in.inject)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func writeErrs(s *Store, pages []testPage) []error {
	reqs := make([]WriteReq, len(pages))
	for i, p := range pages {
		reqs[i] = WriteReq{Loc: p.loc, Header: p.hdr, Data: p.data}
	}
	return s.Write(context.Background(), reqs)
}

// TestFaultsAtNamedPoints drives each fault the seam offers through a
// Store: only the page it hits fails, with the error a caller can tell
// apart (an errno, a short transfer, a corrupt page), and a page whose write
// failed is never read back as good.
func TestFaultsAtNamedPoints(t *testing.T) {
	eio := func(*Op) error { return syscall.EIO }
	for _, tc := range []struct {
		name      string
		point     Point
		fault     func(op *Op) error
		writeErr  func(error) bool // page 1's write error; nil: no error
		readErr   func(error) bool // page 1's read error
		wholeFile bool             // the fault fails every page of the file
	}{
		{name: "write fails", point: BeforeWrite, fault: eio, // nothing reaches the slot
			writeErr: isErrno(syscall.EIO), readErr: corruptWith("invalid page header")},
		{name: "torn write: header only", point: BeforeWrite, // the header lands, the data does not
			fault:    func(op *Op) error { op.Bytes = page.HeaderSize; return nil },
			writeErr: func(err error) bool { return errors.Is(err, io.ErrShortWrite) }, readErr: corruptWith("checksum")},
		{name: "sync fails", point: BeforeSync, fault: eio, wholeFile: true,
			writeErr: isErrno(syscall.EIO), readErr: func(err error) bool { return err == nil }},
		{name: "sync fails after the fact", point: AfterSync, fault: eio, wholeFile: true,
			writeErr: isErrno(syscall.EIO), readErr: func(err error) bool { return err == nil }},
		{name: "read fails", point: AfterRead, fault: eio, readErr: isErrno(syscall.EIO)},
		{name: "short read", point: AfterRead,
			fault:   func(op *Op) error { op.Bytes -= page.Alignment; return nil },
			readErr: func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }},
		{name: "flipped data", point: AfterRead,
			fault: func(op *Op) error { op.Data[3] ^= 1; return nil }, readErr: isCorrupt},
		// Issue 9, finding 6: data and header sum changed together.
		{name: "consistent rewrite", point: AfterRead,
			fault:   func(op *Op) error { return reseal(op.Header, op.Data) },
			readErr: corruptWith("header checksum")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &injector{point: tc.point, fault: tc.fault}
			s := openFaulty(t, testDir(t), in)
			rng := rand.New(rand.NewPCG(8, 8))
			pages := []testPage{newPage(t, s, rng, 9000), newPage(t, s, rng, 9000), newPage(t, s, rng, 9000)}
			if tc.point != BeforeSync && tc.point != AfterSync {
				in.at = &pages[1].loc
			}
			werrs := writeErrs(s, pages)
			for i, err := range werrs {
				want := i == 1 || tc.wholeFile
				switch {
				case want && tc.writeErr != nil && !tc.writeErr(err):
					t.Fatalf("write page %d: %v", i, err)
				case (!want || tc.writeErr == nil) && err != nil:
					t.Fatalf("write page %d: %v, want nil", i, err)
				}
			}
			rerrs := readAll(t, s, pages)
			for i, err := range rerrs {
				if i == 1 && !tc.readErr(err) || i != 1 && err != nil {
					t.Fatalf("read page %d: %v", i, err)
				}
			}
			if in.hits.Load() == 0 {
				t.Fatal("the fault was never reached")
			}
		})
	}
}

func isCorrupt(err error) bool {
	var ce *page.CorruptError
	return errors.As(err, &ce)
}

func corruptWith(reason string) func(error) bool {
	return func(err error) bool { return isCorrupt(err) && strings.Contains(err.Error(), reason) }
}

func isErrno(e syscall.Errno) func(error) bool {
	return func(err error) bool { return errors.Is(err, e) && !isCorrupt(err) }
}

// TestFaultStallsOneCall: an injector that blocks holds the call it
// intercepts, and that call returns once released.
func TestFaultStallsOneCall(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	in := &injector{point: AfterRead, fault: func(*Op) error { close(entered); <-release; return nil }}
	s := openFaulty(t, testDir(t), in)
	p := newPage(t, s, rand.New(rand.NewPCG(9, 9)), 4096)
	writeAll(t, s, []testPage{p})
	done := make(chan error, 1)
	go func() { done <- s.Read(context.Background(), []ReadReq{{p.loc, p.hdr, alignedBytes(len(p.data))}})[0] }()
	<-entered
	select {
	case err := <-done:
		t.Fatalf("read returned while stalled: %v", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.InFlight != 0 {
		t.Fatalf("in flight %d after the stall", st.InFlight)
	}
}

// TestFaultAtPreallocate: a failed preallocation fails Open, naming it.
func TestFaultAtPreallocate(t *testing.T) {
	fs := WithFaults(OS, func(_ string, op *Op) error {
		if op.Point == Preallocate {
			return syscall.ENOSPC
		}
		return nil
	})
	_, err := Open(Config{Dir: testDir(t), CapacityBytes: RegionBytes, FS: fs})
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "preallocate") {
		t.Fatalf("Open: %v, want a preallocation ENOSPC", err)
	}
}

// TestSparseOSNeitherPreallocatesNorShortens: SparseOS gives a new page
// file its size without taking the disk's blocks, and never shortens a
// longer file (its tail holds pages beyond the tier).
func TestSparseOSNeitherPreallocatesNorShortens(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName(0))
	for _, size := range []uint64{256 << 20, 64 << 20} {
		f, err := SparseOS.OpenPageFile(path, size)
		if err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(f.Fd(), &st); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if st.Size != 256<<20 || st.Blocks*512 >= 1<<20 {
			t.Fatalf("opened for %d bytes: size %d, %d bytes allocated; want 256 MiB, sparse", size, st.Size, st.Blocks*512)
		}
	}
}
