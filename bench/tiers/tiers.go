// Package tiers is `orbitkv bench tiers`: the peer's DRAM tier through the
// engine API (an in-process peer over its socket, as an engine reaches it)
// beside a single-thread memcpy and Redis, the SSD tier beside fio
// (bench/ssd), and the peer systems Mooncake Store and LMCache through
// their own Python drivers. It uses nothing below the peer's engine API.
package tiers

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/bench/ssd"
	"github.com/orbitkv/orbitkv/fabric"
	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// tiersBench is a run of the bench, Config with its working state.
type tiersBench struct {
	dir         string
	shmDir      string
	flash       engineclient.Flash
	pages       int
	batch       int
	rounds      int
	ssdPages    int
	ssdDepth    int
	redisServer string
	// mooncakeVenv and lmcacheVenv are the peer systems' environments
	// (scripts/install-mooncake.sh, scripts/install-lmcache.sh); empty skips
	// one. driverDir overrides where their drivers are.
	mooncakeVenv string
	lmcacheVenv  string
	driverDir    string
	seed         int64 // of the pages the drivers generate
	skipSSD      bool
	scratch      string // under dir, made by run and removed when it returns
}

// Config is a tiers bench's run.
type Config struct {
	Dir          string             // directory on the SSD (not tmpfs) for the run's scratch files, removed at the end
	ShmDir       string             // directory for the engine's shared-memory KV buffer
	Flash        engineclient.Flash // page geometry
	Pages        int                // pages saved and loaded through the peer, Redis and the peer systems
	Rounds       int                // rounds of the DRAM comparison (medians reported)
	Batch        int                // pages per save/load request
	SSDPages     int                // pages for the SSD-versus-fio comparison
	SSDDepth     int                // SSD queue depth (fio iodepth)
	RedisServer  string             // redis-server binary for the Redis baseline; empty skips it
	MooncakeVenv string             // Mooncake Store's environment (scripts/install-mooncake.sh); empty skips it
	LMCacheVenv  string             // LMCache's environment (scripts/install-lmcache.sh); empty skips it
	DriverDir    string             // the peer systems' driver scripts; empty: DriverDirRel beside the binary's repository
	Seed         int64              // seed of the pages the peer systems' drivers generate
	SkipSSD      bool               // skip the SSD-versus-fio comparison
}

// DefaultConfig is `orbitkv bench tiers`'s default run, the peer systems'
// environments where their install scripts put them under home.
func DefaultConfig(home string) Config {
	return Config{Dir: "data/bench", ShmDir: "/dev/shm", Flash: benchutil.Qwen3Flash(), Pages: 96, Rounds: 5, Batch: 32,
		SSDPages: 256, SSDDepth: 32, RedisServer: "redis-server",
		MooncakeVenv: filepath.Join(home, ".cache/orbitkv/mooncake-"+MooncakeVersion),
		LMCacheVenv:  filepath.Join(home, ".cache/orbitkv/lmcache-"+LMCacheVersion), Seed: 1}
}

// Run measures the tiers and the baselines and prints the tables.
func Run(ctx context.Context, cfg Config, out io.Writer) error {
	b := tiersBench{dir: cfg.Dir, shmDir: cfg.ShmDir, flash: cfg.Flash, pages: cfg.Pages, batch: cfg.Batch, rounds: cfg.Rounds,
		ssdPages: cfg.SSDPages, ssdDepth: cfg.SSDDepth, redisServer: cfg.RedisServer, mooncakeVenv: cfg.MooncakeVenv,
		lmcacheVenv: cfg.LMCacheVenv, driverDir: cfg.DriverDir, seed: cfg.Seed, skipSSD: cfg.SkipSSD}
	b.flash.NumBlocks = 2 * b.pages * (b.flash.PageTokens / b.flash.BlockTokens)
	return b.run(ctx, out)
}

func (b *tiersBench) run(ctx context.Context, out io.Writer) error {
	scratch, cleanup, err := benchutil.ScratchDir(b.dir, "tiers")
	if err != nil {
		return err
	}
	defer cleanup()
	b.scratch = scratch
	pageBytes := uint64(b.flash.Size()) / uint64(b.flash.NumBlocks) * uint64(b.flash.PageTokens/b.flash.BlockTokens)
	fmt.Fprintf(out, "orbitkv bench tiers: %d pages of %s (%d layers x K,V, %d tokens), %d pages per request\n\n",
		b.pages, bytesize.Size(pageBytes), b.flash.Layers, b.flash.PageTokens, b.batch)
	rounds, err := b.dramRounds(ctx)
	if err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	peerSave, peerLoad, memcpy := medianOf(rounds, func(r dramRound) float64 { return r.save }),
		medianOf(rounds, func(r dramRound) float64 { return r.load }), medianOf(rounds, func(r dramRound) float64 { return r.memcpy })
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DRAM tier\tOrbitKV GB/s\tbaseline\tbaseline GB/s\tratio\ttarget")
	fmt.Fprintf(tw, "save (engine -> DRAM)\t%.2f\tsingle-thread memcpy\t%.2f\t%.2f\t>= 0.70\n", peerSave, memcpy, peerSave/memcpy)
	fmt.Fprintf(tw, "load (DRAM -> engine)\t%.2f\tsingle-thread memcpy\t%.2f\t%.2f\t>= 0.70\n", peerLoad, memcpy, peerLoad/memcpy)
	if b.redisServer != "" {
		rput, rget, err := b.redisRoundTrip(ctx, pageBytes)
		if err != nil {
			return fmt.Errorf("redis baseline: %w", err)
		}
		fmt.Fprintf(tw, "save vs Redis SET\t%.2f\tredis-server (loopback)\t%.2f\t%.2f\t>= 3\n", peerSave, rput, peerSave/rput)
		fmt.Fprintf(tw, "load vs Redis GET\t%.2f\tredis-server (loopback)\t%.2f\t%.2f\t>= 3\n", peerLoad, rget, peerLoad/rget)
	}
	var notes []string
	for _, p := range b.peerSystems() {
		note, err := b.peerRows(ctx, tw, p, peerSave, peerLoad, pageBytes)
		if err != nil {
			return err
		}
		if note != "" {
			notes = append(notes, note)
		}
	}
	tw.Flush()
	fmt.Fprintf(out, "(medians of %d rounds; save/load/memcpy GB/s per round:", len(rounds))
	for _, r := range rounds {
		fmt.Fprintf(out, " %.1f/%.1f/%.1f", r.save, r.load, r.memcpy)
	}
	fmt.Fprintln(out, ")")
	for _, n := range notes {
		fmt.Fprintln(out, n)
	}
	if b.skipSSD {
		return nil
	}
	fmt.Fprintf(out, "\nSSD tier (same file, block size = slot size, depth %d):\n", b.ssdDepth)
	return ssd.Run(ctx, ssd.Config{Dir: filepath.Join(b.scratch, "ssd"), PageBytes: pageBytes, Pages: b.ssdPages, Depth: b.ssdDepth}, out)
}

// memcpyGBps is the best of three single-thread copies of n bytes between
// pre-faulted buffers.
func memcpyGBps(n int) float64 {
	src, dst := make([]byte, n), make([]byte, n)
	rand.Read(src)
	copy(dst, src) // fault both in
	best := time.Duration(1 << 62)
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		copy(dst, src)
		best = min(best, time.Since(t0))
	}
	return float64(n) / best.Seconds() / 1e9
}

// startPeer starts the DRAM-only peer of the DRAM comparison, its pool
// sized for the run's pages, the engine buffer filled with random bytes.
func (b *tiersBench) startPeer(ctx context.Context) (*benchutil.Engine, error) {
	cfg := fabric.DefaultConfig()
	cfg.DataDir, cfg.MetricsAddr, cfg.SSDBytes = filepath.Join(b.scratch, "peer"), "", 0
	pageBytes := benchutil.FlashPageBytes(b.flash)
	cfg.DRAMSlabBytes = bytesize.Size(max(64<<20, 4*((pageBytes+4095)&^4095)))
	cfg.DRAMBytes = bytesize.Size(uint64(cfg.DRAMSlabBytes) * (uint64(b.pages)*pageBytes/uint64(cfg.DRAMSlabBytes) + 2))
	be, err := benchutil.StartPeer(ctx, cfg, b.flash, filepath.Join(b.shmDir, "orbitkv-bench-"+strconv.Itoa(os.Getpid())))
	if err != nil {
		return nil, err
	}
	rand.Read(be.Shm.Mem)
	return be, nil
}

// dramRound is one round of the DRAM comparison, GB/s.
type dramRound struct{ save, load, memcpy float64 }

// dramRounds runs b.rounds rounds of save, load and memcpy in one peer and
// returns them; the table reports medians.
func (b *tiersBench) dramRounds(ctx context.Context) ([]dramRound, error) {
	be, err := b.startPeer(ctx)
	if err != nil {
		return nil, err
	}
	defer be.Stop()
	var out []dramRound
	for r := 0; r < b.rounds; r++ {
		save, load, err := b.peerRoundTrip(ctx, be)
		if err != nil {
			return nil, err
		}
		out = append(out, dramRound{save: save, load: load, memcpy: memcpyGBps(int(be.E.PageBytes) * b.pages)})
		// Between rounds, outside the timing: let the sealer finish and
		// empty the pool so every round saves into free slots.
		if _, err := be.Admin.Drain(ctx, &pb.DrainRequest{TimeoutMs: 30000}); err != nil {
			return nil, err
		}
		if _, err := be.Admin.Evict(ctx, &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// peerRoundTrip saves b.pages fresh pages through the peer and loads them
// back into other blocks, returning GB/s of each direction.
func (b *tiersBench) peerRoundTrip(ctx context.Context, be *benchutil.Engine) (save, load float64, err error) {
	per := b.flash.PageTokens / b.flash.BlockTokens
	keys := make([][]byte, b.pages)
	for i := range keys {
		keys[i] = make([]byte, 16)
		rand.Read(keys[i])
	}
	refs := func(first int) []*pb.PageRef {
		out := make([]*pb.PageRef, b.pages)
		for i := range out {
			out[i] = &pb.PageRef{Key: keys[i]}
			for j := 0; j < per; j++ {
				out[i].Blocks = append(out[i].Blocks, uint32(first+i*per+j))
			}
		}
		return out
	}
	total := float64(be.E.PageBytes) * float64(b.pages)
	dSave, err := b.timeBatches(ctx, refs(0), func(r []*pb.PageRef) (*pb.OpStatus, error) {
		return be.E.Save(ctx, r, pb.Durability_DURABILITY_DRAM)
	})
	if err != nil {
		return 0, 0, err
	}
	dLoad, err := b.timeBatches(ctx, refs(b.pages*per), func(r []*pb.PageRef) (*pb.OpStatus, error) {
		return be.E.Load(ctx, r)
	})
	if err != nil {
		return 0, 0, err
	}
	return total / dSave.Seconds() / 1e9, total / dLoad.Seconds() / 1e9, nil
}

func (b *tiersBench) timeBatches(ctx context.Context, refs []*pb.PageRef, call func([]*pb.PageRef) (*pb.OpStatus, error)) (time.Duration, error) {
	t0 := time.Now()
	for i := 0; i < len(refs); i += b.batch {
		st, err := call(refs[i:min(i+b.batch, len(refs))])
		if err != nil {
			return 0, err
		}
		if err := engineclient.AllOK(st); err != nil {
			return 0, err
		}
	}
	return time.Since(t0), nil
}

// redisRoundTrip stores the same pages in a local redis-server the way a
// Redis-backed cache does (gather the page's blocks into one value, SET;
// GET, scatter back) and returns GB/s of each direction.
func (b *tiersBench) redisRoundTrip(ctx context.Context, pageBytes uint64) (put, get float64, err error) {
	addr, stop, err := startRedis(ctx, b.redisServer)
	if err != nil {
		return 0, 0, err
	}
	defer stop()
	rc, err := dialRedis(addr, 5*time.Second)
	if err != nil {
		return 0, 0, err
	}
	defer rc.Close()
	shm := make([]byte, b.flash.Size())
	rand.Read(shm)
	blob := make([]byte, pageBytes)
	per := b.flash.PageTokens / b.flash.BlockTokens
	t0 := time.Now()
	for i := 0; i < b.pages; i++ {
		gatherFlash(b.flash, shm, blob, i*per, per, false)
		if err := rc.set([]byte("page:"+strconv.Itoa(i)), blob); err != nil {
			return 0, 0, err
		}
	}
	dPut := time.Since(t0)
	t0 = time.Now()
	for i := 0; i < b.pages; i++ {
		if err := rc.get([]byte("page:"+strconv.Itoa(i)), blob); err != nil {
			return 0, 0, err
		}
		gatherFlash(b.flash, shm, blob, (b.pages+i)*per, per, true)
	}
	dGet := time.Since(t0)
	total := float64(pageBytes) * float64(b.pages)
	return total / dPut.Seconds() / 1e9, total / dGet.Seconds() / 1e9, nil
}

// gatherFlash copies a page's blocks between the engine buffer and a blob
// (scatter when back is true), segment-major like the peer.
func gatherFlash(f engineclient.Flash, buf, blob []byte, first, per int, back bool) {
	off, bb := 0, f.BlockBytes()
	for l := 0; l < f.Layers; l++ {
		for p := 0; p < 2; p++ {
			at := f.BlockOffset(l, p, first)
			if back {
				copy(buf[at:at+per*bb], blob[off:off+per*bb])
			} else {
				copy(blob[off:off+per*bb], buf[at:at+per*bb])
			}
			off += per * bb
		}
	}
}

// startRedis runs a throwaway redis-server on a free loopback port with
// persistence off and waits until it answers PING.
func startRedis(ctx context.Context, bin string) (string, func(), error) {
	if _, err := exec.LookPath(bin); err != nil {
		return "", nil, fmt.Errorf("%s not found (make deps installs it): %w", bin, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.CommandContext(ctx, bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--maxmemory", "0", "--protected-mode", "yes")
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rc, err := dialRedis(addr, time.Second)
		if err == nil {
			err = rc.ping()
			rc.Close()
			if err == nil {
				return addr, stop, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.Join(errors.New("redis-server did not answer within 10s"), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func medianOf(rs []dramRound, f func(dramRound) float64) float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	return benchutil.Median(xs)
}
