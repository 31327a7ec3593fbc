package engineapi

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/fabric/store"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/dram"
)

// TestLookupsStampTheInjectedClock: a hit of the engine's Lookup, and of the
// admin's CatalogLookup, records its access time (catalog LastAccess) by the
// API's clock, Deps.Now: the clock the store judges that time by
// (fabric/store/evict.go drops a DRAM-only page unused for fillProtect), not
// the wall clock.
func TestLookupsStampTheInjectedClock(t *testing.T) {
	clock := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC) // years from the wall clock
	now := func() time.Time { return clock }
	pool, err := dram.New(dram.Config{Bytes: 4 << 20, SlabBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	cat, err := catalog.Open(catalog.Options{}) // in memory
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	reg := prometheus.NewRegistry()
	st := store.New(cat, pool, nil, store.Options{QueryBudget: 1 << 20, Registry: reg, Log: zerolog.Nop(), Now: now})
	p := New(Limits{LeaseTTL: time.Minute, Keepalive: time.Minute, OpDeadline: time.Minute, MaxKeys: 8, MaxPages: 8},
		Deps{Catalog: cat, Store: st, MaxPageBytes: 1 << 20, Started: clock, Registry: reg, Log: zerolog.Nop(), Now: now})
	eng, adm := &engineServer{p: p}, &adminServer{p: p}
	ctx := context.Background()

	open, err := eng.OpenSession(ctx, &pb.OpenSessionRequest{EngineId: "scheduler", Layout: tinyFlash.Layout("m"),
		BlockTokens: uint32(tinyFlash.BlockTokens)}) // lookup-only
	if err != nil {
		t.Fatal(err)
	}
	k := pagekey.Key{1, 2, 3}
	if err := cat.Put(catalog.Entry{Key: k, Layout: pagekey.Fingerprint(open.LayoutFingerprint), Size: open.PageBytes, DRAMSlot: 0, LastAccess: 1}); err != nil {
		t.Fatal(err)
	}
	stamped := func(what string) {
		t.Helper()
		e, ok := cat.Get(k)
		if !ok {
			t.Fatalf("%s: the page left the catalog", what)
		}
		if got := time.Unix(0, e.LastAccess).UTC(); !got.Equal(clock) {
			t.Errorf("%s stamped the page's access at %v, want the API clock's %v", what, got, clock)
		}
	}
	clock = clock.Add(time.Hour)
	if r, err := eng.Lookup(ctx, &pb.LookupRequest{SessionId: open.SessionId, Keys: [][]byte{k[:]}}); err != nil || r.HitPages != 1 {
		t.Fatalf("lookup: %v, %v", r, err)
	}
	stamped("a Lookup")
	clock = clock.Add(time.Hour)
	if r, err := adm.CatalogLookup(ctx, &pb.CatalogLookupRequest{Keys: [][]byte{k[:]}}); err != nil || r.HitPages != 1 {
		t.Fatalf("catalog lookup: %v, %v", r, err)
	}
	stamped("a CatalogLookup")
}
