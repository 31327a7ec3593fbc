package fabric

import (
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// testPeer is a peer serving on a socket in a temp dir.
type testPeer struct {
	t     testing.TB
	p     *Peer
	cfg   Config
	conn  *grpc.ClientConn
	admin pb.AdminServiceClient
	stop  context.CancelFunc
	done  chan error
}

func smallConfig(dir string) Config {
	cfg := DefaultConfig()
	cfg.DataDir = dir
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.DRAMBytes, cfg.DRAMSlabBytes = 4<<20, 1<<20
	cfg.SSDBytes, cfg.SSDFileBytes = 128<<20, 64<<20
	if m := os.Getenv("ORBITKV_CUDA_METHOD"); m != "" {
		cfg.CUDAMethod = m // GPU runs: the copy method the peer's transports use (scripts/gpu/h200.sh)
	}
	return cfg
}

func startPeer(t testing.TB, cfg Config) *testPeer {
	t.Helper()
	p, err := New(cfg, zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tp := &testPeer{t: t, p: p, cfg: p.cfg, stop: cancel, done: make(chan error, 1)}
	go func() { tp.done <- p.Run(ctx) }()
	select { // serving before the first call, so tests need no WaitForReady
	case <-p.ready:
	case err := <-tp.done:
		t.Fatalf("peer stopped before serving: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("peer not serving within 20s")
	}
	tp.conn, err = engineclient.Dial(p.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	tp.admin = pb.NewAdminServiceClient(tp.conn)
	t.Cleanup(tp.shutdown)
	return tp
}

func (tp *testPeer) shutdown() {
	if tp.stop == nil {
		return
	}
	tp.conn.Close()
	tp.stop()
	select {
	case err := <-tp.done:
		if err != nil {
			tp.t.Errorf("peer run: %v", err)
		}
	case <-time.After(20 * time.Second):
		tp.t.Error("peer did not stop within 20s")
	}
	tp.stop = nil
}

// engine is a fake engine's KV buffer plus its session.
type engine struct {
	*engineclient.Engine
	f   engineclient.Flash
	shm *engineclient.Shm
}

var tinyFlash = engineclient.Flash{Layers: 2, NumBlocks: 64, BlockTokens: 4, PageTokens: 16, KVHeads: 2, HeadDim: 16, ElemBytes: 4}

func (tp *testPeer) engine(f engineclient.Flash) *engine {
	tp.t.Helper()
	return tp.engineIn(f, tp.t.TempDir())
}

// engineIn is engine with its KV buffer file in dir.
func (tp *testPeer) engineIn(f engineclient.Flash, dir string) *engine {
	t := tp.t
	t.Helper()
	shm, err := engineclient.CreateShm(filepath.Join(dir, "kv"), f.Size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Close() })
	if _, err := rand.Read(shm.Mem); err != nil {
		t.Fatal(err)
	}
	e, err := engineclient.Open(ctx(t), tp.conn, f.OpenRequest("m", shm.Path))
	if err != nil {
		t.Fatal(err)
	}
	return &engine{Engine: e, f: f, shm: shm}
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// page returns the bytes of one page's blocks, segment-major, as the peer
// would store them.
func (e *engine) page(blocks []uint32) []byte {
	var out []byte
	bb := e.f.BlockBytes()
	for l := 0; l < e.f.Layers; l++ {
		for p := 0; p < 2; p++ {
			for _, b := range blocks {
				off := e.f.BlockOffset(l, p, int(b))
				out = append(out, e.shm.Mem[off:off+bb]...)
			}
		}
	}
	return out
}

func randKeys(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, 16)
		rand.Read(out[i])
	}
	return out
}

// refs names pages whose blocks start at first, 4 blocks per page.
func refs(keys [][]byte, first uint32, perPage int) []*pb.PageRef {
	out := make([]*pb.PageRef, len(keys))
	for i, k := range keys {
		r := &pb.PageRef{Key: k}
		for j := 0; j < perPage; j++ {
			r.Blocks = append(r.Blocks, first+uint32(i*perPage+j))
		}
		out[i] = r
	}
	return out
}

func (tp *testPeer) metric(name string) string {
	resp, err := http.Get("http://" + tp.metricsAddr() + "/metrics")
	if err != nil {
		tp.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			return line
		}
	}
	return ""
}

func (tp *testPeer) metricsAddr() string { return tp.p.metricsAddr() }

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// okOp returns a checker for an operation's (status, error) pair.
func okOp(t testing.TB) func(*pb.OpStatus, error) {
	return func(st *pb.OpStatus, err error) { mustOK(t, st, err) }
}

func mustOK(t testing.TB, st *pb.OpStatus, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := engineclient.AllOK(st); err != nil {
		t.Fatal(err)
	}
}

// fakeClock is a clock for Config.Now that moves only when told to; it
// starts at the wall clock's now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
