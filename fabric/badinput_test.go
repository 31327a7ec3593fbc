package fabric

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

func mustKey(t *testing.T, b []byte) pagekey.Key {
	k, err := pagekey.FromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestBadInput sends malformed requests: each gets a clear code, and the
// pages stored before are all still there afterwards.
func TestBadInput(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(4)
	src := refs(keys, 0, 4)
	okOp(t)(e.Save(ctx(t), src, pb.Durability_DURABILITY_SSD))
	before := [][]byte{}
	for _, r := range src {
		before = append(before, e.page(r.Blocks))
	}
	open := func(mut func(r *pb.OpenSessionRequest)) error {
		r := tinyFlash.OpenRequest("m", e.shm.Path)
		mut(r)
		_, err := e.C.OpenSession(ctx(t), r)
		return err
	}
	load := func(lease string) error {
		_, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, LeaseId: lease, Pages: refs(keys[:1], 40, 4), Wait: true})
		return err
	}
	expired, foreign := badLeases(t, tp, e, keys)
	link := filepath.Join(t.TempDir(), "kv")
	ssdFile := filepath.Join(tp.cfg.DataDir, "ssd", "orbitkv-000.pages")
	if err := os.Symlink(ssdFile, link); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(tp.cfg.DataDir, "..", "kv-hard") // same filesystem, outside the data dir
	if err := os.Link(ssdFile, hard); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(hard)
	cases := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"geometry wrapping 2^64", func() error {
			// 63 strides of (2^64+47)/63 bytes end 47 bytes on, modulo 2^64.
			return open(func(r *pb.OpenSessionRequest) { r.Segments[1].BlockStride = (1<<64 + 47) / 63 })
		}, codes.InvalidArgument},
		{"page size wrapping 2^64", func() error {
			return open(func(r *pb.OpenSessionRequest) { // 4 blocks of 4 segments of 2^60 bytes: 2^64 ≡ 0
				r.NumBlocks, r.Buffers[0].SizeBytes = 1, 1<<62
				for i, sg := range r.Segments {
					sg.Offset, sg.BlockStride, sg.BlockBytes = uint64(i)<<60, 1<<60, 1<<60
				}
			})
		}, codes.InvalidArgument},
		{"keepalive past the cap", func() error {
			return open(func(r *pb.OpenSessionRequest) {
				r.KeepaliveMs = uint32((10*time.Minute + time.Millisecond) / time.Millisecond)
			})
		}, codes.InvalidArgument},
		{"lookup-only session keepalive past the cap", func() error {
			_, err := e.C.OpenSession(ctx(t), &pb.OpenSessionRequest{Layout: tinyFlash.Layout("m"), BlockTokens: 4, KeepaliveMs: 49 * 24 * 3600 * 1000})
			return err
		}, codes.InvalidArgument},
		{"buffer is the peer's ssd page file", func() error {
			return open(func(r *pb.OpenSessionRequest) {
				r.Buffers[0].Kind = &pb.Buffer_Shm{Shm: &pb.SharedMemory{Path: ssdFile}}
			})
		}, codes.InvalidArgument},
		{"buffer symlinked to the peer's ssd page file", func() error {
			return open(func(r *pb.OpenSessionRequest) { r.Buffers[0].Kind = &pb.Buffer_Shm{Shm: &pb.SharedMemory{Path: link}} })
		}, codes.InvalidArgument},
		{"buffer hard-linked to the peer's ssd page file", func() error {
			return open(func(r *pb.OpenSessionRequest) { r.Buffers[0].Kind = &pb.Buffer_Shm{Shm: &pb.SharedMemory{Path: hard}} })
		}, codes.InvalidArgument},
		{"unknown durability", func() error {
			_, err := e.C.Save(ctx(t), &pb.SaveRequest{SessionId: e.Session, Pages: refs(keys[:1], 0, 4), Durability: pb.Durability(7), Wait: true})
			return err
		}, codes.InvalidArgument},
		{"garbage lease", func() error { return load("l-garbage") }, codes.NotFound},
		{"expired lease", func() error { return load(expired) }, codes.NotFound},
		{"lease of another model's session", func() error { return load(foreign) }, codes.FailedPrecondition},
		{"no layout", func() error { return open(func(r *pb.OpenSessionRequest) { r.Layout = nil }) }, codes.InvalidArgument},
		{"zero layers", func() error { return open(func(r *pb.OpenSessionRequest) { r.Layout.NumLayers = 0 }) }, codes.InvalidArgument},
		{"tp rank past size", func() error { return open(func(r *pb.OpenSessionRequest) { r.Layout.TpRank = 3 }) }, codes.InvalidArgument},
		{"block tokens not dividing", func() error { return open(func(r *pb.OpenSessionRequest) { r.BlockTokens = 3 }) }, codes.InvalidArgument},
		{"missing segment", func() error { return open(func(r *pb.OpenSessionRequest) { r.Segments = r.Segments[1:] }) }, codes.InvalidArgument},
		{"duplicate segment", func() error {
			return open(func(r *pb.OpenSessionRequest) { r.Segments[1].Plane, r.Segments[1].Layer = 0, 0 })
		}, codes.InvalidArgument},
		{"segment past buffer", func() error { return open(func(r *pb.OpenSessionRequest) { r.Segments[3].Offset += 1 << 20 }) }, codes.InvalidArgument},
		{"buffer larger than file", func() error {
			return open(func(r *pb.OpenSessionRequest) { r.Buffers[0].SizeBytes *= 2; r.NumBlocks *= 2 })
		}, codes.FailedPrecondition},
		{"relative path", func() error {
			return open(func(r *pb.OpenSessionRequest) { r.Buffers[0].Kind = &pb.Buffer_Shm{Shm: &pb.SharedMemory{Path: "kv"}} })
		}, codes.InvalidArgument},
		{"unknown session", func() error {
			_, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: "s-nope", Keys: keys})
			return err
		}, codes.NotFound},
		{"short key", func() error {
			_, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: e.Session, Keys: [][]byte{make([]byte, 15)}})
			return err
		}, codes.InvalidArgument},
		{"block out of range", func() error {
			_, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: []*pb.PageRef{{Key: keys[0], Blocks: []uint32{0, 1, 2, 64}}}})
			return err
		}, codes.InvalidArgument},
		{"save with a skipped block", func() error {
			_, err := e.C.Save(ctx(t), &pb.SaveRequest{SessionId: e.Session, Pages: []*pb.PageRef{{Key: keys[0], Blocks: []uint32{0xFFFFFFFF, 1, 2, 3}}}})
			return err
		}, codes.InvalidArgument},
		{"load of a page of only skips", func() error {
			_, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: []*pb.PageRef{{Key: keys[0], Blocks: []uint32{0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}}}})
			return err
		}, codes.InvalidArgument},
		{"layer-wise load that waits", func() error {
			_, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: refs(keys[:1], 0, 4), Layerwise: true, Wait: true})
			return err
		}, codes.InvalidArgument},
		{"wrong block count", func() error {
			_, err := e.C.Save(ctx(t), &pb.SaveRequest{SessionId: e.Session, Pages: []*pb.PageRef{{Key: keys[0], Blocks: []uint32{0}}}})
			return err
		}, codes.InvalidArgument},
		{"no pages", func() error {
			_, err := e.C.Save(ctx(t), &pb.SaveRequest{SessionId: e.Session})
			return err
		}, codes.InvalidArgument},
		{"too many pages", func() error {
			_, err := e.C.Save(ctx(t), &pb.SaveRequest{SessionId: e.Session, Pages: refs(randKeys(5000), 0, 0)})
			return err
		}, codes.InvalidArgument},
		{"unknown op", func() error {
			_, err := e.C.Wait(ctx(t), &pb.WaitRequest{SessionId: e.Session, OpId: "op-x"})
			return err
		}, codes.NotFound},
		{"evict without tier", func() error {
			_, err := tp.admin.Evict(ctx(t), &pb.EvictRequest{})
			return err
		}, codes.InvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := status.Code(c.call()); got != c.want {
				t.Fatalf("code %v, want %v", got, c.want)
			}
		})
	}
	dst := refs(keys, 40, 4)
	okOp(t)(e.Load(ctx(t), dst))
	for i := range dst {
		if string(before[i]) != string(e.page(dst[i].Blocks)) {
			t.Fatalf("page %d changed after bad input", i)
		}
	}
}

// badLeases returns an expired lease of e's session and a live lease of a
// session of another model, both on stored keys.
func badLeases(t *testing.T, tp *testPeer, e *engine, keys [][]byte) (expired, foreign string) {
	t.Helper()
	short, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: e.Session, Keys: keys, Lease: true, LeaseMs: 1})
	if err != nil || short.LeaseId == "" {
		t.Fatalf("short lease: %v %v", short, err)
	}
	waitFor(t, "the short lease to expire", 5*time.Second, func() bool { return time.Now().UnixMilli() > short.LeaseExpiresUnixMs })
	other, err := e.C.OpenSession(ctx(t), &pb.OpenSessionRequest{EngineId: "other", Layout: tinyFlash.Layout("other-model"), BlockTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	look, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: other.SessionId, Keys: keys, Lease: true})
	if err != nil || look.LeaseId == "" {
		t.Fatalf("other model's lease: %v %v", look, err)
	}
	return short.LeaseId, look.LeaseId
}

// TestLoadLeaseOfAnySessionOfTheModel: a Load may name its own lease or one
// a lookup-only session of the same model took for another TP rank (the vLLM
// scheduler's), and loads with it.
func TestLoadLeaseOfAnySessionOfTheModel(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	shm, err := engineclient.CreateShm(filepath.Join(t.TempDir(), "kv"), tinyFlash.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	req := tinyFlash.OpenRequest("m", shm.Path)
	req.Layout.TpSize, req.Layout.TpRank = 2, 1
	e, err := engineclient.Open(ctx(t), tp.conn, req)
	if err != nil {
		t.Fatal(err)
	}
	keys := randKeys(2)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	sched := tinyFlash.Layout("m")
	sched.TpSize = 2
	s, err := e.C.OpenSession(ctx(t), &pb.OpenSessionRequest{EngineId: "scheduler", Layout: sched, BlockTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	for name, sid := range map[string]string{"own": e.Session, "scheduler's": s.SessionId} {
		look, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: sid, Keys: keys, Lease: true})
		if err != nil || look.LeaseId == "" {
			t.Fatalf("%s lease: %v %v", name, look, err)
		}
		h, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, LeaseId: look.LeaseId, Pages: refs(keys, 20, 4), Wait: true})
		if err != nil {
			t.Fatalf("load with the %s lease: %v", name, err)
		}
		mustOK(t, h.Status, nil)
		// An expired lease not yet reaped: engineapi.TestCheckLoadLease.
	}
}

func TestLookupOnlySession(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(3)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	lay := tinyFlash.Layout("m")
	lay.Dtype = "fp32"
	s, err := e.C.OpenSession(ctx(t), &pb.OpenSessionRequest{EngineId: "scheduler", Layout: lay, BlockTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	look, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: s.SessionId, Keys: keys, Lease: true})
	if err != nil || look.HitPages != 3 || look.LeaseId == "" {
		t.Fatalf("lookup-only session lookup: %v %v", look, err)
	}
	_, err = e.C.Load(ctx(t), &pb.LoadRequest{SessionId: s.SessionId, Pages: refs(keys, 0, 4)})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("load on a lookup-only session: %v, want FailedPrecondition", err)
	}
	lay.Dtype = "weird"
	_, err = e.C.OpenSession(ctx(t), &pb.OpenSessionRequest{EngineId: "scheduler", Layout: lay, BlockTokens: 4})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown dtype: %v, want InvalidArgument", err)
	}
}

func TestUnwaitedOpsAreBounded(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	cfg.MaxUnwaitedOps = 2
	tp := startPeer(t, cfg)
	e := tp.engine(tinyFlash)
	keys := randKeys(3)
	var ids []string
	for i := 0; i < 2; i++ {
		h, err := e.C.Save(ctx(t), &pb.SaveRequest{SessionId: e.Session, Pages: refs(keys[i:i+1], uint32(4*i), 4)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h.OpId)
	}
	_, err := e.C.Save(ctx(t), &pb.SaveRequest{SessionId: e.Session, Pages: refs(keys[2:], 8, 4)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third unwaited op: %v, want ResourceExhausted", err)
	}
	okOp(t)(e.Wait(ctx(t), ids[0]))
	okOp(t)(e.Save(ctx(t), refs(keys[2:], 8, 4), pb.Durability_DURABILITY_DRAM))
}

// TestSaveRejectsDuplicateKeys: one key twice in a Save would gather two
// copies of which the catalog could name only one.
func TestSaveRejectsDuplicateKeys(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	k := randKeys(1)
	pages := append(refs(k, 0, 4), refs(k, 4, 4)...)
	_, err := e.C.Save(ctx(t), &pb.SaveRequest{SessionId: e.Session, Pages: pages})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("duplicate key: %v, want InvalidArgument", err)
	}
	if got := tp.p.pages.PoolStats().Slots; got != 0 {
		t.Fatalf("%d dram slots in use after a rejected save", got)
	}
}

// TestLeaseChargesRealPageSize: a lookup-only session that declares a tiny
// layout still pays each leased page's real size against the budget.
func TestLeaseChargesRealPageSize(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	cfg.QueryBudgetBytes = 5 * 64 << 10
	tp := startPeer(t, cfg)
	f := tinyFlash
	f.NumBlocks, f.HeadDim = 512, 128 // 64 KiB pages
	e := tp.engine(f)
	keys := randKeys(8)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	tiny := &pb.Layout{Model: "m", Dtype: "fp8", NumLayers: 1, KvHeads: 1, HeadDim: 1, TpSize: 1, PageTokens: 1, ByteLayout: "x"}
	s, err := e.C.OpenSession(ctx(t), &pb.OpenSessionRequest{EngineId: "sched", Layout: tiny, BlockTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	look, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: s.SessionId, Keys: keys, Lease: true})
	if err != nil || look.HitPages != 5 {
		t.Fatalf("lease within a 5-page budget: %v %v", look, err)
	}
	if got := tp.metric("orbitkv_fabric_query_bytes"); got != "orbitkv_fabric_query_bytes 327680" {
		t.Fatalf("query bytes %q, want 5 real pages (327680)", got)
	}
}
