//go:build cgo && linux

// Memory ownership: this file creates driver objects on behalf of Go values
// (Device holds a retained primary context; Stream, Event and DeviceMem hold
// a stream, an event and a device allocation). Each lives off the Go heap
// until the owning value's Close or Free, which is idempotent. Go memory
// passed to C (name buffers, byte slices for synchronous copies) is borrowed
// for one call and kept alive with runtime.KeepAlive until it returns.

package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// libraryName is what Init dlopens; ORBITKV_LIBCUDA overrides it (tests).
const libraryName = "libcuda.so.1"

var driver struct {
	once sync.Once
	err  error
}

// Init loads libcuda.so.1 and initialises the driver. It is safe to call
// many times; the first result is returned to every caller. Without a
// driver it returns an error wrapping ErrNoDriver.
func Init() error {
	driver.once.Do(func() {
		path := libraryName
		if p := os.Getenv("ORBITKV_LIBCUDA"); p != "" {
			path = p
		}
		// Gated layer-wise loads park a stream on a device-side wait
		// (gates.go); with the default 8 hardware connections a copier stream
		// that shares one with it would queue behind the wait. 32 is the
		// driver's maximum; a value set by the operator wins.
		if os.Getenv("CUDA_DEVICE_MAX_CONNECTIONS") == "" {
			_ = os.Setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
		}
		if err := load(path); err != nil {
			driver.err = err
			return
		}
		if r := C.okv_init(); r != 0 {
			driver.err = fmt.Errorf("%w: cuInit: %w", ErrNoDriver, cudaErr("cuInit", r))
		}
	})
	return driver.err
}

// load dlopens path and resolves the symbol table.
func load(path string) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	if C.okv_load(cpath, &buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("%w: no %s: %s", ErrNoDriver, libraryName, C.GoString(&buf[0]))
	}
	return nil
}

func cudaErr(op string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &Error{Op: op, Code: int(r), Name: C.GoString(C.okv_error_name(r)), Msg: C.GoString(C.okv_error_string(r))}
}

// DriverVersion returns the driver's CUDA version, e.g. 13000 for 13.0.
func DriverVersion() (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	var v C.int
	return int(v), cudaErr("cuDriverGetVersion", C.okv_driver_version(&v))
}

// HasBatchCopy reports whether the driver exports cuMemcpyBatchAsync.
func HasBatchCopy() bool { return Init() == nil && C.okv_batch_kind() != 0 }

// DeviceCount returns the number of CUDA devices.
func DeviceCount() (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	var n C.int
	return int(n), cudaErr("cuDeviceGetCount", C.okv_device_count(&n))
}

// Device is one GPU with its primary context retained.
type Device struct {
	ordinal int
	dev     C.CUdevice
	ctx     C.CUcontext
	closed  atomic.Bool
	// peers are the devices this context may read and write directly
	// (EnablePeerAccess): the copy kernel runs device-to-device copies from
	// them (peercopy.go).
	peers sync.Map // *Device -> struct{}

	kernel struct {
		sync.Mutex
		loaded bool
		mod    C.CUmodule
		fn     C.CUfunction
		err    error
	}
}

// Open retains the primary context of device ordinal.
func Open(ordinal int) (*Device, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	d := &Device{ordinal: ordinal}
	if r := C.okv_device_get(&d.dev, C.int(ordinal)); r != 0 {
		return nil, cudaErr(fmt.Sprintf("cuDeviceGet %d", ordinal), r)
	}
	if r := C.okv_primary_ctx_retain(&d.ctx, d.dev); r != 0 {
		return nil, cudaErr(fmt.Sprintf("cuDevicePrimaryCtxRetain %d", ordinal), r)
	}
	return d, nil
}

// Ordinal returns the CUDA ordinal the device was opened with.
func (d *Device) Ordinal() int { return d.ordinal }

// Close unloads the copy kernel and releases the primary context. Every
// Stream, Event, DeviceMem, HostRegion, IPCMapping and Copier of the device
// must be closed first. Close is idempotent.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	var err error
	d.kernel.Lock()
	if d.kernel.loaded && d.kernel.err == nil {
		err = cudaErr("cuModuleUnload", C.okv_module_unload(d.ctx, d.kernel.mod))
	}
	d.kernel.Unlock()
	if r := C.okv_primary_ctx_release(d.dev); r != 0 && err == nil {
		err = cudaErr("cuDevicePrimaryCtxRelease", r)
	}
	return err
}

func (d *Device) live() error {
	if d == nil || d.closed.Load() {
		return ErrClosed
	}
	return nil
}

func (d *Device) attr(a int) int {
	var v C.int
	if C.okv_device_attr(&v, C.int(a), d.dev) != 0 {
		return 0
	}
	return int(v)
}

// MemInfo returns free and total device memory in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	if err := d.live(); err != nil {
		return 0, 0, err
	}
	var f, t C.size_t
	err = cudaErr("cuMemGetInfo", C.okv_mem_get_info(d.ctx, &f, &t))
	return uint64(f), uint64(t), err
}

// Stream is a non-blocking CUDA stream of one device.
type Stream struct {
	d *Device
	s C.CUstream
}

// NewStream creates a stream that never synchronises with the NULL stream.
func (d *Device) NewStream() (*Stream, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	s := &Stream{d: d}
	if r := C.okv_stream_create(d.ctx, &s.s); r != 0 {
		return nil, cudaErr("cuStreamCreate", r)
	}
	return s, nil
}

// Synchronize blocks until all work queued on the stream has finished.
func (s *Stream) Synchronize() error {
	return cudaErr("cuStreamSynchronize", C.okv_stream_sync(s.d.ctx, s.s))
}

// WaitEvent makes later work on s wait for e (no host blocking).
func (s *Stream) WaitEvent(e *Event) error {
	return cudaErr("cuStreamWaitEvent", C.okv_stream_wait_event(s.d.ctx, s.s, e.e))
}

// Close destroys the stream (queued work still completes). Idempotent.
func (s *Stream) Close() error {
	if s == nil || s.s == nil {
		return nil
	}
	err := cudaErr("cuStreamDestroy", C.okv_stream_destroy(s.d.ctx, s.s))
	s.s = nil
	return err
}

// Event is a CUDA event of one device.
type Event struct {
	d *Device
	e C.CUevent
}

// NewEvent creates an event; timing enables Elapsed at some cost per record.
func (d *Device) NewEvent(timing bool) (*Event, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	e := &Event{d: d}
	t := C.int(0)
	if timing {
		t = 1
	}
	if r := C.okv_event_create(d.ctx, &e.e, t); r != 0 {
		return nil, cudaErr("cuEventCreate", r)
	}
	return e, nil
}

// Record captures the work queued on s so far.
func (e *Event) Record(s *Stream) error {
	return cudaErr("cuEventRecord", C.okv_event_record(e.d.ctx, e.e, s.s))
}

// Done reports whether the recorded work has completed.
func (e *Event) Done() (bool, error) {
	r := C.okv_event_query(e.d.ctx, e.e)
	if r == codeNotReady {
		return false, nil
	}
	return r == 0, cudaErr("cuEventQuery", r)
}

// Wait blocks until the recorded work has completed or ctx ends. With a
// context that can end it polls in C, sleeping eventPollNap between queries
// and coming back to check ctx every eventPollSlice; otherwise it blocks in
// cuEventSynchronize. (It used to poll from Go with time.Sleep, whose
// sub-millisecond sleeps last about a millisecond: a copy's completion was
// seen 0.5 ms late on average, 2% of an 8K-token restore.) When ctx ends
// first the work is still queued: memory it touches stays in use until the
// event completes.
func (e *Event) Wait(ctx context.Context) error {
	if ctx.Done() == nil {
		return cudaErr("cuEventSynchronize", C.okv_event_sync(e.d.ctx, e.e))
	}
	for {
		r := C.okv_event_poll(e.d.ctx, e.e, C.uint(eventPollSlice/time.Microsecond), C.uint(eventPollNap/time.Nanosecond))
		if r != codeNotReady {
			return cudaErr("cuEventQuery", r)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("cuda: wait for event: %w", err)
		}
	}
}

// eventPollNap is the sleep between event queries while waiting (plus the
// kernel's timer slack, 50 µs by default); eventPollSlice how long one poll
// in C lasts before ctx is checked.
const (
	eventPollNap   = 10 * time.Microsecond
	eventPollSlice = 2 * time.Millisecond
)

// Elapsed returns the milliseconds between two completed timing events.
func Elapsed(start, end *Event) (float32, error) {
	var ms C.float
	err := cudaErr("cuEventElapsedTime", C.okv_event_elapsed(start.d.ctx, &ms, start.e, end.e))
	return float32(ms), err
}

// Close destroys the event. Idempotent.
func (e *Event) Close() error {
	if e == nil || e.e == nil {
		return nil
	}
	err := cudaErr("cuEventDestroy", C.okv_event_destroy(e.d.ctx, e.e))
	e.e = nil
	return err
}
