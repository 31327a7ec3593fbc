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
		if i, ok := pageFileNumber(e.Name()); ok && i >= n {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

// ScanBeyond finds the whole pages, as Scan does, that dir's page files
// hold outside tier (nil: the SSD tier is disabled): in the files tier does
// not use and past a used file's configured size (a former configuration's
// larger files). Only files that reach beyond the tier are read, each from
// its start, since a page may begin inside the tier and end past it; a tier
// that covers every file reads nothing. The catalog may have lost these
// pages (damaged, deleted), so they are what a start that would give them
// up must see (fabric/store/discard.go).
func ScanBeyond(dir string, tier *Store, fn func(Found)) (ScanStats, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return ScanStats{}, nil
	}
	if err != nil {
		return ScanStats{}, fmt.Errorf("list ssd dir: %w", err)
	}
	var sizes []uint64
	if tier != nil {
		sizes = tier.sizes
	}
	old := &Store{} // the files as they lie on disk; only those reaching beyond tier have a size
	defer func() {
		for _, f := range old.files {
			if f != nil {
				f.Close()
			}
		}
	}()
	for _, e := range ents {
		i, ok := pageFileNumber(e.Name())
		if !ok {
			continue
		}
		f, size, err := openBeyond(filepath.Join(dir, e.Name()), i, sizes)
		if err != nil {
			return ScanStats{}, err
		}
		if f == nil {
			continue
		}
		for len(old.sizes) <= i {
			old.sizes, old.files = append(old.sizes, 0), append(old.files, nil)
		}
		old.sizes[i], old.files[i] = size, f
	}
	return old.Scan(func(f Found) {
		if tier == nil || !tier.Holds(f.Loc) {
			fn(f)
		}
	})
}

// openBeyond opens page file i read-only when it is longer than sizes
// gives it (any length when i is past them), with its size in whole
// regions; nil when it lies inside the tier.
func openBeyond(path string, i int, sizes []uint64) (File, uint64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, 0, fmt.Errorf("stat ssd file: %w", err)
	}
	size := uint64(st.Size()) / RegionBytes * RegionBytes
	if i < len(sizes) && size <= sizes[i] || size == 0 {
		return nil, 0, nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("open %s to scan: %w", path, err)
	}
	return osFile(fd), size, nil
}

// pageFileNumber is i for a name FileName(i).
func pageFileNumber(name string) (int, bool) {
	num, ok := strings.CutPrefix(name, "orbitkv-")
	num, ok2 := strings.CutSuffix(num, ".pages")
	i, err := strconv.Atoi(num)
	return i, ok && ok2 && err == nil && i >= 0 && name == FileName(i)
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

// PageFiles lists the numbers of the page files in dir, in order; a
// missing dir has none.
func PageFiles(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list ssd dir: %w", err)
	}
	var out []int
	for _, e := range ents {
		if i, ok := pageFileNumber(e.Name()); ok {
			out = append(out, i)
		}
	}
	return out, nil
}
