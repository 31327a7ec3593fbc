package transfer

import (
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
	const n = 512 << 20 // ~10 ms on PCIe gen5: far past the bound below
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
