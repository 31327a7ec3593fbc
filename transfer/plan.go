package transfer

import (
	"errors"
	"fmt"
	"math/bits"
)

// ErrGeometry reports a segment description that does not fit its buffers.
var ErrGeometry = errors.New("kv buffer geometry")

// Segment locates one (layer, plane) of the KV cache in a buffer: block b
// occupies [Offset + b*Stride, + BlockBytes).
type Segment struct {
	Buffer     int
	Offset     uint64
	Stride     uint64
	BlockBytes uint64
}

// Geometry is how one engine session's pages map onto its buffers.
type Geometry struct {
	Segments      []Segment
	NumBlocks     uint32
	BlocksPerPage int
}

// PageBytes is the size of one page blob (of a geometry Validate accepted:
// it does not pass 2^64).
func (g *Geometry) PageBytes() uint64 {
	n, _ := g.pageBytes()
	return n
}

// Validate checks every segment's blocks against the buffer sizes.
func (g *Geometry) Validate(bufSizes []uint64) error {
	if g.BlocksPerPage <= 0 || g.NumBlocks == 0 || len(g.Segments) == 0 {
		return fmt.Errorf("%w: %d blocks per page, %d blocks, %d segments", ErrGeometry, g.BlocksPerPage, g.NumBlocks, len(g.Segments))
	}
	for i, s := range g.Segments {
		if s.Buffer < 0 || s.Buffer >= len(bufSizes) {
			return fmt.Errorf("%w: segment %d names buffer %d of %d", ErrGeometry, i, s.Buffer, len(bufSizes))
		}
		if s.BlockBytes == 0 || (g.NumBlocks > 1 && s.Stride < s.BlockBytes) {
			return fmt.Errorf("%w: segment %d block %d bytes, stride %d", ErrGeometry, i, s.BlockBytes, s.Stride)
		}
		end, ok := segmentEnd(s, g.NumBlocks)
		if !ok {
			return fmt.Errorf("%w: segment %d: offset %d + %d strides of %d + %d bytes passes 2^64", ErrGeometry, i, s.Offset, g.NumBlocks-1, s.Stride, s.BlockBytes)
		}
		if end > bufSizes[s.Buffer] {
			return fmt.Errorf("%w: segment %d ends at byte %d, buffer %d has %d", ErrGeometry, i, end, s.Buffer, bufSizes[s.Buffer])
		}
	}
	if _, ok := g.pageBytes(); !ok {
		return fmt.Errorf("%w: a page of %d blocks of %d segments passes 2^64 bytes", ErrGeometry, g.BlocksPerPage, len(g.Segments))
	}
	return nil
}

// segmentEnd is the end of a segment's last block, Offset + (blocks-1)·Stride
// + BlockBytes; ok is false when that passes 2^64.
func segmentEnd(s Segment, blocks uint32) (end uint64, ok bool) {
	hi, span := bits.Mul64(uint64(blocks-1), s.Stride)
	end, c1 := bits.Add64(s.Offset, span, 0)
	end, c2 := bits.Add64(end, s.BlockBytes, 0)
	return end, hi == 0 && c1 == 0 && c2 == 0
}

// pageBytes is PageBytes; ok is false when it passes 2^64.
func (g *Geometry) pageBytes() (uint64, bool) {
	var n uint64
	for _, s := range g.Segments {
		var c uint64
		if n, c = bits.Add64(n, s.BlockBytes, 0); c != 0 {
			return 0, false
		}
	}
	hi, total := bits.Mul64(n, uint64(g.BlocksPerPage))
	return total, hi == 0
}

// SkipBlock in a load's block list means "do not copy this block": the
// engine already holds it (computed locally). Its part of the page blob is
// left out; the other blocks keep their blob offsets. Saves may not use it.
const SkipBlock = ^uint32(0)

// HasSkip reports whether a block list skips any block.
func HasSkip(blocks []uint32) bool {
	for _, b := range blocks {
		if b == SkipBlock {
			return true
		}
	}
	return false
}

// CheckBlocks validates one page's block list. SkipBlock entries are
// allowed (whether the operation may skip is the caller's rule), but a page
// must name at least one real block.
func (g *Geometry) CheckBlocks(blocks []uint32) error {
	if len(blocks) != g.BlocksPerPage {
		return fmt.Errorf("%w: page names %d blocks, want %d", ErrGeometry, len(blocks), g.BlocksPerPage)
	}
	real := 0
	for _, b := range blocks {
		if b == SkipBlock {
			continue
		}
		if b >= g.NumBlocks {
			return fmt.Errorf("%w: block %d out of range (%d blocks)", ErrGeometry, b, g.NumBlocks)
		}
		real++
	}
	if real == 0 {
		return fmt.Errorf("%w: page skips all its %d blocks", ErrGeometry, len(blocks))
	}
	return nil
}

// Gather appends the descriptors that copy a page's blocks from the engine
// buffers into blob at blobOff, in blob order. A save names every block:
// SkipBlock is refused.
func (g *Geometry) Gather(dst []Desc, bufs []*Region, blocks []uint32, blob *Region, blobOff uint64) ([]Desc, error) {
	return g.plan(dst, bufs, blocks, blob, blobOff, false)
}

// Scatter appends the descriptors that copy a page blob back into blocks;
// blocks given as SkipBlock get no descriptor.
func (g *Geometry) Scatter(dst []Desc, bufs []*Region, blocks []uint32, blob *Region, blobOff uint64) ([]Desc, error) {
	return g.plan(dst, bufs, blocks, blob, blobOff, true)
}

// ScatterSegments appends the descriptors that copy segments [lo, hi) of a
// page blob at blobOff (its part of the blob: segment-major, then blocks)
// back into blocks. A layer-wise restore plans one layer's K and V
// (segments 2l and 2l+1) of every page before the next layer.
func (g *Geometry) ScatterSegments(dst []Desc, bufs []*Region, blocks []uint32, blob *Region, blobOff uint64, lo, hi int) ([]Desc, error) {
	if lo < 0 || hi > len(g.Segments) || lo > hi {
		return dst, fmt.Errorf("%w: segments [%d, %d) of %d", ErrGeometry, lo, hi, len(g.Segments))
	}
	for _, s := range g.Segments[:lo] {
		blobOff += s.BlockBytes * uint64(g.BlocksPerPage)
	}
	return g.planRange(dst, bufs, blocks, blob, blobOff, true, g.Segments[lo:hi])
}

func (g *Geometry) plan(out []Desc, bufs []*Region, blocks []uint32, blob *Region, off uint64, toEngine bool) ([]Desc, error) {
	return g.planRange(out, bufs, blocks, blob, off, toEngine, g.Segments)
}

func (g *Geometry) planRange(out []Desc, bufs []*Region, blocks []uint32, blob *Region, off uint64, toEngine bool, segs []Segment) ([]Desc, error) {
	if err := g.CheckBlocks(blocks); err != nil {
		return out, err
	}
	if !toEngine && HasSkip(blocks) {
		return out, fmt.Errorf("%w: a save cannot skip blocks", ErrGeometry)
	}
	for _, s := range segs {
		buf := bufs[s.Buffer]
		for _, b := range blocks {
			if b == SkipBlock {
				off += s.BlockBytes // its bytes stay in the blob, uncopied
				continue
			}
			d := Desc{Src: buf, SrcOff: s.Offset + uint64(b)*s.Stride, Dst: blob, DstOff: off, Len: s.BlockBytes}
			if toEngine {
				d.Src, d.Dst, d.SrcOff, d.DstOff = d.Dst, d.Src, d.DstOff, d.SrcOff
			}
			if err := d.check(); err != nil {
				return out, fmt.Errorf("%w: %v", ErrGeometry, err)
			}
			out = appendMerged(out, d)
			off += s.BlockBytes
		}
	}
	return out, nil
}

// appendMerged appends d, extending the last descriptor when d continues it
// on both sides.
func appendMerged(out []Desc, d Desc) []Desc {
	if n := len(out); n > 0 {
		l := &out[n-1]
		if l.Src == d.Src && l.Dst == d.Dst && l.SrcOff+l.Len == d.SrcOff && l.DstOff+l.Len == d.DstOff {
			l.Len += d.Len
			return out
		}
	}
	return append(out, d)
}
