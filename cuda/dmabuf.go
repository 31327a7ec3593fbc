//go:build cgo && linux

// Memory ownership: ExportDmabuf makes a dmabuf file descriptor for a range
// of device memory that the caller already owns (an allocation, or another
// process's allocation mapped by OpenIPC). The descriptor is the caller's to
// close; the kernel keeps the memory's pages pinned for as long as any
// descriptor or importer (an RDMA memory registration) holds the dmabuf, so
// every importer must be released before the mapping is closed. The only Go
// memory passed to C is one int, for one call.

package cuda

/*
#include "shim.h"
*/
import "C"

import "fmt"

// attrDmabufSupported is CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED.
const attrDmabufSupported = 124

// DmabufSupported reports whether device memory of d can be exported as a
// dmabuf: the driver exports cuMemGetHandleForAddressRange (CUDA 11.7+) and
// the device reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (it needs the
// open kernel modules, and a kernel with dmabuf).
func (d *Device) DmabufSupported() bool {
	return d.dmabufMissing() == nil
}

func (d *Device) dmabufMissing() error {
	if err := d.live(); err != nil {
		return err
	}
	if C.okv_has_dmabuf() == 0 {
		return fmt.Errorf("%w: this driver has no cuMemGetHandleForAddressRange (CUDA 11.7+)", ErrNotSupported)
	}
	if d.attr(attrDmabufSupported) == 0 {
		return fmt.Errorf("%w: device %d reports no dmabuf support (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0)", ErrNotSupported, d.ordinal)
	}
	return nil
}

// ExportDmabuf exports size bytes of d's memory at p as a dmabuf file
// descriptor (cuMemGetHandleForAddressRange with
// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags 0), for GPUDirect RDMA
// (ibv_reg_dmabuf_mr). p and size must be multiples of the host page size
// and the range must lie in one allocation. The caller closes the
// descriptor. Where the driver or device cannot, the error wraps
// ErrNotSupported.
func (d *Device) ExportDmabuf(p DevicePtr, size uint64) (int, error) {
	if err := CheckDmabufRange(p, size); err != nil {
		return -1, err
	}
	if err := d.dmabufMissing(); err != nil {
		return -1, err
	}
	var fd C.int
	if r := C.okv_mem_dmabuf_fd(d.ctx, &fd, C.CUdeviceptr(p), C.size_t(size)); r != 0 {
		return -1, cudaErr(fmt.Sprintf("cuMemGetHandleForAddressRange %d bytes at %#x", size, uint64(p)), r)
	}
	return int(fd), nil
}
