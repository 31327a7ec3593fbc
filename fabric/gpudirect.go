package fabric

import (
	"errors"
	"fmt"

	"github.com/orbitkv/orbitkv/cuda"
	"github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer"
)

// GPUDirect: a CUDA session's imported engine buffers registered with the
// RDMA engine through a dmabuf the CUDA driver exports of them, so that an
// RDMA READ may land in engine HBM without the copy through the DRAM pool.
// Only where the device says it can (cuda.Device.DmabufSupported) and the
// cluster has an RDMA engine; otherwise, and whenever a registration fails,
// the buffers stay on the staging path (pages land in DRAM, the copier
// moves them) and nothing of the attempt stays registered. It has not run
// on hardware: it is tested over fakes of both seams (gpudirect_test.go).

// hbmRegistrar is the verbs side of GPUDirect (*cluster.Cluster:
// rdma.Engine.RegisterDevice, ibv_reg_dmabuf_mr).
type hbmRegistrar interface {
	RegisterDevice(region *transfer.Region, export rdma.DmabufExporter) (release func() error, err error)
}

// dmabufDevice is the CUDA side of GPUDirect (*cuda.Device).
type dmabufDevice interface {
	DmabufSupported() bool
	ExportDmabuf(p cuda.DevicePtr, size uint64) (fd int, err error)
}

// errStaging says why engine HBM stays on the staging path.
var errStaging = errors.New("gpudirect: engine HBM stays on the DRAM staging path")

// registerHBM registers each of regions (engine HBM on dev) with reg,
// exported by dev as dmabuf, and returns what releases them all. Where it
// cannot (no registrar, no dmabuf support, a region off the host page) or a
// registration fails part way, it returns an error wrapping errStaging and
// releases whatever it had registered: nothing stays registered.
func registerHBM(reg hbmRegistrar, dev dmabufDevice, regions []*transfer.Region) (func() error, error) {
	switch {
	case reg == nil:
		return nil, fmt.Errorf("%w: no RDMA engine", errStaging)
	case !dev.DmabufSupported():
		return nil, fmt.Errorf("%w: the device cannot export dmabuf", errStaging)
	}
	for _, r := range regions {
		if err := cuda.CheckDmabufRange(cuda.DevicePtr(r.Device), r.Size); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", errStaging, r.Name, err)
		}
	}
	export := func(ptr, size uint64) (int, error) { return dev.ExportDmabuf(cuda.DevicePtr(ptr), size) }
	releases := make([]func() error, 0, len(regions))
	releaseAll := func() error {
		var errs []error
		for _, rel := range releases {
			errs = append(errs, rel())
		}
		return errors.Join(errs...)
	}
	for _, r := range regions {
		rel, err := reg.RegisterDevice(r, export)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("%w: %w", errStaging, err), releaseAll())
		}
		releases = append(releases, rel)
	}
	return releaseAll, nil
}
