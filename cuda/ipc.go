//go:build cgo && linux

// Memory ownership: an IPCMapping owns the mapping of another process's
// device allocation into this process (cuIpcOpenMemHandle) until Close; the
// allocation itself stays owned by the exporting process, which must keep it
// alive until every importer has closed it. Handles are copied by value.

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// ExportIPC returns the IPC handle of the allocation that contains p (p
// must be the base of a cuMemAlloc allocation for the importer to see the
// same offsets).
func (d *Device) ExportIPC(p DevicePtr) (IPCHandle, error) {
	var h IPCHandle
	if err := d.live(); err != nil {
		return h, err
	}
	r := C.okv_ipc_get(d.ctx, (*C.CUipcMemHandle)(unsafe.Pointer(&h)), C.CUdeviceptr(p))
	runtime.KeepAlive(&h)
	return h, cudaErr("cuIpcGetMemHandle", r)
}

// IPCMapping is another process's device allocation opened in this one.
type IPCMapping struct {
	d   *Device
	Ptr DevicePtr // base of the exporter's allocation in this process
}

// OpenIPC maps the allocation behind h (exported by another process on the
// same device) into this process. A process cannot open its own handles.
func (d *Device) OpenIPC(h IPCHandle) (*IPCMapping, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	var p C.CUdeviceptr
	r := C.okv_ipc_open(d.ctx, &p, (*C.CUipcMemHandle)(unsafe.Pointer(&h)))
	runtime.KeepAlive(&h)
	if r != 0 {
		return nil, cudaErr("cuIpcOpenMemHandle", r)
	}
	return &IPCMapping{d: d, Ptr: DevicePtr(p)}, nil
}

// Close unmaps the allocation. No copy into it may be in flight. Idempotent.
func (m *IPCMapping) Close() error {
	if m == nil || m.Ptr == 0 {
		return nil
	}
	err := cudaErr("cuIpcCloseMemHandle", C.okv_ipc_close(m.d.ctx, C.CUdeviceptr(m.Ptr)))
	m.Ptr = 0
	return err
}

// AddressRange returns the base and size of the allocation (or IPC mapping)
// that contains p (cuMemGetAddressRange): what bounds an imported buffer.
func (d *Device) AddressRange(p DevicePtr) (DevicePtr, uint64, error) {
	if err := d.live(); err != nil {
		return 0, 0, err
	}
	var base C.CUdeviceptr
	var size C.size_t
	if r := C.okv_mem_address_range(d.ctx, &base, &size, C.CUdeviceptr(p)); r != 0 {
		return 0, 0, cudaErr("cuMemGetAddressRange", r)
	}
	return DevicePtr(base), uint64(size), nil
}
