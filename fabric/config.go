package fabric

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/orbitkv/orbitkv/fabric/cluster"
	"github.com/orbitkv/orbitkv/fabric/engineapi"
	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// Config configures a peer. Zero fields take the defaults of DefaultConfig.
type Config struct {
	DataDir     string // directory for the socket, the catalog and the SSD files
	Socket      string // engine/admin Unix socket path (default DataDir/orbitkv.sock)
	MetricsAddr string // Prometheus /metrics listen address; "" disables

	DRAMBytes     bytesize.Size // DRAM pool capacity in bytes
	DRAMSlabBytes bytesize.Size // DRAM slab size in bytes (largest page)
	SSDBytes      bytesize.Size // SSD tier capacity in bytes; 0 disables the tier
	SSDFileBytes  bytesize.Size // size of each preallocated SSD file in bytes
	SSDQueueDepth int           // io_uring submissions in flight per batch
	SSDNoSync     bool          // skip fdatasync (benchmarks only: loses durability)
	// SSDSparse leaves the page files sparse instead of preallocating
	// them (ssd.SparseOS), unless SSDFS is set. Benchmarks only: a tier
	// larger than the free disk then starts, and fails writes when full.
	SSDSparse bool
	// SSDFS is the filesystem of the SSD page files (nil: the real one).
	// Not a flag: fault tests wrap it (ssd.WithFaults).
	SSDFS ssd.FS `json:"-"`
	// SSDDiscard lets a start drop the SSD pages a smaller (or disabled) SSD
	// tier no longer covers, and remove their files; without it such a
	// start is refused (discard.go).
	SSDDiscard bool
	// SSDNoReadmit answers a cache-fill save of a page held only on SSD
	// "already stored", as before readmission, instead of taking the
	// engine's bytes back into DRAM (store/readmit.go): no device copy, and
	// the page is read from the SSD when it is next restored.
	SSDNoReadmit bool
	// SSDReadmitAll readmits such a page even into a full DRAM tier when it
	// was asked for no more often lately than the page it pushes out
	// (fabric/store/readmit.go): the peer before 2026-12-02, for A/B runs.
	SSDReadmitAll bool
	// Now is the clock of the peer's decisions: lease expiry, the SSD read
	// rate's age, tier fault windows (nil: time.Now). Not a flag: tests
	// move it.
	Now func() time.Time `json:"-"`

	// The engine API's budgets and bounds (fabric/engineapi).
	engineapi.Limits

	// CUDA is "auto" (pin the DRAM pool and serve CUDA sessions when a GPU
	// is present, else run without), "off", or "require" (fail to start
	// without a GPU).
	CUDA        string
	CUDACopiers int    // device copies in flight at once, per GPU (operations beyond wait)
	CUDAMethod  string // copy method: auto, kernel, pitched, batch, streams, per-segment
	// CUDARestorePitchMinRow: auto restores by pitched copies only where
	// their rows average at least this many bytes (cuda.CopierConfig).
	CUDARestorePitchMinRow bytesize.Size
	// CUDALayerGates gates layer-wise loads where the driver has stream
	// memory operations: the Load answers once the layer events are armed,
	// and the copies (on the copy engines) are enqueued after it.
	CUDALayerGates bool
	// HBMStageBytes is the HBM the peer takes on each GPU a CUDA session
	// uses, for the HBM stage (fabric/store/hbmstage.go): that GPU's saves
	// are also kept there, and loads on any GPU of the host copy them GPU
	// to GPU instead of from DRAM. 0 (the default) turns it off.
	HBMStageBytes bytesize.Size

	// The cluster (fabric/cluster); ClusterAddr "" runs the peer standalone.
	cluster.Config
}

// DefaultConfig returns the embedded default `make run` uses.
func DefaultConfig() Config {
	return Config{
		DataDir:       "./data",
		MetricsAddr:   "127.0.0.1:9464",
		DRAMBytes:     1 << 30,
		DRAMSlabBytes: 64 << 20,
		SSDBytes:      4 << 30,
		SSDFileBytes:  1 << 30,
		SSDQueueDepth: 32,
		Limits: engineapi.Limits{LeaseTTL: 30 * time.Second, Keepalive: 10 * time.Second, // QueryBudgetBytes 0: half the pool
			OpDeadline: 30 * time.Second, MaxKeys: 1 << 16, MaxPages: 4096},
		CUDA:           "auto",
		CUDACopiers:    4,
		CUDAMethod:     "auto",
		CUDALayerGates: true,
		// RDMA: every device; each port's RoCE v2 GID, IPv4-mapped first.
		Config: cluster.Config{RDMA: rdma.Config{GIDIndex: -1}},
	}
}

// RegisterFlags binds the config to flags (documented in docs/configuration.md).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the socket, catalog and SSD files")
	fs.StringVar(&c.Socket, "socket", c.Socket, "engine/admin Unix socket (default DATA-DIR/orbitkv.sock)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "Prometheus /metrics address; empty disables")
	fs.Var(&c.DRAMBytes, "dram-bytes", "DRAM pool capacity (e.g. 1GiB)")
	fs.Var(&c.DRAMSlabBytes, "dram-slab-bytes", "DRAM slab size; the largest page that fits")
	fs.Var(&c.SSDBytes, "ssd-bytes", "SSD tier capacity; 0 disables the SSD tier")
	fs.Var(&c.SSDFileBytes, "ssd-file-bytes", "size of each preallocated SSD file")
	fs.IntVar(&c.SSDQueueDepth, "ssd-queue-depth", c.SSDQueueDepth, "io_uring submissions in flight")
	fs.BoolVar(&c.SSDNoSync, "ssd-no-sync", c.SSDNoSync, "skip fdatasync on SSD writes (benchmarks only)")
	fs.BoolVar(&c.SSDSparse, "ssd-sparse", c.SSDSparse, "leave the SSD page files sparse instead of preallocated (benchmarks only: writes fail when the disk fills)")
	fs.BoolVar(&c.SSDDiscard, "ssd-discard", c.SSDDiscard, "start even if the SSD tier is now smaller than the pages on disk: drop those pages and remove their files")
	fs.BoolVar(&c.SSDNoReadmit, "ssd-no-readmit", c.SSDNoReadmit, "answer a cache-fill save of a page held only on SSD \"already stored\" instead of taking it back into DRAM")
	fs.BoolVar(&c.SSDReadmitAll, "ssd-readmit-all", c.SSDReadmitAll, "take every such page back into DRAM, even into a full tier when it was asked for no more often lately than the page it pushes out (default: only a hotter one)")
	c.Limits.RegisterFlags(fs)
	fs.StringVar(&c.CUDA, "cuda", c.CUDA, "CUDA sessions: auto (when a GPU is present), off, require")
	fs.IntVar(&c.CUDACopiers, "cuda-copiers", c.CUDACopiers, "device copies in flight at once per GPU")
	fs.Var(&c.HBMStageBytes, "hbm-stage-bytes", "HBM the peer takes on each GPU in use to keep saved pages for GPU-to-GPU loads on this host (same-host P/D); 0 disables")
	fs.StringVar(&c.CUDAMethod, "cuda-method", c.CUDAMethod, "host<->GPU copy method: auto, kernel, pitched, batch, streams, per-segment")
	fs.Var(&c.CUDARestorePitchMinRow, "cuda-restore-pitch-min-row", "with --cuda-method auto, restore by pitched copies only where their rows average at least this many bytes, else by cuMemcpyBatchAsync")
	c.Config.RegisterFlags(fs)
	fs.BoolVar(&c.CUDALayerGates, "cuda-layer-gates", c.CUDALayerGates, "gate layer-wise loads (answer once layer events are armed, enqueue the copies after; copy engines) where the driver has stream memory ops")
}

// Validate checks the config and fills derived defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("data-dir is required"))
	}
	if c.Socket == "" {
		c.Socket = filepath.Join(c.DataDir, "orbitkv.sock")
	}
	if c.DRAMSlabBytes == 0 || c.DRAMBytes < c.DRAMSlabBytes {
		errs = append(errs, fmt.Errorf("dram-bytes %v must hold at least one slab of %v", c.DRAMBytes, c.DRAMSlabBytes))
	}
	if c.SSDBytes > 0 && c.SSDFileBytes == 0 {
		errs = append(errs, errors.New("ssd-file-bytes must be positive"))
	}
	if c.SSDNoReadmit && c.SSDReadmitAll {
		errs = append(errs, errors.New("ssd-no-readmit and ssd-readmit-all contradict each other: readmit none, or every one"))
	}
	errs = append(errs, c.Limits.Validate()...)
	switch c.CUDA {
	case "":
		c.CUDA = "auto"
	case "auto", "off", "require":
	default:
		errs = append(errs, fmt.Errorf("cuda must be auto, off or require, got %q", c.CUDA))
	}
	if c.CUDACopiers == 0 {
		c.CUDACopiers = 4
	}
	if c.CUDACopiers < 0 || c.CUDACopiers > 64 {
		errs = append(errs, fmt.Errorf("cuda-copiers %d, want 1..64", c.CUDACopiers))
	}
	errs = append(errs, c.Config.Validate()...)
	errs = append(errs, c.validateLimits()...)
	return errors.Join(errs...)
}

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
