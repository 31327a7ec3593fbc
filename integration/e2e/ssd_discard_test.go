package e2e

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// TestSSDTierShrinkRefusedUnlessDiscarded: `orbitkv serve --ssd-bytes 0` on
// a data dir holding SSD pages exits with a message naming --ssd-discard
// and leaves every page in place; with --ssd-discard it serves, says how
// many pages it dropped and removes the page files (before: it started and
// threw the pages away with one info line, the files left on disk).
func TestSSDTierShrinkRefusedUnlessDiscarded(t *testing.T) {
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	peer := startPeer(t, data)
	e := shmEngine(t, peer)
	refs := []*pb.PageRef{{Key: randKey(), Blocks: blocksOf(0)}, {Key: randKey(), Blocks: blocksOf(1)}}
	if st, err := e.Save(ctx, refs, pb.Durability_DURABILITY_SSD); err != nil || engineclient.AllOK(st) != nil {
		t.Fatalf("save: %v %v", st, err)
	}
	peer.stop(t)

	out, err := serveOnce(ctx, data, "--ssd-bytes", "0")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(out, "--ssd-discard") || !strings.Contains(out, "2 pages") {
		t.Fatalf("serve --ssd-bytes 0 over 2 ssd pages: %v\n%s\nwant a refusal naming --ssd-discard and 2 pages", err, out)
	}
	peer = startPeer(t, data) // refused: nothing changed
	e = openEngine(t, peer, e.shm)
	dst := []*pb.PageRef{{Key: refs[0].Key, Blocks: blocksOf(2)}, {Key: refs[1].Key, Blocks: blocksOf(3)}}
	if st, err := e.Load(ctx, dst); err != nil || engineclient.AllOK(st) != nil {
		t.Fatalf("load after the refused start: %v %v", st, err)
	}
	peer.stop(t)

	peer = startPeer(t, data, "--ssd-bytes", "0", "--ssd-discard")
	peer.stop(t)
	if files, _ := filepath.Glob(filepath.Join(data, "ssd", "*.pages")); len(files) != 0 {
		t.Fatalf("page files %v left after --ssd-discard", files)
	}
}

// serveOnce runs `orbitkv serve` expecting it to exit by itself, and returns
// its output.
func serveOnce(ctx context.Context, data string, extra ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	args := append([]string{"serve", "--data-dir", data, "--metrics-addr", "127.0.0.1:0",
		"--dram-bytes", "32MiB", "--dram-slab-bytes", "4MiB", "--ssd-file-bytes", "64MiB"}, extra...)
	out, err := exec.CommandContext(ctx, binPath, args...).CombinedOutput()
	return string(out), err
}
