// Package bytesize parses and prints byte counts with binary suffixes
// ("256MiB", "4GiB", "1048576"), for flags and logs.
package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

// Size is a byte count usable as a flag.Value.
type Size uint64

var units = []struct {
	suffix string
	mul    uint64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1},
}

// Parse reads a byte count: an integer with an optional unit suffix.
func Parse(s string) (Size, error) {
	t := strings.TrimSpace(s)
	mul := uint64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mul = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mul
			break
		}
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("byte size %q: want an integer with an optional unit (KiB, MiB, GiB, TiB)", s)
	}
	if n != 0 && n*mul/mul != n {
		return 0, fmt.Errorf("byte size %q overflows", s)
	}
	return Size(n * mul), nil
}

// String prints the size with the largest exact binary unit.
func (s Size) String() string {
	for _, u := range units[:4] {
		if s != 0 && uint64(s)%u.mul == 0 {
			return fmt.Sprintf("%d%s", uint64(s)/u.mul, u.suffix)
		}
	}
	return strconv.FormatUint(uint64(s), 10)
}

// Set implements flag.Value.
func (s *Size) Set(v string) error {
	n, err := Parse(v)
	if err != nil {
		return err
	}
	*s = n
	return nil
}
