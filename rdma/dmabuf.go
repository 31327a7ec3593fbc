package rdma

import (
	"fmt"
	"os"
	"syscall"
)

// DmabufExporter exports a range of device memory as a dmabuf file
// descriptor, for GPUDirect RDMA: with CUDA it is
// cuMemGetHandleForAddressRange(&fd, ptr, size,
// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) on the engine's HBM (the cuda
// package is the one to call it; this package only takes the hook, so it
// needs no CUDA). The engine closes fd after registering it.
type DmabufExporter func(ptr, size uint64) (fd int, err error)

// RegisterDevice registers size bytes of device memory at ptr on every NIC
// through ibv_reg_dmabuf_mr (rdma-core 34+, a kernel with dmabuf support in
// the NIC driver, and the GPU's memory exported by export). Work requests
// address it by ptr (the IOVA), so an Op's segments use the device offsets
// directly. ptr and size must be multiples of the host page size.
func (e *Engine) RegisterDevice(name string, ptr, size uint64, access Access, export DmabufExporter) (*Region, error) {
	if export == nil {
		return nil, fmt.Errorf("register %s: %w: no dmabuf exporter (GPUDirect needs the CUDA hook)", name, ErrNotSupported)
	}
	page := uint64(os.Getpagesize())
	if size == 0 || ptr%page != 0 || size%page != 0 {
		return nil, fmt.Errorf("register %s: %d bytes at %#x: want a non-empty range aligned to %d", name, size, ptr, page)
	}
	fd, err := export(ptr, size)
	if err != nil {
		return nil, fmt.Errorf("register %s: export %d bytes at %#x as dmabuf: %w", name, size, ptr, err)
	}
	defer syscall.Close(fd) // each MR holds its own reference to the dmabuf
	return e.register(name, ptr, size, access, func(n *nic) (mrInfo, error) {
		return e.v.regDmabufMR(n.pd, 0, size, ptr, fd, access.mrAccess())
	})
}
