package fabric

import (
	"bytes"
	"github.com/orbitkv/orbitkv/fabric/store"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// shmDir is a directory under /dev/shm for one test's engine files.
func shmDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "orbitkv-test-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestShrunkEngineFileFailsOnlyItsSession: an engine that truncates its
// registered shared-memory file after OpenSession gets a clear error naming
// the file on its next Save and Load; the peer survives and another
// session's pages still save and load byte-exact.
func TestShrunkEngineFileFailsOnlyItsSession(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	bad, good := tp.engineIn(tinyFlash, shmDir(t)), tp.engineIn(tinyFlash, shmDir(t))
	keys := randKeys(4)
	okOp(t)(bad.Save(ctx(t), refs(keys[:2], 0, 4), pb.Durability_DURABILITY_DRAM))
	if err := os.Truncate(bad.shm.Path, int64(tinyFlash.Size()/3)); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"save": func() error {
			_, err := bad.Save(ctx(t), refs(keys[2:], 8, 4), pb.Durability_DURABILITY_DRAM)
			return err
		},
		"load": func() error { _, err := bad.Load(ctx(t), refs(keys[:2], 40, 4)); return err },
	} {
		err := call()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), bad.shm.Path) {
			t.Fatalf("%s on a shrunk file: %v, want FailedPrecondition naming %s", name, err, bad.shm.Path)
		}
	}
	src := refs(keys[2:], 0, 4)
	okOp(t)(good.Save(ctx(t), src, pb.Durability_DURABILITY_SSD))
	dst := refs(keys[2:], 20, 4)
	okOp(t)(good.Load(ctx(t), dst))
	for i := range dst {
		if !bytes.Equal(good.page(src[i].Blocks), good.page(dst[i].Blocks)) {
			t.Fatalf("page %d of the healthy session differs after the other's fault", i)
		}
	}
	if got := tp.metric("orbitkv_fabric_engine_buffer_faults_total"); got != "orbitkv_fabric_engine_buffer_faults_total 2" {
		t.Fatalf("fault counter %q, want 2", got)
	}
}

// TestEngineFaultDuringCopyFailsThePage: a file that shrinks after the
// operation's size check, while the pages are copied, faults inside the
// copy: the pages fail with PAGE_IO_ERROR naming the file, nothing leaks,
// and the peer goes on.
func TestEngineFaultDuringCopyFailsThePage(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engineIn(tinyFlash, shmDir(t))
	keys := randKeys(4)
	okOp(t)(e.Save(ctx(t), refs(keys[:2], 0, 4), pb.Durability_DURABILITY_DRAM))
	sess, err := tp.p.api.Engine(e.Session)
	if err != nil {
		t.Fatal(err)
	}
	slots := tp.p.pages.PoolStats().Slots
	if err := os.Truncate(e.shm.Path, 0); err != nil {
		t.Fatal(err)
	}
	// The pages' own paths, past the per-operation check (startPageOp).
	for name, run := range map[string]func(res []store.Result){
		"save": func(res []store.Result) {
			tp.p.pages.Save(ctx(t), sess, []store.PageReq{{Key: mustKey(t, keys[2]), Blocks: []uint32{8, 9, 10, 11}}}, true, res)
		},
		"load": func(res []store.Result) {
			tp.p.pages.Load(ctx(t), sess, []store.PageReq{{Key: mustKey(t, keys[0]), Blocks: []uint32{40, 41, 42, 43}}}, res)
		},
	} {
		res := make([]store.Result, 1)
		run(res)
		if res[0].Code != store.CodeIOError || !strings.Contains(res[0].Msg, e.shm.Path) {
			t.Fatalf("%s faulting in the copy: %+v, want PAGE_IO_ERROR naming %s", name, res[0], e.shm.Path)
		}
	}
	if got := tp.metric("orbitkv_fabric_engine_buffer_faults_total"); got != "orbitkv_fabric_engine_buffer_faults_total 2" {
		t.Fatalf("fault counter %q, want 2 (one save, one load)", got)
	}
	if got := tp.p.pages.PoolStats().Slots; got != slots {
		t.Fatalf("%d dram slots in use after the faults, want %d", got, slots)
	}
	look, err := e.Lookup(ctx(t), keys, false)
	if err != nil || look.HitPages != 2 {
		t.Fatalf("lookup after the faults: %v %v, want the 2 saved pages", look, err)
	}
}
