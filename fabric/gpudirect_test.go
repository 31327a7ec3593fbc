package fabric

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/cuda"
	"github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer"
)

// fakeDmabufDevice is the CUDA side: it exports any range as a numbered
// descriptor, failing the failAt-th export (1-based; 0: never).
type fakeDmabufDevice struct {
	supported bool
	failAt    int
	exports   int
	open      map[int][2]uint64 // descriptor → (ptr, size) not yet closed
}

func (d *fakeDmabufDevice) DmabufSupported() bool { return d.supported }

func (d *fakeDmabufDevice) ExportDmabuf(p cuda.DevicePtr, size uint64) (int, error) {
	d.exports++
	if d.exports == d.failAt {
		return -1, errors.New("cuMemGetHandleForAddressRange: CUDA_ERROR_INVALID_VALUE")
	}
	if d.open == nil {
		d.open = map[int][2]uint64{}
	}
	fd := 100 + d.exports
	d.open[fd] = [2]uint64{uint64(p), size}
	return fd, nil
}

// fakeVerbs is the verbs side, as rdma.Engine.RegisterDevice behaves: it
// exports the region, registers it (failing the failAt-th registration)
// and closes the descriptor either way.
type fakeVerbs struct {
	dev    *fakeDmabufDevice
	failAt int
	calls  int
	live   map[*transfer.Region]int // region → the descriptor its MR was made from
}

func (v *fakeVerbs) RegisterDevice(r *transfer.Region, export rdma.DmabufExporter) (func() error, error) {
	v.calls++
	fd, err := export(r.Device, r.Size)
	if err != nil {
		return nil, fmt.Errorf("register %s: export: %w", r.Name, err)
	}
	if got := v.dev.open[fd]; got != [2]uint64{r.Device, r.Size} {
		return nil, fmt.Errorf("register %s: descriptor %d exports %v, want the region's range", r.Name, fd, got)
	}
	delete(v.dev.open, fd) // the engine closes the descriptor after ibv_reg_dmabuf_mr
	if v.calls == v.failAt {
		return nil, fmt.Errorf("register %s: ibv_reg_dmabuf_mr: %w", r.Name, rdma.ErrNotSupported)
	}
	if v.live == nil {
		v.live = map[*transfer.Region]int{}
	}
	v.live[r] = fd
	released := false
	return func() error {
		if !released {
			released = true
			delete(v.live, r)
		}
		return nil
	}, nil
}

// hbmRegions are n engine buffers of 2 MiB on page boundaries.
func hbmRegions(n int) []*transfer.Region {
	out := make([]*transfer.Region, n)
	for i := range out {
		out[i] = &transfer.Region{Name: fmt.Sprintf("cuda0/buffer%d", i), Kind: transfer.Device,
			Device: 0x7f0000000000 + uint64(i)*(4<<20), Size: 2 << 20}
	}
	return out
}

// TestRegisterHBMWhereTheDeviceCan: with dmabuf support every buffer is
// exported over its own range and registered; release deregisters them all
// and may run twice; no descriptor is left open.
func TestRegisterHBMWhereTheDeviceCan(t *testing.T) {
	dev := &fakeDmabufDevice{supported: true}
	v := &fakeVerbs{dev: dev}
	regions := hbmRegions(3)
	release, err := registerHBM(v, dev, regions)
	if err != nil {
		t.Fatalf("registerHBM: %v", err)
	}
	if len(v.live) != 3 || dev.exports != 3 {
		t.Fatalf("%d regions registered from %d exports, want 3 and 3", len(v.live), dev.exports)
	}
	for _, r := range regions {
		if _, ok := v.live[r]; !ok {
			t.Errorf("%s not registered", r.Name)
		}
	}
	if err := release(); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := release(); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if len(v.live) != 0 || len(dev.open) != 0 {
		t.Fatalf("after release: %d registered, %d descriptors open; want none", len(v.live), len(dev.open))
	}
}

// TestRegisterHBMFallsBackToStaging: where GPUDirect cannot be used the
// buffers stay on the staging path, said by errStaging, and neither the
// device nor the engine was asked for anything.
func TestRegisterHBMFallsBackToStaging(t *testing.T) {
	page := uint64(os.Getpagesize())
	misaligned := hbmRegions(2)
	misaligned[1].Device += page / 2
	for _, c := range []struct {
		name      string
		supported bool
		noVerbs   bool
		regions   []*transfer.Region
		want      string
	}{
		{"device without dmabuf", false, false, hbmRegions(2), "cannot export dmabuf"},
		{"no RDMA engine", true, true, hbmRegions(2), "no RDMA engine"},
		{"a buffer off the host page", true, false, misaligned, "cuda0/buffer1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dev := &fakeDmabufDevice{supported: c.supported}
			v := &fakeVerbs{dev: dev}
			var reg hbmRegistrar = v
			if c.noVerbs {
				reg = nil
			}
			release, err := registerHBM(reg, dev, c.regions)
			if !errors.Is(err, errStaging) || release != nil {
				t.Fatalf("registerHBM = %v, release set %v; want errStaging and no release", err, release != nil)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			if v.calls != 0 || dev.exports != 0 {
				t.Errorf("%d registrations, %d exports asked for; want none", v.calls, dev.exports)
			}
		})
	}
}

// TestRegisterHBMFailingPartWayReleasesAll: a registration or an export
// that fails after others succeeded leaves nothing registered and no
// descriptor open, and the error names the failure.
func TestRegisterHBMFailingPartWayReleasesAll(t *testing.T) {
	for _, c := range []struct {
		name                   string
		verbsFailAt, devFailAt int
		want                   string
	}{
		{"third registration fails", 3, 0, "ibv_reg_dmabuf_mr"},
		{"second export fails", 0, 2, "cuMemGetHandleForAddressRange"},
		{"last of four fails", 4, 0, "cuda0/buffer3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dev := &fakeDmabufDevice{supported: true, failAt: c.devFailAt}
			v := &fakeVerbs{dev: dev, failAt: c.verbsFailAt}
			release, err := registerHBM(v, dev, hbmRegions(4))
			if !errors.Is(err, errStaging) || release != nil {
				t.Fatalf("registerHBM = %v, release set %v; want errStaging and no release", err, release != nil)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name %q", err, c.want)
			}
			if len(v.live) != 0 || len(dev.open) != 0 {
				t.Fatalf("%d regions still registered, %d descriptors open; want none", len(v.live), len(dev.open))
			}
		})
	}
}
