package engineapi

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/fabric/store"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/dram"
)

// TestOpenSessionTheEngineGaveUpOnIsNotKept: an open that finishes after the
// engine's deadline passed (a large buffer took long to register) answers
// with the deadline's code and leaves no session behind; the engine's next
// open is the only one. Before, each timed-out open left a session (and its
// mappings) until its keepalive lapsed.
func TestOpenSessionTheEngineGaveUpOnIsNotKept(t *testing.T) {
	pool, err := dram.New(dram.Config{Bytes: 4 << 20, SlabBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	cat, err := catalog.Open(catalog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	reg := prometheus.NewRegistry()
	st := store.New(cat, pool, nil, store.Options{QueryBudget: 1 << 20, Registry: reg, Log: zerolog.Nop()})
	p := New(Limits{LeaseTTL: time.Minute, Keepalive: time.Minute, OpDeadline: time.Minute, MaxKeys: 8, MaxPages: 8},
		Deps{Catalog: cat, Store: st, MaxPageBytes: 1 << 20, Started: time.Now(), Registry: reg, Log: zerolog.Nop()})
	eng := &engineServer{p: p}
	req := &pb.OpenSessionRequest{EngineId: "worker", Layout: tinyFlash.Layout("m"), BlockTokens: uint32(tinyFlash.BlockTokens)}

	gone, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := eng.OpenSession(gone, req); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("an open whose caller's deadline passed: %v, want DeadlineExceeded", err)
	}
	if n := len(p.sessions.list()); n != 0 {
		t.Fatalf("%d sessions kept after an open the engine gave up on, want 0", n)
	}
	open, err := eng.OpenSession(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if l := p.sessions.list(); len(l) != 1 || l[0].id != open.SessionId {
		t.Fatalf("%d sessions after the retried open, want only %s", len(l), open.SessionId)
	}
}
