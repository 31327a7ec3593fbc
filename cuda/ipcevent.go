//go:build cgo && linux

// Memory ownership: an interprocess Event is a driver event like any other,
// owned by the Go value until Close; its handle is 64 bytes copied by value.
// An event opened from another process's handle (OpenIPCEvent) is this
// process's reference to it and is destroyed by its own Close.

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// IPCEventHandle is an exported interprocess event handle (CUipcEventHandle,
// the same 64 bytes as cudaIpcEventHandle_t and torch.cuda.Event.ipc_handle).
type IPCEventHandle [64]byte

// NewIPCEvent creates an event that other processes on the same device can
// open by handle and make their streams wait on (CU_EVENT_INTERPROCESS, so
// timing is disabled).
func (d *Device) NewIPCEvent() (*Event, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	e := &Event{d: d}
	if r := C.okv_event_create_ipc(d.ctx, &e.e); r != 0 {
		return nil, cudaErr("cuEventCreate(interprocess)", r)
	}
	return e, nil
}

// IPCHandle exports an event made by NewIPCEvent.
func (e *Event) IPCHandle() (IPCEventHandle, error) {
	var h IPCEventHandle
	r := C.okv_ipc_event_get(e.d.ctx, (*C.CUipcEventHandle)(unsafe.Pointer(&h)), e.e)
	runtime.KeepAlive(&h)
	return h, cudaErr("cuIpcGetEventHandle", r)
}

// OpenIPCEvent opens another process's interprocess event. A process cannot
// open its own handles.
func (d *Device) OpenIPCEvent(h IPCEventHandle) (*Event, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	e := &Event{d: d}
	r := C.okv_ipc_event_open(d.ctx, &e.e, (*C.CUipcEventHandle)(unsafe.Pointer(&h)))
	runtime.KeepAlive(&h)
	if r != 0 {
		return nil, cudaErr("cuIpcOpenEventHandle", r)
	}
	return e, nil
}
