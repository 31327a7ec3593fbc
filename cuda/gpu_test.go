//go:build cgo && linux

package cuda

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// requireDevice opens GPU 0, or skips when there is no driver or GPU —
// failing instead when ORBITKV_REQUIRE=cuda (set on the GPU machine).
func requireDevice(t testing.TB) *Device {
	t.Helper()
	if err := Init(); err != nil {
		skipOrFail(t, "%v", err)
	}
	n, err := DeviceCount()
	if err != nil || n == 0 {
		skipOrFail(t, "no CUDA device: count %d, %v", n, err)
	}
	d, err := Open(0)
	if err != nil {
		t.Fatalf("open device 0: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close device: %v", err)
		}
	})
	return d
}

func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if strings.Contains(os.Getenv("ORBITKV_REQUIRE"), "cuda") {
		t.Fatalf("ORBITKV_REQUIRE=cuda but: "+format, args...)
	}
	t.Skipf("skipping: "+format, args...)
}

// mapHost returns n bytes of anonymous, pre-faulted memory (like the DRAM
// pool), unmapped when the test ends.
func mapHost(t testing.TB, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", n, err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(b) })
	return b
}

// registerHost maps and registers n bytes, unregistered before the unmap.
func registerHost(t testing.TB, d *Device, n int) *HostRegion {
	t.Helper()
	h, err := d.RegisterHost(mapHost(t, n))
	if err != nil {
		t.Fatalf("register host: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Unregister(); err != nil {
			t.Errorf("unregister: %v", err)
		}
	})
	return h
}

func allocDevice(t testing.TB, d *Device, n uint64) *DeviceMem {
	t.Helper()
	m, err := d.Alloc(n)
	if err != nil {
		t.Fatalf("alloc: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Free(); err != nil {
			t.Errorf("free: %v", err)
		}
	})
	return m
}

func fillRandom(r *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
}

func TestLoadMissingLibrary(t *testing.T) {
	err := load("/nonexistent/libcuda.so.1")
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "no libcuda.so.1") {
		t.Fatalf("load of a missing library = %v, want ErrNoDriver naming libcuda.so.1", err)
	}
}

func TestDevices(t *testing.T) {
	requireDevice(t)
	v, err := DriverVersion()
	if err != nil {
		t.Fatal(err)
	}
	infos, err := Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		t.Logf("driver %d, batch copy %v: %+v", v, HasBatchCopy(), in)
		if in.Name == "" || in.TotalMemory == 0 || in.SMs == 0 || in.PCIBusID == "" {
			t.Errorf("incomplete device info %+v", in)
		}
	}
}

func TestStreamEventMemset(t *testing.T) {
	d := requireDevice(t)
	const n = 1 << 20
	m := allocDevice(t, d, n)
	if err := d.Memset(m.Ptr, 0x3c, n); err != nil {
		t.Fatal(err)
	}
	host := registerHost(t, d, n)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start, _ := d.NewEvent(true)
	end, _ := d.NewEvent(true)
	defer start.Close()
	defer end.Close()
	if err := start.Record(s); err != nil {
		t.Fatal(err)
	}
	buf := host.Bytes()
	if err := s.CopyAsync(DeviceToHost, hostPtr(buf), m.Ptr, n); err != nil {
		t.Fatal(err)
	}
	if err := end.Record(s); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := end.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if ms, err := Elapsed(start, end); err != nil || ms < 0 {
		t.Fatalf("elapsed %v ms, %v", ms, err)
	}
	for i, b := range buf {
		if b != 0x3c {
			t.Fatalf("byte %d = %#x after memset 0x3c and copy back", i, b)
		}
	}
}
