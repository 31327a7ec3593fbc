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

// cRect is a pitched (2D) copy in the shim's form (okv_rect): Height rows of
// Width bytes, row r from Src+r·SrcPitch to Dst+r·DstPitch. Plain integers
// only, like cSeg.
type cRect struct {
	Src, Dst, Width, Height, SrcPitch, DstPitch uint64
}

// rects folds copies into pitched copies, appending to dst. A run of copies
// of one length whose sources and destinations each advance by one constant
// stride (at least the length, at most maxPitch) becomes one rectangle; runs
// may interleave with a short period (the copies r, r+p, r+2p, … for each r
// below p), which is how a page of several blocks is planned: segment by
// segment, each segment's blocks in turn, so each block's planes form one
// run. Any other copy is a rectangle of one row. An engine's KV planes sit
// at a constant stride (one buffer, or one tensor per layer allocated back
// to back) and a page's planes lie at one stride in DRAM, so an 8K-token
// restore of 9,216 copies becomes 128 copies that the copy engines run as
// 2D transfers. Every input copy is exactly one row of the output.
func rects(dst []cRect, segs []cSeg, maxPitch uint64) []cRect {
	for i := 0; i < len(segs); {
		p, h := bestFold(segs[i:], maxPitch)
		if h < 2 {
			s := segs[i]
			dst = append(dst, cRect{Src: s.Src, Dst: s.Dst, Width: s.Len, Height: 1, SrcPitch: s.Len, DstPitch: s.Len})
			i++
			continue
		}
		for r := range p {
			s, n := segs[i+r], segs[i+r+p]
			dst = append(dst, cRect{Src: s.Src, Dst: s.Dst, Width: s.Len, Height: uint64(h), SrcPitch: n.Src - s.Src, DstPitch: n.Dst - s.Dst})
		}
		i += p * h
	}
	return dst
}

// maxFoldPeriod is the longest interleaving rects looks for (blocks per
// page: 4 for 16-token blocks in 64-token pages).
const maxFoldPeriod = 8

// bestFold returns the period that folds the most leading copies of segs
// and its height (rows per rectangle); height < 2 means none folds.
func bestFold(segs []cSeg, maxPitch uint64) (period, height int) {
	best := 0
	for p := 1; p <= maxFoldPeriod; p++ {
		if h := fold(segs, p, maxPitch); h >= 2 && p*h > best {
			best, period, height = p*h, p, h
		}
	}
	return period, height
}

// fold returns how many rows the p interleaved runs at the head of segs
// share: runs of copies of one length, all with the source stride and the
// destination stride of the first.
func fold(segs []cSeg, p int, maxPitch uint64) int {
	if len(segs) < 2*p {
		return 0
	}
	w := segs[0].Len
	sp, dp := segs[p].Src-segs[0].Src, segs[p].Dst-segs[0].Dst // wrap (descending) fails the bounds below
	if sp < w || dp < w || sp > maxPitch || dp > maxPitch {
		return 0
	}
	h := 1
	for ; (h+1)*p <= len(segs); h++ {
		for r := range p {
			a, b := segs[(h-1)*p+r], segs[h*p+r]
			if a.Len != w || b.Len != w || b.Src != a.Src+sp || b.Dst != a.Dst+dp {
				return h
			}
		}
	}
	return h
}

// lowerPeer checks peer segments and appends them to dst in the shim's
// form, merging runs adjacent on both sides.
func lowerPeer(dst []cSeg, segs []PeerSegment) ([]cSeg, error) {
	for i, s := range segs {
		switch {
		case s.Len == 0 || s.Src == 0 || s.Dst == 0:
			return dst, fmt.Errorf("%w: peer segment %d: len %d src %#x dst %#x", ErrBadSegment, i, s.Len, uint64(s.Src), uint64(s.Dst))
		case uint64(s.Src)+s.Len < uint64(s.Src) || uint64(s.Dst)+s.Len < uint64(s.Dst):
			return dst, fmt.Errorf("%w: peer segment %d: range wraps", ErrBadSegment, i)
		}
		if n := len(dst); n > 0 && dst[n-1].Src+dst[n-1].Len == uint64(s.Src) && dst[n-1].Dst+dst[n-1].Len == uint64(s.Dst) {
			dst[n-1].Len += s.Len
			continue
		}
		dst = append(dst, cSeg{Src: uint64(s.Src), Dst: uint64(s.Dst), Len: s.Len})
	}
	return dst, nil
}
