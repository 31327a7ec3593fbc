package ssd

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A configuration may shrink the tier a former one wrote: fewer files,
// smaller files, or none. Slots outside the configured files are then not
// the Store's; the caller decides (with the operator) whether the pages in
// them are given up, and only then removes what holds them.

// Holds reports whether loc lies inside the Store's files as configured. A
// catalog slot that does not was written under a larger configuration.
func (s *Store) Holds(loc Loc) bool {
	return int(loc.File) < len(s.sizes) && loc.Offset <= s.sizes[loc.File] && loc.Bytes <= s.sizes[loc.File]-loc.Offset
}

// Files is the number of page files the Store uses.
func (s *Store) Files() int { return len(s.sizes) }

// Stray lists the page files in dir that a Store of n files does not use
// (numbered n and above), in order; a missing dir has none.
func Stray(dir string, n int) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list ssd dir: %w", err)
	}
	var out []string
	for _, e := range ents {
		name := e.Name()
		num, ok := strings.CutPrefix(name, "orbitkv-")
		num, ok2 := strings.CutSuffix(num, ".pages")
		if i, err := strconv.Atoi(num); ok && ok2 && err == nil && i >= n && name == FileName(i) {
			out = append(out, filepath.Join(dir, name))
		}
	}
	return out, nil
}

// Trim cuts each of the Store's files that is longer than configured (a
// former configuration had larger files) back to its size, giving up the
// tail's slots.
func (s *Store) Trim() error {
	for i, f := range s.files {
		fd := f.Fd()
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("stat %s: %w", FileName(i), err)
		}
		if uint64(st.Size) <= s.sizes[i] {
			continue
		}
		if err := unix.Ftruncate(fd, int64(s.sizes[i])); err != nil {
			return fmt.Errorf("trim %s to %d bytes: %w", FileName(i), s.sizes[i], err)
		}
	}
	return nil
}
