//go:build cgo && linux

// Memory ownership: DeviceMem owns a cuMemAlloc allocation until Free. A
// HostRegion does not own its bytes: they belong to the caller's mmap (the
// DRAM pool), which must stay mapped until Unregister returns; the driver
// keeps the pages pinned and their mapping in between. Byte slices passed to
// the synchronous copies are Go or mmapped memory borrowed for one call and
// kept alive with runtime.KeepAlive.

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// DeviceMem is a device allocation made with cuMemAlloc.
type DeviceMem struct {
	d    *Device
	Ptr  DevicePtr
	Size uint64
}

// Alloc allocates n bytes of device memory.
func (d *Device) Alloc(n uint64) (*DeviceMem, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	var p C.CUdeviceptr
	if r := C.okv_mem_alloc(d.ctx, &p, C.size_t(n)); r != 0 {
		return nil, cudaErr(fmt.Sprintf("cuMemAlloc %d bytes", n), r)
	}
	return &DeviceMem{d: d, Ptr: DevicePtr(p), Size: n}, nil
}

// Free releases the allocation. Idempotent.
func (m *DeviceMem) Free() error {
	if m == nil || m.Ptr == 0 {
		return nil
	}
	err := cudaErr("cuMemFree", C.okv_mem_free(m.d.ctx, C.CUdeviceptr(m.Ptr)))
	m.Ptr = 0
	return err
}

// Memset sets n bytes at p to v, synchronously.
func (d *Device) Memset(p DevicePtr, v byte, n uint64) error {
	if err := d.live(); err != nil {
		return err
	}
	if r := C.okv_memset_d8(d.ctx, C.CUdeviceptr(p), C.uchar(v), C.size_t(n)); r != 0 {
		return cudaErr("cuMemsetD8", r)
	}
	return cudaErr("cuStreamSynchronize(NULL)", C.okv_stream_sync(d.ctx, nil))
}

// CopyToDevice copies src to device address dst, synchronously.
func (d *Device) CopyToDevice(dst DevicePtr, src []byte) error {
	if err := d.live(); err != nil {
		return err
	}
	if len(src) == 0 {
		return nil
	}
	r := C.okv_memcpy_htod(d.ctx, C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)))
	runtime.KeepAlive(src)
	return cudaErr("cuMemcpyHtoD", r)
}

// CopyFromDevice copies len(dst) bytes from device address src, synchronously.
func (d *Device) CopyFromDevice(dst []byte, src DevicePtr) error {
	if err := d.live(); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	r := C.okv_memcpy_dtoh(d.ctx, unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst)))
	runtime.KeepAlive(dst)
	return cudaErr("cuMemcpyDtoH", r)
}

// CopyAsync enqueues one contiguous copy of n bytes between host address
// host (pinned memory) and device address dev on s. The caller keeps both
// alive until the stream has passed the copy.
func (s *Stream) CopyAsync(dir Direction, host unsafe.Pointer, dev DevicePtr, n uint64) error {
	dst, src := uint64(dev), uint64(uintptr(host))
	if dir == DeviceToHost {
		dst, src = src, dst
	}
	r := C.okv_memcpy_async(s.d.ctx, C.int(dir), C.uint64_t(dst), C.uint64_t(src), C.size_t(n), s.s)
	return cudaErr(fmt.Sprintf("cuMemcpy %s async %d bytes", dir, n), r)
}

// Host registration flags (CU_MEMHOSTREGISTER_*).
const (
	hostRegisterPortable  = 0x01
	hostRegisterDeviceMap = 0x02
)

// HostRegion is host memory registered (pinned and mapped) with the driver.
type HostRegion struct {
	d    *Device
	base unsafe.Pointer
	size uint64

	mu struct {
		sync.Mutex
		mapped map[*Device]uint64 // device address of base, per device
		closed bool
	}
}

// RegisterHost pins b, which must be page-aligned memory from mmap (never
// the Go heap), for every device (portable) and maps it into the device
// address space so the copy kernel can reach it. Registering touches every
// page: pre-fault the mapping (MAP_POPULATE) first.
func (d *Device) RegisterHost(b []byte) (*HostRegion, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	if len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%4096 != 0 {
		return nil, fmt.Errorf("cuda: register host: want a non-empty page-aligned region, got %d bytes at %p", len(b), unsafe.SliceData(b))
	}
	base := unsafe.Pointer(&b[0])
	r := C.okv_mem_host_register(d.ctx, base, C.size_t(len(b)), hostRegisterPortable|hostRegisterDeviceMap)
	runtime.KeepAlive(b)
	if r != 0 {
		return nil, cudaErr(fmt.Sprintf("cuMemHostRegister %d bytes", len(b)), r)
	}
	h := &HostRegion{d: d, base: base, size: uint64(len(b))}
	h.mu.mapped = map[*Device]uint64{}
	return h, nil
}

// Len returns the region's size in bytes.
func (h *HostRegion) Len() uint64 { return h.size }

// Bytes returns the region as a slice (the caller's own mapping).
func (h *HostRegion) Bytes() []byte { return unsafe.Slice((*byte)(h.base), h.size) }

// devicePointer returns the device address of the region's first byte as
// seen from device d (cuMemHostGetDevicePointer, cached per device).
func (h *HostRegion) devicePointer(d *Device) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return 0, ErrClosed
	}
	if p, ok := h.mu.mapped[d]; ok {
		return p, nil
	}
	var p C.CUdeviceptr
	if r := C.okv_mem_host_device_pointer(d.ctx, &p, h.base); r != 0 {
		return 0, cudaErr("cuMemHostGetDevicePointer", r)
	}
	h.mu.mapped[d] = uint64(p)
	return uint64(p), nil
}

// Unregister unpins the region. No copy may be in flight. Idempotent.
func (h *HostRegion) Unregister() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return nil
	}
	h.mu.closed = true
	return cudaErr("cuMemHostUnregister", C.okv_mem_host_unregister(h.d.ctx, h.base))
}

// CanAccessPeer reports whether d can read and write peer's memory directly.
func (d *Device) CanAccessPeer(peer *Device) (bool, error) {
	var can C.int
	err := cudaErr("cuDeviceCanAccessPeer", C.okv_can_access_peer(&can, d.dev, peer.dev))
	return can != 0, err
}

// EnablePeerAccess lets d's context access peer's memory (for PeerCopyAsync
// over NVLink rather than staged through the host). Enabling it twice is
// not an error.
func (d *Device) EnablePeerAccess(peer *Device) error {
	r := C.okv_enable_peer_access(d.ctx, peer.ctx)
	if r == 704 { // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
		r = 0
	}
	if r == 0 {
		d.peers.Store(peer, struct{}{})
	}
	return cudaErr("cuCtxEnablePeerAccess", r)
}

// PeerCopyAsync enqueues a copy of n bytes from src on device srcDev to dst
// on the stream's device (cuMemcpyPeerAsync).
func (s *Stream) PeerCopyAsync(dst DevicePtr, srcDev *Device, src DevicePtr, n uint64) error {
	r := C.okv_memcpy_peer_async(s.d.ctx, C.CUdeviceptr(dst), s.d.ctx, C.CUdeviceptr(src), srcDev.ctx, C.size_t(n), s.s)
	return cudaErr(fmt.Sprintf("cuMemcpyPeerAsync %d bytes", n), r)
}
