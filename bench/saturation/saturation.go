// Package saturation is `orbitkv bench saturation`: engine saves offered faster than the disk writes, the
// way the H200's SSD configuration saw them (docs/benchmarks.md, "Saves
// faster than the disk"). Two fresh in-process peers in one run: (A) DRAM
// only, the baseline; (B) the same DRAM and an SSD tier under --dir. The
// same load drives both: --streams goroutines on one engine session (as
// the vLLM connector's save and load threads share one), each looping over
// steps of the mix (satMix) for --seconds.
//
// It drives the peers through the engine API (benchutil.StartPeer) and reads
// their /metrics, /proc/self/io and a block profile of this process; it
// reaches nothing below fabric's public surface.
package saturation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/fabric"
	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// satBench is a run of the bench, Config with its working state.
type satBench struct {
	dir, shmDir string
	flash       engineclient.Flash
	dramBytes   bytesize.Size
	ssdBytes    bytesize.Size
	seconds     float64
	streams     int
	batch       int     // pages per save: one prompt's new pages
	reuse       float64 // probability that a step revisits an earlier prompt
	seed        uint64
	// allowMemoryFS lets a test put --dir on tmpfs (the numbers then
	// measure memory; the flag does not exist).
	allowMemoryFS bool
	scratch       string // under dir, made by run and removed when it returns
}

// Config is a saturation bench's run (units in each field).
type Config struct {
	Dir       string             // directory on the SSD (not tmpfs) for the peers' data and SSD tier; a scratch directory under it is removed at the end
	ShmDir    string             // directory for the engine's shared-memory KV buffer
	Flash     engineclient.Flash // page geometry
	DRAMBytes bytesize.Size      // DRAM pool of both peers
	SSDBytes  bytesize.Size      // SSD tier of peer B
	Seconds   float64            // seconds each peer is driven
	Streams   int                // concurrent savers/loaders on the one engine session
	Batch     int                // pages per save (one prompt's pages)
	Reuse     float64            // probability that a step revisits an earlier prompt
	Seed      uint64             // seed of the mix and of the page bytes
}

// DefaultConfig is `orbitkv bench saturation`'s default run.
func DefaultConfig() Config {
	return Config{Dir: "data/bench", ShmDir: "/dev/shm", Flash: benchutil.Qwen3Flash(), DRAMBytes: 1 << 30, SSDBytes: 6 << 30,
		Seconds: 20, Streams: 4, Batch: 8, Reuse: 0.5, Seed: 1}
}

// Run validates cfg, drives peer A (DRAM only), then peer B (DRAM and an
// SSD tier), then fio, and prints the table.
func Run(ctx context.Context, cfg Config, out io.Writer) error {
	b := satBench{dir: cfg.Dir, shmDir: cfg.ShmDir, flash: cfg.Flash, dramBytes: cfg.DRAMBytes, ssdBytes: cfg.SSDBytes,
		seconds: cfg.Seconds, streams: cfg.Streams, batch: cfg.Batch, reuse: cfg.Reuse, seed: cfg.Seed}
	if err := b.validate(); err != nil {
		return err
	}
	_, err := b.run(ctx, out)
	return err
}

// validate checks the flags, and refuses a --dir in memory: the SSD tier's
// writes would measure tmpfs, not a disk.
func (b *satBench) validate() error {
	var errs []error
	f := b.flash
	if f.Layers < 1 || f.KVHeads < 1 || f.HeadDim < 1 {
		errs = append(errs, fmt.Errorf("layers, kv-heads and head-dim must be positive (got %d, %d, %d)", f.Layers, f.KVHeads, f.HeadDim))
	}
	if b.seconds <= 0 {
		errs = append(errs, fmt.Errorf("seconds %v must be positive", b.seconds))
	}
	if b.streams < 1 || b.streams > 64 {
		errs = append(errs, fmt.Errorf("streams %d, want 1..64", b.streams))
	}
	if b.batch < 1 || b.batch > 1024 {
		errs = append(errs, fmt.Errorf("batch %d, want 1..1024", b.batch))
	}
	if b.reuse < 0 || b.reuse > 1 {
		errs = append(errs, fmt.Errorf("reuse %v, want 0..1", b.reuse))
	}
	if len(errs) == 0 && uint64(b.dramBytes) < 4*satSlotBytes(benchutil.FlashPageBytes(f)) {
		errs = append(errs, fmt.Errorf("dram-bytes %v holds fewer than 4 pages of %v", b.dramBytes, bytesize.Size(benchutil.FlashPageBytes(f))))
	}
	if b.ssdBytes < ssd.RegionBytes {
		errs = append(errs, fmt.Errorf("ssd-bytes %v is below one SSD region (%v)", b.ssdBytes, bytesize.Size(ssd.RegionBytes)))
	}
	if mfs := benchutil.MemoryFS(b.dir); mfs != "" && !b.allowMemoryFS {
		errs = append(errs, fmt.Errorf("--dir %s is on %s: the SSD tier would write to memory, not a disk (give --dir a directory on the SSD)", b.dir, mfs))
	}
	return errors.Join(errs...)
}

// satSlotBytes is a page's DRAM slot (its bytes rounded up to the alignment).
func satSlotBytes(pageBytes uint64) uint64 { return (pageBytes + 4095) &^ 4095 }

// satWindow is how many of the last prompts saved a revisit picks among:
// as many as both of B's tiers hold, so some revisits find their prompt in
// DRAM, some on SSD and some gone.
func (b *satBench) satWindow() int {
	prompt := uint64(b.batch) * benchutil.FlashPageBytes(b.flash)
	return max(1, int((uint64(b.dramBytes)+uint64(b.ssdBytes))/prompt))
}

// run drives peer A, then peer B, then fio, prints the table and returns
// the peers' results.
func (b *satBench) run(ctx context.Context, out io.Writer) ([]satResult, error) {
	scratch, cleanup, err := benchutil.ScratchDir(b.dir, "saturation")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	b.scratch = scratch
	b.flash.NumBlocks = 2 * b.streams * b.batch * (b.flash.PageTokens / b.flash.BlockTokens)
	pageBytes := benchutil.FlashPageBytes(b.flash)
	fmt.Fprintf(out, "orbitkv bench saturation: %d streams on one session, %d pages of %v per save, revisit probability %.2f among the last %d prompts, %vs per peer, seed %d\n",
		b.streams, b.batch, bytesize.Size(pageBytes), b.reuse, b.satWindow(), b.seconds, b.seed)
	fmt.Fprintf(out, "peers' data under %s (%s)\n\n", scratch, fsName(scratch))
	// Go's block profile attributes the saves' waits (satBlocked).
	runtime.SetBlockProfileRate(1)
	defer runtime.SetBlockProfileRate(0)
	var results []satResult
	for _, c := range []struct {
		label string
		ssd   bytesize.Size
	}{{"A: DRAM " + b.dramBytes.String(), 0}, {"B: DRAM " + b.dramBytes.String() + " + SSD " + b.ssdBytes.String(), b.ssdBytes}} {
		r, err := b.drivePeer(ctx, c.label, c.ssd)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.label, err)
		}
		results = append(results, r)
	}
	fio := b.fioWrite(ctx, pageBytes)
	printSaturation(out, results, fio)
	return results, nil
}

// fioWrite is fio's sequential O_DIRECT write rate on a fresh file in the
// scratch directory (block size = an SSD slot, the tier's queue depth), as
// bench ssd runs it; a reason instead when fio is missing or fails.
func (b *satBench) fioWrite(ctx context.Context, pageBytes uint64) satFio {
	size := min(uint64(b.ssdBytes), 2<<30)
	f := satFio{bytes: size}
	file := filepath.Join(b.scratch, "fio")
	defer os.Remove(file)
	bw, err := benchutil.FioBandwidth(ctx, file, "write", ssd.SlotBytes(pageBytes), ssd.DefaultQueueDepth, size)
	if err != nil {
		f.skipped = err.Error()
		return f
	}
	f.gbps = bw / 1e9
	return f
}

// peerConfig is the config of one of the run's peers: DRAM of --dram-bytes
// in 64 MiB slabs (as serve's default; smaller pools one slab), the SSD
// tier of ssdBytes (0: none) in files of up to 1 GiB, metrics on a free
// loopback port for the report.
func (b *satBench) peerConfig(name string, ssdBytes bytesize.Size) (fabric.Config, error) {
	cfg := fabric.DefaultConfig()
	cfg.DataDir = filepath.Join(b.scratch, name)
	cfg.DRAMBytes = b.dramBytes
	cfg.DRAMSlabBytes = bytesize.Size(min(64<<20, uint64(b.dramBytes)&^4095))
	cfg.SSDBytes = ssdBytes
	if ssdBytes > 0 {
		cfg.SSDFileBytes = bytesize.Size(min(1<<30, uint64(ssdBytes)/ssd.RegionBytes*ssd.RegionBytes))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return cfg, fmt.Errorf("free port for metrics: %w", err)
	}
	cfg.MetricsAddr = l.Addr().String()
	l.Close()
	return cfg, nil
}

// drivePeer starts a fresh peer, fills the engine buffer, drives the mix
// for --seconds and returns what it measured.
func (b *satBench) drivePeer(ctx context.Context, label string, ssdBytes bytesize.Size) (satResult, error) {
	name := "dram"
	if ssdBytes > 0 {
		name = "ssd"
	}
	cfg, err := b.peerConfig(name, ssdBytes)
	if err != nil {
		return satResult{}, err
	}
	be, err := benchutil.StartPeer(ctx, cfg, b.flash, filepath.Join(b.shmDir, "orbitkv-bench-sat-"+strconv.Itoa(os.Getpid())))
	if err != nil {
		return satResult{}, err
	}
	defer func() { be.Stop(); os.RemoveAll(cfg.DataDir) }() // B's SSD files: gigabytes
	kctx, kcancel := context.WithCancel(ctx)
	defer kcancel()
	go be.E.KeepAlive(kctx, 2*time.Second)
	d := newSatDriver(b, be)
	d.fill(b.seed)
	before, err := d.observe(cfg.MetricsAddr)
	if err != nil {
		return satResult{}, err
	}
	elapsed, tally, err := d.drive(ctx, time.Duration(b.seconds*float64(time.Second)))
	if err != nil {
		return satResult{}, err
	}
	after, err := d.observe(cfg.MetricsAddr)
	if err != nil {
		return satResult{}, err
	}
	return satResult{label: label, ssd: ssdBytes > 0, elapsed: elapsed, pageBytes: be.E.PageBytes, tally: tally, peer: after.since(before)}, nil
}

// satDriver drives one peer through the mix.
type satDriver struct {
	b   *satBench
	be  *benchutil.Engine
	mix *satMix
	per int // blocks per page
}

func newSatDriver(b *satBench, be *benchutil.Engine) *satDriver {
	return &satDriver{b: b, be: be, mix: newSatMix(b.reuse, b.satWindow()), per: b.flash.PageTokens / b.flash.BlockTokens}
}

// drive runs every stream until d elapses (each finishes the step it is
// in) and returns the time they took and their merged tally.
func (d *satDriver) drive(ctx context.Context, dur time.Duration) (time.Duration, satTally, error) {
	tallies := make([]satTally, d.b.streams)
	errs := make([]error, d.b.streams)
	start := time.Now()
	end := start.Add(dur)
	var wg sync.WaitGroup
	for st := range d.b.streams {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(d.b.seed, uint64(st)+1))
			tallies[st] = newSatTally()
			for ctx.Err() == nil && time.Now().Before(end) && errs[st] == nil {
				errs[st] = d.step(ctx, st, d.mix.step(rng), &tallies[st])
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return 0, satTally{}, err
	}
	total := newSatTally()
	for _, t := range tallies {
		total.merge(t)
	}
	return elapsed, total, nil
}

// step saves a new prompt and, when the mix says so, revisits an earlier
// one: looks up its first half with a lease, loads the hit pages (their
// bytes checked) and saves the whole prompt again — what vLLM does for a
// prompt whose prefix the peer holds, recomputing what it did not load.
func (d *satDriver) step(ctx context.Context, st int, s satStep, t *satTally) error {
	if err := d.save(ctx, st, s.fresh, &t.save); err != nil {
		return err
	}
	d.mix.saved(s.fresh)
	if s.revisit < 0 {
		return nil
	}
	if err := d.load(ctx, st, s.revisit, t); err != nil {
		return err
	}
	return d.save(ctx, st, s.revisit, &t.resave)
}
