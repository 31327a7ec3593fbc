package ssd

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
)

// Invalidate overwrites the header blocks of the slots at locs with zeroes
// and (under SyncBatch) fdatasyncs the files it touched, so that no scan
// finds the pages they held again: a page given up on purpose (an admin
// eviction) must not come back at the next start. The caller frees the
// slots afterwards; no Read or Write may be in flight on them. The data
// blocks are left as they are.
//
// A region whose first slot is invalidated no longer tells a header scan
// its slot size (ScanHeaders reads it from there when the caller's catalog
// names no slot of the region); pages in it that the catalog lost are then
// not rebuilt.
func (s *Store) Invalidate(locs []Loc) error {
	if !s.begin() {
		return ErrClosed
	}
	defer s.calls.Done()
	zero := alignedBytes(page.HeaderSize)
	touched := map[uint32]bool{}
	for _, l := range locs {
		if int(l.File) >= len(s.files) || l.Offset%page.Alignment != 0 || !s.Holds(l) || l.Bytes < page.HeaderSize {
			return fmt.Errorf("invalidate ssd slot %+v: %w", l, ErrInvalid)
		}
		n, err := unix.Pwrite(s.files[l.File].Fd(), zero, int64(l.Offset))
		if err == nil && n != len(zero) {
			err = fmt.Errorf("short write: %d of %d bytes", n, len(zero))
		}
		if err != nil {
			return fmt.Errorf("invalidate %s at %d: %w", FileName(int(l.File)), l.Offset, err)
		}
		touched[l.File] = true
	}
	if s.cfg.Sync == SyncNone {
		return nil
	}
	for f := range touched {
		if err := unix.Fdatasync(s.files[f].Fd()); err != nil {
			return fmt.Errorf("sync %s: %w", FileName(int(f)), err)
		}
	}
	return nil
}
