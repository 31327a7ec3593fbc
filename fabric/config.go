package fabric

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/orbitkv/orbitkv/internal/bytesize"
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
	// SSDFS is the filesystem of the SSD page files (nil: the real one).
	// Not a flag: fault tests wrap it (ssd.WithFaults).
	SSDFS ssd.FS `json:"-"`
	// SSDDiscard lets a start drop the SSD pages a smaller (or disabled) SSD
	// tier no longer covers, and remove their files; without it such a
	// start is refused (discard.go).
	SSDDiscard bool

	LeaseTTL         time.Duration // default lease lifetime
	QueryBudgetBytes bytesize.Size // bytes all live leases may hold at once
	Keepalive        time.Duration // a session without a keepalive for this long is closed
	OpDeadline       time.Duration // default deadline of a Save or Load

	MaxKeys  int // most keys in one Lookup
	MaxPages int // most pages in one Save or Load

	// CUDA is "auto" (pin the DRAM pool and serve CUDA sessions when a GPU
	// is present, else run without), "off", or "require" (fail to start
	// without a GPU).
	CUDA        string
	CUDACopiers int    // device copies in flight at once, per GPU (operations beyond wait)
	CUDAMethod  string // copy method: auto, kernel, pitched, batch, streams, per-segment
	// CUDALayerGates gates layer-wise loads where the driver has stream
	// memory operations: the Load answers once the layer events are armed,
	// and the copies (on the copy engines) are enqueued after it.
	CUDALayerGates bool

	// The cluster (cluster.go); ClusterAddr "" runs the peer standalone.
	ClusterAddr      string // memberlist gossip bind address (host:port)
	ClusterAdvertise string // address members reach the gossip at (default: memberlist's choice)
	ClusterJoin      string // comma-separated gossip addresses of members to join through
	ClusterKeyFile   string // gossip encryption key (base64, 16/24/32 bytes); "" gossips in clear
	NodeName         string // unique member name (default: kept in DataDir/node-name)
	PeerAddr         string // peer gRPC service listen address (default: gossip host, port+1)
	DataAddr         string // TCP data plane listen address (default: gossip host, port+2)
	TLSCert          string // this peer's certificate (PEM): mutual TLS on the peer service and data plane
	TLSKey           string // its private key (PEM)
	TLSCA            string // the cluster CA (PEM)
	// ClusterInsecure allows a cluster without mutual TLS or without a gossip
	// key: anyone who reaches the ports can then read pages or join.
	ClusterInsecure bool
}

// DefaultConfig returns the embedded default `make run` uses.
func DefaultConfig() Config {
	return Config{
		DataDir:          "./data",
		MetricsAddr:      "127.0.0.1:9464",
		DRAMBytes:        1 << 30,
		DRAMSlabBytes:    64 << 20,
		SSDBytes:         4 << 30,
		SSDFileBytes:     1 << 30,
		SSDQueueDepth:    32,
		LeaseTTL:         30 * time.Second,
		QueryBudgetBytes: 2 << 30,
		Keepalive:        10 * time.Second,
		OpDeadline:       30 * time.Second,
		MaxKeys:          1 << 16,
		MaxPages:         4096,
		CUDA:             "auto",
		CUDACopiers:      4,
		CUDAMethod:       "auto",
		CUDALayerGates:   true,
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
	fs.BoolVar(&c.SSDDiscard, "ssd-discard", c.SSDDiscard, "start even if the SSD tier is now smaller than the pages on disk: drop those pages and remove their files")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "default lease lifetime")
	fs.Var(&c.QueryBudgetBytes, "query-budget-bytes", "bytes all live leases may hold at once")
	fs.DurationVar(&c.Keepalive, "keepalive", c.Keepalive, "close a session silent for this long")
	fs.DurationVar(&c.OpDeadline, "op-deadline", c.OpDeadline, "default deadline of a save or load")
	fs.IntVar(&c.MaxKeys, "max-keys", c.MaxKeys, "most keys in one lookup")
	fs.IntVar(&c.MaxPages, "max-pages", c.MaxPages, "most pages in one save or load")
	fs.StringVar(&c.CUDA, "cuda", c.CUDA, "CUDA sessions: auto (when a GPU is present), off, require")
	fs.IntVar(&c.CUDACopiers, "cuda-copiers", c.CUDACopiers, "device copies in flight at once per GPU")
	fs.StringVar(&c.CUDAMethod, "cuda-method", c.CUDAMethod, "host<->GPU copy method: auto, kernel, pitched, batch, streams, per-segment")
	fs.StringVar(&c.ClusterAddr, "cluster-addr", c.ClusterAddr, "gossip bind address host:port (e.g. 0.0.0.0:7946); empty runs standalone")
	fs.StringVar(&c.ClusterAdvertise, "cluster-advertise", c.ClusterAdvertise, "gossip address members reach this peer at (default: chosen by memberlist)")
	fs.StringVar(&c.ClusterJoin, "cluster-join", c.ClusterJoin, "comma-separated gossip addresses of members to join through")
	fs.StringVar(&c.ClusterKeyFile, "cluster-key-file", c.ClusterKeyFile, "gossip encryption key file (base64 of 16/24/32 bytes; orbitkv pki init writes one)")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "unique member name (default: kept in DATA-DIR/node-name)")
	fs.StringVar(&c.PeerAddr, "peer-addr", c.PeerAddr, "peer gRPC listen address (default: gossip host, port+1)")
	fs.StringVar(&c.DataAddr, "data-addr", c.DataAddr, "TCP data plane listen address (default: gossip host, port+2)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "peer certificate (PEM) for mutual TLS between peers")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "private key of --tls-cert (PEM)")
	fs.StringVar(&c.TLSCA, "tls-ca", c.TLSCA, "cluster CA certificate (PEM)")
	fs.BoolVar(&c.ClusterInsecure, "cluster-insecure", c.ClusterInsecure, "allow a cluster without mutual TLS or gossip encryption (trusted test networks only)")
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
	for name, d := range map[string]time.Duration{"lease-ttl": c.LeaseTTL, "keepalive": c.Keepalive, "op-deadline": c.OpDeadline} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", name, d))
		}
	}
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
	if c.MaxKeys <= 0 || c.MaxPages <= 0 {
		errs = append(errs, errors.New("max-keys and max-pages must be positive"))
	}
	errs = append(errs, c.validateCluster()...)
	return errors.Join(errs...)
}

// validateCluster checks the cluster flags and fills the peer and data
// addresses from the gossip address.
func (c *Config) validateCluster() []error {
	if c.ClusterAddr == "" {
		for name, v := range map[string]string{"cluster-join": c.ClusterJoin, "peer-addr": c.PeerAddr, "data-addr": c.DataAddr,
			"tls-cert": c.TLSCert, "cluster-key-file": c.ClusterKeyFile} {
			if v != "" {
				return []error{fmt.Errorf("%s needs --cluster-addr", name)}
			}
		}
		return nil
	}
	host, port, err := splitHostPort(c.ClusterAddr)
	if err != nil {
		return []error{fmt.Errorf("cluster-addr %q: %w", c.ClusterAddr, err)}
	}
	next := func(d int) string {
		if port == 0 {
			return net.JoinHostPort(host, "0")
		}
		return net.JoinHostPort(host, strconv.Itoa(port+d))
	}
	if c.PeerAddr == "" {
		c.PeerAddr = next(1)
	}
	if c.DataAddr == "" {
		c.DataAddr = next(2)
	}
	var errs []error
	for name, v := range map[string]string{"peer-addr": c.PeerAddr, "data-addr": c.DataAddr} {
		if _, _, err := splitHostPort(v); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", name, v, err))
		}
	}
	set := btoi(c.TLSCert != "") + btoi(c.TLSKey != "") + btoi(c.TLSCA != "")
	if set != 0 && set != 3 {
		errs = append(errs, errors.New("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca"))
	}
	if (set == 0 || c.ClusterKeyFile == "") && !c.ClusterInsecure {
		errs = append(errs, errors.New("a cluster needs --tls-cert, --tls-key, --tls-ca and --cluster-key-file "+
			"(orbitkv pki init / issue make them); without them anyone reaching the ports reads pages or joins: "+
			"--cluster-insecure allows that on a trusted test network"))
	}
	if len(c.NodeName) > maxNameLen {
		errs = append(errs, fmt.Errorf("node-name of %d bytes, at most %d", len(c.NodeName), maxNameLen))
	}
	return errs
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
