//go:build cgo && linux

package cuda

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestPeerCopy copies between the first two GPUs (NVLink on the two-GPU
// machine). It needs two devices and skips, whatever ORBITKV_REQUIRE says,
// on a machine with one.
func TestPeerCopy(t *testing.T) {
	d0 := requireDevice(t)
	if n, _ := DeviceCount(); n < 2 {
		t.Skipf("skipping: needs 2 GPUs, have %d", n)
	}
	d1, _ := openSecond(t, d0)
	const n = 32 << 20
	src := allocDevice(t, d0, n)
	dst := allocDevice(t, d1, n)
	want := make([]byte, n)
	fillRandom(rand.New(rand.NewPCG(11, 12)), want)
	if err := d0.CopyToDevice(src.Ptr, want); err != nil {
		t.Fatal(err)
	}
	s, err := d1.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := d1.NewEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := s.PeerCopyAsync(dst.Ptr, d0, src.Ptr, n); err != nil {
		t.Fatal(err)
	}
	if err := e.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := d1.CopyFromDevice(got, dst.Ptr); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("peer copy differs")
	}
}

// openSecond opens GPU 1, closed at the end of the test, with access to
// d0's memory turned on where the devices allow it (reported).
func openSecond(t testing.TB, d0 *Device) (*Device, bool) {
	t.Helper()
	d1, err := Open(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d1.Close() })
	ok, err := d1.CanAccessPeer(d0)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		if err := d1.EnablePeerAccess(d0); err != nil {
			t.Fatal(err)
		}
	}
	return d1, ok
}

// BenchmarkPeerCopy moves an 8K-token prompt's KV (Qwen3-8B: 8,192 × 144 KiB
// = 1,152 MiB) and a 32 MiB chunk from GPU 0 to GPU 1 two ways: direct
// (cuMemcpyPeerAsync, over NVLink where peer access is on) and staged through
// pinned host memory (GPU 0 → DRAM, then DRAM → GPU 1: the path a P/D handoff
// through the peer's DRAM tier takes today, without its overlap of the two
// halves). Needs two GPUs; skips on one.
func BenchmarkPeerCopy(b *testing.B) {
	d0 := requireDevice(b)
	if n, _ := DeviceCount(); n < 2 {
		b.Skipf("skipping: needs 2 GPUs, have %d", n)
	}
	d1, peer := openSecond(b, d0)
	b.Logf("GPU 1 can access GPU 0 directly: %v", peer)
	for _, n := range []uint64{32 << 20, 1152 << 20} {
		src, dst := allocDevice(b, d0, n), allocDevice(b, d1, n)
		host := registerHost(b, d0, int(n)) // portable: pinned for both devices
		b.Run(fmt.Sprintf("direct/%dMiB", n>>20), func(b *testing.B) {
			copyLoop(b, d0, d1, n, func(s1 *Stream, _ *Stream) error { return s1.PeerCopyAsync(dst.Ptr, d0, src.Ptr, n) })
		})
		b.Run(fmt.Sprintf("staged/%dMiB", n>>20), func(b *testing.B) {
			copyLoop(b, d0, d1, n, func(s1, s0 *Stream) error {
				if err := s0.CopyAsync(DeviceToHost, unsafe.Pointer(&host.Bytes()[0]), src.Ptr, n); err != nil {
					return err
				}
				if err := s0.Synchronize(); err != nil {
					return err
				}
				return s1.CopyAsync(HostToDevice, unsafe.Pointer(&host.Bytes()[0]), dst.Ptr, n)
			})
		})
	}
}

// copyLoop times b.N rounds of enqueue (on a GPU 1 stream and a GPU 0 stream)
// then wait for GPU 1's stream, at n bytes each.
func copyLoop(b *testing.B, d0, d1 *Device, n uint64, enqueue func(s1, s0 *Stream) error) {
	s0, err := d0.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s0.Close()
	s1, err := d1.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s1.Close()
	b.SetBytes(int64(n))
	b.ResetTimer()
	for range b.N {
		if err := enqueue(s1, s0); err != nil {
			b.Fatal(err)
		}
		if err := s1.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStartPeerSegments copies scattered device-to-device segments with
// Copier.StartPeer and compares every byte of the destination (copied
// ranges and the gaps between them): on one GPU (HBM to HBM, the HBM
// stage's same-device loads), for the kernel and the copy-engine methods,
// and from GPU 0 to GPU 1 where there are two (peer access on: the kernel
// reads over NVLink).
func TestStartPeerSegments(t *testing.T) {
	d0 := requireDevice(t)
	pairs := [][2]*Device{{d0, d0}}
	if n, _ := DeviceCount(); n >= 2 {
		d1, _ := openSecond(t, d0)
		pairs = append(pairs, [2]*Device{d0, d1})
	} else {
		t.Logf("one GPU: the GPU 0 -> GPU 1 case needs two")
	}
	const n = 8 << 20
	r := rand.New(rand.NewPCG(21, 22))
	for _, p := range pairs {
		src, dst := p[0], p[1]
		for _, m := range []Method{MethodAuto, MethodBatch} {
			t.Run(fmt.Sprintf("gpu%d-to-gpu%d/%v", src.Ordinal(), dst.Ordinal(), m), func(t *testing.T) {
				c, err := dst.NewCopier(CopierConfig{Method: m})
				if err != nil {
					t.Skipf("method %v: %v", m, err)
				}
				defer c.Close()
				sm, dm := allocDevice(t, src, n), allocDevice(t, dst, n)
				want := make([]byte, n)
				fillRandom(r, want)
				if err := src.CopyToDevice(sm.Ptr, want); err != nil {
					t.Fatal(err)
				}
				if err := dst.Memset(dm.Ptr, 0xA5, n); err != nil {
					t.Fatal(err)
				}
				exp := bytes.Repeat([]byte{0xA5}, n)
				var segs []PeerSegment
				for off := uint64(0); off+64<<10 <= n; off += 96 << 10 { // 64 KiB runs, 32 KiB gaps, reversed order below
					so := n - 64<<10 - off
					segs = append(segs, PeerSegment{Src: sm.Ptr + DevicePtr(so), Dst: dm.Ptr + DevicePtr(off), Len: 64 << 10})
					copy(exp[off:off+64<<10], want[so:so+64<<10])
				}
				odd := []PeerSegment{{Src: sm.Ptr + 16, Dst: dm.Ptr + 64<<10 + 3, Len: 1000}} // unaligned: never the kernel
				copy(exp[64<<10+3:64<<10+1003], want[16:1016])
				var methods []Method
				for _, batch := range [][]PeerSegment{segs, odd} {
					pend, err := c.StartPeer(src, batch)
					if err != nil {
						t.Fatal(err)
					}
					if err := pend.Add([]Segment{{HostOff: 0, Dev: dm.Ptr, Len: 16}}); err == nil {
						t.Error("Add to a peer batch succeeded, want ErrNotSupported")
					}
					if err := pend.Wait(context.Background()); err != nil {
						t.Fatal(err)
					}
					methods = append(methods, pend.Method())
				}
				if c.Method() == MethodKernel && methods[0] != MethodKernel {
					t.Errorf("aligned segments went by %v on a kernel copier", methods[0])
				}
				if methods[1] == MethodKernel {
					t.Error("an unaligned segment went by the kernel")
				}
				got := make([]byte, n)
				if err := dst.CopyFromDevice(got, dm.Ptr); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, exp) {
					i := 0
					for i < n && got[i] == exp[i] {
						i++
					}
					t.Fatalf("destination differs from byte %d (methods %v)", i, methods)
				}
				t.Logf("%d aligned segments went by %v, an unaligned one by %v", len(segs), methods[0], methods[1])
				if _, err := c.StartPeer(src, []PeerSegment{{Src: sm.Ptr, Dst: 0, Len: 16}}); !errors.Is(err, ErrBadSegment) {
					t.Errorf("a segment to address 0: %v, want ErrBadSegment", err)
				}
			})
		}
	}
}
