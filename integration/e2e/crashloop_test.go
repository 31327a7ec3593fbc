package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// The crash-consistency test (DESIGN.md §6 "recovery"): the real binary is
// SIGKILLed at random points under concurrent saves (SSD and DRAM
// durability, re-saves of existing keys with other bytes), loads and
// evictions (and, one iteration in four, once more during the restart:
// the page-file scan, the catalog's rebuild), restarted, and checked:
//
//   - every page whose SSD save was acknowledged, and not evicted from SSD
//     since, is found and served with bytes some save of that key sent;
//   - no load ever serves bytes that no save of that key sent;
//   - the gauges (copies, operations, leases, query bytes, SSD queue,
//     unsealed pages) are back to 0 once the checks are done.
//
// Each worker owns its keys, so per key the operations are sequential and
// the model below is exact. A key's bytes may legitimately be any version
// sent for it: a re-save of a stored key is a no-op that keeps the stored
// bytes, and a restart may find an older copy of a key whose newer copy
// lived in DRAM only. ORBITKV_CRASH_ITERS sets the number of kills
// (default 3, the short form `make test` runs; `make crash` runs 200).

const (
	crashWorkers       = 4
	crashKeysPerWorker = 40 // 160 pages of 128 KiB: the SSD tier never evicts
)

// crashKey is the model of one key.
type crashKey struct {
	key      []byte
	versions map[[32]byte]bool // every byte version a save sent
	mustHave bool              // an SSD save was acknowledged and no SSD eviction followed
}

// crashStats are the figures the run reports.
type crashStats struct {
	mu                  sync.Mutex
	ackedSSD, ackedDRAM int // acknowledged saves
	loads, evictions    int
	checked             int // acknowledged SSD pages checked after restarts
	lost, wrong, bad    int // violations: acknowledged pages gone, bytes no save sent, other failures
	reported            int
}

// violation counts a broken invariant and reports the first few.
func (s *crashStats) violation(t *testing.T, kind *int, format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*kind++
	if s.reported++; s.reported <= 20 {
		t.Errorf(format, args...)
	}
}

func (s *crashStats) add(f func(s *crashStats)) {
	s.mu.Lock()
	f(s)
	s.mu.Unlock()
}

func crashIters(t *testing.T) int {
	v := os.Getenv("ORBITKV_CRASH_ITERS")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("ORBITKV_CRASH_ITERS=%q: want a positive number", v)
	}
	return n
}

func TestCrashConsistency(t *testing.T) {
	iters := crashIters(t)
	data, shm := t.TempDir(), newShm(t)
	keys := make([][]*crashKey, crashWorkers)
	for w := range keys {
		for range crashKeysPerWorker {
			k := make([]byte, 16)
			rand.Read(k)
			keys[w] = append(keys[w], &crashKey{key: k, versions: map[[32]byte]bool{}})
		}
	}
	var st crashStats
	startKills := 0
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 7))
	start := time.Now()
	for it := range iters {
		if rng.IntN(4) == 0 { // a kill during the start: the scan, the catalog's rebuild
			killDuringStart(t, data, time.Duration(rng.IntN(300))*time.Millisecond)
			startKills++
		}
		p := startPeer(t, data)
		checkAfterRestart(t, p, shm, keys, &st)
		runUntilKilled(t, p, shm, keys, &st, time.Duration(20+rng.IntN(400))*time.Millisecond)
		if it == 0 || (it+1)%50 == 0 {
			t.Logf("iteration %d: %d lost, %d wrong, %d other failures so far", it+1, st.lost, st.wrong, st.bad)
		}
	}
	p := startPeer(t, data)
	checkAfterRestart(t, p, shm, keys, &st)
	p.stop(t)
	t.Logf("crash test: %d SIGKILLs under load and %d during starts in %v; acknowledged saves %d to SSD, %d to DRAM; "+
		"%d loads and %d evictions under load; %d acknowledged SSD pages checked after restarts: %d lost, %d wrong, %d other failures",
		iters, startKills, time.Since(start).Round(time.Second), st.ackedSSD, st.ackedDRAM, st.loads, st.evictions,
		st.checked, st.lost, st.wrong, st.bad)
	if st.lost+st.wrong+st.bad > 0 {
		t.Fatal("the crash test found lost or wrong pages")
	}
}

// killDuringStart starts a peer on data and SIGKILLs it after d, serving
// or not.
func killDuringStart(t *testing.T, data string, d time.Duration) {
	t.Helper()
	cmd := exec.Command(binPath, serveArgs(data)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-exited
	case err := <-exited:
		t.Fatalf("peer exited on its own during start: %v", err)
	}
}

// checkAfterRestart loads every key once and checks it against the model,
// then waits for the gauges to drain.
func checkAfterRestart(t *testing.T, p *proc, shm *engineclient.Shm, keys [][]*crashKey, st *crashStats) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := openEngine(t, p, shm)
	for _, ks := range keys {
		for _, k := range ks {
			dst := &pb.PageRef{Key: k.key, Blocks: blocksOf(31)}
			res, err := e.Load(ctx, []*pb.PageRef{dst})
			if err != nil {
				t.Fatalf("load after restart: %v", err)
			}
			code, msg := res.Pages[0].Code, res.Pages[0].Message
			if k.mustHave {
				st.add(func(s *crashStats) { s.checked++ })
			}
			switch {
			case code == pb.PageCode_PAGE_OK && !k.versions[sha256.Sum256(pageBytes(shm, dst.Blocks))]:
				st.violation(t, &st.wrong, "page %x served after restart with bytes no save sent", k.key)
			case code == pb.PageCode_PAGE_OK:
			case k.mustHave:
				st.violation(t, &st.lost, "acknowledged SSD page %x lost after restart: %v %s", k.key, code, msg)
				k.mustHave = false // counted once
			case code != pb.PageCode_PAGE_NOT_FOUND:
				st.violation(t, &st.bad, "page %x after restart: %v %s", k.key, code, msg)
				k.mustHave = false
			}
		}
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitGaugesZero(t, p)
}

// drainGauges are the series that must read 0 when the peer is idle.
var drainGauges = []string{"orbitkv_transfer_inflight_copies", "orbitkv_transfer_inflight_ops", "orbitkv_fabric_leases",
	"orbitkv_fabric_query_bytes", "orbitkv_tiers_ssd_inflight", "orbitkv_tiers_unsealed_pages"}

func waitGaugesZero(t *testing.T, p *proc) {
	t.Helper()
	waitFor(t, "gauges back to 0", 10*time.Second, func() bool {
		for _, g := range drainGauges {
			if metricValue(t, p, g) != 0 {
				return false
			}
		}
		return true
	})
}

// runUntilKilled runs the workers against p and SIGKILLs it after d.
func runUntilKilled(t *testing.T, p *proc, shm *engineclient.Shm, keys [][]*crashKey, st *crashStats, d time.Duration) {
	t.Helper()
	conn, err := engineclient.Dial(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := pb.NewAdminServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, crashWorkers)
	for w := range crashWorkers {
		e := openEngine(t, p, shm)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- crashWorker(t, ctx, e, admin, w, keys[w], st)
		}()
	}
	timer := time.NewTimer(d)
	select {
	case <-timer.C:
	case <-p.exited:
		t.Fatal("peer exited under the workload")
	}
	p.kill()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// crashWorker runs random operations on its keys until the peer is gone,
// counting the violations it sees while the peer serves. It returns an
// error only for a failure of the test itself.
func crashWorker(t *testing.T, ctx context.Context, e *engineProc, admin pb.AdminServiceClient, w int, keys []*crashKey, st *crashStats) error {
	rng := mrand.New(mrand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	src, dst := 2*w, 2*w+1 // this worker's page slots in the shared memory
	for ctx.Err() == nil {
		k := keys[rng.IntN(len(keys))]
		var err error
		switch op := rng.IntN(10); {
		case op < 4:
			err = crashSave(t, ctx, e, src, k, pb.Durability_DURABILITY_SSD, st)
		case op < 6:
			err = crashSave(t, ctx, e, src, k, pb.Durability_DURABILITY_DRAM, st)
		case op < 9:
			err = crashLoad(t, ctx, e, dst, k, st)
		default:
			err = crashEvict(ctx, admin, k, rng.IntN(2) == 0, st)
		}
		if err == errPeerGone {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

var errPeerGone = fmt.Errorf("peer gone")

func crashSave(t *testing.T, ctx context.Context, e *engineProc, slot int, k *crashKey, d pb.Durability, st *crashStats) error {
	blocks := blocksOf(slot)
	for l := 0; l < flash.Layers; l++ {
		for pl := 0; pl < 2; pl++ {
			for _, b := range blocks {
				off := flash.BlockOffset(l, pl, int(b))
				rand.Read(e.shm.Mem[off : off+flash.BlockBytes()])
			}
		}
	}
	k.versions[sha256.Sum256(pageBytes(e.shm, blocks))] = true // before the save: a kill may land it
	res, err := e.Save(ctx, []*pb.PageRef{{Key: k.key, Blocks: blocks}}, d)
	if err != nil {
		return errPeerGone
	}
	switch pg := res.Pages[0]; {
	case pg.Code == pb.PageCode_PAGE_OK && d == pb.Durability_DURABILITY_SSD:
		k.mustHave = true
		st.add(func(s *crashStats) { s.ackedSSD++ })
	case pg.Code == pb.PageCode_PAGE_OK:
		st.add(func(s *crashStats) { s.ackedDRAM++ })
	default:
		st.violation(t, &st.bad, "save %x (%v): %v %s", k.key, d, pg.Code, pg.Message)
	}
	return nil
}

func crashLoad(t *testing.T, ctx context.Context, e *engineProc, slot int, k *crashKey, st *crashStats) error {
	dst := &pb.PageRef{Key: k.key, Blocks: blocksOf(slot)}
	res, err := e.Load(ctx, []*pb.PageRef{dst})
	if err != nil {
		return errPeerGone
	}
	st.add(func(s *crashStats) { s.loads++ })
	switch pg := res.Pages[0]; {
	case pg.Code == pb.PageCode_PAGE_OK && !k.versions[sha256.Sum256(pageBytes(e.shm, dst.Blocks))]:
		st.violation(t, &st.wrong, "page %x served with bytes no save sent", k.key)
	case pg.Code == pb.PageCode_PAGE_OK:
	case k.mustHave:
		st.violation(t, &st.lost, "acknowledged SSD page %x not served: %v %s", k.key, pg.Code, pg.Message)
		k.mustHave = false
	case pg.Code != pb.PageCode_PAGE_NOT_FOUND:
		st.violation(t, &st.bad, "load %x: %v %s", k.key, pg.Code, pg.Message)
		k.mustHave = false // the peer dropped it: not counted again as lost
	}
	return nil
}

func crashEvict(ctx context.Context, admin pb.AdminServiceClient, k *crashKey, ssdTier bool, st *crashStats) error {
	tier := pb.Tier_TIER_DRAM
	if ssdTier {
		tier = pb.Tier_TIER_SSD
	}
	res, err := admin.Evict(ctx, &pb.EvictRequest{Tier: tier, Keys: [][]byte{k.key}})
	if err != nil {
		if ssdTier {
			k.mustHave = false // the kill may have come after the eviction
		}
		return errPeerGone
	}
	st.add(func(s *crashStats) { s.evictions++ })
	if ssdTier && res.EvictedPages > 0 {
		k.mustHave = false
	}
	return nil
}
