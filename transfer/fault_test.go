package transfer

import (
	"context"
	"errors"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapShm maps a fresh size-byte file under /dev/shm (an engine's KV buffer).
func mapShm(t *testing.T, size int) (string, []byte) {
	t.Helper()
	f, err := os.CreateTemp("/dev/shm", "orbitkv-fault-*")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	defer f.Close()
	t.Cleanup(func() { os.Remove(f.Name()) })
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return f.Name(), mem
}

// TestLocalCopyFaultIsAnError: a copy from or into a mapping whose file
// shrank under it (SIGBUS) returns a FaultError naming the region, and the
// process goes on; the other side of the copy is left as it was.
func TestLocalCopyFaultIsAnError(t *testing.T) {
	const size = 1 << 20
	for _, c := range []struct {
		name    string
		toShm   bool
		sum     bool
		srcOff  uint64
		wantOff uint64
	}{
		{"read", false, false, 0, size / 2},
		{"read with checksum", false, true, size/2 - 4096, size / 2},
		{"write", true, false, 0, size / 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			path, mem := mapShm(t, size)
			shm := HostRegion(path, mem)
			other := HostRegion("dram", make([]byte, size))
			if err := os.Truncate(path, size/2); err != nil {
				t.Fatal(err)
			}
			d := Desc{Src: shm, Dst: other, SrcOff: c.srcOff, Len: size - c.srcOff}
			if c.toShm {
				d = Desc{Src: other, Dst: shm, DstOff: c.srcOff, Len: size - c.srcOff}
			}
			var err error
			if c.sum {
				_, err = Local{}.CopyChecksum(context.Background(), []Desc{d})
			} else {
				err = Local{}.Copy(context.Background(), []Desc{d})
			}
			var fe *FaultError
			if !errors.As(err, &fe) {
				t.Fatalf("copy over a shrunk mapping: %v, want a FaultError", err)
			}
			if fe.Region != path || fe.Offset < c.wantOff || fe.Offset >= size {
				t.Fatalf("fault %+v, want region %s at or past byte %d", fe, path, c.wantOff)
			}
		})
	}
}

// TestFaultRegion: a faulting address is attributed to the region of the
// batch it lies in; an address in none of them (a bug of the peer's, not an
// engine's) is not, so the fault is not turned into an error.
func TestFaultRegion(t *testing.T) {
	a, b := HostRegion("a", make([]byte, 100)), HostRegion("b", make([]byte, 50))
	batch := []Desc{{Src: a, Dst: b, Len: 50}}
	base := func(r *Region) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(r.Host))) }
	for _, c := range []struct {
		name   string
		addr   uintptr
		region string
		off    uint64
	}{
		{"first byte of src", base(a), "a", 0},
		{"inside src", base(a) + 70, "a", 70},
		{"last byte of dst", base(b) + 49, "b", 49},
		{"past dst", base(b) + 50, "", 0},
		{"nil page", 8, "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			fe := regionFault(batch, c.addr)
			switch {
			case c.region == "" && fe != nil:
				t.Fatalf("address %#x attributed to %+v", c.addr, fe)
			case c.region != "" && (fe == nil || fe.Region != c.region || fe.Offset != c.off):
				t.Fatalf("address %#x: %+v, want %s at %d", c.addr, fe, c.region, c.off)
			}
		})
	}
}
