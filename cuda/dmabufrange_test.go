package cuda

import (
	"os"
	"testing"
)

func TestCheckDmabufRange(t *testing.T) {
	page := uint64(os.Getpagesize())
	for _, c := range []struct {
		name string
		p    DevicePtr
		size uint64
		ok   bool
	}{
		{"aligned", DevicePtr(16 * page), 4 * page, true},
		{"empty", DevicePtr(16 * page), 0, false},
		{"start off a page", DevicePtr(16*page + 256), 4 * page, false},
		{"length off a page", DevicePtr(16 * page), 4*page + 1, false},
		{"wraps the address space", DevicePtr(^uint64(0) - page + 1), 2 * page, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := CheckDmabufRange(c.p, c.size); (err == nil) != c.ok {
				t.Fatalf("CheckDmabufRange(%#x, %d) = %v, want ok %v", uint64(c.p), c.size, err, c.ok)
			}
		})
	}
}
