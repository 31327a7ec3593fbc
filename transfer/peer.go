package transfer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/orbitkv/orbitkv/cuda"
)

// PeerSource is a transport another can copy device memory from: its GPU.
type PeerSource interface {
	PeerDevice() *cuda.Device // nil: not a GPU transport
}

// PeerDevice implements PeerSource.
func (c *CUDA) PeerDevice() *cuda.Device { return c.dev }

// CopyFrom copies device-to-device descriptors out of src's device into this
// transport's device, on one of this transport's copiers: the copy kernel
// reading src's memory where peer access is enabled (NVLink between two
// GPUs; HBM to HBM on one), else the copy engines (cuda.Copier.StartPeer).
// Every descriptor's source is a Device region of src's device and its
// destination one of this device. A copy that outlives its deadline and
// finishTimeout is ErrStuck, as for every device copy.
func (c *CUDA) CopyFrom(ctx context.Context, src PeerSource, batch []Desc) (err error) {
	var sd *cuda.Device
	if src != nil {
		sd = src.PeerDevice()
	}
	if sd == nil {
		return fmt.Errorf("cuda peer copy: the source is not a cuda transport: %w", ErrUnsupported)
	}
	var segs []cuda.PeerSegment
	var n uint64
	if segs, n, err = lowerPeer(nil, batch, sd.Ordinal(), c.dev.Ordinal()); err != nil {
		return err
	}
	slot, err := c.acquire(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	ok := true
	defer func() {
		c.copyNanos.Add(int64(time.Since(start)))
		if ok {
			c.copiers <- slot
		}
	}()
	for i := 0; i < len(segs); i += c.maxSegs {
		chunk := segs[i:min(i+c.maxSegs, len(segs))]
		p, err := slot.cp.StartPeer(sd, chunk)
		if err != nil {
			return fmt.Errorf("cuda peer copy of %d descriptors from device %d: %w", len(chunk), sd.Ordinal(), err)
		}
		c.started(p)
		if err := c.wait(ctx, p); err != nil {
			ok = !errors.Is(err, ErrStuck)
			return err
		}
	}
	c.bytes.Add(n)
	return nil
}

// lowerPeer turns device-to-device descriptors into peer segments appended
// to dst and counts their bytes: every source must be device memory of GPU
// srcOrd and every destination device memory of GPU dstOrd.
func lowerPeer(dst []cuda.PeerSegment, batch []Desc, srcOrd, dstOrd int) ([]cuda.PeerSegment, uint64, error) {
	var bytes uint64
	for i := range batch {
		d := &batch[i]
		switch {
		case d.Src.Kind != Device || d.Dst.Kind != Device:
			return dst, 0, fmt.Errorf("descriptor %d (%s -> %s): a peer copy moves device memory only: %w", i, d.Src.Name, d.Dst.Name, ErrUnsupported)
		case d.Src.Ordinal != srcOrd || d.Dst.Ordinal != dstOrd:
			return dst, 0, fmt.Errorf("descriptor %d (%s on device %d -> %s on device %d): not a copy from device %d to device %d: %w",
				i, d.Src.Name, d.Src.Ordinal, d.Dst.Name, d.Dst.Ordinal, srcOrd, dstOrd, ErrUnsupported)
		}
		if err := d.check(); err != nil {
			return dst, 0, err
		}
		if d.Len == 0 {
			continue
		}
		dst = append(dst, cuda.PeerSegment{Src: cuda.DevicePtr(d.Src.Device + d.SrcOff), Dst: cuda.DevicePtr(d.Dst.Device + d.DstOff), Len: d.Len})
		bytes += d.Len
	}
	return dst, bytes, nil
}
