package store

import (
	"context"
	"crypto/rand"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/tiers/ssd"
	"github.com/orbitkv/orbitkv/transfer"
)

// testStore is a store over a 4 MiB DRAM pool (1 MiB slabs), an SSD tier
// of ssdBytes in one file (0: none) and a catalog, all in a temp dir; it
// is closed when the test ends. Nothing runs in the background.
func testStore(t testing.TB, ssdBytes uint64) *Store { return testStoreWith(t, ssdBytes, nil) }

// testStoreWith is testStore with members to fetch remote pages from.
func testStoreWith(t testing.TB, ssdBytes uint64, members Members) *Store {
	t.Helper()
	dir := t.TempDir()
	pool, err := dram.New(dram.Config{Bytes: 4 << 20, SlabBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	var st *ssd.Store
	if ssdBytes > 0 {
		st, err = ssd.Open(ssd.Config{Dir: filepath.Join(dir, "ssd"), CapacityBytes: ssdBytes, FileBytes: ssdBytes, QueueDepth: 8, Sync: ssd.SyncNone})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
	}
	cat, err := catalog.Open(catalog.Options{Dir: filepath.Join(dir, "catalog")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	return New(cat, pool, st, Options{QueryBudget: 1 << 20, SSDDir: filepath.Join(dir, "ssd"), Members: members, Registry: prometheus.NewRegistry(), Log: zerolog.Nop()})
}

// testEngine is a shared-memory engine of the fabric tests' tiny layout:
// 2 layers, 64 blocks of 4 tokens, 4 blocks (16 tokens) a page, 2 KV heads
// of 16 fp32 elements; its buffer holds random bytes.
type testEngine struct {
	*Engine
	mem []byte
}

const (
	tinyLayers, tinyBlocks, tinyBlockBytes = 2, 64, 4 * 2 * 16 * 4
)

func newTestEngine(t testing.TB) *testEngine {
	t.Helper()
	mem := make([]byte, tinyLayers*2*tinyBlocks*tinyBlockBytes)
	if _, err := rand.Read(mem); err != nil {
		t.Fatal(err)
	}
	g := transfer.Geometry{NumBlocks: tinyBlocks, BlocksPerPage: 4}
	for seg := range tinyLayers * 2 {
		g.Segments = append(g.Segments, transfer.Segment{Offset: uint64(seg * tinyBlocks * tinyBlockBytes), Stride: tinyBlockBytes, BlockBytes: tinyBlockBytes})
	}
	if err := g.Validate([]uint64{uint64(len(mem))}); err != nil {
		t.Fatal(err)
	}
	l := pagekey.Layout{Model: "m", DType: "fp32", NumLayers: tinyLayers, KVHeads: 2, HeadDim: 16, TPSize: 1, PageTokens: 16, ByteLayout: "vllm-flash"}
	e := &Engine{Layout: l, FP: l.Fingerprint(), Geom: g, Bufs: []*transfer.Region{transfer.HostRegion("kv", mem)}}
	e.PageBytes = g.PageBytes()
	return &testEngine{Engine: e, mem: mem}
}

// page is the bytes of one page's blocks, segment-major, as the store keeps them.
func (e *testEngine) page(blocks []uint32) []byte {
	var out []byte
	for seg := range tinyLayers * 2 {
		for _, b := range blocks {
			off := (seg*tinyBlocks + int(b)) * tinyBlockBytes
			out = append(out, e.mem[off:off+tinyBlockBytes]...)
		}
	}
	return out
}

// reqs names n fresh pages whose blocks start at first, 4 blocks a page.
func reqs(keys []pagekey.Key, first uint32) []PageReq {
	out := make([]PageReq, len(keys))
	for i, k := range keys {
		out[i] = PageReq{Key: k, Blocks: []uint32{first + uint32(4*i), first + uint32(4*i+1), first + uint32(4*i+2), first + uint32(4*i+3)}}
	}
	return out
}

func randKey(t testing.TB) pagekey.Key {
	var k pagekey.Key
	if _, err := rand.Read(k[:]); err != nil {
		t.Fatal(err)
	}
	return k
}

func randKeys(t testing.TB, n int) []pagekey.Key {
	out := make([]pagekey.Key, n)
	for i := range out {
		out[i] = randKey(t)
	}
	return out
}

func testCtx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// saveAll saves src as a cache fill and fails the test unless every page
// saved.
func saveAll(t testing.TB, what string, ps *Store, e *testEngine, src []PageReq) {
	t.Helper()
	res := make([]Result, len(src))
	ps.Save(testCtx(t), e.Engine, src, false, res)
	mustAllOK(t, what, res)
}

// unseal makes k's entry look as if the sealer had not got to it yet: no
// checksum, and pending (no sealer runs in these tests).
func unseal(ps *Store, k pagekey.Key) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.cat.Update(k, func(c *catalog.Entry) bool { c.Checksum = 0; return true })
	ps.mu.unsealed[k] = struct{}{}
}

// mustAllOK fails the test unless every result is OK.
func mustAllOK(t testing.TB, what string, res []Result) {
	t.Helper()
	for i, r := range res {
		if r.Code != CodeOK {
			t.Fatalf("%s: page %d: code %d: %s", what, i, r.Code, r.Msg)
		}
	}
}
