package ssd

import (
	"errors"
	"flag"
	"fmt"
)

// SyncPolicy says when written pages become durable.
type SyncPolicy int

const (
	// SyncBatch fdatasyncs every file a Write call touched before the call
	// returns: a nil error from Write means the page survives a crash.
	SyncBatch SyncPolicy = iota
	// SyncNone never syncs. A nil error only means the device accepted the
	// write; a crash may lose it or (with a volatile device cache) tear it.
	// For benchmarks only.
	SyncNone
)

func (p SyncPolicy) String() string {
	switch p {
	case SyncBatch:
		return "batch"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("SyncPolicy(%d)", int(p))
}

// Set parses "batch" or "none"; with String it makes a SyncPolicy a
// flag.Value.
func (p *SyncPolicy) Set(s string) error {
	switch s {
	case "batch":
		*p = SyncBatch
	case "none":
		*p = SyncNone
	default:
		return fmt.Errorf("ssd sync policy %q: want batch or none", s)
	}
	return nil
}

// Defaults.
const (
	DefaultFileBytes  = 1 << 30
	DefaultQueueDepth = 32
	maxQueueDepth     = 4096
)

// Config configures a Store. The zero value of a field means its default.
type Config struct {
	// Dir holds the page files; created if missing. It must be on a
	// filesystem that supports O_DIRECT (not tmpfs).
	Dir string
	// CapacityBytes is the total size of the page files in bytes, at least
	// RegionBytes. Files hold whole regions; a remainder smaller than a
	// region is not used.
	CapacityBytes uint64
	// FileBytes is the size of one page file in bytes, a multiple of
	// RegionBytes (default 1 GiB). The last file may be smaller.
	FileBytes uint64
	// QueueDepth is the most I/O operations in flight at once, over all
	// callers (default 32, at most 4096).
	QueueDepth int
	// Sync says when writes become durable (default SyncBatch).
	Sync SyncPolicy
	// FS is the filesystem the page files live on (default OS); tests
	// wrap it to inject faults (fs.go). Not a flag.
	FS FS
}

// RegisterFlags registers the fields as -ssd-* flags on fs, with c's
// current values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Dir, "ssd-dir", c.Dir, "directory of the SSD page files (not tmpfs)")
	fs.Uint64Var(&c.CapacityBytes, "ssd-capacity-bytes", c.CapacityBytes, "total bytes of SSD page files")
	fs.Uint64Var(&c.FileBytes, "ssd-file-bytes", c.FileBytes, "bytes per SSD page file, a multiple of 64 MiB (0: 1 GiB)")
	fs.IntVar(&c.QueueDepth, "ssd-queue-depth", c.QueueDepth, "SSD operations in flight (0: 32)")
	fs.Var(&c.Sync, "ssd-sync", "SSD sync policy: batch (durable writes) or none (benchmarks)")
}

func (c Config) withDefaults() Config {
	if c.FileBytes == 0 {
		c.FileBytes = DefaultFileBytes
	}
	if c.QueueDepth == 0 {
		c.QueueDepth = DefaultQueueDepth
	}
	if c.FS == nil {
		c.FS = OS
	}
	return c
}

// Validate reports the first invalid field, defaults applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Dir == "":
		return errors.New("ssd: Dir is empty")
	case c.CapacityBytes < RegionBytes:
		return fmt.Errorf("ssd: CapacityBytes %d is below one region (%d bytes)", c.CapacityBytes, RegionBytes)
	case c.FileBytes%RegionBytes != 0:
		return fmt.Errorf("ssd: FileBytes %d is not a multiple of %d", c.FileBytes, RegionBytes)
	case c.QueueDepth < 1 || c.QueueDepth > maxQueueDepth:
		return fmt.Errorf("ssd: QueueDepth %d not in [1, %d]", c.QueueDepth, maxQueueDepth)
	case c.Sync != SyncBatch && c.Sync != SyncNone:
		return fmt.Errorf("ssd: unknown Sync %v", c.Sync)
	}
	return nil
}

// fileSizes returns the size of each page file in bytes.
func (c Config) fileSizes() []uint64 {
	var sizes []uint64
	for left := c.CapacityBytes / RegionBytes * RegionBytes; left > 0; {
		n := min(left, c.FileBytes)
		sizes = append(sizes, n)
		left -= n
	}
	return sizes
}
