package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

var flash = engineclient.Flash{Layers: 4, NumBlocks: 128, BlockTokens: 16, PageTokens: 64, KVHeads: 2, HeadDim: 64, ElemBytes: 2}

type engineProc struct {
	*engineclient.Engine
	shm *engineclient.Shm
}

func openEngine(t *testing.T, p *proc, shm *engineclient.Shm) *engineProc {
	t.Helper()
	return openEngineAs(t, p, shm, flash)
}

// openEngineAs opens an engine session with layout fl on shm.
func openEngineAs(t *testing.T, p *proc, shm *engineclient.Shm, fl engineclient.Flash) *engineProc {
	t.Helper()
	conn, err := engineclient.Dial(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := engineclient.Open(ctx, conn, fl.OpenRequest("e2e", shm.Path))
	if err != nil {
		t.Fatal(err)
	}
	return &engineProc{Engine: e, shm: shm}
}

func pageBytes(shm *engineclient.Shm, blocks []uint32) []byte {
	return pageBytesAs(shm, blocks, flash)
}

// pageBytesAs is a page's bytes in shm laid out as fl.
func pageBytesAs(shm *engineclient.Shm, blocks []uint32, fl engineclient.Flash) []byte {
	var out []byte
	for l := 0; l < fl.Layers; l++ {
		for pl := 0; pl < 2; pl++ {
			for _, b := range blocks {
				off := fl.BlockOffset(l, pl, int(b))
				out = append(out, shm.Mem[off:off+fl.BlockBytes()]...)
			}
		}
	}
	return out
}

func blocksOf(page int) []uint32 {
	per := flash.PageTokens / flash.BlockTokens
	out := make([]uint32, per)
	for i := range out {
		out[i] = uint32(page*per + i)
	}
	return out
}

// TestCrashDuringSavesLosesNoAcknowledgedPage saves pages through the real
// binary, SIGKILLs it while further saves are in flight, restarts it and
// loads every page whose save was acknowledged as durable on SSD.
func TestCrashDuringSavesLosesNoAcknowledgedPage(t *testing.T) {
	data := t.TempDir()
	shm, err := engineclient.CreateShm(filepath.Join(t.TempDir(), "kv"), flash.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	peer := startPeer(t, data)
	e := openEngine(t, peer, shm)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A first round trip, byte-exact.
	acked := map[string][32]byte{}
	first := saveRound(t, ctx, e, 0, 4, acked)
	if len(first) != 4 {
		t.Fatalf("first round acknowledged %d of 4 pages", len(first))
	}
	dst := []*pb.PageRef{{Key: first[0].Key, Blocks: blocksOf(31)}}
	st, err := e.Load(ctx, dst)
	if err != nil || engineclient.AllOK(st) != nil {
		t.Fatalf("load: %v %v", st, err)
	}
	if sha256.Sum256(pageBytes(shm, dst[0].Blocks)) != acked[string(first[0].Key)] {
		t.Fatal("loaded page differs from the saved one")
	}

	// Saves keep going in the background; the peer dies under them.
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for round := 1; ctx.Err() == nil; round++ {
			if len(saveRound(t, ctx, e, round%7, 4, acked)) == 0 {
				return // the peer is gone
			}
		}
	}()
	waitAcked(t, acked, 60)
	peer.kill()
	<-stopped
	t.Logf("%d pages acknowledged before SIGKILL", len(acked))

	peer2 := startPeer(t, data)
	if out, err := peer2.cli(t, "status"); err != nil || !strings.HasPrefix(out, "healthy") {
		t.Fatalf("status after restart: %v\n%s", err, out)
	}
	e2 := openEngine(t, peer2, shm)
	verifyAll(t, ctx, e2, shm, acked)
	verifyUnacked(t, ctx, e2, shm, acked)
}

// verifyUnacked loads the pages whose saves were in flight at the kill: each
// is either gone or exactly what was saved, never wrong bytes.
func verifyUnacked(t *testing.T, ctx context.Context, e *engineProc, shm *engineclient.Shm, acked map[string][32]byte) {
	found, gone := 0, 0
	for k, sum := range attempted {
		if _, ok := acked[k]; ok {
			continue
		}
		ref := &pb.PageRef{Key: []byte(k), Blocks: blocksOf(30)}
		st, err := e.Load(ctx, []*pb.PageRef{ref})
		if err != nil {
			t.Fatal(err)
		}
		switch st.Pages[0].Code {
		case pb.PageCode_PAGE_NOT_FOUND:
			gone++
		case pb.PageCode_PAGE_OK:
			if sha256.Sum256(pageBytes(shm, ref.Blocks)) != sum {
				t.Fatalf("unacknowledged page %x served with wrong bytes", k)
			}
			found++
		default:
			t.Fatalf("unacknowledged page %x: %v %s", k, st.Pages[0].Code, st.Pages[0].Message)
		}
	}
	t.Logf("pages in flight at the kill: %d recovered intact, %d gone", found, gone)
}

var (
	ackMu     = make(chan struct{}, 1)
	attempted = map[string][32]byte{} // every page a save was sent for
)

// saveRound writes fresh random bytes into n pages' blocks (starting at page
// slot base*n), saves them durably and records the acknowledged ones.
func saveRound(t *testing.T, ctx context.Context, e *engineProc, base, n int, acked map[string][32]byte) []*pb.PageRef {
	sums := map[string][32]byte{}
	refs := writePages(e, base, n, sums)
	ackMu <- struct{}{}
	for k, v := range sums {
		attempted[k] = v
	}
	<-ackMu
	st, err := e.Save(ctx, refs, pb.Durability_DURABILITY_SSD)
	if err != nil {
		return nil
	}
	var ok []*pb.PageRef
	ackMu <- struct{}{}
	for i, p := range st.Pages {
		if p.Code == pb.PageCode_PAGE_OK && p.Tier == pb.Tier_TIER_SSD {
			acked[string(refs[i].Key)] = sums[string(refs[i].Key)]
			ok = append(ok, refs[i])
		}
	}
	<-ackMu
	return ok
}

// writePages fills n page slots (from base*n) with fresh random bytes
// under fresh random keys and records each page's sum.
func writePages(e *engineProc, base, n int, sums map[string][32]byte) []*pb.PageRef {
	var refs []*pb.PageRef
	for i := 0; i < n; i++ {
		blocks := blocksOf(base*n + i)
		for l := 0; l < flash.Layers; l++ {
			for pl := 0; pl < 2; pl++ {
				for _, b := range blocks {
					off := flash.BlockOffset(l, pl, int(b))
					rand.Read(e.shm.Mem[off : off+flash.BlockBytes()])
				}
			}
		}
		key := make([]byte, 16)
		rand.Read(key)
		refs = append(refs, &pb.PageRef{Key: key, Blocks: blocks})
		sums[string(key)] = sha256.Sum256(pageBytes(e.shm, blocks))
	}
	return refs
}

func waitAcked(t *testing.T, acked map[string][32]byte, n int) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ackMu <- struct{}{}
		got := len(acked)
		<-ackMu
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d pages acknowledged in 30s", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// verifyAll loads every acknowledged page after the restart: each must be
// found, pass its checksum and match what was saved.
func verifyAll(t *testing.T, ctx context.Context, e *engineProc, shm *engineclient.Shm, acked map[string][32]byte) {
	ackMu <- struct{}{}
	defer func() { <-ackMu }()
	var keys [][]byte
	for k := range acked {
		keys = append(keys, []byte(k))
	}
	for i := 0; i < len(keys); i += 8 {
		batch := keys[i:min(i+8, len(keys))]
		var refs []*pb.PageRef
		for j, k := range batch {
			refs = append(refs, &pb.PageRef{Key: k, Blocks: blocksOf(16 + j)})
		}
		st, err := e.Load(ctx, refs)
		if err != nil {
			t.Fatal(err)
		}
		for j, p := range st.Pages {
			if p.Code != pb.PageCode_PAGE_OK {
				t.Fatalf("acknowledged page %x after restart: %v %s", batch[j], p.Code, p.Message)
			}
			if got := sha256.Sum256(pageBytes(shm, refs[j].Blocks)); !bytes.Equal(got[:], ptr(acked[string(batch[j])])) {
				t.Fatalf("acknowledged page %x differs after restart", batch[j])
			}
		}
	}
	t.Logf("all %d acknowledged pages found and verified after restart", len(keys))
}

func ptr(a [32]byte) []byte { return a[:] }
