package gpu

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/orbitkv/orbitkv/cuda"
	"github.com/orbitkv/orbitkv/fabric"
	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/crc32c"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/transfer"
)

// PeerConfig configures the part of `orbitkv bench gpu` that moves
// pages through the peer API: an in-process peer (DRAM pool pinned and
// mapped), an engine process holding Qwen3-8B KV blocks in GPU memory
// (this binary, re-run with --engine-child), one CUDA session over its IPC
// handle, and timed Save/Load operations of randomly scattered blocks.
type PeerConfig struct {
	Enabled     bool
	DRAM        bytesize.Size // peer DRAM pool
	EngineBytes bytesize.Size // engine KV allocation on the GPU
	BlockTokens []int         // engine block sizes, one table each (a page is 64 tokens)
	Concurrency int           // concurrent loads in the concurrency row
	Copiers     int           // peer --cuda-copiers
	Method      string        // peer --cuda-method; comma-separated, one peer (and its rows) each
	// RestorePitchMinRow is the peer's --cuda-restore-pitch-min-row.
	RestorePitchMinRow bytesize.Size
	child              string // internal: run as the engine process ("BYTES")
}

// RegisterFlags adds the flags of `bench gpu` beyond the basic ones:
// batch sizes, whether to print the copy-method tables, and the peer rows.
func RegisterFlags(fs *flag.FlagSet, g *Config) {
	fs.Func("pages", "pages per batch, comma separated (default 32,128)", func(s string) error {
		g.Pages = nil
		for _, f := range strings.Split(s, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err != nil || n <= 0 {
				return fmt.Errorf("pages %q", f)
			}
			g.Pages = append(g.Pages, n)
		}
		return nil
	})
	fs.BoolVar(&g.SkipTables, "skip-methods", false, "skip the copy-method tables (print only the peer rows)")
	g.Peer = registerPeerFlags(fs)
}

func registerPeerFlags(fs *flag.FlagSet) *PeerConfig {
	c := &PeerConfig{DRAM: 12 << 30, EngineBytes: 16 << 30}
	fs.BoolVar(&c.Enabled, "peer", true, "also measure save/restore through an in-process peer and a CUDA session")
	fs.Var(&c.DRAM, "peer-dram-bytes", "peer DRAM pool for the through-the-peer rows")
	fs.Var(&c.EngineBytes, "engine-bytes", "GPU memory of the engine process's KV blocks")
	fs.Func("block-tokens", "engine block sizes in tokens for the copy-method tables and the peer rows, comma separated (default 64,16)", func(s string) error {
		c.BlockTokens = nil
		for _, f := range strings.Split(s, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err != nil || n <= 0 || gpuPageTokens%n != 0 {
				return fmt.Errorf("block tokens %q must divide %d", f, gpuPageTokens)
			}
			c.BlockTokens = append(c.BlockTokens, n)
		}
		return nil
	})
	fs.IntVar(&c.Concurrency, "concurrency", 4, "concurrent loads in the concurrency row")
	fs.IntVar(&c.Copiers, "cuda-copiers", 4, "peer copiers per GPU (concurrent device copies)")
	fs.StringVar(&c.Method, "cuda-method", "auto", "peer copy methods for the peer rows, comma separated (one peer each)")
	fs.Var(&c.RestorePitchMinRow, "cuda-restore-pitch-min-row", "the peer's --cuda-restore-pitch-min-row")
	fs.StringVar(&c.child, "engine-child", "", "internal: run as the engine process")
	return c
}

// peerGPUEngineChild is the engine process: it allocates n bytes on the GPU,
// fills them with non-zero pseudo-random bytes, prints "HANDLE <hex>" and
// holds the allocation until stdin closes.
func peerGPUEngineChild(spec string, device int, in io.Reader, out io.Writer) error {
	var n uint64
	if _, err := fmt.Sscan(spec, &n); err != nil {
		return err
	}
	if err := cuda.Init(); err != nil {
		return err
	}
	d, err := cuda.Open(device)
	if err != nil {
		return err
	}
	defer d.Close()
	m, err := d.Alloc(n)
	if err != nil {
		return err
	}
	defer m.Free()
	chunk := make([]byte, min(n, 256<<20))
	fillParallel(chunk, 99)
	for off := uint64(0); off < n; off += uint64(len(chunk)) {
		part := chunk[:min(uint64(len(chunk)), n-off)]
		part[0] = byte(off >> 20) // no two chunks identical
		if err := d.CopyToDevice(m.Ptr+cuda.DevicePtr(off), part); err != nil {
			return err
		}
	}
	h, err := d.ExportIPC(m.Ptr)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "HANDLE %s\n", hex.EncodeToString(h[:]))
	_, _ = io.Copy(io.Discard, in) // until the parent closes stdin
	return nil
}

// peerBench is one run of the through-the-peer rows.
type peerBench struct {
	cfg    PeerConfig
	b      *gpuBench
	peer   *fabric.Peer
	conn   *grpc.ClientConn
	handle []byte
	rng    *mrand.Rand
}

func (b *gpuBench) peerTables(ctx context.Context, w io.Writer, pc PeerConfig) error {
	if len(pc.BlockTokens) == 0 {
		pc.BlockTokens = []int{64, 16}
	}
	dir, err := os.MkdirTemp("", "orbitkv-bench-gpu-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.CommandContext(ctx, self, "bench", "gpu", "--device", fmt.Sprint(b.cfg.Device), "--engine-child", fmt.Sprint(uint64(pc.EngineBytes)))
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	if err := child.Start(); err != nil {
		return fmt.Errorf("start engine process: %w", err)
	}
	defer func() { stdin.Close(); _ = child.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 2 || f[0] != "HANDLE" {
		return fmt.Errorf("engine process said %q: %v", line, err)
	}
	handle, err := hex.DecodeString(f[1])
	if err != nil {
		return err
	}
	crcReport(w, b.host.Bytes()[:min(b.host.Len(), 1<<30)])
	for _, method := range strings.Split(pc.Method, ",") {
		if err := b.peerRun(ctx, w, pc, strings.TrimSpace(method), dir, handle); err != nil {
			return err
		}
	}
	return nil
}

// peerRun starts an in-process peer copying by method and prints its rows.
func (b *gpuBench) peerRun(ctx context.Context, w io.Writer, pc PeerConfig, method, dir string, handle []byte) error {
	cfg := fabric.DefaultConfig()
	cfg.DataDir, cfg.MetricsAddr = dir, ""
	cfg.DRAMBytes, cfg.DRAMSlabBytes, cfg.SSDBytes = pc.DRAM, 64<<20, 0
	cfg.CUDA, cfg.CUDACopiers, cfg.CUDAMethod = "require", pc.Copiers, method
	cfg.CUDARestorePitchMinRow = pc.RestorePitchMinRow
	if err := cfg.Validate(); err != nil { // fills the socket path
		return err
	}
	start := time.Now()
	peer, err := fabric.New(cfg, zerolog.New(os.Stderr).Level(zerolog.WarnLevel))
	if err != nil {
		return err
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- peer.Run(pctx) }()
	defer func() { stop(); <-done }()
	conn, err := engineclient.Dial(cfg.Socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	fmt.Fprintf(w, "\nthrough the peer API: in-process peer, %v DRAM pool pinned+mapped (start %v), engine process with %v of KV blocks on the GPU, one CUDA session (IPC handle), --cuda-copiers %d --cuda-method %s --cuda-restore-pitch-min-row %v\n",
		pc.DRAM, time.Since(start).Round(time.Millisecond), pc.EngineBytes, pc.Copiers, method, pc.RestorePitchMinRow)
	pbench := &peerBench{cfg: pc, b: b, peer: peer, conn: conn, handle: handle, rng: mrand.New(mrand.NewPCG(b.cfg.Seed, 0x9ee7))}
	for _, bt := range pc.BlockTokens {
		for _, pages := range b.cfg.Pages {
			if err := pbench.table(ctx, w, bt, pages); err != nil {
				return err
			}
		}
	}
	return nil
}

// crcReport measures CRC-32C over host memory as the peer runs it
// (internal/crc32c), one thread and one goroutine per page up to 8, beside
// hash/crc32's on one thread.
func crcReport(w io.Writer, mem []byte) {
	rate := func(sum func()) float64 {
		t0 := time.Now()
		sum()
		return float64(len(mem)) / time.Since(t0).Seconds() / 1e9
	}
	tab := crc32.MakeTable(crc32.Castagnoli)
	std := rate(func() { _ = crc32.Checksum(mem, tab) })
	one := rate(func() { _ = crc32c.Checksum(mem) })
	part := len(mem) / 8
	eight := rate(func() {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() { _ = crc32c.Checksum(mem[i*part : (i+1)*part]) })
		}
		wg.Wait()
	})
	fmt.Fprintf(w, "CRC-32C on the host (SSD-durable saves checksum every page from its pinned slot; DRAM saves are sealed in the background), %s kernel: %.1f GB/s one thread, %.1f GB/s 8 threads over %d MiB; hash/crc32 %.1f GB/s one thread\n",
		crc32c.Kernel(), one, eight, len(mem)>>20, std)
}

// session opens a CUDA session in vLLM's FlashAttention layout over the
// engine allocation with blocks of bt tokens.
func (p *peerBench) session(ctx context.Context, bt int) (*engineclient.Engine, int, error) {
	blockBytes := uint64(gpuSegBytes / (gpuPageTokens / bt))
	size := uint64(p.cfg.EngineBytes)
	nb := int(size / (gpuPlanes * blockBytes))
	r := &pb.OpenSessionRequest{EngineId: "bench-gpu", BlockTokens: uint32(bt), NumBlocks: uint32(nb),
		Layout: &pb.Layout{Model: "Qwen/Qwen3-8B", Revision: fmt.Sprintf("bench-bt%d", bt), Dtype: "bf16", NumLayers: gpuLayers,
			KvHeads: gpuKVHeads, HeadDim: gpuHeadDim, TpSize: 1, PageTokens: gpuPageTokens, ByteLayout: "vllm-flash"},
		Buffers: []*pb.Buffer{{Kind: &pb.Buffer_Cuda{Cuda: &pb.CudaIpc{Handle: p.handle, Device: int32(p.b.cfg.Device)}}, SizeBytes: size}}}
	for pl := range gpuPlanes {
		r.Segments = append(r.Segments, &pb.Segment{Layer: uint32(pl / 2), Plane: uint32(pl % 2),
			Offset: uint64(pl) * uint64(nb) * blockBytes, BlockStride: blockBytes, BlockBytes: blockBytes})
	}
	e, err := engineclient.Open(ctx, p.conn, r)
	return e, nb, err
}

// refs draws pages of random distinct blocks (scattered over the pool).
func (p *peerBench) refs(keys [][]byte, nb, perPage int) []*pb.PageRef {
	perm := p.rng.Perm(nb)
	out := make([]*pb.PageRef, len(keys))
	for i, k := range keys {
		r := &pb.PageRef{Key: k}
		for j := range perPage {
			r.Blocks = append(r.Blocks, uint32(perm[i*perPage+j]))
		}
		out[i] = r
	}
	return out
}

func newKeys(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, 16)
		_, _ = rand.Read(out[i])
	}
	return out
}

func timed(ctx context.Context, op func(context.Context) (*pb.OpStatus, error)) (time.Duration, error) {
	t0 := time.Now()
	st, err := op(ctx)
	d := time.Since(t0)
	if err == nil {
		err = engineclient.AllOK(st)
	}
	return d, err
}

// table prints contiguous, per-block (naive) and through-the-peer rows for
// one block size and batch.
func (p *peerBench) table(ctx context.Context, w io.Writer, bt, pages int) error {
	e, nb, err := p.session(ctx, bt)
	if err != nil {
		return fmt.Errorf("open CUDA session: %w", err)
	}
	defer e.Close(context.Background())
	perPage := gpuPageTokens / bt
	total := uint64(pages) * gpuPageBytes
	reps := min(p.b.cfg.Reps, 8)
	fmt.Fprintf(w, "\npeer: %d-token blocks (%d per page, %d KiB segments, %d descriptors), batch of %d pages = %d MiB, %d blocks per plane, median of %d\n",
		bt, perPage, gpuSegBytes/perPage>>10, pages*perPage*gpuPlanes, pages, total>>20, nb, reps)
	contig, err := p.b.contiguous(ctx, total)
	if err != nil {
		return err
	}
	naive, err := p.b.perBlock(ctx, pages, perPage)
	if err != nil {
		return err
	}
	var saves, loads []time.Duration
	var saved [][]byte
	st0, ph0 := p.peer.CUDAStats()[p.b.cfg.Device], p.peer.GPUPhases()
	for range reps + 1 {
		keys := newKeys(pages)
		refs := p.refs(keys, nb, perPage) // drawn before the clock starts
		d, err := timed(ctx, func(c context.Context) (*pb.OpStatus, error) {
			return e.Save(c, refs, pb.Durability_DURABILITY_DRAM)
		})
		if err != nil {
			return fmt.Errorf("save through the peer: %w", err)
		}
		saves, saved = append(saves, d), keys
	}
	st1, ph1 := p.peer.CUDAStats()[p.b.cfg.Device], p.peer.GPUPhases()
	for range reps + 1 {
		refs := p.refs(saved, nb, perPage)
		d, err := timed(ctx, func(c context.Context) (*pb.OpStatus, error) { return e.Load(c, refs) })
		if err != nil {
			return fmt.Errorf("load through the peer: %w", err)
		}
		loads = append(loads, d)
	}
	st2, ph2 := p.peer.CUDAStats()[p.b.cfg.Device], p.peer.GPUPhases()
	// Inside the peer: GB/s of the transport alone (copier in hand to bytes
	// in place; DRAM saves are checksummed later, by the sealer).
	inner := func(a, b transfer.CUDAStats) float64 {
		return float64(b.Bytes-a.Bytes) / (b.CopyTime - a.CopyTime).Seconds() / 1e9
	}
	conc, err := p.concurrent(ctx, e, saved, nb, perPage, reps)
	if err != nil {
		return err
	}
	gbps := func(ds []time.Duration) float64 {
		ds = slices.Clone(ds[1:]) // the first is a warm-up
		slices.Sort(ds)
		return float64(total) / ds[len(ds)/2].Seconds() / 1e9
	}
	rs, ss := gbps(loads), gbps(saves)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "path\trestore GB/s\t/contig\tsave GB/s\t/contig\t\n")
	fmt.Fprintf(tw, "contiguous pinned copy, 1 cuMemcpyAsync (the limit)\t%.1f\t1.00\t%.1f\t1.00\t\n", contig[0], contig[1])
	fmt.Fprintf(tw, "per-block cuMemcpyAsync, 1 stream (naive)\t%.1f\t%.2f\t%.1f\t%.2f\t\n", naive[0], naive[0]/contig[0], naive[1], naive[1]/contig[1])
	fmt.Fprintf(tw, "OrbitKV peer API (Load / Save to DRAM, RPC to completion)\t%.1f\t%.2f\t%.1f\t%.2f\t\n", rs, rs/contig[0], ss, ss/contig[1])
	fmt.Fprintf(tw, "  of which the CUDA transport (copier in hand to bytes in place), all reps\t%.1f\t%.2f\t%.1f\t%.2f\t\n",
		inner(st1, st2), inner(st1, st2)/contig[0], inner(st0, st1), inner(st0, st1)/contig[1])
	fmt.Fprintf(tw, "OrbitKV peer API, %d concurrent loads of %d pages\t%.1f\t%.2f\t\t\t\n", p.cfg.Concurrency, pages/p.cfg.Concurrency, conc, conc/contig[0])
	if err := tw.Flush(); err != nil {
		return err
	}
	phaseLine(w, "restore", ph1, ph2, loads)
	phaseLine(w, "save", ph0, ph1, saves)
	fmt.Fprintf(w, "device batches by copy method: restore %s; save %s\n", methodDelta(st1, st2), methodDelta(st0, st1))
	fmt.Fprintf(w, "SUMMARY peer bt=%d pages=%d restore %.1f GB/s = %.0f%% of contiguous %.1f; save %.1f GB/s = %.0f%% of contiguous %.1f; naive %.0f%%/%.0f%% (target ≥ 90%%)\n",
		bt, pages, rs, 100*rs/contig[0], contig[0], ss, 100*ss/contig[1], contig[1], 100*naive[0]/contig[0], 100*naive[1]/contig[1])
	return nil
}

// phaseLine prints where one kind of operation spent its time inside the
// peer between two snapshots (mean per operation, warm-up included), and
// what the caller saw around it: RPCs, scheduling, the completion's notice.
func phaseLine(w io.Writer, what string, a, b fabric.GPUPhases, seen []time.Duration) {
	op := map[string]string{"restore": "load", "save": "save"}[what]
	n := b.Ops[op] - a.Ops[op]
	if n <= 0 {
		return
	}
	var inside time.Duration
	var parts []string
	for _, ph := range b.Order[op] {
		d := (b.Phase[op][ph] - a.Phase[op][ph]) / time.Duration(n)
		inside += d
		parts = append(parts, fmt.Sprintf("%s %.3f", ph, d.Seconds()*1e3))
	}
	var total time.Duration
	for _, d := range seen {
		total += d
	}
	mean := total / time.Duration(len(seen))
	fmt.Fprintf(w, "PHASES %s (ms per op, mean of %d): %s; inside the peer %.3f; seen by the caller %.3f (RPCs and notice %.3f)\n",
		what, n, strings.Join(parts, ", "), inside.Seconds()*1e3, mean.Seconds()*1e3, (mean-inside).Seconds()*1e3)
}

// concurrent runs Concurrency loads of pages/Concurrency pages at once and
// returns the aggregate GB/s (median over reps).
func (p *peerBench) concurrent(ctx context.Context, e *engineclient.Engine, keys [][]byte, nb, perPage, reps int) (float64, error) {
	c := p.cfg.Concurrency
	per := len(keys) / c
	if per == 0 {
		return 0, errors.New("fewer pages than concurrent loads")
	}
	var ds []time.Duration
	for range reps + 1 {
		refs := p.refs(keys[:per*c], nb, perPage)
		errs := make([]error, c)
		var wg sync.WaitGroup
		t0 := time.Now()
		for i := range c {
			wg.Go(func() {
				_, errs[i] = timed(ctx, func(cx context.Context) (*pb.OpStatus, error) { return e.Load(cx, refs[i*per:(i+1)*per]) })
			})
		}
		wg.Wait()
		ds = append(ds, time.Since(t0))
		if err := errors.Join(errs...); err != nil {
			return 0, fmt.Errorf("concurrent loads: %w", err)
		}
	}
	ds = ds[1:]
	slices.Sort(ds)
	return float64(per*c) * gpuPageBytes / ds[len(ds)/2].Seconds() / 1e9, nil
}

// perBlock times one cuMemcpyAsync per block per plane (the naive engine
// loop) for a batch of pages with perPage blocks each.
func (b *gpuBench) perBlock(ctx context.Context, pages, perPage int) ([2]float64, error) {
	sets := b.placements(pages)
	segs := make([][]cuda.Segment, len(sets))
	for i, pl := range sets {
		segs[i] = split(b.segments(pl, func(page int) uint64 { return uint64(pl.slots[page]) * gpuPageBytes }), perPage)
	}
	c, err := b.d.NewCopier(cuda.CopierConfig{Method: cuda.MethodPerSegment, MaxSegments: len(segs[0])})
	if err != nil {
		return [2]float64{}, err
	}
	defer c.Close()
	var out [2]float64
	n := float64(pages) * gpuPageBytes
	for dir, run := range []func(context.Context, *cuda.HostRegion, []cuda.Segment) error{c.Restore, c.Save} {
		t, err := b.timeRuns(ctx, func(i int) error { return run(ctx, b.host, segs[i%len(segs)]) })
		if err != nil {
			return out, err
		}
		out[dir] = n / t.Seconds() / 1e9
	}
	return out, nil
}

// methodDelta lists the device batches between two snapshots by the copy
// method they went by ("batch 21, pitched 3").
func methodDelta(a, b transfer.CUDAStats) string {
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(b.ByMethod)) {
		if n := b.ByMethod[m] - a.ByMethod[m]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", m, n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
