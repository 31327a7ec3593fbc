package fabric

import (
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/orbitkv/orbitkv/cuda"
	"github.com/orbitkv/orbitkv/fabric/store"
	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// TestGPUStagedHandoff is the same-host P/D handoff through the HBM stage
// on real GPUs: a producer engine's DRAM save fills the stage of its GPU
// (device-to-device, in the peer's context), and a consumer engine — on GPU
// 1 where there are two, else a second process on GPU 0 — loads the pages
// into other scattered blocks straight from the stage. Every plane of the
// consumer's allocation is compared by digest with the blocks it must hold
// (the producer's pages in the loaded blocks, its own bytes everywhere
// else), and the counters say every page came from HBM, none from DRAM. A
// second load after the stage is overwritten by newer pages comes from
// DRAM, and is compared the same way.
func TestGPUStagedHandoff(t *testing.T) {
	requireGPU(t)
	consDev := 0
	if n, _ := cuda.DeviceCount(); n >= 2 {
		consDev = 1
	}
	t.Logf("producer on GPU 0, consumer on GPU %d", consDev)
	cfg := smallConfig(t.TempDir())
	cfg.DRAMBytes, cfg.DRAMSlabBytes = 256<<20, 16<<20
	cfg.CUDA = "require"
	g := gpuKV{name: "flash", layers: 4, numBlocks: 256, blockBytes: 32 << 10, perPage: 4} // 1 MiB pages
	cfg.HBMStageBytes = 16 << 20                                                           // 16 slots
	tp := startPeer(t, cfg)
	prod := startGPUEngineOn(t, g.size(), 42, 0)
	cons := startGPUEngineOn(t, g.size(), 43, consDev)
	open := func(e *gpuEngine, dev int) *engineclient.Engine {
		req := g.request(e.handle, 0, g.size())
		req.Buffers[0].GetCuda().Device = int32(dev)
		s, err := engineclient.Open(ctx(t), tp.conn, req)
		if err != nil {
			t.Fatalf("open a CUDA session on GPU %d: %v", dev, err)
		}
		return s
	}
	ps, cs := open(prod, 0), open(cons, consDev)
	r := rand.New(rand.NewPCG(7, 8))
	keys, src := g.pagesOf(r, 12)
	okOp(t)(ps.Save(ctx(t), pageRefs(keys, src), pb.Durability_DURABILITY_DRAM))
	wantCounts(t, tp, map[string]string{stagedOK: "12"})

	load := func(keys [][]byte, src [][]uint32, wantHBM, wantDRAM string) {
		t.Helper()
		_, dst := g.pagesOf(r, len(keys))
		for j := range dst {
			g.place(cons.mirror, g.blob(prod.mirror, src[j]), dst[j])
		}
		st, err := cs.Load(ctx(t), pageRefs(keys, dst))
		if err == nil {
			err = engineclient.AllOK(st)
		}
		if err != nil {
			t.Fatalf("consumer load: %v", err)
		}
		if bad := g.badPlanes(cons); len(bad) > 0 {
			t.Fatalf("consumer planes differ after the load: %v", bad)
		}
		wantCounts(t, tp, map[string]string{hbmLoaded: wantHBM, dramLoaded: wantDRAM})
	}
	start := time.Now()
	load(keys, src, "12", "0")
	t.Logf("12 pages (12 MiB) GPU 0 stage -> GPU %d blocks in %v (with the digests)", consDev, time.Since(start))

	newer, nsrc := g.pagesOf(r, 16) // fills the 16 slots: the first 12 pages' are reused
	okOp(t)(ps.Save(ctx(t), pageRefs(newer, nsrc), pb.Durability_DURABILITY_DRAM))
	load(keys[:4], src[:4], "12", "4")
	load(newer[:4], nsrc[:4], "16", "4")
	for _, s := range []*engineclient.Engine{ps, cs} {
		if err := s.Close(ctx(t)); err != nil {
			t.Error(err)
		}
	}
	for ord, gd := range tp.p.gpu.mu.devs {
		t.Logf("GPU %d: transport %s %+v, stage %+v", ord, gd.xfer.Name(), gd.xfer.Stats(), gd.stage.Stats())
	}
}

// BenchmarkGPUHandoff times an 8K-token prompt's handoff (Qwen3-8B's KV:
// 36 layers, 144 KiB a token, 128 pages of 9 MiB, 1,152 MiB) through the
// peer, between a producer engine on GPU 0 and a consumer on GPU 1 (or a
// second process on GPU 0 where there is one GPU), the two ways:
//
//	save/dram    the producer's save into DRAM, as without a stage
//	save/staged  the same save with the HBM stage on (also device to device)
//	load/dram    the consumer's load of those pages from DRAM (host to device)
//	load/hbm     the consumer's load of the staged pages from the stage
//
// beside, in the same run, the contiguous copies of the same bytes they are
// bounded by: contiguous/h2d (one pinned host -> device copy from the DRAM
// pool) and contiguous/d2d (one cuMemcpyPeerAsync from GPU 0 into the
// consumer's GPU). Run with -benchtime 3x (saves need fresh keys: each
// round stores another 1,152 MiB).
func BenchmarkGPUHandoff(b *testing.B) {
	requireGPU(b)
	consDev := 0
	if n, _ := cuda.DeviceCount(); n >= 2 {
		consDev = 1
	}
	const pages = 128
	g := gpuKV{name: "flash", layers: 36, numBlocks: 2 * pages * 4, blockBytes: 32 << 10, perPage: 4}
	pageBytes := uint64(g.layers * 2 * g.perPage * g.blockBytes)
	total := pages * pageBytes
	cfg := smallConfig(b.TempDir())
	cfg.DRAMBytes, cfg.DRAMSlabBytes = 12<<30, 16<<20 // 8 rounds of saves (4 each way with -benchtime 3x) fit: no eviction
	cfg.SSDBytes = 0
	cfg.CUDA = "require"
	cfg.HBMStageBytes = bytesize.Size(2 * total)
	tp := startPeer(b, cfg)
	prod := startGPUEngineOn(b, g.size(), 42, 0)
	cons := startGPUEngineOn(b, g.size(), 43, consDev)
	open := func(e *gpuEngine, dev int) (*engineclient.Engine, *store.Engine) {
		req := g.request(e.handle, 0, g.size())
		req.Buffers[0].GetCuda().Device = int32(dev)
		s, err := engineclient.Open(ctx(b), tp.conn, req)
		if err != nil {
			b.Fatalf("open a CUDA session on GPU %d: %v", dev, err)
		}
		sess, err := tp.p.api.Engine(s.Session)
		if err != nil {
			b.Fatal(err)
		}
		return s, sess
	}
	ps, psess := open(prod, 0)
	cs, _ := open(cons, consDev)
	stage := psess.Stage
	const dstBlock = pages * 4 // the consumer's blocks: after the producer's 0..511
	save := func(b *testing.B, staged bool) [][]byte {
		psess.Stage = nil
		if staged {
			psess.Stage = stage
		}
		keys := randKeys(pages)
		okOp(b)(ps.Save(ctx(b), refs(keys, 0, g.perPage), pb.Durability_DURABILITY_DRAM))
		return keys
	}
	var dramKeys, hbmKeys [][]byte
	for _, c := range []struct {
		name   string
		staged bool
		keys   *[][]byte
	}{{"save/dram", false, &dramKeys}, {"save/staged", true, &hbmKeys}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(total))
			for range b.N {
				*c.keys = save(b, c.staged)
			}
		})
	}
	for _, c := range []struct {
		name, tier string
		keys       [][]byte
	}{{"load/dram", "dram", dramKeys}, {"load/hbm", "hbm", hbmKeys}} {
		b.Run(c.name, func(b *testing.B) {
			before := tp.counter(`orbitkv_fabric_loaded_pages_total{tier="` + c.tier + `"}`)
			b.SetBytes(int64(total))
			for range b.N {
				st, err := cs.Load(ctx(b), refs(c.keys, dstBlock, g.perPage))
				if err == nil {
					err = engineclient.AllOK(st)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			after := tp.counter(`orbitkv_fabric_loaded_pages_total{tier="` + c.tier + `"}`)
			b.Logf("pages loaded from %s: %s -> %s over %d rounds", c.tier, before, after, b.N)
		})
	}
	contiguous(b, tp, consDev, total)
}

// contiguous times the two contiguous copies a handoff's loads are bounded
// by, n bytes each, on the peer's own devices: DRAM pool -> GPU dev, and
// GPU 0 -> GPU dev.
func contiguous(b *testing.B, tp *testPeer, dev int, n uint64) {
	d0, err := tp.p.gpu.device(0)
	if err != nil {
		b.Fatal(err)
	}
	dd, err := tp.p.gpu.device(dev)
	if err != nil {
		b.Fatal(err)
	}
	src, err := d0.d.Alloc(n)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Free()
	dstMem, err := dd.d.Alloc(n)
	if err != nil {
		b.Fatal(err)
	}
	defer dstMem.Free()
	s, err := dd.d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	host := tp.p.gpu.host.Bytes()
	if uint64(len(host)) < n {
		b.Fatalf("dram pool of %d bytes, want %d", len(host), n)
	}
	for _, c := range []struct {
		name string
		copy func() error
	}{
		{"contiguous/h2d", func() error { return s.CopyAsync(cuda.HostToDevice, unsafe.Pointer(&host[0]), dstMem.Ptr, n) }},
		{"contiguous/d2d", func() error { return s.PeerCopyAsync(dstMem.Ptr, d0.d, src.Ptr, n) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(n))
			for range b.N {
				if err := c.copy(); err != nil {
					b.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
