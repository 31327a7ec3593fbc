//go:build cgo && linux

package cuda

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
)

// TestPeerCopy copies between the first two GPUs (NVLink on the two-GPU
// machine). It needs two devices and skips, whatever ORBITKV_REQUIRE says,
// on a machine with one.
func TestPeerCopy(t *testing.T) {
	d0 := requireDevice(t)
	if n, _ := DeviceCount(); n < 2 {
		t.Skipf("skipping: needs 2 GPUs, have %d", n)
	}
	d1, err := Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer d1.Close()
	if ok, err := d1.CanAccessPeer(d0); err != nil {
		t.Fatal(err)
	} else if ok {
		if err := d1.EnablePeerAccess(d0); err != nil {
			t.Fatal(err)
		}
	}
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
