//go:build cgo && linux

// Memory ownership: a Copier owns, off the Go heap, a pinned descriptor
// staging buffer (cuMemAllocHost) and its device twin (cuMemAlloc) for the
// kernel, C-allocated scratch arrays for cuMemcpyBatchAsync, its streams and
// its events; Close frees them after draining the streams. The Go slices of
// descriptors it passes to C hold no Go pointers and are read only during
// the call. The HostRegion and device memory a batch names are the caller's
// and must stay valid until Wait returns nil.

package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

const cSegSize = uint64(unsafe.Sizeof(cSeg{}))

// Copier moves batches of segments between pinned host memory and device
// memory on one device, one batch at a time.
type Copier struct {
	d       *Device
	cfg     CopierConfig
	method  Method
	streams []*Stream
	joins   []*Event // recorded on streams[1:], waited on by streams[0]
	done    *Event   // recorded on streams[0] after the joins

	staging  unsafe.Pointer // pinned, MaxSegments cSegs (kernel descriptors)
	devSegs  *DeviceMem     // device copy of staging
	scratch  unsafe.Pointer // C.malloc, 3×MaxSegments words (batch arrays)
	fn       C.CUfunction
	maxPitch uint64 // CU_DEVICE_ATTRIBUTE_MAX_PITCH, for pitched copies; 0 without them
	auto     bool   // MethodAuto: batched copies, or pitched ones where a batch folds

	mu struct {
		sync.Mutex
		gen      uint64 // batches started; a Pending adds only to its own
		inflight bool
		closed   bool
		merged   []Segment
		segs     []cSeg
		rects    []cRect
	}
}

// NewCopier creates a copier. MethodAuto keeps every copy on the copy
// engines (DMA), leaving the SMs to the engine whose KV it moves: batch by
// batch, pitched copies where the batch folds into runs at constant strides
// (a page's planes: on an H200 97% of a contiguous pinned copy both ways),
// else cuMemcpyBatchAsync over 4 streams (90–95% alone). Only a driver
// without cuMemcpyBatchAsync gets the copy kernel (91–95% alone, one launch
// per batch), else per-segment copies over several streams (about 47%).
// Alone the kernel is as fast, but beside a serving engine it takes SMs from
// the engine's own kernels: under vLLM 0.26 on an H100 the kernel's restores
// spent 14.6 s copying per minute and served 4–5% fewer requests than vLLM's
// own offloading, cuMemcpyBatchAsync's 2.1–2.7 s and 4–5% more
// (docs/benchmarks.md). Ask for MethodKernel to have it anyway.
func (d *Device) NewCopier(cfg CopierConfig) (*Copier, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Copier{d: d}
	if err := c.init(cfg); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

func (c *Copier) init(cfg CopierConfig) error {
	m, err := c.resolve(cfg.Method)
	if err != nil {
		return err
	}
	cfg.Method = m
	cfg.setDefaults()
	c.cfg, c.method = cfg, m
	for i := 0; i < cfg.Streams; i++ {
		s, err := c.d.NewStream()
		if err != nil {
			return err
		}
		c.streams = append(c.streams, s)
		if i > 0 {
			e, err := c.d.NewEvent(false)
			if err != nil {
				return err
			}
			c.joins = append(c.joins, e)
		}
	}
	if c.done, err = c.d.NewEvent(false); err != nil {
		return err
	}
	n := uint64(cfg.MaxSegments)
	switch m {
	case MethodKernel:
		var p unsafe.Pointer
		if r := C.okv_mem_alloc_host(c.d.ctx, &p, C.size_t(n*cSegSize)); r != 0 {
			return cudaErr("cuMemAllocHost descriptors", r)
		}
		c.staging = p
		if c.devSegs, err = c.d.Alloc(n * cSegSize); err != nil {
			return err
		}
	}
	if C.okv_batch_kind() != 0 { // MethodBatch, and the kernel's fallback
		c.scratch = C.malloc(C.size_t(3 * 8 * n))
		if c.scratch == nil {
			return fmt.Errorf("cuda: allocate batch scratch for %d segments", n)
		}
	}
	return nil
}

// resolve turns MethodAuto into a concrete method and checks availability.
func (c *Copier) resolve(m Method) (Method, error) {
	canKernel := func() error {
		if c.d.attr(attrCanMapHostMemory) == 0 {
			return fmt.Errorf("%w: device cannot map host memory", ErrNotSupported)
		}
		fn, err := c.d.copyKernel()
		c.fn = fn
		return err
	}
	switch m {
	case MethodAuto:
		c.auto = true
		if C.okv_has_copy_2d() != 0 {
			c.maxPitch = uint64(c.d.attr(attrMaxPitch))
		}
		if C.okv_batch_kind() != 0 {
			return MethodBatch, nil
		}
		if canKernel() == nil {
			return MethodKernel, nil
		}
		return MethodStreams, nil
	case MethodKernel:
		return m, canKernel()
	case MethodBatch:
		if C.okv_batch_kind() == 0 {
			return m, fmt.Errorf("%w: driver has no cuMemcpyBatchAsync", ErrNotSupported)
		}
	case MethodPitched:
		if C.okv_has_copy_2d() == 0 {
			return m, fmt.Errorf("%w: driver has no cuMemcpy2DAsync_v2", ErrNotSupported)
		}
		if c.maxPitch = uint64(c.d.attr(attrMaxPitch)); c.maxPitch == 0 {
			return m, fmt.Errorf("%w: device reports no maximum pitch", ErrNotSupported)
		}
	}
	return m, nil
}

// Method returns the method batches use.
func (c *Copier) Method() Method { return c.method }

// Config returns the effective configuration.
func (c *Copier) Config() CopierConfig { return c.cfg }

// Restore copies segments host → device and waits for them.
func (c *Copier) Restore(ctx context.Context, h *HostRegion, segs []Segment) error {
	return c.run(ctx, HostToDevice, h, segs)
}

// Save copies segments device → host and waits for them.
func (c *Copier) Save(ctx context.Context, h *HostRegion, segs []Segment) error {
	return c.run(ctx, DeviceToHost, h, segs)
}

func (c *Copier) run(ctx context.Context, dir Direction, h *HostRegion, segs []Segment) error {
	p, err := c.Start(dir, h, segs)
	if err != nil {
		return err
	}
	return p.Wait(ctx)
}

// idleLocked reports why the copier cannot take a batch now: closed, or
// a batch still in flight (Wait for it first).
func (c *Copier) idleLocked() error {
	switch {
	case c.mu.closed:
		return ErrClosed
	case c.mu.inflight:
		return fmt.Errorf("cuda: copier busy: Wait for the previous batch first")
	}
	return nil
}

// Pending is a batch in flight.
type Pending struct {
	c   *Copier
	gen uint64 // the copier's batch this is
	dir Direction
	h   *HostRegion
	m   Method // the method its copies went by
}

// Method is the method the batch's copies went by (MethodAuto resolves per
// batch: pitched copies where it folds, else cuMemcpyBatchAsync).
func (p *Pending) Method() Method { return p.m }

// Start enqueues a batch and returns without waiting. The copier takes no
// other batch until the Pending's Wait has returned nil.
func (c *Copier) Start(dir Direction, h *HostRegion, segs []Segment) (*Pending, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.idleLocked(); err != nil {
		return nil, err
	}
	if err := checkSegments(segs, h.Len()); err != nil {
		return nil, err
	}
	c.mu.merged = coalesce(c.mu.merged[:0], segs)
	if len(c.mu.merged) > c.cfg.MaxSegments {
		return nil, fmt.Errorf("%w: %d segments, copier holds %d", ErrBadSegment, len(c.mu.merged), c.cfg.MaxSegments)
	}
	m, err := c.enqueueLocked(dir, h)
	if err != nil {
		// Part of the batch may be queued: drain before the caller reuses memory.
		return nil, errors.Join(err, c.drain())
	}
	c.mu.inflight = true
	c.mu.gen++
	return &Pending{c: c, gen: c.mu.gen, dir: dir, h: h, m: m}, nil
}

// Add enqueues more segments behind the batch in flight, in the same
// direction and on the same copy engines, before Wait: a caller that plans
// a large batch page by page starts the copy with the first pages and adds
// the rest while it runs. Only a batch that went by a copy-engine method
// takes more (ErrNotSupported after the kernel, whose descriptor buffer is
// in use). An error from the enqueue drains the copier first: what was
// added before is then in place or the device failed.
func (p *Pending) Add(segs []Segment) error {
	c := p.c
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.mu.closed:
		return ErrClosed
	case !c.mu.inflight || c.mu.gen != p.gen:
		return fmt.Errorf("cuda: add to a batch that was waited for")
	case p.m == MethodKernel:
		return fmt.Errorf("%w: adding to a kernel batch", ErrNotSupported)
	case p.h == nil:
		return fmt.Errorf("%w: adding to a peer batch", ErrNotSupported)
	case len(segs) == 0:
		return nil
	}
	if err := checkSegments(segs, p.h.Len()); err != nil {
		return err
	}
	c.mu.merged = coalesce(c.mu.merged[:0], segs)
	if len(c.mu.merged) > c.cfg.MaxSegments {
		return fmt.Errorf("%w: %d segments, copier holds %d", ErrBadSegment, len(c.mu.merged), c.cfg.MaxSegments)
	}
	c.mu.segs = lower(c.mu.segs[:0], p.dir, uint64(uintptr(p.h.base)), c.mu.merged)
	err := c.engineLocked(p.m, p.dir, 0, len(c.mu.segs))
	if err == nil {
		err = c.joinLocked(c.done) // done now follows the added copies too
	}
	if err != nil {
		return errors.Join(err, c.drain())
	}
	return nil
}

// Wait blocks until the batch has completed or ctx ends. After a context
// error the batch is still in flight; call Wait again before reusing the
// memory it names.
func (p *Pending) Wait(ctx context.Context) error {
	if err := p.c.done.Wait(ctx); err != nil {
		return err
	}
	p.c.mu.Lock()
	p.c.mu.inflight = false
	p.c.mu.Unlock()
	return nil
}

// engineMethod is the copy-engine method a kernel copy falls back to:
// cuMemcpyBatchAsync where the driver has it, else several streams.
func (c *Copier) engineMethod() Method {
	if c.scratch != nil {
		return MethodBatch
	}
	return MethodStreams
}

// enqueueLocked enqueues c.mu.merged and returns the method it went by.
func (c *Copier) enqueueLocked(dir Direction, h *HostRegion) (Method, error) {
	m := c.method
	if c.auto && c.folds(dir, h) {
		m = MethodPitched // a page's planes at constant strides: 2D copies
	}
	var chunks uint32
	if m == MethodKernel {
		base, err := h.devicePointer(c.d)
		if err != nil {
			return m, err
		}
		c.mu.segs = lower(c.mu.segs[:0], dir, base, c.mu.merged)
		var ok bool
		if chunks, ok = kernelFits(c.mu.segs, uint64(c.cfg.KernelChunk)); !ok {
			m = c.engineMethod() // unaligned or oversized: the copy engines
		}
	}
	if m != MethodKernel {
		c.mu.segs = lower(c.mu.segs[:0], dir, uint64(uintptr(h.base)), c.mu.merged)
	}
	var err error
	switch m {
	case MethodKernel:
		err = c.launchLocked(chunks)
	default:
		err = c.engineLocked(m, dir, 0, len(c.mu.segs))
	}
	if err != nil {
		return m, err
	}
	return m, c.joinLocked(c.done)
}

// foldRatio is how many copies a pitched copy must replace on average for
// MethodAuto to prefer pitched copies over the kernel (or, for copies that
// must stay on the copy engines, over cuMemcpyBatchAsync). On an H200
// pitched copies of a page's 72 planes ran at 97% of a contiguous copy both
// ways, the kernel at 91% (restore) and 94% (save); one cuMemcpy2DAsync
// costs about two batched copies to enqueue.
const foldRatio = 4

// folds reports whether c.mu.merged folds into pitched copies well.
func (c *Copier) folds(dir Direction, h *HostRegion) bool {
	if c.maxPitch == 0 || len(c.mu.merged) < foldRatio {
		return false
	}
	c.mu.segs = lower(c.mu.segs[:0], dir, uint64(uintptr(h.base)), c.mu.merged)
	return c.foldsRange(0, len(c.mu.segs)) && (dir != HostToDevice || meanRow(c.mu.rects) >= c.cfg.RestorePitchMinRow)
}

// meanRow is the bytes per row of rs, on average over their rows.
func meanRow(rs []cRect) uint64 {
	var bytes, rows uint64
	for _, r := range rs {
		bytes += r.Width * r.Height
		rows += r.Height
	}
	if rows == 0 {
		return 0
	}
	return bytes / rows
}

// foldsRange reports whether the lowered copies c.mu.segs[lo:hi) fold into
// pitched copies well.
func (c *Copier) foldsRange(lo, hi int) bool {
	if c.maxPitch == 0 || hi-lo < foldRatio {
		return false
	}
	c.mu.rects = rects(c.mu.rects[:0], c.mu.segs[lo:hi], c.maxPitch)
	return len(c.mu.rects)*foldRatio <= hi-lo
}

// engineLocked enqueues segs[lo:hi) on the copy engines (method m).
func (c *Copier) engineLocked(m Method, dir Direction, lo, hi int) error {
	switch m {
	case MethodBatch:
		return c.batchLocked(dir == HostToDevice && c.cfg.BatchSrcAnyOrder, lo, hi)
	case MethodPerSegment:
		return c.eachLocked(dir, c.streams[:1], lo, hi)
	case MethodPitched:
		return c.pitchedLocked(dir, lo, hi)
	default:
		return c.eachLocked(dir, c.streams, lo, hi)
	}
}

func (c *Copier) eachLocked(dir Direction, streams []*Stream, lo, hi int) error {
	ss := make([]C.CUstream, len(streams))
	for i, s := range streams {
		ss[i] = s.s
	}
	var failed C.size_t
	segs := c.mu.segs[lo:hi]
	r := C.okv_copy_each(c.d.ctx, C.int(dir), (*C.okv_seg)(unsafe.Pointer(&segs[0])), C.size_t(len(segs)),
		&ss[0], C.int(len(ss)), &failed)
	runtime.KeepAlive(segs)
	runtime.KeepAlive(ss)
	if r != 0 {
		return cudaErr(fmt.Sprintf("cuMemcpy%sAsync segment %d of %d", dirName(dir), lo+int(failed), len(c.mu.segs)), r)
	}
	return nil
}

// pitchedLocked folds segs[lo:hi) into pitched copies and enqueues them
// over the streams.
func (c *Copier) pitchedLocked(dir Direction, lo, hi int) error {
	if hi <= lo {
		return nil
	}
	c.mu.rects = rects(c.mu.rects[:0], c.mu.segs[lo:hi], c.maxPitch)
	rs := c.mu.rects
	ss := make([]C.CUstream, len(c.streams))
	for i, s := range c.streams {
		ss[i] = s.s
	}
	var failed C.size_t
	r := C.okv_copy_2d(c.d.ctx, C.int(dir), (*C.okv_rect)(unsafe.Pointer(&rs[0])), C.size_t(len(rs)), &ss[0], C.int(len(ss)), &failed)
	runtime.KeepAlive(rs)
	runtime.KeepAlive(ss)
	if r != 0 {
		return cudaErr(fmt.Sprintf("cuMemcpy2DAsync %d of %d (from %d segments)", int(failed), len(rs), hi-lo), r)
	}
	return nil
}

// batchLocked enqueues segs[lo:hi) as cuMemcpyBatchAsync calls split over
// the streams; each segment uses its own slots of the scratch arrays.
// srcAny: the sources may be read out of stream order (BatchSrcAnyOrder).
func (c *Copier) batchLocked(srcAny bool, lo, hi int) error {
	segs := c.mu.segs
	n := uint64(c.cfg.MaxSegments)
	anyOrder := C.int(0)
	if srcAny {
		anyOrder = 1
	}
	words := unsafe.Slice((*C.CUdeviceptr)(c.scratch), 3*n)
	for k, rg := range splitEven(hi-lo, len(c.streams)) {
		i, j := lo+rg[0], lo+rg[1]
		var failed C.size_t
		r := C.okv_copy_batch(c.d.ctx, (*C.okv_seg)(unsafe.Pointer(&segs[i])), C.size_t(j-i), c.streams[k].s,
			C.uint(c.cfg.BatchFlags), anyOrder, &words[i], &words[n+uint64(i)], (*C.size_t)(unsafe.Pointer(&words[2*n+uint64(i)])), &failed)
		if r != 0 {
			return cudaErr(fmt.Sprintf("cuMemcpyBatchAsync segments [%d,%d)", i, j), r)
		}
	}
	runtime.KeepAlive(segs)
	return nil
}

func (c *Copier) launchLocked(chunks uint32) error {
	segs := c.mu.segs
	copy(unsafe.Slice((*cSeg)(c.staging), len(segs)), segs)
	r := C.okv_launch_copy(c.d.ctx, c.fn, C.CUdeviceptr(c.devSegs.Ptr), (*C.okv_seg)(c.staging), C.size_t(len(segs)),
		C.uint(c.cfg.KernelChunk), C.uint(chunks), C.uint(c.cfg.KernelThreads), c.streams[0].s)
	return cudaErr(fmt.Sprintf("launch %s over %d segments", copyKernelName, len(segs)), r)
}

// joinLocked makes streams[0] wait for the others and records target on it.
func (c *Copier) joinLocked(target *Event) error {
	if err := c.joinStreamsLocked(); err != nil {
		return err
	}
	return target.Record(c.streams[0])
}

// joinStreamsLocked makes streams[0] wait for the work queued on the others.
func (c *Copier) joinStreamsLocked() error {
	for i, e := range c.joins {
		if err := e.Record(c.streams[i+1]); err != nil {
			return err
		}
		if err := c.streams[0].WaitEvent(e); err != nil {
			return err
		}
	}
	return nil
}

// drain blocks until every stream is idle.
func (c *Copier) drain() error {
	var errs []error
	for _, s := range c.streams {
		if s.s != nil {
			errs = append(errs, s.Synchronize())
		}
	}
	return errors.Join(errs...)
}

// Close drains the streams and frees everything the copier owns. Idempotent.
func (c *Copier) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return nil
	}
	c.mu.closed = true
	errs := []error{c.drain(), c.done.Close(), c.devSegs.Free()}
	for _, e := range c.joins {
		errs = append(errs, e.Close())
	}
	for _, s := range c.streams {
		errs = append(errs, s.Close())
	}
	if c.staging != nil {
		errs = append(errs, cudaErr("cuMemFreeHost", C.okv_mem_free_host(c.d.ctx, c.staging)))
		c.staging = nil
	}
	if c.scratch != nil {
		C.free(c.scratch)
		c.scratch = nil
	}
	return errors.Join(errs...)
}

func dirName(d Direction) string {
	if d == HostToDevice {
		return "HtoD"
	}
	return "DtoH"
}

// Device attributes (CU_DEVICE_ATTRIBUTE_*).
const (
	attrMaxPitch            = 11
	attrMultiprocessorCount = 16
	attrCanMapHostMemory    = 19
	attrPCIBusID            = 33
	attrAsyncEngineCount    = 40
	attrComputeMajor        = 75
	attrComputeMinor        = 76
	// CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 (cuda.h): the original
	// cuStreamWaitValue32 entry points work on this device.
	attrCanUseStreamMemOpsV1 = 92
)

// copyKernel loads the copy kernel into the device's context once.
func (d *Device) copyKernel() (C.CUfunction, error) {
	d.kernel.Lock()
	defer d.kernel.Unlock()
	if d.kernel.loaded {
		return d.kernel.fn, d.kernel.err
	}
	d.kernel.loaded = true
	ptx, err := kernelPTX()
	if err != nil {
		d.kernel.err = fmt.Errorf("cuda: read kernel PTX: %w", err)
		return nil, d.kernel.err
	}
	image := C.CString(ptx)
	defer C.free(unsafe.Pointer(image))
	var log [4096]C.char
	if r := C.okv_module_load(d.ctx, &d.kernel.mod, image, &log[0], C.size_t(len(log))); r != 0 {
		d.kernel.err = fmt.Errorf("%w: %s", cudaErr("cuModuleLoadData copy kernel", r), C.GoString(&log[0]))
		return nil, d.kernel.err
	}
	name := C.CString(copyKernelName)
	defer C.free(unsafe.Pointer(name))
	if r := C.okv_module_function(d.ctx, &d.kernel.fn, d.kernel.mod, name); r != 0 {
		d.kernel.err = cudaErr("cuModuleGetFunction "+copyKernelName, r)
	}
	return d.kernel.fn, d.kernel.err
}
