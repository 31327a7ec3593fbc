package store

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/transfer"
)

// BenchmarkSaveLoadDRAM measures the store alone on bench tiers' geometry
// (Qwen3-8B: 72 segments, 4 blocks of 32 KiB a page, 9 MiB pages; 64 pages
// saved in two requests of 32, then loaded into other blocks; a DRAM pool
// sized as bench tiers sizes the peer's). It reports save and load GB/s
// for each engine-buffer kind (a /dev/shm file, as bench tiers and a CPU
// engine have; anonymous memory; anonymous memory with huge pages), copy
// worker count and with the background sealer running or not, and
// save+seal: the saves' time plus the time to seal what they left unsealed
// (outside the timed loop, one core). Every load is checked byte for byte
// outside the timing.
//
//	go test -ldflags=-checklinkname=0 -run '^$' -bench SaveLoadDRAM -benchtime 20x -count 3 ./fabric/store/
func BenchmarkSaveLoadDRAM(b *testing.B) {
	for _, buf := range []string{"shm", "anon", "anon-huge"} {
		for _, workers := range []int{1, 2} {
			for _, seal := range []bool{false, true} {
				name := fmt.Sprintf("buf=%s/workers=%d/sealer=%v", buf, workers, seal)
				b.Run(name, func(b *testing.B) { benchSaveLoad(b, buf, workers, seal) })
			}
		}
	}
}

// bench tiers' geometry.
const (
	benchSegments   = 72
	benchBlockBytes = 32 << 10
	benchPerPage    = 4
	benchPages      = 64
	benchBatch      = 32
)

func benchSaveLoad(b *testing.B, buf string, workers int, seal bool) {
	defer func(w int) { copyWorkers = w }(copyWorkers)
	copyWorkers = workers
	s := benchStore(b)
	e := benchEngine(b, buf)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if seal {
		go s.RunSealer(ctx)
	}
	total := float64(e.PageBytes) * benchPages
	var saveD, loadD, sealD time.Duration
	for b.Loop() {
		keys := randKeys(b, benchPages)
		saveD += timeOps(b, keys, 0, func(r []PageReq, res []Result) { s.Save(ctx, e, r, false, res) })
		loadD += timeOps(b, keys, benchPages*benchPerPage, func(r []PageReq, res []Result) { s.Load(ctx, e, r, res) })
		b.StopTimer()
		t0 := time.Now()
		for s.sealSome(ctx) > 0 { // the sums still owed: what the peer's Drain waits for
		}
		sealD += time.Since(t0)
		checkLoaded(b, e)
		if _, err := s.Evict(ctx, catalog.TierDRAM, nil); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(total*float64(b.N)/saveD.Seconds()/1e9, "save-GB/s")
	b.ReportMetric(total*float64(b.N)/loadD.Seconds()/1e9, "load-GB/s")
	// Save with the CRCs it leaves to the sealer, as if they ran on the copies' cores.
	b.ReportMetric(total*float64(b.N)/(saveD+sealD).Seconds()/1e9, "save+seal-GB/s")
}

// timeOps runs op over the pages in requests of benchBatch and returns the
// time it took; every page must succeed.
func timeOps(b *testing.B, keys []pagekey.Key, first uint32, op func([]PageReq, []Result)) time.Duration {
	rs := make([]PageReq, len(keys))
	for i, k := range keys {
		rs[i] = PageReq{Key: k}
		for j := range benchPerPage {
			rs[i].Blocks = append(rs[i].Blocks, first+uint32(i*benchPerPage+j))
		}
	}
	res := make([]Result, len(keys))
	t0 := time.Now()
	for lo := 0; lo < len(rs); lo += benchBatch {
		op(rs[lo:lo+benchBatch], res[lo:lo+benchBatch])
	}
	d := time.Since(t0)
	mustAllOK(b, "op", res)
	return d
}

// checkLoaded compares the loaded blocks with the saved ones, segment by segment.
func checkLoaded(b *testing.B, e *Engine) {
	mem := e.Bufs[0].Host
	half := benchPages * benchPerPage * benchBlockBytes
	for seg := range benchSegments {
		base := seg * 2 * half
		if !bytes.Equal(mem[base:base+half], mem[base+half:base+2*half]) {
			b.Fatalf("segment %d: loaded bytes differ from saved ones", seg)
		}
		clear(mem[base+half : base+2*half]) // the next round must write them again
	}
}

// benchStore is a store over a DRAM pool sized as bench tiers sizes the
// peer's: 64 MiB slabs, the pages' bytes plus two slabs.
func benchStore(b *testing.B) *Store {
	dir := b.TempDir()
	pageBytes := uint64(benchSegments * benchPerPage * benchBlockBytes)
	slab := uint64(dram.DefaultSlabBytes)
	pool, err := dram.New(dram.Config{Bytes: slab * (benchPages*pageBytes/slab + 2), SlabBytes: slab})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Close() })
	cat, err := catalog.Open(catalog.Options{Dir: filepath.Join(dir, "catalog")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cat.Close() })
	return New(cat, pool, nil, Options{QueryBudget: 1 << 30, Registry: prometheus.NewRegistry(), Log: zerolog.Nop()})
}

// benchEngine is an engine session of bench tiers' geometry over a buffer
// of the given kind, with twice the pages' blocks (saved from the first
// half, loaded into the second).
func benchEngine(b *testing.B, kind string) *Engine {
	numBlocks := 2 * benchPages * benchPerPage
	size := benchSegments * numBlocks * benchBlockBytes
	mem := benchBuffer(b, kind, size)
	for i := 0; i < len(mem); i += 8 { // cheap distinct bytes: fill time is not measured
		mem[i] = byte(i >> 3)
		mem[i+1] = byte(i >> 11)
		mem[i+2] = byte(i >> 19)
	}
	g := transfer.Geometry{NumBlocks: uint32(numBlocks), BlocksPerPage: benchPerPage}
	for seg := range benchSegments {
		g.Segments = append(g.Segments, transfer.Segment{Offset: uint64(seg * numBlocks * benchBlockBytes), Stride: benchBlockBytes, BlockBytes: benchBlockBytes})
	}
	if err := g.Validate([]uint64{uint64(size)}); err != nil {
		b.Fatal(err)
	}
	l := pagekey.Layout{Model: "m", DType: "bf16", NumLayers: benchSegments / 2, KVHeads: 8, HeadDim: 128, TPSize: 1, PageTokens: 64, ByteLayout: "vllm-flash"}
	e := &Engine{Layout: l, FP: l.Fingerprint(), Geom: g, Bufs: []*transfer.Region{transfer.HostRegion("kv", mem)}}
	e.PageBytes = g.PageBytes()
	return e
}

// benchBuffer maps size bytes of the given kind, pre-faulted.
func benchBuffer(b *testing.B, kind string, size int) []byte {
	fd, flags := -1, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS
	if kind == "shm" {
		f, err := os.CreateTemp("/dev/shm", "orbitkv-storebench-")
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		b.Cleanup(func() { os.Remove(f.Name()) })
		if err := f.Truncate(int64(size)); err != nil {
			b.Fatal(err)
		}
		fd, flags = int(f.Fd()), unix.MAP_SHARED
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Munmap(mem) })
	if kind == "anon-huge" {
		if err := unix.Madvise(mem, unix.MADV_HUGEPAGE); err != nil {
			b.Fatal(err)
		}
	}
	if err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE); err != nil {
		b.Fatal(err)
	}
	return mem
}
