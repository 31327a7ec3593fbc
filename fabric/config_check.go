package fabric

import (
	"fmt"
	"path/filepath"

	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// maxSocketPath is the longest Unix socket path the kernel binds: sun_path
// is 108 bytes, one of them the terminating NUL.
const maxSocketPath = 107

// ssdMaxQueueDepth is the SSD tier's limit on --ssd-queue-depth.
const ssdMaxQueueDepth = 4096

// validateLimits checks what the tiers and the kernel would otherwise refuse
// later, after the DRAM pool is allocated, in their own words (a Go field
// such as CapacityBytes). Every message names the flag, which is also the
// config file's key. It also makes the default socket path absolute, so
// the path the peer logs and the admin commands dial does not depend on
// the directory the peer was started in.
func (c *Config) validateLimits() []error {
	var errs []error
	if c.Socket == filepath.Join(c.DataDir, "orbitkv.sock") {
		if abs, err := filepath.Abs(c.Socket); err == nil {
			c.Socket = abs
		}
	}
	if len(c.Socket) > maxSocketPath {
		errs = append(errs, fmt.Errorf("socket %q is %d bytes, longer than the kernel's limit of %d for a Unix socket path: set a shorter socket (or data-dir)",
			c.Socket, len(c.Socket), maxSocketPath))
	}
	if c.DRAMSlabBytes%page.Alignment != 0 {
		errs = append(errs, fmt.Errorf("dram-slab-bytes %v is not a multiple of %d bytes", c.DRAMSlabBytes, page.Alignment))
	}
	if c.SSDBytes == 0 {
		return errs
	}
	region := bytesize.Size(ssd.RegionBytes)
	if c.SSDBytes < region {
		errs = append(errs, fmt.Errorf("ssd-bytes %v is below one SSD region (%v); 0 disables the SSD tier", c.SSDBytes, region))
	}
	if c.SSDFileBytes%region != 0 {
		errs = append(errs, fmt.Errorf("ssd-file-bytes %v is not a multiple of %v", c.SSDFileBytes, region))
	}
	if c.SSDQueueDepth < 0 || c.SSDQueueDepth > ssdMaxQueueDepth {
		errs = append(errs, fmt.Errorf("ssd-queue-depth %d, want 1..%d (0: %d)", c.SSDQueueDepth, ssdMaxQueueDepth, ssd.DefaultQueueDepth))
	}
	return errs
}

// queryBudget is the effective query budget: half the DRAM pool when none
// is asked (the default), else the one asked, capped at half the pool so
// leases can never pin every slot and stall saves; capped says the cap cut
// an asked budget.
func queryBudget(asked, poolBytes uint64) (budget uint64, capped bool) {
	half := poolBytes / 2
	if asked == 0 {
		return half, false
	}
	return min(asked, half), asked > half
}
