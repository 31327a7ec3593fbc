//go:build cgo && linux

// Memory ownership: as copier.go. StartGroups writes every group's kernel
// descriptors into the copier's pinned staging buffer and uploads them with
// one asynchronous copy; the buffer is not written again until the batch's
// Pending.Wait has returned nil (the copier takes no other batch before).
// The events passed in are the caller's and must outlive the batch.

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// StartGroups enqueues groups of segments, in order, as one batch and
// records marks[g] on the device right after group g's copies, with no host
// round trip between groups: another stream (or, with interprocess events,
// another process) can wait for group g without waiting for the rest. A
// layer-wise restore is one group per layer, so an engine's attention of
// layer l waits for layer l only. Groups are coalesced each on its own,
// never across a boundary; an empty group just records its mark. The busy
// rule is Start's: Wait on the Pending before the next batch. The kernel
// method uploads every group's descriptors once and launches once per
// group; the copy-engine methods join their streams before each mark.
func (c *Copier) StartGroups(dir Direction, h *HostRegion, groups [][]Segment, marks []*Event) (*Pending, error) {
	if len(marks) != len(groups) {
		return nil, fmt.Errorf("cuda: %d groups, %d marks: want one mark per group", len(groups), len(marks))
	}
	return c.startGroups(dir, h, groups, false, func(g int, s *Stream) error { return marks[g].Record(s) })
}

// StartGroupsGated is StartGroups for a gated layer-wise load: group g's
// copies are followed by gates.Write(g, gen) (which opens the gate the
// engine's mark g waits behind) instead of a mark record. The copies run on
// the copy engines (cuMemcpyBatchAsync, else per-segment copies over the
// streams) whatever the copier's method, so that they never take SMs from
// the engine's forward they overlap.
func (c *Copier) StartGroupsGated(dir Direction, h *HostRegion, groups [][]Segment, gates *Gates, gen uint32) (*Pending, error) {
	if gates == nil || gates.Len() != len(groups) {
		return nil, fmt.Errorf("cuda: %d groups need as many gates", len(groups))
	}
	return c.startGroups(dir, h, groups, true, func(g int, s *Stream) error { return gates.Write(s, g, gen) })
}

func (c *Copier) startGroups(dir Direction, h *HostRegion, groups [][]Segment, engines bool, after func(g int, s *Stream) error) (*Pending, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.idleLocked(); err != nil {
		return nil, err
	}
	c.mu.merged = c.mu.merged[:0]
	ends := make([]int, len(groups))
	for g, segs := range groups {
		if err := checkSegments(segs, h.Len()); err != nil {
			return nil, fmt.Errorf("group %d: %w", g, err)
		}
		c.mu.merged = append(c.mu.merged, coalesce(nil, segs)...)
		ends[g] = len(c.mu.merged)
	}
	if len(c.mu.merged) > c.cfg.MaxSegments {
		return nil, fmt.Errorf("%w: %d segments, copier holds %d", ErrBadSegment, len(c.mu.merged), c.cfg.MaxSegments)
	}
	if err := c.enqueueGroupsLocked(dir, h, ends, engines, after); err != nil {
		return nil, errors.Join(err, c.drain())
	}
	c.mu.inflight = true
	c.mu.gen++
	return &Pending{c: c, gen: c.mu.gen, dir: dir, h: h, m: MethodKernel}, nil // takes no Add
}

func (c *Copier) enqueueGroupsLocked(dir Direction, h *HostRegion, ends []int, engines bool, after func(g int, s *Stream) error) error {
	m := c.method
	if engines && m == MethodKernel {
		m = c.engineMethod()
	}
	var chunks uint32
	if m == MethodKernel {
		base, err := h.devicePointer(c.d)
		if err != nil {
			return err
		}
		c.mu.segs = lower(c.mu.segs[:0], dir, base, c.mu.merged)
		var ok bool
		if chunks, ok = kernelFits(c.mu.segs, uint64(c.cfg.KernelChunk)); !ok && len(c.mu.segs) > 0 {
			m = c.engineMethod()
		}
	}
	if m != MethodKernel {
		c.mu.segs = lower(c.mu.segs[:0], dir, uint64(uintptr(h.base)), c.mu.merged)
		lo := 0
		for g, hi := range ends {
			if hi > lo {
				gm := m
				if c.auto && c.foldsRange(lo, hi) {
					gm = MethodPitched // e.g. one layer of consecutive pages in consecutive blocks
				}
				if err := c.engineLocked(gm, dir, lo, hi); err != nil {
					return err
				}
			}
			if err := c.joinStreamsLocked(); err != nil {
				return err
			}
			if err := after(g, c.streams[0]); err != nil {
				return err
			}
			lo = hi
		}
		return c.joinLocked(c.done)
	}
	return c.launchGroupsLocked(chunks, ends, after)
}

// launchGroupsLocked uploads every descriptor once, then launches the copy
// kernel over each group's range and records its mark, all on streams[0].
func (c *Copier) launchGroupsLocked(chunks uint32, ends []int, after func(g int, s *Stream) error) error {
	segs := c.mu.segs
	s := c.streams[0]
	if len(segs) > 0 {
		copy(unsafe.Slice((*cSeg)(c.staging), len(segs)), segs)
		r := C.okv_memcpy_async(c.d.ctx, C.int(HostToDevice), C.uint64_t(c.devSegs.Ptr), C.uint64_t(uintptr(c.staging)),
			C.size_t(uint64(len(segs))*cSegSize), s.s)
		if r != 0 {
			return cudaErr("upload copy descriptors", r)
		}
	}
	lo := 0
	for g, hi := range ends {
		if hi > lo {
			at := uint64(c.devSegs.Ptr) + uint64(lo)*cSegSize
			r := C.okv_launch_only(c.d.ctx, c.fn, C.CUdeviceptr(at), C.size_t(hi-lo),
				C.uint(c.cfg.KernelChunk), C.uint(chunks), C.uint(c.cfg.KernelThreads), s.s)
			if r != 0 {
				return cudaErr(fmt.Sprintf("launch %s over group %d (%d segments)", copyKernelName, g, hi-lo), r)
			}
		}
		if err := after(g, s); err != nil {
			return err
		}
		lo = hi
	}
	return c.done.Record(s)
}
