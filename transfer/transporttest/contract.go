package transporttest

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/transfer"
)

// Harness is one Transport under test and its remote end.
type Harness struct {
	Transport transfer.Transport
	Endpoint  string
	// Put holds a page at the remote end; it returns the page's key.
	Put func(h page.Header, data []byte) transfer.RemoteKey
	// Stall makes the remote end stop answering (nil: the deadline case is
	// skipped).
	Stall func()
	// Local makes a zeroed local region of n bytes that the transport can
	// move into and out of (an RDMA transport registers it; nil: Go heap
	// memory).
	Local func(t *testing.T, name string, n int) *transfer.Region
}

// local is a zeroed region of n bytes from h.Local, or the Go heap.
func (h Harness) local(t *testing.T, name string, n int) *transfer.Region {
	if h.Local == nil {
		return transfer.HostRegion(name, make([]byte, n))
	}
	return h.Local(t, name, n)
}

// Contract runs the transfer.Transport contract against the harnesses
// newHarness makes (a fresh one per case).
func Contract(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, h Harness)
	}{
		{"read batch lands in place", readBatch},
		{"a missing page fails alone", missingFailsAlone},
		{"a bad descriptor fails alone", badDescFailsAlone},
		{"cancelled context fails every descriptor", cancelled},
		{"stalled remote ends by the deadline", stalled},
		{"write reads back or is unsupported", writeBack},
		{"bytes unlike their header are never verified", neverVerifiesWrongBytes},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newHarness(t)) })
	}
}

var layout = pagekey.Fingerprint{7, 7, 7}

// testPage is a random page of size bytes.
func testPage(r *rand.Rand, size int) (page.Header, []byte) {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	var k pagekey.Key
	for i := range k {
		k[i] = byte(r.Uint32())
	}
	return page.Header{Key: k, Layout: layout, Length: uint64(size), Checksum: page.Checksum(data), Generation: 1}, data
}

func deadline(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// readBatch: pages of several sizes read into one local region at offsets
// in another order than the batch's; each lands at its own offset with the
// header the remote holds, and verifies.
func readBatch(t *testing.T, h Harness) {
	r := rand.New(rand.NewPCG(1, 2))
	sizes := []int{4096, 1, 65536, 12345, 8192}
	local := h.local(t, "local", 1<<18)
	var batch []transfer.RemoteDesc
	var want [][]byte
	var heads []page.Header
	off := uint64(len(local.Host))
	for _, n := range sizes {
		hd, data := testPage(r, n)
		off -= uint64(n) + 100 // from the end down: placement is not the batch order
		batch = append(batch, transfer.RemoteDesc{Op: transfer.Read, Remote: h.Put(hd, data), Len: uint64(n), Local: local, LocalOff: off})
		want, heads = append(want, data), append(heads, hd)
	}
	got := h.Transport.Submit(deadline(t, 10*time.Second), h.Endpoint, batch)
	if len(got) != len(batch) {
		t.Fatalf("%d completions for %d descriptors", len(got), len(batch))
	}
	for i, c := range got {
		if c.Err != nil {
			t.Fatalf("descriptor %d: %v", i, c.Err)
		}
		if c.Header.Key != heads[i].Key || c.Header.Checksum != heads[i].Checksum || c.Header.Length != heads[i].Length {
			t.Fatalf("descriptor %d: header %+v, want %+v", i, c.Header, heads[i])
		}
		b := batch[i].LocalBytes()
		if !bytes.Equal(b, want[i]) || c.Header.Verify(b) != nil {
			t.Fatalf("descriptor %d: bytes not in place at %d", i, batch[i].LocalOff)
		}
	}
}

// neverVerifiesWrongBytes: a remote page whose bytes do not match its own
// header (a holder with a bad copy) completes unverified, for the caller
// to catch, or fails as corrupt; a Verified completion never carries them.
func neverVerifiesWrongBytes(t *testing.T, h Harness) {
	r := rand.New(rand.NewPCG(5, 6))
	hd, data := testPage(r, 8192)
	hd.Checksum ^= 1 // the holder's header no longer matches its bytes
	local := h.local(t, "local", 8192)
	got := h.Transport.Submit(deadline(t, 10*time.Second), h.Endpoint,
		[]transfer.RemoteDesc{{Op: transfer.Read, Remote: h.Put(hd, data), Len: 8192, Local: local}})
	var ce *page.CorruptError
	switch c := got[0]; {
	case c.Err != nil && !errors.As(c.Err, &ce):
		t.Fatalf("a wrong page failed with %v, want a *page.CorruptError (or an unverified completion)", c.Err)
	case c.Err == nil && c.Verified:
		t.Fatal("a page whose bytes do not match its header completed Verified")
	}
}

// missingFailsAlone: a page the remote does not hold fails its descriptor
// with ErrRemoteNotFound; the others complete.
func missingFailsAlone(t *testing.T, h Harness) {
	r := rand.New(rand.NewPCG(3, 4))
	local := h.local(t, "local", 3*4096)
	var batch []transfer.RemoteDesc
	for i := range 3 {
		hd, data := testPage(r, 4096)
		key := transfer.PageKey(hd.Key, hd.Layout)
		if i != 1 {
			key = h.Put(hd, data)
		}
		batch = append(batch, transfer.RemoteDesc{Op: transfer.Read, Remote: key, Len: 4096, Local: local, LocalOff: uint64(i * 4096)})
	}
	got := h.Transport.Submit(deadline(t, 10*time.Second), h.Endpoint, batch)
	for i, c := range got {
		switch {
		case i == 1 && !errors.Is(c.Err, transfer.ErrRemoteNotFound):
			t.Fatalf("missing page: %v, want ErrRemoteNotFound", c.Err)
		case i != 1 && c.Err != nil:
			t.Fatalf("descriptor %d beside a missing page: %v", i, c.Err)
		}
	}
}

// badDescFailsAlone: a descriptor whose local range is outside its region
// fails; the one beside it completes; nothing panics.
func badDescFailsAlone(t *testing.T, h Harness) {
	r := rand.New(rand.NewPCG(5, 6))
	local := h.local(t, "local", 8192)
	hd, data := testPage(r, 4096)
	key := h.Put(hd, data)
	batch := []transfer.RemoteDesc{
		{Op: transfer.Read, Remote: key, Len: 4096, Local: local, LocalOff: 6000},
		{Op: transfer.Read, Remote: key, Len: 4096, Local: local, LocalOff: 0},
	}
	got := h.Transport.Submit(deadline(t, 10*time.Second), h.Endpoint, batch)
	if got[0].Err == nil || got[1].Err != nil {
		t.Fatalf("out of range: %v; in range: %v", got[0].Err, got[1].Err)
	}
}

// cancelled: a batch under a cancelled context fails every descriptor with
// an error that says so, and returns.
func cancelled(t *testing.T, h Harness) {
	r := rand.New(rand.NewPCG(7, 8))
	local := h.local(t, "local", 4096)
	hd, data := testPage(r, 4096)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	got := h.Transport.Submit(ctx, h.Endpoint, []transfer.RemoteDesc{{Op: transfer.Read, Remote: h.Put(hd, data), Len: 4096, Local: local}})
	if !errors.Is(got[0].Err, context.Canceled) {
		t.Fatalf("cancelled batch: %v, want context.Canceled", got[0].Err)
	}
}

// stalled: a remote that stops answering fails the batch by its deadline,
// with context.DeadlineExceeded.
func stalled(t *testing.T, h Harness) {
	if h.Stall == nil {
		t.Skip("the harness cannot stall its remote")
	}
	r := rand.New(rand.NewPCG(9, 10))
	local := h.local(t, "local", 4096)
	hd, data := testPage(r, 4096)
	key := h.Put(hd, data)
	h.Stall()
	const d = 200 * time.Millisecond
	start := time.Now()
	got := h.Transport.Submit(deadline(t, d), h.Endpoint, []transfer.RemoteDesc{{Op: transfer.Read, Remote: key, Len: 4096, Local: local}})
	took := time.Since(start)
	if !errors.Is(got[0].Err, context.DeadlineExceeded) {
		t.Fatalf("stalled remote: %v, want context.DeadlineExceeded", got[0].Err)
	}
	if took > d+5*time.Second {
		t.Fatalf("stalled remote returned after %v, deadline %v", took, d)
	}
}

// writeBack: a Write either fails with ErrUnsupported (a transport that
// only reads) or stores the bytes, which a Read then returns.
func writeBack(t *testing.T, h Harness) {
	r := rand.New(rand.NewPCG(11, 12))
	hd, data := testPage(r, 4096)
	src := h.local(t, "src", len(data))
	copy(src.Host, data)
	key := transfer.PageKey(hd.Key, hd.Layout)
	w := h.Transport.Submit(deadline(t, 10*time.Second), h.Endpoint, []transfer.RemoteDesc{{Op: transfer.Write, Remote: key, Len: 4096, Local: src}})
	if errors.Is(w[0].Err, transfer.ErrUnsupported) {
		t.Logf("%s does not write (allowed): %v", h.Transport.Name(), w[0].Err)
		return
	}
	if w[0].Err != nil {
		t.Fatalf("write: %v", w[0].Err)
	}
	dst := h.local(t, "dst", 4096)
	got := h.Transport.Submit(deadline(t, 10*time.Second), h.Endpoint, []transfer.RemoteDesc{{Op: transfer.Read, Remote: key, Len: 4096, Local: dst}})
	if got[0].Err != nil || !bytes.Equal(dst.Host, data) || got[0].Header.Verify(dst.Host) != nil {
		t.Fatalf("read after write: %v, bytes equal %v", got[0].Err, bytes.Equal(dst.Host, data))
	}
}
