//go:build !cgo || !linux

package cuda

import (
	"context"
	"unsafe"
)

// Without cgo (or off Linux) there is no driver binding: every entry point
// returns ErrNotSupported, so the peer builds and runs without a GPU.

// Init returns ErrNotSupported.
func Init() error { return ErrNotSupported }

// DriverVersion returns ErrNotSupported.
func DriverVersion() (int, error) { return 0, ErrNotSupported }

// HasBatchCopy returns false.
func HasBatchCopy() bool { return false }

// DeviceCount returns ErrNotSupported.
func DeviceCount() (int, error) { return 0, ErrNotSupported }

// Devices returns ErrNotSupported.
func Devices() ([]DeviceInfo, error) { return nil, ErrNotSupported }

// Device is a GPU; unavailable in this build.
type Device struct{}

// Open returns ErrNotSupported.
func Open(int) (*Device, error) { return nil, ErrNotSupported }

func (*Device) Ordinal() int                             { return -1 }
func (*Device) Close() error                             { return nil }
func (*Device) Info() (DeviceInfo, error)                { return DeviceInfo{}, ErrNotSupported }
func (*Device) MemInfo() (uint64, uint64, error)         { return 0, 0, ErrNotSupported }
func (*Device) NewStream() (*Stream, error)              { return nil, ErrNotSupported }
func (*Device) NewEvent(bool) (*Event, error)            { return nil, ErrNotSupported }
func (*Device) Alloc(uint64) (*DeviceMem, error)         { return nil, ErrNotSupported }
func (*Device) Memset(DevicePtr, byte, uint64) error     { return ErrNotSupported }
func (*Device) CopyToDevice(DevicePtr, []byte) error     { return ErrNotSupported }
func (*Device) CopyFromDevice([]byte, DevicePtr) error   { return ErrNotSupported }
func (*Device) RegisterHost([]byte) (*HostRegion, error) { return nil, ErrNotSupported }
func (*Device) CanAccessPeer(*Device) (bool, error)      { return false, ErrNotSupported }
func (*Device) EnablePeerAccess(*Device) error           { return ErrNotSupported }
func (*Device) ExportIPC(DevicePtr) (IPCHandle, error)   { return IPCHandle{}, ErrNotSupported }
func (*Device) OpenIPC(IPCHandle) (*IPCMapping, error)   { return nil, ErrNotSupported }
func (*Device) AddressRange(DevicePtr) (DevicePtr, uint64, error) {
	return 0, 0, ErrNotSupported
}
func (*Device) NewCopier(CopierConfig) (*Copier, error) { return nil, ErrNotSupported }

// DmabufSupported returns false.
func (*Device) DmabufSupported() bool { return false }

// ExportDmabuf returns ErrNotSupported.
func (*Device) ExportDmabuf(DevicePtr, uint64) (int, error) { return -1, ErrNotSupported }

// Stream is a CUDA stream; unavailable in this build.
type Stream struct{}

func (*Stream) Synchronize() error                                           { return ErrNotSupported }
func (*Stream) WaitEvent(*Event) error                                       { return ErrNotSupported }
func (*Stream) Close() error                                                 { return nil }
func (*Stream) CopyAsync(Direction, unsafe.Pointer, DevicePtr, uint64) error { return ErrNotSupported }
func (*Stream) PeerCopyAsync(DevicePtr, *Device, DevicePtr, uint64) error    { return ErrNotSupported }

// Event is a CUDA event; unavailable in this build.
type Event struct{}

func (*Event) Record(*Stream) error       { return ErrNotSupported }
func (*Event) Done() (bool, error)        { return false, ErrNotSupported }
func (*Event) Wait(context.Context) error { return ErrNotSupported }
func (*Event) Close() error               { return nil }

// IPCEventHandle is an exported interprocess event handle.
type IPCEventHandle [64]byte

func (*Device) NewIPCEvent() (*Event, error)                { return nil, ErrNotSupported }
func (*Event) IPCHandle() (IPCEventHandle, error)           { return IPCEventHandle{}, ErrNotSupported }
func (*Device) OpenIPCEvent(IPCEventHandle) (*Event, error) { return nil, ErrNotSupported }
func Elapsed(*Event, *Event) (float32, error)               { return 0, ErrNotSupported }

// DeviceMem is a device allocation; unavailable in this build.
type DeviceMem struct {
	Ptr  DevicePtr
	Size uint64
}

func (*DeviceMem) Free() error { return nil }

// HostRegion is registered host memory; unavailable in this build.
type HostRegion struct{}

func (*HostRegion) Len() uint64       { return 0 }
func (*HostRegion) Bytes() []byte     { return nil }
func (*HostRegion) Unregister() error { return nil }

// IPCMapping is an imported allocation; unavailable in this build.
type IPCMapping struct{ Ptr DevicePtr }

func (*IPCMapping) Close() error { return nil }

// Copier moves batches; unavailable in this build.
type Copier struct{}

// Pending is a batch in flight; unavailable in this build.
type Pending struct{}

func (*Copier) Method() Method                                        { return MethodAuto }
func (*Copier) Config() CopierConfig                                  { return CopierConfig{} }
func (*Copier) Restore(context.Context, *HostRegion, []Segment) error { return ErrNotSupported }
func (*Copier) Save(context.Context, *HostRegion, []Segment) error    { return ErrNotSupported }
func (*Copier) Start(Direction, *HostRegion, []Segment) (*Pending, error) {
	return nil, ErrNotSupported
}
func (*Copier) StartGroups(Direction, *HostRegion, [][]Segment, []*Event) (*Pending, error) {
	return nil, ErrNotSupported
}
func (*Copier) StartGroupsGated(Direction, *HostRegion, [][]Segment, *Gates, uint32) (*Pending, error) {
	return nil, ErrNotSupported
}
func (*Copier) StartPeer(*Device, []PeerSegment) (*Pending, error) { return nil, ErrNotSupported }
func (*Copier) Close() error                                       { return nil }

// Gates hold a layer-wise load's marks until its copies land; unavailable
// in this build.
type Gates struct{}

func (*Device) HasStreamMemOps() bool           { return false }
func (*Device) NewGates(int) (*Gates, error)    { return nil, ErrNotSupported }
func (*Gates) Len() int                         { return 0 }
func (*Gates) Word(int) uint32                  { return 0 }
func (*Gates) Arm([]*Event, uint32) error       { return ErrNotSupported }
func (*Gates) Write(*Stream, int, uint32) error { return ErrNotSupported }
func (*Gates) Release(uint32)                   {}
func (*Gates) Close() error                     { return nil }
func (*Pending) Wait(context.Context) error     { return ErrNotSupported }
func (*Pending) Add([]Segment) error            { return ErrNotSupported }
