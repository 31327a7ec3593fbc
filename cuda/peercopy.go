//go:build cgo && linux

// Memory ownership: a peer batch names device memory on two devices (or
// twice on one); both are the caller's and must stay allocated until the
// Pending's Wait returns nil. The copier's own buffers are used as for host
// batches (copier.go).

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
)

// peerEnabled reports whether d's context may access src's memory directly
// (the same device, or EnablePeerAccess succeeded).
func (d *Device) peerEnabled(src *Device) bool {
	if src == d {
		return true
	}
	_, ok := d.peers.Load(src)
	return ok
}

// StartPeer enqueues a batch of device-to-device copies from device src
// (which may be the copier's own device) into the copier's device and
// returns without waiting, like Start. The copy kernel runs it where it is
// loaded, the copies are 16-byte aligned and src is the copier's device or
// one with peer access enabled (EnablePeerAccess: NVLink reads); otherwise
// the copy engines do, by cuMemcpyBatchAsync where the driver has it (the
// driver stages through the host where the devices cannot reach each
// other), else one cuMemcpyPeerAsync per segment over the streams. A peer
// batch takes no Add.
func (c *Copier) StartPeer(src *Device, segs []PeerSegment) (*Pending, error) {
	if err := src.live(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.idleLocked(); err != nil {
		return nil, err
	}
	var err error
	if c.mu.segs, err = lowerPeer(c.mu.segs[:0], segs); err != nil {
		return nil, err
	}
	if len(c.mu.segs) > c.cfg.MaxSegments {
		return nil, fmt.Errorf("%w: %d segments, copier holds %d", ErrBadSegment, len(c.mu.segs), c.cfg.MaxSegments)
	}
	m, err := c.enqueuePeerLocked(src)
	if err == nil {
		err = c.joinLocked(c.done)
	}
	if err != nil {
		return nil, errors.Join(err, c.drain())
	}
	c.mu.inflight = true
	c.mu.gen++
	return &Pending{c: c, gen: c.mu.gen, m: m}, nil
}

// enqueuePeerLocked enqueues c.mu.segs (absolute device addresses) and
// returns the method they went by.
func (c *Copier) enqueuePeerLocked(src *Device) (Method, error) {
	if len(c.mu.segs) == 0 {
		return c.method, nil
	}
	if c.method == MethodKernel && c.d.peerEnabled(src) {
		if chunks, ok := kernelFits(c.mu.segs, uint64(c.cfg.KernelChunk)); ok {
			return MethodKernel, c.launchLocked(chunks)
		}
	}
	if c.scratch != nil {
		return MethodBatch, c.batchLocked(false, 0, len(c.mu.segs)) // the source GPU's streams may still write it
	}
	for i, s := range c.mu.segs {
		st := c.streams[i%len(c.streams)]
		r := C.okv_memcpy_peer_async(c.d.ctx, C.CUdeviceptr(s.Dst), c.d.ctx, C.CUdeviceptr(s.Src), src.ctx, C.size_t(s.Len), st.s)
		if r != 0 {
			return MethodStreams, cudaErr(fmt.Sprintf("cuMemcpyPeerAsync segment %d of %d", i, len(c.mu.segs)), r)
		}
	}
	return MethodStreams, nil
}
