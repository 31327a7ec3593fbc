package fabric

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/cuda"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/dram"
)

// The GPU tests play a GPU engine with a child process (this test binary
// re-run as TestGPUEngineHelper): it allocates device memory, fills it with
// seeded random bytes, exports a CUDA IPC handle and answers digest, memset
// and poke requests on stdin. A process cannot open its own IPC handles, so
// the engine must be another process, as it is in production.

const gpuEngineEnv = "ORBITKV_TEST_GPU_ENGINE"

// requireGPU skips without a usable GPU, failing instead under
// ORBITKV_REQUIRE=cuda (set on the GPU machine).
func requireGPU(t testing.TB) {
	t.Helper()
	why := ""
	if err := cuda.Init(); err != nil {
		why = err.Error()
	} else if n, err := cuda.DeviceCount(); err != nil || n == 0 {
		why = fmt.Sprintf("no CUDA device (count %d, %v)", n, err)
	}
	if why == "" {
		return
	}
	if strings.Contains(os.Getenv("ORBITKV_REQUIRE"), "cuda") {
		t.Fatalf("ORBITKV_REQUIRE=cuda but: %s", why)
	}
	t.Skipf("skipping: %s", why)
}

func gpuFill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x67707521))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
}

// TestGPUEngineHelper is the engine process of the GPU tests; it does
// nothing unless started by one of them.
func TestGPUEngineHelper(t *testing.T) {
	spec := os.Getenv(gpuEngineEnv)
	if spec == "" {
		t.Skip("helper process of the GPU session tests; runs only as their child")
	}
	if err := gpuEngineMain(spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gpu engine:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// gpuEngineMain: spec is "SIZE SEED". Prints "HANDLE <hex>", then answers
// "SUMS off stride len count" (sha256 of count chunks), "SET off len byte",
// "POKE off byte" and "QUIT".
func gpuEngineMain(spec string, in io.Reader, out io.Writer) error {
	var size, seed uint64
	var dev int
	if _, err := fmt.Sscan(spec, &size, &seed, &dev); err != nil {
		return err
	}
	d, err := cuda.Open(dev)
	if err != nil {
		return err
	}
	defer d.Close()
	m, err := d.Alloc(size)
	if err != nil {
		return err
	}
	defer m.Free()
	host := make([]byte, size)
	gpuFill(host, seed)
	if err := d.CopyToDevice(m.Ptr, host); err != nil {
		return err
	}
	h, err := d.ExportIPC(m.Ptr)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "HANDLE %s\n", hex.EncodeToString(h[:]))
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		n := make([]uint64, len(f))
		for i := 1; i < len(f); i++ {
			n[i], _ = strconv.ParseUint(f[i], 10, 64)
		}
		switch {
		case len(f) == 5 && f[0] == "SUMS":
			off, stride, ln, count := n[1], n[2], n[3], n[4]
			buf := make([]byte, (count-1)*stride+ln)
			if err := d.CopyFromDevice(buf, m.Ptr+cuda.DevicePtr(off)); err != nil {
				return err
			}
			fmt.Fprintf(out, "SUM %x\n", stridedSum(buf, 0, stride, ln, count))
		case len(f) == 4 && f[0] == "SET":
			if err := d.Memset(m.Ptr+cuda.DevicePtr(n[1]), byte(n[3]), n[2]); err != nil {
				return err
			}
			fmt.Fprintln(out, "OK")
		case len(f) == 3 && f[0] == "POKE":
			if err := d.CopyToDevice(m.Ptr+cuda.DevicePtr(n[1]), []byte{byte(n[2])}); err != nil {
				return err
			}
			fmt.Fprintln(out, "OK")
		case len(f) == 2 && f[0] == "WAITEV": // open a peer's interprocess event, wait for it
			var h cuda.IPCEventHandle
			if b, err := hex.DecodeString(f[1]); err != nil || len(b) != len(h) {
				return fmt.Errorf("bad event handle %q", f[1])
			} else {
				copy(h[:], b)
			}
			ev, err := d.OpenIPCEvent(h)
			if err != nil {
				return err
			}
			wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err = ev.Wait(wctx)
			cancel()
			ev.Close()
			if err != nil {
				return err
			}
			fmt.Fprintln(out, "OK")
		case len(f) == 1 && f[0] == "QUIT":
			return nil
		default:
			return fmt.Errorf("bad request %q", sc.Text())
		}
	}
	return sc.Err()
}

func stridedSum(b []byte, off, stride, ln, count uint64) []byte {
	h := sha256.New()
	for i := uint64(0); i < count; i++ {
		h.Write(b[off+i*stride : off+i*stride+ln])
	}
	return h.Sum(nil)
}

// gpuEngine is the parent's handle on the child, with a mirror of what the
// device allocation must hold.
type gpuEngine struct {
	t      testing.TB
	in     io.WriteCloser
	out    *bufio.Reader
	handle []byte
	mirror []byte
}

func startGPUEngine(t testing.TB, size, seed uint64) *gpuEngine {
	t.Helper()
	return startGPUEngineOn(t, size, seed, 0)
}

// startGPUEngineOn is startGPUEngine with the allocation on CUDA device dev.
func startGPUEngineOn(t testing.TB, size, seed uint64, dev int) *gpuEngine {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestGPUEngineHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %d %d", gpuEngineEnv, size, seed, dev))
	cmd.Stderr = os.Stderr
	e := &gpuEngine{t: t, mirror: make([]byte, size)}
	var err error
	if e.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fmt.Fprintln(e.in, "QUIT"); e.in.Close(); _ = cmd.Wait() })
	e.out = bufio.NewReader(stdout)
	f := strings.Fields(e.line())
	if len(f) != 2 || f[0] != "HANDLE" {
		t.Fatalf("engine said %q", f)
	}
	if e.handle, err = hex.DecodeString(f[1]); err != nil {
		t.Fatal(err)
	}
	gpuFill(e.mirror, seed)
	return e
}

func (e *gpuEngine) line() string {
	l, err := e.out.ReadString('\n')
	if err != nil {
		e.t.Fatalf("engine process: %v", err)
	}
	return strings.TrimSpace(l)
}

func (e *gpuEngine) ask(format string, args ...any) string {
	fmt.Fprintf(e.in, format+"\n", args...)
	return e.line()
}

// set memsets the device and the mirror.
func (e *gpuEngine) set(off, n uint64, v byte) {
	if r := e.ask("SET %d %d %d", off, n, v); r != "OK" {
		e.t.Fatalf("SET: %q", r)
	}
	for i := off; i < off+n; i++ {
		e.mirror[i] = v
	}
}

// poke writes one device byte without touching the mirror.
func (e *gpuEngine) poke(off uint64, v byte) {
	if r := e.ask("POKE %d %d", off, v); r != "OK" {
		e.t.Fatalf("POKE: %q", r)
	}
}

// planeOK compares one strided range of the device with the mirror.
func (e *gpuEngine) planeOK(off, stride, ln, count uint64) bool {
	got := e.ask("SUMS %d %d %d %d", off, stride, ln, count)
	return got == fmt.Sprintf("SUM %x", stridedSum(e.mirror, off, stride, ln, count))
}

// gpuKV is one engine KV layout inside the engine's allocation.
type gpuKV struct {
	name                string // "flash" (2, NB, …) per layer or "flashinfer" (NB, 2, …)
	base                uint64 // buffer offset in the allocation
	layers, numBlocks   int
	blockBytes, perPage int
}

func (g gpuKV) size() uint64 { return uint64(g.layers * 2 * g.numBlocks * g.blockBytes) }

// at is the buffer offset of block b of (layer, plane) and the plane's stride.
func (g gpuKV) at(l, p, b int) (off, stride uint64) {
	bb, nb := uint64(g.blockBytes), uint64(g.numBlocks)
	if g.name == "flash" {
		return (uint64(2*l+p)*nb + uint64(b)) * bb, bb
	}
	return uint64(l)*nb*2*bb + uint64(b)*2*bb + uint64(p)*bb, 2 * bb
}

func (g gpuKV) request(handle []byte, off, size uint64) *pb.OpenSessionRequest {
	r := &pb.OpenSessionRequest{EngineId: "gpu-test-" + g.name,
		Layout: &pb.Layout{Model: "gpu-test", Revision: g.name, Dtype: "bf16", NumLayers: uint32(g.layers), KvHeads: 8,
			HeadDim: uint32(g.blockBytes / (16 * 8 * 2)), TpSize: 1, PageTokens: uint32(16 * g.perPage), ByteLayout: "vllm-" + g.name},
		BlockTokens: 16, NumBlocks: uint32(g.numBlocks),
		Buffers: []*pb.Buffer{{Kind: &pb.Buffer_Cuda{Cuda: &pb.CudaIpc{Handle: handle, Device: 0, Offset: off}}, SizeBytes: size}}}
	for l := range g.layers {
		for p := range 2 {
			o, st := g.at(l, p, 0)
			r.Segments = append(r.Segments, &pb.Segment{Layer: uint32(l), Plane: uint32(p), Offset: o, BlockStride: st, BlockBytes: uint64(g.blockBytes)})
		}
	}
	return r
}

// blob is the page blob of blocks as the mirror holds them (segment-major).
func (g gpuKV) blob(mirror []byte, blocks []uint32) []byte {
	var out []byte
	for l := range g.layers {
		for p := range 2 {
			for _, b := range blocks {
				o, _ := g.at(l, p, int(b))
				o += g.base
				out = append(out, mirror[o:o+uint64(g.blockBytes)]...)
			}
		}
	}
	return out
}

// place writes a blob into blocks of the mirror (what a load must do).
func (g gpuKV) place(mirror, blob []byte, blocks []uint32) {
	for l := range g.layers {
		for p := range 2 {
			for _, b := range blocks {
				o, _ := g.at(l, p, int(b))
				o += g.base
				n := copy(mirror[o:o+uint64(g.blockBytes)], blob)
				blob = blob[n:]
			}
		}
	}
}

// badPlanes lists the (layer, plane) whose digest differs from the mirror.
func (g gpuKV) badPlanes(e *gpuEngine) []string {
	var bad []string
	for l := range g.layers {
		for p := range 2 {
			o, st := g.at(l, p, 0)
			if !e.planeOK(g.base+o, st, uint64(g.blockBytes), uint64(g.numBlocks)) {
				bad = append(bad, fmt.Sprintf("L%d%c", l, "KV"[p]))
			}
		}
	}
	return bad
}

// pagesOf makes n pages of random distinct blocks.
func (g gpuKV) pagesOf(r *rand.Rand, n int) ([][]byte, [][]uint32) {
	perm := r.Perm(g.numBlocks)
	keys := randKeys(n)
	blocks := make([][]uint32, n)
	for i := range blocks {
		for j := range g.perPage {
			blocks[i] = append(blocks[i], uint32(perm[i*g.perPage+j]))
		}
	}
	return keys, blocks
}

func pageRefs(keys [][]byte, blocks [][]uint32) []*pb.PageRef {
	out := make([]*pb.PageRef, len(keys))
	for i := range keys {
		out[i] = &pb.PageRef{Key: keys[i], Blocks: blocks[i]}
	}
	return out
}

// TestGPUSessionRestoreThroughPeer saves scattered pages from an engine's GPU
// buffers through the peer and restores them into other scattered blocks,
// for the FlashAttention and FlashInfer layouts in one allocation (two
// buffers, one IPC handle), and checks every plane by digest, the sentinel
// gaps, the per-page checksums, and that deliberate corruption is seen.
func TestGPUSessionRestoreThroughPeer(t *testing.T) {
	requireGPU(t)
	cfg := smallConfig(t.TempDir())
	cfg.DRAMBytes, cfg.DRAMSlabBytes = 256<<20, 16<<20
	cfg.CUDA = "require"
	tp := startPeer(t, cfg)
	kvs := []gpuKV{
		{name: "flash", base: 0, layers: 4, numBlocks: 256, blockBytes: 32 << 10, perPage: 4},
		{name: "flashinfer", base: 80 << 20, layers: 4, numBlocks: 256, blockBytes: 32 << 10, perPage: 4},
	}
	const allocBytes = 160 << 20
	eng := startGPUEngine(t, allocBytes, 42)
	r := rand.New(rand.NewPCG(5, 6))
	sessions := make([]*engineclient.Engine, len(kvs))
	for i, g := range kvs {
		s, err := engineclient.Open(ctx(t), tp.conn, g.request(eng.handle, g.base, g.size()))
		if err != nil {
			t.Fatalf("%s: open CUDA session: %v", g.name, err)
		}
		sessions[i] = s
	}
	if n := tp.p.gpu.imp.Mappings(); n != 1 {
		t.Errorf("%d IPC mappings for one handle, want 1", n)
	}
	type saved struct {
		keys   [][]byte
		blobs  [][]byte
		blocks [][]uint32
	}
	var all []saved
	for i, g := range kvs {
		keys, blocks := g.pagesOf(r, 16)
		dur := []pb.Durability{pb.Durability_DURABILITY_DRAM, pb.Durability_DURABILITY_SSD}[i]
		st, err := sessions[i].Save(ctx(t), pageRefs(keys, blocks), dur)
		mustOK(t, st, err)
		// A DRAM save is acknowledged before its checksum (seal.go).
		waitFor(t, "the sealer to drain", 10*time.Second, func() bool {
			return tp.metric("orbitkv_tiers_unsealed_pages") == "orbitkv_tiers_unsealed_pages 0"
		})
		sv := saved{keys: keys}
		for j, k := range keys {
			blob := g.blob(eng.mirror, blocks[j])
			sv.blobs = append(sv.blobs, blob)
			e, ok := tp.p.cat.Get(mustKey(t, k))
			if !ok || e.Checksum != crc32.Checksum(blob, crc32.MakeTable(crc32.Castagnoli)) || e.Size != uint64(len(blob)) {
				t.Fatalf("%s page %d: catalog %+v, want crc %08x of %d bytes", g.name, j, e, crc32.Checksum(blob, crc32.MakeTable(crc32.Castagnoli)), len(blob))
			}
		}
		all = append(all, sv)
		eng.set(g.base, g.size(), 0xA5) // sentinel: every block not restored keeps it
	}
	// Restore into other scattered blocks: four loads at once (two per session).
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i, g := range kvs {
		_, dst := g.pagesOf(r, 16)
		all[i].blocks = dst
		for j := range dst {
			g.place(eng.mirror, all[i].blobs[j], dst[j])
		}
		for h := range 2 {
			wg.Go(func() {
				lo, hi := h*8, h*8+8
				st, err := sessions[i].Load(ctx(t), pageRefs(all[i].keys[lo:hi], dst[lo:hi]))
				if err == nil {
					err = engineclient.AllOK(st)
				}
				if err != nil {
					errs <- fmt.Errorf("%s load: %w", g.name, err)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, g := range kvs {
		if bad := g.badPlanes(eng); len(bad) > 0 {
			t.Fatalf("%s: planes differ after restore: %v", g.name, bad)
		}
	}
	if !eng.planeOK(0, allocBytes, allocBytes, 1) {
		t.Fatal("allocation differs outside the sessions' buffers (gaps written)")
	}
	t.Run("corruption is detected", func(t *testing.T) {
		g := kvs[0]
		dst := all[0].blocks
		o, _ := g.at(1, 1, int(dst[3][2]))
		eng.poke(g.base+o+77, eng.mirror[g.base+o+77]^0xFF)
		if bad := g.badPlanes(eng); len(bad) != 1 || bad[0] != "L1V" {
			t.Fatalf("payload corruption in L1V seen as %v", bad)
		}
		eng.poke(g.base+o+77, eng.mirror[g.base+o+77])
		o, _ = g.at(2, 0, int(g.numBlocks-1)) // not a restored block unless drawn
		eng.poke(g.base+o, eng.mirror[g.base+o]^1)
		if bad := g.badPlanes(eng); len(bad) != 1 || bad[0] != "L2K" {
			t.Fatalf("sentinel corruption in L2K seen as %v", bad)
		}
		eng.poke(g.base+o, eng.mirror[g.base+o])
		// A corrupt source page in DRAM is restored as it is: the digest sees it.
		e, _ := tp.p.cat.Get(mustKey(t, all[0].keys[5]))
		slot := tp.p.pool.Bytes(dram.Slot(e.DRAMSlot))
		at := 3*g.perPage*g.blockBytes + 1000 // segment 3 = L1V
		slot[at] ^= 0x40
		st, err := sessions[0].Load(ctx(t), pageRefs(all[0].keys[5:6], dst[5:6]))
		mustOK(t, st, err)
		slot[at] ^= 0x40
		if bad := g.badPlanes(eng); len(bad) != 1 || bad[0] != "L1V" {
			t.Fatalf("corrupt source page seen as %v", bad)
		}
		st, err = sessions[0].Load(ctx(t), pageRefs(all[0].keys[5:6], dst[5:6]))
		mustOK(t, st, err)
		if bad := g.badPlanes(eng); len(bad) != 0 {
			t.Fatalf("after a clean reload: %v", bad)
		}
	})
	t.Run("bad buffers", func(t *testing.T) {
		g := kvs[0]
		junk := bytes.Repeat([]byte{0x5A}, 64)
		for _, c := range []struct {
			name string
			req  *pb.OpenSessionRequest
			want codes.Code
		}{
			{"torch 66-byte handle", g.request(append([]byte{1, 'c'}, eng.handle...), 0, g.size()), codes.InvalidArgument},
			{"unopenable handle", g.request(junk, 0, g.size()), codes.FailedPrecondition},
			{"past the allocation", g.request(eng.handle, allocBytes-g.size()+4096, g.size()), codes.FailedPrecondition},
			{"no such device", func() *pb.OpenSessionRequest {
				r := g.request(eng.handle, 0, g.size())
				r.Buffers[0].GetCuda().Device = 97
				return r
			}(), codes.InvalidArgument},
		} {
			_, err := sessions[0].C.OpenSession(ctx(t), c.req)
			if status.Code(err) != c.want {
				t.Errorf("%s: %v, want %v", c.name, err, c.want)
			}
		}
	})
	for _, s := range sessions {
		if err := s.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}
	if n := tp.p.gpu.imp.Mappings(); n != 0 {
		t.Errorf("%d IPC mappings left after the sessions closed", n)
	}
	t.Logf("cuda transport %s: %+v", tp.p.gpu.mu.devs[0].xfer.Name(), tp.p.gpu.mu.devs[0].xfer.Stats())
}

// TestGPULayerwiseRestore: a CUDA session gets one interprocess event per
// layer; a layer-wise load answers once enqueued, every layer event
// completes (waited on from the engine process), the op reports every page,
// and every plane's digest matches with no byte outside the restored blocks
// written.
func TestGPULayerwiseRestore(t *testing.T) {
	requireGPU(t)
	cfg := smallConfig(t.TempDir())
	cfg.DRAMBytes, cfg.DRAMSlabBytes = 256<<20, 16<<20
	cfg.CUDA = "require"
	tp := startPeer(t, cfg)
	g := gpuKV{name: "flash", base: 0, layers: 6, numBlocks: 256, blockBytes: 32 << 10, perPage: 4}
	const allocBytes = 128 << 20
	eng := startGPUEngine(t, allocBytes, 43)
	s, err := engineclient.Open(ctx(t), tp.conn, g.request(eng.handle, g.base, g.size()))
	if err != nil {
		t.Fatalf("open CUDA session: %v", err)
	}
	defer s.Close(context.Background())
	if len(s.LayerEvents) != g.layers {
		t.Fatalf("%d layer events for %d layers", len(s.LayerEvents), g.layers)
	}
	r := rand.New(rand.NewPCG(9, 10))
	keys, blocks := g.pagesOf(r, 24)
	okOp(t)(s.Save(ctx(t), pageRefs(keys, blocks), pb.Durability_DURABILITY_DRAM))
	blobs := make([][]byte, len(keys))
	for j := range keys {
		blobs[j] = g.blob(eng.mirror, blocks[j])
	}
	eng.set(g.base, g.size(), 0xA5)
	for round := range 2 { // the events are reused by the next load
		_, dst := g.pagesOf(r, 24)
		for j := range dst {
			g.place(eng.mirror, blobs[j], dst[j])
		}
		h, err := s.C.Load(ctx(t), &pb.LoadRequest{SessionId: s.Session, Pages: pageRefs(keys, dst), Layerwise: true})
		if err != nil {
			t.Fatalf("round %d: layer-wise load: %v", round, err)
		}
		for l, ev := range s.LayerEvents {
			if got := eng.ask("WAITEV %s", hex.EncodeToString(ev)); got != "OK" {
				t.Fatalf("round %d: layer %d event: %q", round, l, got)
			}
		}
		st, err := s.Wait(ctx(t), h.OpId)
		mustOK(t, st, err)
		if bad := g.badPlanes(eng); len(bad) > 0 {
			t.Fatalf("round %d: planes differ after the layer-wise restore: %v", round, bad)
		}
	}
	if !eng.planeOK(0, allocBytes, allocBytes, 1) {
		t.Fatal("allocation differs outside the session's buffer")
	}
}

// TestCUDABuffersRefusedWithoutGPU: on a peer without a GPU a CUDA session
// is a clear FailedPrecondition, a malformed one InvalidArgument.
func TestCUDABuffersRefusedWithoutGPU(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	cfg.CUDA = "off"
	tp := startPeer(t, cfg)
	g := gpuKV{name: "flash", layers: 2, numBlocks: 8, blockBytes: 32 << 10, perPage: 4}
	c := pb.NewEngineServiceClient(tp.conn)
	handle := make([]byte, 64)
	_, err := c.OpenSession(ctx(t), g.request(handle, 0, g.size()))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "no usable CUDA device") {
		t.Errorf("CUDA session on a GPU-less peer: %v", err)
	}
	_, err = c.OpenSession(ctx(t), g.request(handle[:10], 0, g.size()))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("10-byte handle: %v", err)
	}
	mixed := g.request(handle, 0, g.size())
	mixed.Buffers = append(mixed.Buffers, &pb.Buffer{Kind: &pb.Buffer_Shm{Shm: &pb.SharedMemory{Path: "/dev/shm/x"}}, SizeBytes: 1})
	if _, err = c.OpenSession(ctx(t), mixed); status.Code(err) != codes.InvalidArgument {
		t.Errorf("mixed buffer kinds: %v", err)
	}
}
