package benchutil

import (
	"slices"
	"time"
)

// Gbps is bytes over d in GB/s (10^9 bytes per second).
func Gbps(bytes uint64, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e9 }

// Median is the middle of xs (the upper one of an even count); xs is not reordered.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// FirstErr is the first non-nil error of errs.
func FirstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
