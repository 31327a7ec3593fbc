package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/bench/cluster"
	"github.com/orbitkv/orbitkv/bench/gpu"
	"github.com/orbitkv/orbitkv/bench/lookup"
	"github.com/orbitkv/orbitkv/bench/restart"
	"github.com/orbitkv/orbitkv/bench/saturation"
	"github.com/orbitkv/orbitkv/bench/ssd"
	"github.com/orbitkv/orbitkv/bench/tiers"
	"github.com/orbitkv/orbitkv/bench/transfer"
	"github.com/orbitkv/orbitkv/internal/bytesize"
)

func runBench(ctx context.Context, args []string, out io.Writer) error {
	return subcommand(ctx, "bench", args, out, map[string]func(context.Context, []string, io.Writer) error{
		"ssd":   runBenchSSD,
		"tiers": runBenchTiers, "saturation": runBenchSaturation,
		"lookup": runBenchLookup, "fabric": runBenchFabric, "transfer": runBenchTransfer, "cluster": runBenchCluster,
		"gpu": runBenchGPU, "serving": runBenchServing, "report": runBenchReport, "restart": runBenchRestart,
		"echo": runBenchEcho,
	})
}

// runBenchEcho serves a bare Unix-socket echo: the baseline of the engine
// RPC benchmark (integration/python orbitkv.bench.rpc).
func runBenchEcho(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench echo", flag.ContinueOnError)
	path := fs.String("socket", "", "Unix socket path to echo on, until interrupted")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return fmt.Errorf("bench echo: --socket is required")
	}
	return benchutil.ServeEcho(ctx, *path)
}

func runBenchSSD(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench ssd", flag.ContinueOnError)
	cfg := ssd.DefaultConfig()
	dir := fs.String("dir", "data/bench", "directory on the SSD to test (not tmpfs); its scratch file is removed at the end")
	fs.Uint64Var(&cfg.PageBytes, "page-bytes", cfg.PageBytes, "page data bytes")
	fs.IntVar(&cfg.Pages, "pages", cfg.Pages, "pages written then read")
	fs.IntVar(&cfg.Depth, "depth", cfg.Depth, "pages in flight (fio iodepth)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	scratch, cleanup, err := benchutil.ScratchDir(*dir, "ssd")
	if err != nil {
		return err
	}
	defer cleanup()
	cfg.Dir = scratch
	return ssd.Run(ctx, cfg, out)
}

func runBenchLookup(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench lookup", flag.ContinueOnError)
	cfg := lookup.DefaultConfig()
	fs.IntVar(&cfg.Entries, "entries", cfg.Entries, "catalog entries")
	fs.IntVar(&cfg.Chain, "chain", cfg.Chain, "pages per looked-up chain")
	fs.IntVar(&cfg.Iters, "iters", cfg.Iters, "timed lookups")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return lookup.Run(ctx, cfg, out)
}

func runBenchGPU(ctx context.Context, args []string, out io.Writer) error {
	var cfg gpu.Config
	fs := flag.NewFlagSet("bench gpu", flag.ContinueOnError)
	fs.IntVar(&cfg.Device, "device", 0, "CUDA device ordinal")
	pool := bytesize.Size(16 << 30)
	host := bytesize.Size(2 << 30)
	fs.Var(&pool, "pool-bytes", "device pool standing in for the engine's KV blocks")
	fs.Var(&host, "host-bytes", "pinned host pool standing in for the DRAM tier")
	fs.IntVar(&cfg.Reps, "reps", 20, "timed batches per method and direction (median reported)")
	gpu.RegisterFlags(fs, &cfg) // --pages, --skip-methods, the through-the-peer rows
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.PoolBytes, cfg.HostBytes = uint64(pool), uint64(host)
	cfg.BlockTokens = cfg.Peer.BlockTokens // --block-tokens: the method tables' and the peer rows'
	return gpu.Run(ctx, cfg, out)
}

func runBenchRestart(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench restart", flag.ContinueOnError)
	cfg := restart.DefaultConfig()
	fs.StringVar(&cfg.Dir, "dir", "data/bench", "directory on the SSD to test (not tmpfs); its scratch directory is removed at the end")
	sizes := fs.String("sizes", "1GiB,8GiB,32GiB", "SSD tier sizes, comma-separated (page files are preallocated: the disk needs the largest free)")
	fs.Float64Var(&cfg.Fill, "fill", cfg.Fill, "fraction of each tier filled with saved pages (2 MiB each)")
	fillMax, fileBytes := bytesize.Size(cfg.FillMax), bytesize.Size(cfg.FileBytes)
	fs.Var(&fillMax, "fill-max", "at most this many bytes of saved pages per tier")
	fs.Var(&fileBytes, "ssd-file-bytes", "size of each page file")
	fs.IntVar(&cfg.Reps, "reps", cfg.Reps, "timed starts per case (median reported)")
	fs.BoolVar(&cfg.Sparse, "sparse", false, "leave the page files sparse (serve --ssd-sparse): tiers larger than the free disk; the disk needs only the saved pages")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.FillMax, cfg.FileBytes, cfg.Sizes = uint64(fillMax), uint64(fileBytes), nil
	for _, s := range strings.Split(*sizes, ",") {
		n, err := bytesize.Parse(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--sizes: %w", err)
		}
		cfg.Sizes = append(cfg.Sizes, uint64(n))
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Exe = exe
	return restart.Run(ctx, cfg, out)
}

func runBenchCluster(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench cluster", flag.ContinueOnError)
	sockets := fs.String("sockets", "", "engine sockets of the peers, comma-separated; the first saves the pages")
	metrics := fs.String("metrics", "", "metrics addresses (host:port) of the same peers, comma-separated")
	pids := fs.String("pids", "", "process ids of the same peers, comma-separated (device counters from /proc/PID/net/dev, RSS)")
	scale := fs.Bool("scale", false, "the catalog's cost curve: in-process members on loopback as hosts and pages grow (--scale-*), with a fitted model")
	sc := cluster.DefaultScaleConfig()
	sc.RegisterFlags(fs)
	cfg := cluster.DefaultConfig()
	fs.IntVar(&cfg.Pages, "pages", cfg.Pages, "pages announced")
	fs.IntVar(&cfg.Batch, "batch", cfg.Batch, "pages per save")
	fs.DurationVar(&cfg.Idle, "idle", cfg.Idle, "how long the idle cluster's traffic is measured first")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "give up when the pages are not all visible by then")
	fs.StringVar(&cfg.ShmDir, "shm-dir", cfg.ShmDir, "where the engine buffer file goes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *scale {
		return cluster.RunScale(ctx, sc, out)
	}
	cfg.Sockets, cfg.Metrics = benchutil.SplitList(*sockets), benchutil.SplitList(*metrics)
	for _, p := range benchutil.SplitList(*pids) {
		n, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("bench cluster: --pids: %q is not a process id", p)
		}
		cfg.PIDs = append(cfg.PIDs, n)
	}
	return cluster.Run(ctx, cfg, out)
}

func runBenchSaturation(ctx context.Context, args []string, out io.Writer) error {
	cfg := saturation.DefaultConfig()
	fs := flag.NewFlagSet("bench saturation", flag.ContinueOnError)
	fs.StringVar(&cfg.Dir, "dir", cfg.Dir, "directory on the SSD (not tmpfs) for the peers' data and SSD tier, removed at the end")
	fs.StringVar(&cfg.ShmDir, "shm-dir", cfg.ShmDir, "directory for the engine's shared-memory KV buffer")
	fs.Var(&cfg.DRAMBytes, "dram-bytes", "DRAM pool of both peers")
	fs.Var(&cfg.SSDBytes, "ssd-bytes", "SSD tier of peer B")
	benchutil.GeometryFlags(fs, &cfg.Flash)
	fs.Float64Var(&cfg.Seconds, "seconds", cfg.Seconds, "seconds each peer is driven")
	fs.IntVar(&cfg.Streams, "streams", cfg.Streams, "concurrent savers/loaders on the one engine session")
	fs.IntVar(&cfg.Batch, "batch", cfg.Batch, "pages per save (one prompt's pages)")
	fs.Float64Var(&cfg.Reuse, "reuse", cfg.Reuse, "probability that a step revisits an earlier prompt: looks up and loads its first half, saves all of it again")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the mix and of the page bytes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return saturation.Run(ctx, cfg, out)
}

func runBenchTiers(ctx context.Context, args []string, out io.Writer) error {
	home, _ := os.UserHomeDir()
	cfg := tiers.DefaultConfig(home)
	fs := flag.NewFlagSet("bench tiers", flag.ContinueOnError)
	fs.StringVar(&cfg.Dir, "dir", cfg.Dir, "directory on the SSD (not tmpfs) for the run's scratch files, removed at the end")
	fs.StringVar(&cfg.ShmDir, "shm-dir", cfg.ShmDir, "directory for the engine's shared-memory KV buffer")
	benchutil.GeometryFlags(fs, &cfg.Flash)
	fs.IntVar(&cfg.Pages, "pages", cfg.Pages, "pages saved and loaded through the peer, Redis and the peer systems")
	fs.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "rounds of the DRAM comparison (medians reported)")
	fs.IntVar(&cfg.Batch, "batch", cfg.Batch, "pages per save/load request")
	fs.IntVar(&cfg.SSDPages, "ssd-pages", cfg.SSDPages, "pages for the SSD-versus-fio comparison")
	fs.IntVar(&cfg.SSDDepth, "ssd-depth", cfg.SSDDepth, "SSD queue depth (fio iodepth)")
	fs.StringVar(&cfg.RedisServer, "redis-server", cfg.RedisServer, "redis-server binary for the Redis baseline; empty skips it")
	fs.StringVar(&cfg.MooncakeVenv, "mooncake-venv", cfg.MooncakeVenv,
		"Mooncake Store's environment (scripts/install-mooncake.sh) for the peer-system comparison; empty skips it")
	fs.StringVar(&cfg.LMCacheVenv, "lmcache-venv", cfg.LMCacheVenv,
		"LMCache's environment (scripts/install-lmcache.sh) for the lmcache_server comparison; empty skips it")
	fs.StringVar(&cfg.DriverDir, "driver-dir", "", "directory of the peer systems' driver scripts (default: "+tiers.DriverDirRel+" beside the binary's repository)")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the pages the peer systems' drivers generate")
	fs.BoolVar(&cfg.SkipSSD, "skip-ssd", false, "skip the SSD-versus-fio comparison")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return tiers.Run(ctx, cfg, out)
}

func runBenchFabric(ctx context.Context, args []string, out io.Writer) error {
	cfg := transfer.DefaultFabricConfig()
	fs := flag.NewFlagSet("bench fabric", flag.ContinueOnError)
	fs.StringVar(&cfg.Serve, "serve", "", "serve synthetic pages on this address until interrupted")
	fs.StringVar(&cfg.Fetch, "fetch", "", "fetch pages from a --serve side at this address")
	fs.StringVar(&cfg.Iperf3, "iperf3", "", "iperf3 server host for the baseline (empty: none)")
	fs.IntVar(&cfg.IperfPort, "iperf3-port", cfg.IperfPort, "first port of the iperf3 servers (one per stream: port, port+1, …)")
	fs.Uint64Var(&cfg.PageBytes, "page-bytes", cfg.PageBytes, "page data bytes (Qwen3-8B, 64 tokens: 9437184)")
	fs.IntVar(&cfg.Pages, "pages", cfg.Pages, "pages the server holds")
	fs.IntVar(&cfg.Batch, "batch", cfg.Batch, "pages per fetch request")
	fs.IntVar(&cfg.Streams, "streams", cfg.Streams, "fetches in flight (connections)")
	fs.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "measured rounds of --seconds each")
	fs.Float64Var(&cfg.Seconds, "seconds", cfg.Seconds, "length of a round")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return transfer.RunFabric(ctx, cfg, out)
}

func runBenchTransfer(ctx context.Context, args []string, out io.Writer) error {
	cfg := transfer.DefaultConfig()
	fs := flag.NewFlagSet("bench transfer", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Args = args // --netns runs both sides with the same matrix flags
	return transfer.Run(ctx, cfg, out)
}
