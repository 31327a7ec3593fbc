package ssd

import (
	"context"
	"fmt"
	"io"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
)

// WriteReq writes one page: Header into the slot's header block, Data
// after it. Data starts at a page.Alignment-aligned address, has length
// page.AlignUp(Header.Length), and its padding is zeroed by the caller.
// Header.Checksum is the caller's CRC-32C of the Length data bytes; Write
// does not recompute it.
type WriteReq struct {
	Loc    Loc
	Header page.Header
	Data   []byte
}

// ReadReq reads one page into Dst (aligned, length page.AlignUp(Want.Length))
// and checks that the slot holds the page Want describes: its key, layout,
// length, generation and checksum, all as the caller recorded them.
type ReadReq struct {
	Loc  Loc
	Want page.Header
	Dst  []byte
}

// Write writes the pages, up to QueueDepth operations in flight, then,
// under SyncBatch, fdatasyncs each file it touched once. errs[i] is nil
// when page i is written (and durable under SyncBatch); only then may the
// catalog name the slot. When ctx ends, requests not yet submitted fail
// with ctx.Err() at once; those already submitted are reaped first, since
// the kernel owns their buffers until then, and fail with ctx.Err() if the
// sync did not run.
func (s *Store) Write(ctx context.Context, reqs []WriteReq) []error {
	errs := make([]error, len(reqs))
	if !s.begin() {
		return fill(errs, ErrClosed)
	}
	defer s.calls.Done()
	ops := make([]*op, 0, len(reqs))
	done := make(chan *op, len(reqs))
	for i, r := range reqs {
		if errs[i] = s.checkWrite(r); errs[i] == nil {
			ops = append(ops, newOp(opWrite, s.files[r.Loc.File], r.Loc, i, r.Data, done))
		}
	}
	s.run(ctx, ops, errs, func(o *op) error { return s.prepWrite(o, reqs[o.req]) },
		func(o *op) error { return s.finishWrite(o, reqs[o.req]) })
	if s.cfg.Sync == SyncBatch {
		s.sync(ctx, reqs, errs)
	}
	return errs
}

// Read reads the pages, up to QueueDepth operations in flight. errs[i] is
// nil only when page i's header matches Want (key, layout, length,
// generation, checksum) and its data matches that checksum; a mismatch is a
// *page.CorruptError. When ctx ends, requests not yet submitted fail with
// ctx.Err() at once; those already submitted are reaped (and verified)
// before Read returns, since the kernel owns Dst until then.
func (s *Store) Read(ctx context.Context, reqs []ReadReq) []error {
	errs := make([]error, len(reqs))
	if !s.begin() {
		return fill(errs, ErrClosed)
	}
	defer s.calls.Done()
	ops := make([]*op, 0, len(reqs))
	done := make(chan *op, len(reqs))
	for i, r := range reqs {
		if errs[i] = s.checkRead(r); errs[i] == nil {
			ops = append(ops, newOp(opRead, s.files[r.Loc.File], r.Loc, i, r.Dst, done))
		}
	}
	s.run(ctx, ops, errs, func(*op) error { return nil }, func(o *op) error { return s.finishRead(o, reqs[o.req]) })
	return errs
}

// newOp builds a header+data operation on loc; iov[0] is set to the slot's
// header block when the op gets its slot.
func newOp(kind opKind, f File, loc Loc, req int, data []byte, done chan *op) *op {
	o := &op{kind: kind, file: f, fd: f.Fd(), off: loc.Offset, niov: 1, want: int64(loc.Bytes), req: req, done: done}
	if len(data) > 0 {
		o.iov[1] = unix.Iovec{Base: &data[0], Len: uint64(len(data))}
		o.niov = 2
	}
	return o
}

// run submits ops, at most QueueDepth in flight over all callers, and
// waits for every submitted one. prep runs when an op has its slot (an
// error fails the op unsubmitted), finish when it completed, before the
// slot is released.
func (s *Store) run(ctx context.Context, ops []*op, errs []error, prep func(*op) error, finish func(*op) error) {
	next, pending := 0, 0
	for next < len(ops) || pending > 0 {
		if next < len(ops) && ctx.Err() != nil {
			for _, o := range ops[next:] {
				errs[o.req] = ctx.Err()
			}
			next = len(ops)
		}
		n := s.acquire(ctx, ops[next:], pending == 0)
		if n > 0 {
			submit := make([]*op, 0, n)
			for _, o := range ops[next : next+n] {
				if o.kind != opSync {
					o.iov[0] = unix.Iovec{Base: &s.ring.header(o.slot)[0], Len: page.HeaderSize}
				}
				if errs[o.req] = prep(o); errs[o.req] != nil {
					s.ring.free <- o.slot
					continue
				}
				submit = append(submit, o)
			}
			s.ring.submit(submit)
			next, pending = next+n, pending+len(submit)
		}
		if pending > 0 {
			o := <-ops[0].done // the ops of a call share one channel
			errs[o.req] = finish(o)
			s.ring.free <- o.slot
			pending--
		}
	}
}

// acquire gives slots to a prefix of ops and returns its length: waiting
// for the first slot when block is set, taking only free ones otherwise.
func (s *Store) acquire(ctx context.Context, ops []*op, block bool) int {
	for i, o := range ops {
		if ctx.Err() != nil {
			return i
		}
		if i == 0 && block {
			select {
			case o.slot = <-s.ring.free:
				continue
			case <-ctx.Done():
				return 0
			}
		}
		select {
		case o.slot = <-s.ring.free:
		default:
			return i
		}
	}
	return len(ops)
}

// prepWrite encodes the page's header into the op's header block and lets
// the file intercept the write (fs.go), which may shorten it.
func (s *Store) prepWrite(o *op, r WriteReq) error {
	block := s.ring.header(o.slot)
	r.Header.Encode(block)
	fop := &Op{Point: BeforeWrite, Loc: r.Loc, Header: block, Data: r.Data, Bytes: r.Loc.Bytes}
	if err := o.file.Intercept(fop); err != nil {
		return fmt.Errorf("write page %s at %+v: %w", r.Header.Key, r.Loc, err)
	}
	if fop.Bytes == r.Loc.Bytes {
		return nil
	}
	if fop.Bytes == 0 || fop.Bytes > r.Loc.Bytes || fop.Bytes%page.Alignment != 0 {
		return fmt.Errorf("write page %s: %w: intercepted to %d of %d bytes", r.Header.Key, ErrInvalid, fop.Bytes, r.Loc.Bytes)
	}
	o.iov[0].Len = min(fop.Bytes, page.HeaderSize)
	if o.iov[1].Len = fop.Bytes - o.iov[0].Len; o.iov[1].Len == 0 {
		o.niov = 1
	}
	return nil
}

func (s *Store) finishWrite(o *op, r WriteReq) error {
	if err := result(o); err != nil {
		return fmt.Errorf("write page %s at %+v: %w", r.Header.Key, r.Loc, err)
	}
	s.writes.Add(1)
	s.bytesWrit.Add(r.Loc.Bytes)
	return nil
}

func (s *Store) finishRead(o *op, r ReadReq) error {
	if o.res >= 0 {
		fop := &Op{Point: AfterRead, Loc: r.Loc, Header: s.ring.header(o.slot), Data: r.Dst, Bytes: uint64(o.res)}
		if err := o.file.Intercept(fop); err != nil {
			return fmt.Errorf("read page %s at %+v: %w", r.Want.Key, r.Loc, err)
		}
		o.res = int32(min(fop.Bytes, uint64(o.res)))
	}
	if err := result(o); err != nil {
		return fmt.Errorf("read page %s at %+v: %w", r.Want.Key, r.Loc, err)
	}
	if err := verify(r.Want, s.ring.header(o.slot), r.Dst); err != nil {
		return err
	}
	s.reads.Add(1)
	s.bytesRead.Add(r.Loc.Bytes)
	return nil
}

// result turns a completion into an error: an errno, or a short transfer.
func result(o *op) error {
	switch {
	case o.res < 0:
		return syscallErr(o.res)
	case int64(o.res) != o.want && o.kind == opRead:
		return fmt.Errorf("read %d of %d bytes: %w", o.res, o.want, io.ErrUnexpectedEOF)
	case int64(o.res) != o.want && o.kind == opWrite:
		return fmt.Errorf("wrote %d of %d bytes: %w", o.res, o.want, io.ErrShortWrite)
	}
	return nil
}

// verify checks a read page against the header the caller expects (the
// catalog's record: DESIGN.md §7), checksum included, then the data
// against that checksum.
func verify(want page.Header, block, data []byte) error {
	got, err := page.Decode(block)
	if err != nil {
		return &page.CorruptError{Key: want.Key, Reason: err.Error()}
	}
	switch {
	case got.Key != want.Key:
		return &page.CorruptError{Key: want.Key, Reason: fmt.Sprintf("slot holds page %s", got.Key)}
	case got.Layout != want.Layout:
		return &page.CorruptError{Key: want.Key, Reason: fmt.Sprintf("layout %s, want %s", got.Layout, want.Layout)}
	case got.Length != want.Length:
		return &page.CorruptError{Key: want.Key, Reason: fmt.Sprintf("length %d, want %d", got.Length, want.Length)}
	case got.Generation != want.Generation:
		return &page.CorruptError{Key: want.Key, Reason: fmt.Sprintf("generation %d, want %d", got.Generation, want.Generation)}
	case got.Checksum != want.Checksum:
		// A slot rewritten consistently (data and header sum changed
		// together) passes its own check; the caller's record catches it.
		return &page.CorruptError{Key: want.Key, Reason: fmt.Sprintf("header checksum %08x, want %08x", got.Checksum, want.Checksum)}
	}
	return got.Verify(data[:got.Length])
}

func fill(errs []error, err error) []error {
	for i := range errs {
		errs[i] = err
	}
	return errs
}

func aligned(b []byte) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%page.Alignment == 0
}

func syscallErr(res int32) error { return syscall.Errno(-res) }
