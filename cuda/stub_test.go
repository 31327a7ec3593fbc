//go:build !cgo || !linux

package cuda

import (
	"errors"
	"testing"
)

func TestStubsReportNotSupported(t *testing.T) {
	if err := Init(); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Init = %v, want ErrNotSupported", err)
	}
	if _, err := Open(0); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Open = %v, want ErrNotSupported", err)
	}
	if _, err := Devices(); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Devices = %v, want ErrNotSupported", err)
	}
	var d Device
	if _, err := d.ExportDmabuf(0, 4096); !errors.Is(err, ErrNotSupported) || d.DmabufSupported() {
		t.Fatalf("ExportDmabuf = %v, DmabufSupported %v; want ErrNotSupported, false", err, d.DmabufSupported())
	}
}
