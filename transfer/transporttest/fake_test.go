package transporttest

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/transfer"
)

func memoryHarness(t *testing.T) Harness {
	m := NewMemory()
	return Harness{Transport: m, Put: m.Put, Stall: m.Stall}
}

func TestMemoryContract(t *testing.T) { Contract(t, memoryHarness) }

func TestFaultyPassThroughContract(t *testing.T) {
	Contract(t, func(t *testing.T) Harness {
		h := memoryHarness(t)
		h.Transport = &Faulty{Inner: h.Transport}
		return h
	})
}

// TestFaultyFaults: each fault does what it says and nothing else.
func TestFaultyFaults(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	m := NewMemory()
	local := transfer.HostRegion("local", make([]byte, 8*4096))
	var batch []transfer.RemoteDesc
	var want [][]byte
	for i := range 8 {
		hd, data := testPage(r, 4096)
		batch = append(batch, transfer.RemoteDesc{Op: transfer.Read, Remote: m.Put(hd, data), Len: 4096, Local: local, LocalOff: uint64(i * 4096)})
		want = append(want, data)
	}
	odd := func(i int, _ transfer.RemoteDesc) bool { return i%2 == 1 }
	for _, tc := range []struct {
		name    string
		faults  Faults
		check   func(t *testing.T, i int, c transfer.Completion, b []byte)
		timeout time.Duration
	}{
		{"pass-through", Faults{}, func(t *testing.T, i int, c transfer.Completion, b []byte) {
			if c.Err != nil || !bytes.Equal(b, want[i]) {
				t.Fatalf("page %d: %v", i, c.Err)
			}
		}, time.Second},
		{"reorder places each page at its own offset", Faults{Reorder: true, Seed: 9}, func(t *testing.T, i int, c transfer.Completion, b []byte) {
			if c.Err != nil || !bytes.Equal(b, want[i]) || c.Header.Verify(b) != nil {
				t.Fatalf("page %d: %v", i, c.Err)
			}
		}, time.Second},
		{"corrupt reports success with bad bytes", Faults{Corrupt: odd}, func(t *testing.T, i int, c transfer.Completion, b []byte) {
			if c.Err != nil || (c.Header.Verify(b) != nil) != (i%2 == 1) {
				t.Fatalf("page %d: err %v, verify %v", i, c.Err, c.Header.Verify(b))
			}
		}, time.Second},
		{"drop fails by the deadline", Faults{Drop: odd}, func(t *testing.T, i int, c transfer.Completion, b []byte) {
			if (i%2 == 1) != errors.Is(c.Err, context.DeadlineExceeded) || i%2 == 0 && !bytes.Equal(b, want[i]) {
				t.Fatalf("page %d: %v", i, c.Err)
			}
		}, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clear(local.Host)
			f := &Faulty{Inner: m, Faults: tc.faults}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			for i, c := range f.Submit(ctx, "", batch) {
				tc.check(t, i, c, batch[i].LocalBytes())
			}
		})
	}
}

// verifying claims every completion Verified, as the TCP data plane does
// for the bytes it summed as they landed.
type verifying struct{ transfer.Transport }

func (v verifying) Submit(ctx context.Context, ep string, b []transfer.RemoteDesc) []transfer.Completion {
	out := v.Transport.Submit(ctx, ep, b)
	for i := range out {
		out[i].Verified = out[i].Err == nil
	}
	return out
}

// TestFaultyCorruptionIsNeverVerified: bytes the fake corrupts after the
// inner transport checked them are not reported Verified, so the store,
// which skips its own check for verified completions, still catches them.
func TestFaultyCorruptionIsNeverVerified(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	m := NewMemory()
	local := transfer.HostRegion("local", make([]byte, 2*4096))
	var batch []transfer.RemoteDesc
	for i := range 2 {
		hd, data := testPage(r, 4096)
		batch = append(batch, transfer.RemoteDesc{Op: transfer.Read, Remote: m.Put(hd, data), Len: 4096, Local: local, LocalOff: uint64(i * 4096)})
	}
	f := &Faulty{Inner: verifying{m}, Faults: Faults{Corrupt: func(i int, _ transfer.RemoteDesc) bool { return i == 1 }}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	got := f.Submit(ctx, "", batch)
	if !got[0].Verified || got[1].Verified || got[1].Err != nil {
		t.Fatalf("completions %+v: want the first verified, the corrupted second completed unverified", got)
	}
}
