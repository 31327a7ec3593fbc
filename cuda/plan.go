package cuda

import "fmt"

// cSeg is one copy in the shim's form (okv_seg): absolute source and
// destination addresses in the unified address space and a length. Plain
// integers only, so a []cSeg may be passed to C for the duration of a call.
type cSeg struct {
	Src, Dst, Len uint64
}

// checkSegments reports the first segment that is empty or falls outside a
// region of regionLen bytes.
func checkSegments(segs []Segment, regionLen uint64) error {
	for i, s := range segs {
		if s.Len == 0 || s.Dev == 0 {
			return fmt.Errorf("%w: segment %d: len %d dev %#x", ErrBadSegment, i, s.Len, uint64(s.Dev))
		}
		if s.HostOff > regionLen || s.Len > regionLen-s.HostOff {
			return fmt.Errorf("%w: segment %d: host [%d, +%d) outside region of %d bytes",
				ErrBadSegment, i, s.HostOff, s.Len, regionLen)
		}
		if uint64(s.Dev)+s.Len < uint64(s.Dev) {
			return fmt.Errorf("%w: segment %d: device range wraps", ErrBadSegment, i)
		}
	}
	return nil
}

// coalesce merges runs of segments that are adjacent on both sides (host
// offset and device address), in order, appending to dst. It never reorders:
// two merged copies are one copy of the same bytes.
func coalesce(dst, segs []Segment) []Segment {
	for _, s := range segs {
		if n := len(dst); n > 0 {
			last := &dst[n-1]
			if last.HostOff+last.Len == s.HostOff && uint64(last.Dev)+last.Len == uint64(s.Dev) {
				last.Len += s.Len
				continue
			}
		}
		dst = append(dst, s)
	}
	return dst
}

// lower turns segments into shim copies for one direction, appending to dst.
// hostBase is the address the copy engine or kernel uses for offset 0 of the
// region (its host address, or its mapped device address for the kernel).
func lower(dst []cSeg, dir Direction, hostBase uint64, segs []Segment) []cSeg {
	for _, s := range segs {
		h, d := hostBase+s.HostOff, uint64(s.Dev)
		if dir == HostToDevice {
			dst = append(dst, cSeg{Src: h, Dst: d, Len: s.Len})
		} else {
			dst = append(dst, cSeg{Src: d, Dst: h, Len: s.Len})
		}
	}
	return dst
}

// kernelFits reports whether the copy kernel can move these copies: it moves
// 16-byte vectors, so every address and length must be 16-byte aligned, and
// the grid's y dimension (chunks per segment) is at most 65535.
func kernelFits(segs []cSeg, chunk uint64) (chunks uint32, ok bool) {
	var maxLen uint64
	for _, s := range segs {
		if (s.Src|s.Dst|s.Len)&15 != 0 {
			return 0, false
		}
		maxLen = max(maxLen, s.Len)
	}
	c := (maxLen + chunk - 1) / chunk
	if c == 0 || c > 65535 {
		return 0, false
	}
	return uint32(c), true
}

// splitEven splits n items into at most k contiguous, non-empty ranges whose
// sizes differ by at most one.
func splitEven(n, k int) [][2]int {
	if k > n {
		k = n
	}
	out := make([][2]int, 0, k)
	start := 0
	for i := range k {
		size := n / k
		if i < n%k {
			size++
		}
		out = append(out, [2]int{start, start + size})
		start += size
	}
	return out
}
