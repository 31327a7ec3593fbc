package transfer

import (
	"context"
	"fmt"

	"github.com/orbitkv/orbitkv/internal/crc32c"
)

// chunk is the unit of Local's copies: small enough that a checksum over the
// bytes just copied reads them from cache, large enough to amortize calls.
const chunk = 256 << 10

// ntMin is the smallest copy that uses non-temporal stores (copyLarge).
const ntMin = 64 << 10

// Local copies between host regions with memmove. It checks the context
// between chunks, so a deadline stops a large batch promptly.
type Local struct{}

// Name implements Copier.
func (Local) Name() string { return "local" }

// Copy implements Copier.
func (l Local) Copy(ctx context.Context, batch []Desc) error {
	_, err := l.copy(ctx, batch, false)
	return err
}

// CopyChecksum copies batch and returns the CRC-32C of the copied bytes in
// batch order, computed chunk by chunk while they are still in cache.
// For a Gather batch that is the page blob's checksum.
func (l Local) CopyChecksum(ctx context.Context, batch []Desc) (uint32, error) {
	return l.copy(ctx, batch, true)
}

// copy runs with faults guarded: a region whose memory vanished (an
// engine's shrunk file) fails the batch with a *FaultError (fault.go).
func (Local) copy(ctx context.Context, batch []Desc, sum bool) (crc uint32, err error) {
	defer guardFaults()()
	defer catchFault(batch, &err)
	for i, d := range batch {
		if d.Src.Kind != Host || d.Dst.Kind != Host {
			return 0, fmt.Errorf("descriptor %d (%s -> %s): %w", i, d.Src.Name, d.Dst.Name, ErrUnsupported)
		}
		if err := d.check(); err != nil {
			return 0, err
		}
		src := d.Src.Host[d.SrcOff : d.SrcOff+d.Len]
		dst := d.Dst.Host[d.DstOff : d.DstOff+d.Len]
		for len(src) > 0 {
			if err := ctx.Err(); err != nil {
				return 0, fmt.Errorf("copy stopped at descriptor %d: %w", i, err)
			}
			n := min(len(src), chunk)
			copyLarge(dst[:n], src[:n])
			if sum { // the source: just read, so in cache; streaming stores bypass it for dst
				crc = crc32c.Update(crc, src[:n])
			}
			src, dst = src[n:], dst[n:]
		}
	}
	return crc, nil
}
