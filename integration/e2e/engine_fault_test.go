package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// shmEngine opens a session whose KV buffer is a fresh file under /dev/shm.
func shmEngine(t *testing.T, p *proc) *engineProc {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "orbitkv-e2e-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	shm, err := engineclient.CreateShm(filepath.Join(dir, "kv"), flash.Size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Close() })
	rand.Read(shm.Mem)
	return openEngine(t, p, shm)
}

// TestShrunkEngineFileLeavesThePeerServing: an engine truncates its
// registered shared-memory file; its Save and Load fail with an error naming
// the file, and the real peer process keeps serving another engine's pages
// byte-exact (before the fix the peer died of SIGBUS).
func TestShrunkEngineFileLeavesThePeerServing(t *testing.T) {
	peer := startPeer(t, t.TempDir())
	bad, good := shmEngine(t, peer), shmEngine(t, peer)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	saved := []*pb.PageRef{{Key: randKey(), Blocks: blocksOf(0)}}
	if st, err := bad.Save(ctx, saved, pb.Durability_DURABILITY_SSD); err != nil || engineclient.AllOK(st) != nil {
		t.Fatalf("save before the shrink: %v %v", st, err)
	}
	if err := os.Truncate(bad.shm.Path, 0); err != nil {
		t.Fatal(err)
	}
	_, saveErr := bad.Save(ctx, []*pb.PageRef{{Key: randKey(), Blocks: blocksOf(1)}}, pb.Durability_DURABILITY_SSD)
	_, loadErr := bad.Load(ctx, []*pb.PageRef{{Key: saved[0].Key, Blocks: blocksOf(2)}})
	for name, err := range map[string]error{"save": saveErr, "load": loadErr} {
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), bad.shm.Path) {
			t.Fatalf("%s on the shrunk file: %v, want FailedPrecondition naming %s", name, err, bad.shm.Path)
		}
	}
	// The other engine still round-trips, including the page the shrunk
	// engine saved before.
	src := []*pb.PageRef{{Key: randKey(), Blocks: blocksOf(0)}}
	if st, err := good.Save(ctx, src, pb.Durability_DURABILITY_SSD); err != nil || engineclient.AllOK(st) != nil {
		t.Fatalf("healthy engine's save: %v %v", st, err)
	}
	dst := []*pb.PageRef{{Key: src[0].Key, Blocks: blocksOf(3)}, {Key: saved[0].Key, Blocks: blocksOf(4)}}
	if st, err := good.Load(ctx, dst); err != nil || engineclient.AllOK(st) != nil {
		t.Fatalf("healthy engine's load: %v %v", st, err)
	}
	if !bytes.Equal(pageBytes(good.shm, src[0].Blocks), pageBytes(good.shm, dst[0].Blocks)) {
		t.Fatal("healthy engine's page differs after the other's fault")
	}
	select {
	case err := <-peer.exited:
		t.Fatalf("peer exited: %v", err)
	default:
	}
	if out, err := peer.cli(t, "status"); err != nil || !strings.HasPrefix(out, "healthy") {
		t.Fatalf("status after the fault: %v\n%s", err, out)
	}
}

func randKey() []byte {
	k := make([]byte, 16)
	rand.Read(k)
	return k
}
