package fabric

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/cuda"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/transfer"
)

// nullDevice stands in for a GPU transport: it takes the descriptors and
// moves nothing, so a benchmark times only the peer's CPU side of a CUDA
// session's save or load (RPCs, catalog, pins, planning, bookkeeping).
// With idle set, each batch takes that long, as a device copy would: the
// peer's threads sleep meanwhile, and what the caller waits beyond the
// operation's own phases (RPCs, wake-ups) shows.
type nullDevice struct {
	bytes uint64
	idle  time.Duration
}

func (d *nullDevice) Copy(ctx context.Context, batch []transfer.Desc) error {
	return d.CopyGroups(ctx, [][]transfer.Desc{batch}, nil)
}

func (d *nullDevice) CopyFrom(ctx context.Context, _ transfer.PeerSource, batch []transfer.Desc) error {
	return d.Copy(ctx, batch)
}

func (d *nullDevice) PeerDevice() *cuda.Device { return nil }

func (d *nullDevice) CopyGroups(_ context.Context, groups [][]transfer.Desc, done func(g int)) error {
	for g, batch := range groups {
		for _, x := range batch {
			d.bytes += x.Len
		}
		time.Sleep(d.idle)
		if done != nil {
			done(g)
		}
	}
	return nil
}

func (d *nullDevice) Begin(context.Context) (transfer.CopyStream, error) {
	return &nullStream{d: d}, nil
}

// nullStream is nullDevice's stream: parts count, the idle time passes in
// Finish.
type nullStream struct{ d *nullDevice }

func (s *nullStream) Add(batch []transfer.Desc) error {
	for _, x := range batch {
		s.d.bytes += x.Len
	}
	return nil
}

func (s *nullStream) Finish(context.Context) error {
	time.Sleep(s.d.idle)
	return nil
}

func (d *nullDevice) NewMarks(n int) (*transfer.Marks, error) {
	return &transfer.Marks{Events: make([]*cuda.Event, n), Handles: make([][]byte, n)}, nil
}

func (d *nullDevice) StartGroups(ctx context.Context, groups [][]transfer.Desc, _ *transfer.Marks) (transfer.Flight, error) {
	return doneFlight{}, d.CopyGroups(ctx, groups, nil)
}

func (d *nullDevice) OpenGates(*transfer.Marks) (transfer.Gate, error) { return nil, nil }

func (d *nullDevice) StartGated(context.Context, [][]transfer.Desc, transfer.Gate) (transfer.Flight, error) {
	return nil, fmt.Errorf("null device: no gates")
}

type doneFlight struct{}

func (doneFlight) Wait(context.Context) error { return nil }

// benchGPUGeometry has Qwen3-8B's descriptor count per page (36 layers × K,V
// × blocks) with small planes, so the benchmark needs little memory: what
// it measures is per-descriptor and per-page work, not bytes.
func benchGPUGeometry(blockTokens, numBlocks int) engineclient.Flash {
	return engineclient.Flash{Layers: 36, NumBlocks: numBlocks, BlockTokens: blockTokens, PageTokens: 64, KVHeads: 1, HeadDim: 16, ElemBytes: 2}
}

// BenchmarkGPUPathCPU times one Save (DRAM) and one Load of 128 pages (an
// 8K-token prefix) through the engine API of a CUDA session whose device
// transport moves nothing: the peer's CPU cost per operation, which on the
// GPU adds to the copy's time.
func BenchmarkGPUPathCPU(b *testing.B) {
	for _, bt := range []int{64, 16} {
		b.Run(map[int]string{64: "blocks64", 16: "blocks16"}[bt], func(b *testing.B) { benchGPUPath(b, bt, 128, 0) })
	}
}

// BenchmarkGPUPathIdle is BenchmarkGPUPathCPU with a device that takes 20 ms
// per batch (an 8K-token copy takes 22 ms on PCIe gen5): "outside" is what
// the caller waits beyond the operation's phases.
func BenchmarkGPUPathIdle(b *testing.B) { benchGPUPath(b, 64, 128, 20*time.Millisecond) }

func benchGPUPath(b *testing.B, blockTokens, pages int, idle time.Duration) {
	perPage := 64 / blockTokens
	f := benchGPUGeometry(blockTokens, 4*pages*perPage)
	dir := b.TempDir()
	cfg := DefaultConfig()
	cfg.DataDir, cfg.MetricsAddr, cfg.CUDA = dir, "", "off"
	cfg.DRAMBytes, cfg.DRAMSlabBytes, cfg.SSDBytes = 512<<20, 8<<20, 0
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	p, err := New(cfg, zerolog.New(io.Discard))
	if err != nil {
		b.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	defer func() { stop(); <-done }()
	<-p.ready
	conn, err := engineclient.Dial(p.cfg.Socket)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	shm, err := engineclient.CreateShm(filepath.Join(b.TempDir(), "kv"), f.Size()) // outside the data dir: the peer refuses its own files
	if err != nil {
		b.Fatal(err)
	}
	defer shm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e, err := engineclient.Open(ctx, conn, f.OpenRequest("m", shm.Path))
	if err != nil {
		b.Fatal(err)
	}
	sess, err := p.api.Engine(e.Session)
	if err != nil {
		b.Fatal(err)
	}
	sess.GPU = &nullDevice{idle: idle} // the CUDA path, minus the device
	rng := rand.New(rand.NewPCG(1, 2))
	scattered := func(keys [][]byte) []*pb.PageRef { // random distinct blocks, as bench gpu draws them
		perm := rng.Perm(f.NumBlocks)
		out := make([]*pb.PageRef, len(keys))
		for i, k := range keys {
			out[i] = &pb.PageRef{Key: k}
			for j := range perPage {
				out[i].Blocks = append(out[i].Blocks, uint32(perm[i*perPage+j]))
			}
		}
		return out
	}
	keys := randKeys(pages)
	if st, err := e.Save(ctx, scattered(keys), pb.Durability_DURABILITY_DRAM); err != nil || engineclient.AllOK(st) != nil {
		b.Fatalf("first save: %v %v", err, engineclient.AllOK(st))
	}
	ops := []struct {
		name string
		run  func() (*pb.OpStatus, error)
	}{
		{"save", func() (*pb.OpStatus, error) {
			keys = randKeys(pages) // fresh pages: a save of stored pages copies nothing
			return e.Save(ctx, scattered(keys), pb.Durability_DURABILITY_DRAM)
		}},
		{"load", func() (*pb.OpStatus, error) { return e.Load(ctx, scattered(keys)) }},
	}
	for _, op := range ops {
		b.Run(op.name, func(b *testing.B) {
			b.ReportAllocs()
			before := p.GPUPhases()
			for b.Loop() {
				st, err := op.run()
				if err == nil {
					err = engineclient.AllOK(st)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			after := p.GPUPhases()
			kind := op.name
			n := float64(after.Ops[kind] - before.Ops[kind])
			var inside time.Duration
			for ph, d := range after.Phase[kind] {
				inside += d - before.Phase[kind][ph]
				b.ReportMetric(float64(d-before.Phase[kind][ph])/1e3/n, ph+"-µs/op")
			}
			b.ReportMetric((float64(b.Elapsed())-float64(inside))/1e3/n, "outside-µs/op")
		})
	}
}
