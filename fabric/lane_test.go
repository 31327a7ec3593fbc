package fabric

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/internal/lane"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

func dialLane(t *testing.T, tp *testPeer) *lane.Client {
	t.Helper()
	c, err := lane.Dial(tp.cfg.Socket+LaneSuffix, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestLaneAnswersAsGRPC: a Lookup over the engine lane gets the answer gRPC
// gives (hits, tiers, a lease a Load can use), an error gets gRPC's code
// and message, and the lane's calls are counted in the RPC metrics.
func TestLaneAnswersAsGRPC(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(6)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	c := dialLane(t, tp)
	ask := append(keys, randKeys(2)...)
	want, err := e.Lookup(ctx(t), ask, false)
	if err != nil {
		t.Fatal(err)
	}
	var got pb.LookupResponse
	if err := c.Call(ctx(t), "Lookup", &pb.LookupRequest{SessionId: e.Session, Keys: ask, Lease: true}, &got); err != nil {
		t.Fatalf("lane lookup: %v", err)
	}
	if got.HitPages != want.HitPages || got.Tiers.Dram != want.Tiers.Dram || got.HitPages != 6 || got.LeaseId == "" {
		t.Fatalf("lane lookup %v, gRPC's %v", &got, want)
	}
	var load pb.OpHandle
	if err := c.Call(ctx(t), "Load", &pb.LoadRequest{SessionId: e.Session, Pages: refs(keys, 32, 4), LeaseId: got.LeaseId, Wait: true}, &load); err != nil {
		t.Fatalf("lane load: %v", err)
	}
	mustOK(t, load.Status, nil)
	if !load.Status.GetDone() || len(load.Status.Pages) != 6 {
		t.Fatalf("lane load status %v", load.Status)
	}
	for i := range keys {
		if !bytes.Equal(e.page(refs(keys, 0, 4)[i].Blocks), e.page(refs(keys, 32, 4)[i].Blocks)) {
			t.Fatalf("page %d differs after the lane's load", i)
		}
	}
	err = c.Call(ctx(t), "Lookup", &pb.LookupRequest{SessionId: "nope", Keys: ask}, &got)
	_, grpcErr := pb.NewEngineServiceClient(tp.conn).Lookup(ctx(t), &pb.LookupRequest{SessionId: "nope", Keys: ask})
	if status.Code(err) != codes.NotFound || status.Convert(err).Message() != status.Convert(grpcErr).Message() {
		t.Fatalf("unknown session over the lane: %v; over gRPC: %v", err, grpcErr)
	}
	err = c.Call(ctx(t), "Bogus", &pb.LookupRequest{}, &got)
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("unknown method: %v, want Unimplemented", err)
	}
	if m := tp.metric(`orbitkv_fabric_rpcs_total{code="NotFound",method="Lookup"}`); !strings.HasSuffix(m, " 2") {
		t.Fatalf("NotFound lookups counted: %q, want 2 (one per transport)", m)
	}
}

// TestLaneMalformedFrames: a frame that is too long, names no method, or
// stops halfway closes that connection only; the peer goes on answering.
func TestLaneMalformedFrames(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"over the limit", []byte{0x7f, 0xff, 0xff, 0xff}},
		{"no method", []byte{0, 0, 0, 5, 0, 0, 0, 0, 0}},
		{"name past the end", []byte{0, 0, 0, 3, 9, 'L', 'o'}},
		{"half a frame", []byte{0, 0, 0, 40, 6, 'L', 'o', 'o'}},
	} {
		raw, err := net.Dial("unix", tp.cfg.Socket+LaneSuffix)
		if err != nil {
			t.Fatal(err)
		}
		raw.Write(tc.frame)
		if tc.name == "half a frame" {
			raw.(*net.UnixConn).CloseWrite()
		}
		raw.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, err := raw.Read(make([]byte, 64))
		raw.Close()
		if n != 0 || !errors.Is(err, io.EOF) {
			t.Errorf("%s: read %d bytes, %v; want the connection closed (EOF)", tc.name, n, err)
		}
	}
	var got pb.LookupResponse
	if err := dialLane(t, tp).Call(ctx(t), "Lookup", &pb.LookupRequest{SessionId: e.Session, Keys: randKeys(1)}, &got); err != nil {
		t.Fatalf("lookup after the malformed frames: %v", err)
	}
}

// TestLaneCloseEndsCalls: shutting the peer down closes lane connections,
// idle or not, and removes the lane's socket.
func TestLaneCloseEndsCalls(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	c := dialLane(t, tp)
	tp.shutdown()
	var got pb.LookupResponse
	cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Call(cctx, "Lookup", &pb.LookupRequest{SessionId: "x"}, &got); err == nil || status.Code(err) != codes.Unknown {
		t.Fatalf("call after shutdown: %v, want a transport error", err)
	}
	if _, err := net.Dial("unix", tp.cfg.Socket+LaneSuffix); err == nil {
		t.Fatal("the lane socket still accepts after shutdown")
	}
}
