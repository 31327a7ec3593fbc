package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/cuda"
)

// requireCUDA opens GPU 0, or skips (fails under ORBITKV_REQUIRE=cuda).
func requireCUDA(t *testing.T) *cuda.Device {
	t.Helper()
	why := ""
	if err := cuda.Init(); err != nil {
		why = err.Error()
	} else if n, err := cuda.DeviceCount(); err != nil || n == 0 {
		why = fmt.Sprintf("no CUDA device (count %d, %v)", n, err)
	}
	if why != "" {
		if strings.Contains(os.Getenv("ORBITKV_REQUIRE"), "cuda") {
			t.Fatalf("ORBITKV_REQUIRE=cuda but: %s", why)
		}
		t.Skipf("skipping: %s", why)
	}
	d, err := cuda.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestStuckCopyRetiresItsCopier runs a real device copy that outlasts the
// transport's bound after its caller gave up: Finish reports ErrStuck (the
// peer then quarantines the memory), and the copier that ran it is never
// handed to another operation.
func TestStuckCopyRetiresItsCopier(t *testing.T) {
	d := requireCUDA(t)
	const n = 2 << 30 // ~40 ms on PCIe gen5: far past the bound below (a wait gives up after ~4 ms)
	host, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(host)
	h, err := d.RegisterHost(host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unregister()
	mem, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free()
	hr := HostRegion("host", host)
	x, err := NewCUDA(d, h, hr, CUDAConfig{Copiers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close() // drains the retired copier's streams
	old := finishTimeout
	finishTimeout = time.Microsecond
	defer func() { finishTimeout = old }()

	st, err := x.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	dev := &Region{Name: "dev", Kind: Device, Device: uint64(mem.Ptr), Size: n}
	if err := st.Add([]Desc{{Src: hr, Dst: dev, Len: n}}); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel() // the caller gave up at once
	if err := st.Finish(gone); !errors.Is(err, ErrStuck) {
		t.Fatalf("Finish = %v, want ErrStuck", err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if s, err := x.Begin(short); err == nil {
		s.Finish(context.Background())
		t.Fatal("the retired copier was handed out again")
	}
}

// TestStreamPartsLand: a stream of parts lands whole with a copy-engine
// copier (parts added to the batch in flight) and with the kernel (parts
// after the first held for a second batch), and refuses a part that moves
// the other way.
func TestStreamPartsLand(t *testing.T) {
	d := requireCUDA(t)
	const n, part = 64 << 20, 1 << 20
	host, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(host)
	for i := range host {
		host[i] = byte(i*7 + i>>20)
	}
	h, err := d.RegisterHost(host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unregister()
	mem, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free()
	hr := HostRegion("host", host)
	dev := &Region{Name: "dev", Kind: Device, Device: uint64(mem.Ptr), Size: n}
	for _, m := range []cuda.Method{cuda.MethodPitched, cuda.MethodBatch, cuda.MethodKernel} {
		t.Run(m.String(), func(t *testing.T) {
			x, err := NewCUDA(d, h, hr, CUDAConfig{Copiers: 1, Copier: cuda.CopierConfig{Method: m}})
			if err != nil {
				t.Skipf("%v: %v", m, err)
			}
			defer x.Close()
			if err := d.Memset(mem.Ptr, 0, n); err != nil {
				t.Fatal(err)
			}
			st, err := x.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			// Parts of 1 MiB pieces, reversed within each part (no two merge).
			for lo := 0; lo < n; lo += 16 * part {
				var batch []Desc
				for off := lo + 15*part; off >= lo; off -= part {
					batch = append(batch, Desc{Src: hr, SrcOff: uint64(off), Dst: dev, DstOff: uint64(off), Len: part})
				}
				if err := st.Add(batch); err != nil {
					t.Fatalf("add: %v", err)
				}
			}
			if err := st.Finish(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, n)
			if err := d.CopyFromDevice(got, mem.Ptr); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, host) {
				t.Fatalf("%v: device bytes differ from the host after a stream of parts", m)
			}
			if err := st.Finish(context.Background()); err == nil {
				t.Fatal("a second Finish succeeded")
			}
			st, err = x.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Add([]Desc{{Src: hr, Dst: dev, Len: part}}); err != nil {
				t.Fatal(err)
			}
			if err := st.Add([]Desc{{Src: dev, Dst: hr, Len: part}}); err == nil {
				t.Fatal("a part moving the other way was accepted")
			}
			if err := st.Finish(context.Background()); err == nil {
				t.Fatal("Finish did not report the refused part")
			}
		})
	}
}
