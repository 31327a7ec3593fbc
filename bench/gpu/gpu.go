// Package gpu is `orbitkv bench gpu`: restore (host → device) and save
// (device → host) of scattered Qwen3-8B pages with every copy method of the
// cuda package, beside a contiguous pinned copy of the same bytes, then the
// same through the peer (an in-process fabric peer and an engine process
// holding its KV blocks on the GPU, over the engine API). The method tables
// call the cuda package directly: they measure its copy methods, the layer
// the peer's GPU path is built on, so they reach below fabric on purpose.
package gpu

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/orbitkv/orbitkv/cuda"
)

// Qwen3-8B KV geometry: a 64-token page holds, per layer, one K and one V
// segment of 64 tokens × 8 kv heads × 128 dims × 2 bytes (bf16).
const (
	gpuPageTokens = 64
	gpuLayers     = 36
	gpuKVHeads    = 8
	gpuHeadDim    = 128
	gpuSegBytes   = gpuPageTokens * gpuKVHeads * gpuHeadDim * 2 // 128 KiB
	gpuPlanes     = gpuLayers * 2                               // (layer, K|V)
	gpuPageBytes  = gpuPlanes * gpuSegBytes                     // 9 MiB
)

// Config configures `orbitkv bench gpu`; zero fields take their defaults.
type Config struct {
	Device    int    // CUDA ordinal
	Pages     []int  // pages per batch, one table each (default 32 and 128: 2K and 8K tokens)
	PoolBytes uint64 // device pool standing in for the engine's KV blocks, bytes (default 16 GiB)
	HostBytes uint64 // pinned host pool standing in for the DRAM tier, bytes (default 2 GiB)
	Reps      int    // timed batches per method and direction; the median is reported (default 20)
	Warmup    int    // untimed batches first (default 3)
	Streams   []int  // stream counts tried for the multi-stream method (default 2, 4, 8)
	Sets      int    // random page placements rotated through (default 8)
	Seed      uint64 // placement and data seed

	BlockTokens []int       // engine block sizes of the copy-method tables (default 64 and 16: one table each)
	SkipTables  bool        // skip the copy-method tables
	Peer        *PeerConfig // the through-the-peer rows (peer.go); nil skips them
}

func (c *Config) setDefaults() {
	if len(c.Pages) == 0 {
		c.Pages = []int{32, 128}
	}
	if c.PoolBytes == 0 {
		c.PoolBytes = 16 << 30
	}
	if c.HostBytes == 0 {
		c.HostBytes = 2 << 30
	}
	if c.Reps == 0 {
		c.Reps = 20
	}
	if c.Warmup == 0 {
		c.Warmup = 3
	}
	if len(c.Streams) == 0 {
		c.Streams = []int{2, 4, 8}
	}
	if c.Sets == 0 {
		c.Sets = 8
	}
	if len(c.BlockTokens) == 0 {
		c.BlockTokens = []int{64, 16}
	}
}

// gpuBench is the state of one run: the device, a device pool laid out as
// [plane][block] segments, a pinned host pool of page slots, and a small
// pinned scratch region for the correctness check of each method.
type gpuBench struct {
	cfg     Config
	d       *cuda.Device
	pool    *cuda.DeviceMem
	host    *cuda.HostRegion
	scratch *cuda.HostRegion
	blocks  int // blocks per plane
	slots   int // page slots in the host pool
	rng     *rand.Rand
}

// Run measures restore (host → device) and save (device → host) of
// scattered Qwen3-8B pages with every copy method, next to a contiguous
// pinned copy of the same bytes, and prints one table per batch size.
func Run(ctx context.Context, cfg Config, w io.Writer) error {
	cfg.setDefaults()
	if cfg.Peer != nil && cfg.Peer.child != "" {
		return peerGPUEngineChild(cfg.Peer.child, cfg.Device, os.Stdin, w)
	}
	b, err := newGPUBench(cfg)
	if err != nil {
		return err
	}
	defer b.close()
	if err := b.describe(w); err != nil {
		return err
	}
	for _, pages := range cfg.Pages {
		if err := ctx.Err(); err != nil {
			return err
		}
		if cfg.SkipTables {
			break
		}
		for _, bt := range cfg.BlockTokens {
			if err := b.table(ctx, w, pages, gpuPageTokens/bt); err != nil {
				return err
			}
		}
	}
	if cfg.Peer != nil && cfg.Peer.Enabled {
		return b.peerTables(ctx, w, *cfg.Peer)
	}
	return nil
}

func newGPUBench(cfg Config) (*gpuBench, error) {
	if err := cuda.Init(); err != nil {
		return nil, err
	}
	d, err := cuda.Open(cfg.Device)
	if err != nil {
		return nil, err
	}
	b := &gpuBench{cfg: cfg, d: d, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6b76))}
	b.blocks = int(cfg.PoolBytes / gpuPageBytes)
	b.slots = int(cfg.HostBytes / gpuPageBytes)
	if maxPages := slices.Max(cfg.Pages); b.blocks < maxPages || b.slots < maxPages {
		d.Close()
		return nil, fmt.Errorf("bench gpu: %d pages per batch need %d blocks and slots; pool has %d, host %d",
			maxPages, maxPages, b.blocks, b.slots)
	}
	if b.pool, err = d.Alloc(uint64(b.blocks) * gpuPageBytes); err != nil {
		b.close()
		return nil, err
	}
	if b.host, err = registerMapped(d, uint64(b.slots)*gpuPageBytes); err != nil {
		b.close()
		return nil, err
	}
	fillParallel(b.host.Bytes(), cfg.Seed)
	if b.scratch, err = registerMapped(d, 8*gpuPageBytes); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// registerMapped maps n pre-faulted anonymous bytes (as the DRAM pool does)
// and registers them with the driver.
func registerMapped(d *cuda.Device, n uint64) (*cuda.HostRegion, error) {
	mem, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", n, err)
	}
	h, err := d.RegisterHost(mem)
	if err != nil {
		_ = syscall.Munmap(mem)
		return nil, err
	}
	return h, nil
}

func unregisterMapped(h *cuda.HostRegion) {
	if h != nil {
		mem := h.Bytes()
		_ = h.Unregister()
		_ = syscall.Munmap(mem)
	}
}

func (b *gpuBench) close() {
	unregisterMapped(b.scratch)
	unregisterMapped(b.host)
	if b.pool != nil {
		_ = b.pool.Free()
	}
	_ = b.d.Close()
}

// fillParallel fills b with pseudo-random bytes (never time copies of zeros).
func fillParallel(b []byte, seed uint64) {
	var wg sync.WaitGroup
	n := runtime.NumCPU()
	part := (len(b)/n + 7) &^ 7
	for i := 0; i < len(b); i += part {
		chunk := b[i:min(i+part, len(b))]
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(i)))
			for j := 0; j+8 <= len(chunk); j += 8 {
				v := r.Uint64()
				for k := range 8 {
					chunk[j+k] = byte(v >> (8 * k))
				}
			}
		})
	}
	wg.Wait()
}

func (b *gpuBench) describe(w io.Writer) error {
	info, err := b.d.Info()
	if err != nil {
		return err
	}
	ver, _ := cuda.DriverVersion()
	fmt.Fprintf(w, "gpu %d: %s (sm_%d%d, %d SMs, %d copy engines, %.0f GiB), PCIe gen%d x%d (max gen%d x%d), CUDA driver %d.%d, cuMemcpyBatchAsync %v\n",
		info.Ordinal, info.Name, info.ComputeMajor, info.ComputeMinor, info.SMs, info.CopyEngines,
		float64(info.TotalMemory)/(1<<30), info.PCIeGen, info.PCIeWidth, info.PCIeMaxGen, info.PCIeMaxWidth,
		ver/1000, ver%1000/10, cuda.HasBatchCopy())
	fmt.Fprintf(w, "page: Qwen3-8B, %d tokens × %d layers × {K,V} × %d kv heads × %d dims × bf16 = %d segments of %d KiB (%d MiB)\n",
		gpuPageTokens, gpuLayers, gpuKVHeads, gpuHeadDim, gpuPlanes, gpuSegBytes>>10, gpuPageBytes>>20)
	fmt.Fprintf(w, "device pool %.1f GiB (%d blocks per plane), pinned host pool %.1f GiB (%d page slots), median of %d batches over %d random placements\n",
		float64(b.pool.Size)/(1<<30), b.blocks, float64(b.host.Len())/(1<<30), b.slots, b.cfg.Reps, b.cfg.Sets)
	return nil
}

// placement is one batch: page i from host slot slots[i] into block blocks[i].
type placement struct{ slots, blocks []int }

func (b *gpuBench) placements(pages int) []placement {
	out := make([]placement, b.cfg.Sets)
	for i := range out {
		out[i] = placement{b.rng.Perm(b.slots)[:pages], b.rng.Perm(b.blocks)[:pages]}
	}
	return out
}

// segments lists every (page, plane) copy of p; the device pool is laid out
// [plane][block], as an engine keeps one KV tensor per layer and K/V.
func (b *gpuBench) segments(p placement, slotBase func(page int) uint64) []cuda.Segment {
	segs := make([]cuda.Segment, 0, len(p.slots)*gpuPlanes)
	for i := range p.slots {
		for pl := range gpuPlanes {
			segs = append(segs, cuda.Segment{
				HostOff: slotBase(i) + uint64(pl)*gpuSegBytes,
				Dev:     b.pool.Ptr + cuda.DevicePtr((uint64(pl)*uint64(b.blocks)+uint64(p.blocks[i]))*gpuSegBytes),
				Len:     gpuSegBytes,
			})
		}
	}
	return segs
}

// split cuts every (page, plane) segment into perPage blocks, a page's
// blocks in reverse device order so that no two copies merge (an engine's
// blocks of one page are rarely consecutive).
func split(segs []cuda.Segment, perPage int) []cuda.Segment {
	if perPage <= 1 {
		return segs
	}
	out := make([]cuda.Segment, 0, len(segs)*perPage)
	for _, s := range segs {
		n := s.Len / uint64(perPage)
		for j := range uint64(perPage) {
			back := uint64(perPage) - 1 - j
			out = append(out, cuda.Segment{HostOff: s.HostOff + j*n, Dev: s.Dev + cuda.DevicePtr(back*n), Len: n})
		}
	}
	return out
}

// variant is one row of the table.
type variant struct {
	name string
	cfg  cuda.CopierConfig
}

func (b *gpuBench) variants() []variant {
	vs := []variant{{"per-segment cuMemcpyAsync, 1 stream (naive)", cuda.CopierConfig{Method: cuda.MethodPerSegment}}}
	for _, n := range b.cfg.Streams {
		vs = append(vs, variant{fmt.Sprintf("per-segment cuMemcpyAsync, %d streams", n), cuda.CopierConfig{Method: cuda.MethodStreams, Streams: n}})
	}
	if cuda.HasBatchCopy() {
		vs = append(vs,
			variant{"cuMemcpyBatchAsync, 1 stream", cuda.CopierConfig{Method: cuda.MethodBatch, Streams: 1}},
			variant{"cuMemcpyBatchAsync, 1 stream, restores read in any order", cuda.CopierConfig{Method: cuda.MethodBatch, Streams: 1, BatchSrcAnyOrder: true}},
			variant{"cuMemcpyBatchAsync, 2 streams", cuda.CopierConfig{Method: cuda.MethodBatch, Streams: 2}},
			variant{"cuMemcpyBatchAsync, 3 streams", cuda.CopierConfig{Method: cuda.MethodBatch, Streams: 3}},
			variant{"cuMemcpyBatchAsync, 4 streams", cuda.CopierConfig{Method: cuda.MethodBatch, Streams: 4}},
			variant{"cuMemcpyBatchAsync, 4 streams, restores read in any order", cuda.CopierConfig{Method: cuda.MethodBatch, Streams: 4, BatchSrcAnyOrder: true}},
			variant{"cuMemcpyBatchAsync, 4 streams, prefer-overlap flag", cuda.CopierConfig{Method: cuda.MethodBatch, Streams: 4, BatchFlags: 1}})
	}
	vs = append(vs,
		variant{"pitched cuMemcpy2DAsync (a page's planes per copy), 1 stream", cuda.CopierConfig{Method: cuda.MethodPitched, Streams: 1}},
		variant{"pitched cuMemcpy2DAsync, 2 streams", cuda.CopierConfig{Method: cuda.MethodPitched, Streams: 2}},
		variant{"pitched cuMemcpy2DAsync, 3 streams", cuda.CopierConfig{Method: cuda.MethodPitched, Streams: 3}})
	return append(vs,
		variant{"gather/scatter kernel, 64 KiB chunks × 256 threads", cuda.CopierConfig{Method: cuda.MethodKernel}},
		variant{"gather/scatter kernel, 32 KiB chunks × 256 threads", cuda.CopierConfig{Method: cuda.MethodKernel, KernelChunk: 32 << 10}},
		variant{"gather/scatter kernel, 128 KiB chunks × 512 threads", cuda.CopierConfig{Method: cuda.MethodKernel, KernelChunk: 128 << 10, KernelThreads: 512}},
		variant{"auto", cuda.CopierConfig{}},
		variant{"auto, restores pitched only for rows of 64 KiB or more", cuda.CopierConfig{RestorePitchMinRow: 64 << 10}})
}

// table prints the contiguous limits and every variant for one batch size.
func (b *gpuBench) table(ctx context.Context, w io.Writer, pages, perPage int) error {
	total := uint64(pages) * gpuPageBytes
	fmt.Fprintf(w, "\nbatch of %d pages (%d tokens), %d-token blocks: %d segments of %d KiB, %d MiB\n", pages, pages*gpuPageTokens,
		gpuPageTokens/perPage, pages*gpuPlanes*perPage, gpuSegBytes/perPage>>10, total>>20)
	contig, err := b.contiguous(ctx, total)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "method\trestore GB/s\t/contig\tsave GB/s\t/contig\tcheck\t\n")
	fmt.Fprintf(tw, "contiguous pinned copy, 1 cuMemcpyAsync (the limit)\t%.1f\t1.00\t%.1f\t1.00\t\t\n", contig[0], contig[1])
	sets := b.placements(pages)
	best := [2]struct {
		name string
		gbps float64
	}{}
	for _, v := range b.variants() {
		res, method, streams, err := b.measure(ctx, v.cfg, sets, perPage)
		if err != nil {
			fmt.Fprintf(tw, "%s\terror: %v\t\t\t\t\t\n", v.name, err)
			continue
		}
		check := "ok"
		if err := b.check(ctx, v.cfg, sets[0], perPage); err != nil {
			check = "FAILED: " + err.Error()
		}
		name := v.name
		if v.cfg.Method == cuda.MethodAuto {
			name = fmt.Sprintf("%s (pitched where a batch folds, else %v over %d streams)", v.name, method, streams)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.1f\t%.2f\t%s\t\n", name, res[0], res[0]/contig[0], res[1], res[1]/contig[1], check)
		for dir := range 2 {
			if res[dir] > best[dir].gbps && check == "ok" {
				best[dir].name, best[dir].gbps = name, res[dir]
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "best restore: %s, %.1f GB/s = %.0f%% of contiguous; best save: %s, %.1f GB/s = %.0f%% of contiguous (target ≥ 90%%)\n",
		best[0].name, best[0].gbps, 100*best[0].gbps/contig[0], best[1].name, best[1].gbps, 100*best[1].gbps/contig[1])
	return nil
}

// contiguous times one copy of n bytes each way: host slot 0.. → pool start.
func (b *gpuBench) contiguous(ctx context.Context, n uint64) ([2]float64, error) {
	c, err := b.d.NewCopier(cuda.CopierConfig{Method: cuda.MethodPerSegment})
	if err != nil {
		return [2]float64{}, err
	}
	defer c.Close()
	seg := []cuda.Segment{{HostOff: 0, Dev: b.pool.Ptr, Len: n}}
	var out [2]float64
	for dir, run := range []func(context.Context, *cuda.HostRegion, []cuda.Segment) error{c.Restore, c.Save} {
		t, err := b.timeRuns(ctx, func(int) error { return run(ctx, b.host, seg) })
		if err != nil {
			return out, err
		}
		out[dir] = float64(n) / t.Seconds() / 1e9
	}
	return out, nil
}

// measure times restore and save of the rotating placements with cfg.
func (b *gpuBench) measure(ctx context.Context, cfg cuda.CopierConfig, sets []placement, perPage int) (_ [2]float64, _ cuda.Method, streams int, _ error) {
	var out [2]float64
	segs := make([][]cuda.Segment, len(sets))
	for i, p := range sets {
		segs[i] = split(b.segments(p, func(page int) uint64 { return uint64(p.slots[page]) * gpuPageBytes }), perPage)
	}
	cfg.MaxSegments = max(cfg.MaxSegments, len(segs[0]))
	c, err := b.d.NewCopier(cfg)
	if err != nil {
		return out, 0, 0, err
	}
	defer c.Close()
	n := float64(len(sets[0].slots)) * gpuPageBytes
	for dir, run := range []func(context.Context, *cuda.HostRegion, []cuda.Segment) error{c.Restore, c.Save} {
		t, err := b.timeRuns(ctx, func(i int) error { return run(ctx, b.host, segs[i%len(segs)]) })
		if err != nil {
			return out, 0, 0, err
		}
		out[dir] = n / t.Seconds() / 1e9
	}
	return out, c.Method(), c.Config().Streams, nil
}

// timeRuns runs Warmup untimed then Reps timed batches; returns the median.
func (b *gpuBench) timeRuns(ctx context.Context, run func(i int) error) (time.Duration, error) {
	for i := range b.cfg.Warmup {
		if err := run(i); err != nil {
			return 0, err
		}
	}
	ts := make([]time.Duration, 0, b.cfg.Reps)
	for i := range b.cfg.Reps {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		start := time.Now()
		if err := run(i); err != nil {
			return 0, err
		}
		ts = append(ts, time.Since(start))
	}
	slices.Sort(ts)
	return ts[len(ts)/2], nil
}

// check verifies cfg byte for byte on up to 8 pages of p: restore with cfg
// then save with the naive method into scratch, and restore with the naive
// method then save with cfg, each compared with the source pages.
func (b *gpuBench) check(ctx context.Context, cfg cuda.CopierConfig, p placement, perPage int) error {
	k := min(len(p.slots), 8)
	p = placement{p.slots[:k], p.blocks[:k]}
	naive, err := b.d.NewCopier(cuda.CopierConfig{Method: cuda.MethodPerSegment})
	if err != nil {
		return err
	}
	defer naive.Close()
	src := split(b.segments(p, func(i int) uint64 { return uint64(p.slots[i]) * gpuPageBytes }), perPage)
	dst := split(b.segments(p, func(i int) uint64 { return uint64(i) * gpuPageBytes }), perPage)
	cfg.MaxSegments = max(cfg.MaxSegments, len(src))
	c, err := b.d.NewCopier(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	for _, pair := range [][2]*cuda.Copier{{c, naive}, {naive, c}} {
		clear(b.scratch.Bytes())
		if err := pair[0].Restore(ctx, b.host, src); err != nil {
			return err
		}
		if err := pair[1].Save(ctx, b.scratch, dst); err != nil {
			return err
		}
		hb, sb := b.host.Bytes(), b.scratch.Bytes()
		for i, slot := range p.slots {
			want := hb[uint64(slot)*gpuPageBytes : uint64(slot+1)*gpuPageBytes]
			if !bytes.Equal(sb[uint64(i)*gpuPageBytes:uint64(i+1)*gpuPageBytes], want) {
				return fmt.Errorf("page %d differs after %v restore, %v save", i, pair[0].Method(), pair[1].Method())
			}
		}
	}
	return nil
}
