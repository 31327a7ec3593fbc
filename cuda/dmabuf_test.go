//go:build cgo && linux

package cuda

import (
	"errors"
	"syscall"
	"testing"
)

// TestExportDmabuf exports a device allocation as a dmabuf where the device
// says it can (the descriptor is a real open file, closed here), and
// otherwise gets ErrNotSupported naming why; a misaligned range is refused
// before the driver is asked. Skips without a GPU (fails under
// ORBITKV_REQUIRE=cuda).
func TestExportDmabuf(t *testing.T) {
	d := requireDevice(t)
	m := allocDevice(t, d, 4<<20)
	if _, err := d.ExportDmabuf(m.Ptr+256, 2<<20); err == nil {
		t.Fatal("a range starting off a page was exported")
	}
	fd, err := d.ExportDmabuf(m.Ptr, 2<<20)
	if !d.DmabufSupported() {
		if !errors.Is(err, ErrNotSupported) {
			t.Fatalf("device without dmabuf support: ExportDmabuf = %d, %v; want ErrNotSupported", fd, err)
		}
		t.Logf("this device cannot export dmabuf (%v): the unsupported path checked", err)
		return
	}
	if err != nil {
		t.Fatalf("ExportDmabuf of 2 MiB of a 4 MiB allocation: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		t.Errorf("the exported descriptor %d is not an open file: %v", fd, err)
	}
	if err := syscall.Close(fd); err != nil {
		t.Errorf("close the dmabuf: %v", err)
	}
}
