// Package bytesize parses and prints byte counts, for flags, config files
// and logs. Binary suffixes are powers of 1024 (KiB, MiB, GiB, TiB, and the
// Kubernetes spellings Ki, Mi, Gi, Ti); decimal ones powers of 1000 (KB,
// MB, GB, TB): 1GiB is 1073741824 bytes, 1GB is 1000000000.
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
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
	{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}, {"B", 1},
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
		return 0, fmt.Errorf("byte size %q: want an integer with an optional unit: KiB, MiB, GiB, TiB (x1024) or KB, MB, GB, TB (x1000)", s)
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

// Human prints the size for people, in the largest binary unit it reaches,
// with one decimal where it is not whole: "9 MiB", "1.5 GiB", "512 B".
func (s Size) Human() string {
	for _, u := range units[:4] {
		if uint64(s) >= u.mul {
			v := float64(s) / float64(u.mul)
			if uint64(s)%u.mul == 0 {
				return fmt.Sprintf("%.0f %s", v, u.suffix)
			}
			return fmt.Sprintf("%.1f %s", v, u.suffix)
		}
	}
	return fmt.Sprintf("%d B", uint64(s))
}
