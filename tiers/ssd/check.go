package ssd

import (
	"context"
	"fmt"
	"slices"

	"github.com/orbitkv/orbitkv/internal/page"
)

// checkWrite rejects a malformed write before any I/O: it must fill an
// allocated slot exactly, from an aligned buffer.
func (s *Store) checkWrite(r WriteReq) error {
	if err := checkShape(r.Loc, r.Header.Length, r.Data); err != nil {
		return fmt.Errorf("write page %s: %w", r.Header.Key, err)
	}
	s.mu.Lock()
	ok := s.mu.alloc.isAllocated(r.Loc)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("write page %s: %w: slot %+v not allocated", r.Header.Key, ErrInvalid, r.Loc)
	}
	return nil
}

// checkRead rejects a malformed read before any I/O. The slot need not be
// allocated (the header check catches a stale one) but must lie in a file.
func (s *Store) checkRead(r ReadReq) error {
	if err := checkShape(r.Loc, r.Want.Length, r.Dst); err != nil {
		return fmt.Errorf("read page %s: %w", r.Want.Key, err)
	}
	if int(r.Loc.File) >= len(s.sizes) || r.Loc.Offset+r.Loc.Bytes > s.sizes[r.Loc.File] {
		return fmt.Errorf("read page %s: %w: slot %+v outside the files", r.Want.Key, ErrInvalid, r.Loc)
	}
	return nil
}

func checkShape(loc Loc, length uint64, buf []byte) error {
	switch {
	case uint64(len(buf)) != page.AlignUp(length):
		return fmt.Errorf("%w: buffer of %d bytes for a %d-byte page", ErrInvalid, len(buf), length)
	case loc.Bytes != SlotBytes(length):
		return fmt.Errorf("%w: slot of %d bytes for a %d-byte page", ErrInvalid, loc.Bytes, length)
	case loc.Offset%page.Alignment != 0:
		return fmt.Errorf("%w: slot offset %d misaligned", ErrInvalid, loc.Offset)
	case !aligned(buf):
		return fmt.Errorf("%w: buffer not %d-byte aligned", ErrInvalid, page.Alignment)
	}
	return nil
}

// sync fdatasyncs, once each, the files holding the pages written without
// error, and turns a failed (or skipped) sync into the error of each page
// in that file.
func (s *Store) sync(ctx context.Context, reqs []WriteReq, errs []error) {
	var files []uint32
	for i, r := range reqs {
		if errs[i] == nil && !slices.Contains(files, r.Loc.File) {
			files = append(files, r.Loc.File)
		}
	}
	if len(files) == 0 {
		return
	}
	done := make(chan *op, len(files))
	ops := make([]*op, len(files))
	for j, f := range files {
		ops[j] = &op{kind: opSync, file: s.files[f], fd: s.files[f].Fd(), req: j, done: done}
	}
	ferrs := make([]error, len(files))
	s.run(ctx, ops, ferrs, func(o *op) error {
		if err := o.file.Intercept(&Op{Point: BeforeSync}); err != nil {
			return fmt.Errorf("fdatasync %s: %w", FileName(int(files[o.req])), err)
		}
		return nil
	}, func(o *op) error {
		if o.res < 0 {
			return fmt.Errorf("fdatasync %s: %w", FileName(int(files[o.req])), syscallErr(o.res))
		}
		if err := o.file.Intercept(&Op{Point: AfterSync}); err != nil {
			return fmt.Errorf("fdatasync %s: %w", FileName(int(files[o.req])), err)
		}
		return nil
	})
	for i, r := range reqs {
		if errs[i] == nil {
			errs[i] = ferrs[slices.Index(files, r.Loc.File)]
		}
	}
}
