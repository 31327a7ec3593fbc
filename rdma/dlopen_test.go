//go:build cgo && linux

package rdma

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// These run the real dlopen path (no fake). On a machine without RDMA
// hardware (the development machine: no InfiniBand in its kernel) Open must
// end in a clean "no RDMA device"; with ORBITKV_REQUIRE=rdma (a machine
// that has a device) it must open one instead.

func TestOpenWithoutLibraryReportsNotFound(t *testing.T) {
	_, err := Open(Config{Library: "/nonexistent/libibverbs.so.1"})
	if !errors.Is(err, ErrNoLibrary) || !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Open = %v, want ErrNoLibrary (and ErrNoDevice)", err)
	}
	if !strings.Contains(err.Error(), "libibverbs not found") {
		t.Fatalf("message %q does not say libibverbs not found", err)
	}
}

func TestOpenOnThisMachine(t *testing.T) {
	e, err := Open(Config{})
	if strings.Contains(os.Getenv("ORBITKV_REQUIRE"), "rdma") {
		if err != nil {
			t.Fatalf("ORBITKV_REQUIRE=rdma but Open: %v", err)
		}
		defer e.Close()
		t.Logf("opened %v", e.NICs())
		return
	}
	if err == nil {
		defer e.Close()
		t.Skipf("this machine has RDMA devices (%v): the no-device path is not reachable here", e.NICs())
	}
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "no RDMA device") {
		t.Fatalf("Open = %v, want ErrNoDevice saying no RDMA device", err)
	}
	t.Logf("Open on this machine: %v (sysfs devices: %v)", err, SysfsDevices())
}

func TestOpenWithAllowlistOfAbsentDevice(t *testing.T) {
	_, err := Open(Config{Devices: []DeviceSel{{Name: "mlx5_nope", Port: 1}}})
	if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Open = %v, want ErrNoDevice", err)
	}
}
