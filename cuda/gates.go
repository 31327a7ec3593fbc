//go:build cgo && linux

// Memory ownership: Gates owns a pinned, device-mapped host array of uint32
// gate words (cuMemAllocHost), a gate stream and a tail event; Close releases
// every gate (so no stream stays blocked), drains the gate stream and frees
// them. The events passed to Arm are the caller's and must outlive the gates.

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Gates let a layer-wise load record its per-layer marks before its copies
// are enqueued. Arm enqueues, on the gate stream, for each layer l a wait
// until word l reaches the load's generation (cuStreamWaitValue32, GEQ) and
// then the record of mark l: a few dozen small operations, after which an
// engine may make its stream wait on mark l (the record is already queued,
// so the wait is never on a stale record). The copies follow, each layer's
// group ending with Write (cuStreamWriteValue32 of the generation, fenced
// after the copies), which opens gate l. Release opens every gate from the
// host, the path for a load whose copies failed: the words live in pinned
// host memory, so no stream, and no healthy device queue, is needed for it.
type Gates struct {
	d      *Device
	stream *Stream
	tail   *Event // recorded after a load's last Write; the next load's writes wait for it
	words  unsafe.Pointer
	dev    C.CUdeviceptr
	n      int
	armed  atomic.Uint32 // the latest generation armed
}

// HasStreamMemOps reports whether the driver exports the stream memory
// operations gates need (and the device may use them).
func (d *Device) HasStreamMemOps() bool {
	switch C.okv_memops_kind() {
	case 2:
		return true
	case 1:
		return d.attr(attrCanUseStreamMemOpsV1) != 0
	}
	return false
}

// NewGates creates n gates; ErrNotSupported without stream memory operations.
func (d *Device) NewGates(n int) (*Gates, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("cuda: %d gates", n)
	}
	if !d.HasStreamMemOps() {
		return nil, fmt.Errorf("%w: driver has no usable cuStreamWaitValue32/cuStreamWriteValue32", ErrNotSupported)
	}
	g := &Gates{d: d, n: n}
	var p unsafe.Pointer
	if r := C.okv_mem_alloc_host(d.ctx, &p, C.size_t(4*n)); r != 0 {
		return nil, cudaErr("cuMemAllocHost gate words", r)
	}
	g.words = p
	for l := range n {
		atomic.StoreUint32(g.word(l), 0)
	}
	if r := C.okv_mem_host_device_pointer(d.ctx, &g.dev, p); r != 0 {
		return nil, errors.Join(cudaErr("cuMemHostGetDevicePointer gate words", r), g.Close())
	}
	var err error
	if g.stream, err = d.NewStream(); err != nil {
		return nil, errors.Join(err, g.Close())
	}
	if g.tail, err = d.NewEvent(false); err != nil {
		return nil, errors.Join(err, g.Close())
	}
	return g, nil
}

// Len is the number of gates.
func (g *Gates) Len() int { return g.n }

func (g *Gates) word(l int) *uint32 { return (*uint32)(unsafe.Add(g.words, 4*l)) }

// Word reads gate word l on the host.
func (g *Gates) Word(l int) uint32 { return atomic.LoadUint32(g.word(l)) }

// Arm enqueues, per layer, the wait for word l ≥ gen and the record of
// marks[l] on the gate stream. gen must be newer than every generation armed
// before it (wrap-around compares as int32 differences).
func (g *Gates) Arm(marks []*Event, gen uint32) error {
	if len(marks) != g.n {
		return fmt.Errorf("cuda: %d marks for %d gates", len(marks), g.n)
	}
	words := make([]C.CUdeviceptr, g.n)
	evs := make([]C.CUevent, g.n)
	for l := range g.n {
		words[l] = g.dev + C.CUdeviceptr(4*l)
		evs[l] = marks[l].e
	}
	g.armed.Store(gen)
	var failed C.int
	r := C.okv_gate_arm(g.d.ctx, g.stream.s, &words[0], &evs[0], C.int(g.n), C.uint32_t(gen), &failed)
	runtime.KeepAlive(words)
	runtime.KeepAlive(evs)
	if r != 0 {
		return cudaErr(fmt.Sprintf("arm gate %d of %d (cuStreamWaitValue32/cuEventRecord)", int(failed), g.n), r)
	}
	return nil
}

// Write enqueues on s the opening of gate l for generation gen, after
// everything queued on s so far. The first layer's write also waits for the
// previous load's last write, so words only ever move forward.
func (g *Gates) Write(s *Stream, l int, gen uint32) error {
	if l < 0 || l >= g.n {
		return fmt.Errorf("cuda: gate %d of %d", l, g.n)
	}
	if l == 0 {
		if err := s.WaitEvent(g.tail); err != nil {
			return err
		}
	}
	if r := C.okv_write_value32(g.d.ctx, s.s, g.dev+C.CUdeviceptr(4*l), C.uint32_t(gen)); r != 0 {
		return cudaErr(fmt.Sprintf("cuStreamWriteValue32 gate %d", l), r)
	}
	if l == g.n-1 {
		return g.tail.Record(s)
	}
	return nil
}

// Release opens every gate for gen from the host (never moving a word
// backwards), whatever the device's queues are doing.
func (g *Gates) Release(gen uint32) {
	for l := range g.n {
		w := g.word(l)
		for {
			cur := atomic.LoadUint32(w)
			if int32(cur-gen) >= 0 || atomic.CompareAndSwapUint32(w, cur, gen) {
				break
			}
		}
	}
}

// Close opens every gate armed so far, drains the gate stream and frees the
// gates. Idempotent.
func (g *Gates) Close() error {
	if g == nil || g.d == nil {
		return nil
	}
	var errs []error
	if g.words != nil {
		g.Release(g.armed.Load())
	}
	if g.stream != nil {
		errs = append(errs, g.stream.Synchronize(), g.stream.Close())
		g.stream = nil
	}
	if g.tail != nil {
		errs = append(errs, g.tail.Close())
		g.tail = nil
	}
	if g.words != nil {
		errs = append(errs, cudaErr("cuMemFreeHost gate words", C.okv_mem_free_host(g.d.ctx, g.words)))
		g.words = nil
	}
	return errors.Join(errs...)
}
