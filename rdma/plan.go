package rdma

import "fmt"

// Op is one RDMA READ or WRITE of a contiguous range of a peer's region.
// READ scatters the range into Local in order; WRITE gathers Local in order
// into the range. Its length is the sum of Local's lengths.
type Op struct {
	Remote    uint32 // the peer's region key (RemoteRegion.Key)
	RemoteOff uint64 // byte offset in that region
	Local     []Segment
}

// Segment is a range of a local registered region.
type Segment struct {
	Region *Region
	Off    uint64
	Len    uint64
}

// Len is the op's length in bytes.
func (o Op) Len() uint64 {
	var n uint64
	for _, s := range o.Local {
		n += s.Len
	}
	return n
}

// wrSlice is one work request's worth of an op: at most sliceBytes and
// maxSGE local pieces. Lane and the keys are bound when it is posted.
type wrSlice struct {
	op        int
	remote    uint32 // the peer's region key
	remoteOff uint64 // offset in the remote region
	len       uint64
	segs      []Segment
	lane      int   // lane it was last posted on, -1 before
	tries     int   // error completions (not flushes) so far
	lastErr   error // the last of them
}

// planSlices cuts ops into work-request slices. An op that cannot run (an
// unknown remote region, a range outside a region, an empty op) gets its
// error in errs and no slices; the others are unaffected. Pure.
func planSlices(ops []Op, remote map[uint32]RemoteRegion, sliceBytes uint64, maxSGE int) (slices []wrSlice, errs []error) {
	errs = make([]error, len(ops))
	for i, o := range ops {
		if err := checkOp(o, remote); err != nil {
			errs[i] = err
			continue
		}
		slices = cutOp(slices, i, o, sliceBytes, maxSGE)
	}
	return slices, errs
}

func checkOp(o Op, remote map[uint32]RemoteRegion) error {
	n := o.Len()
	if n == 0 {
		return fmt.Errorf("rdma: empty op on region %d", o.Remote)
	}
	r, ok := remote[o.Remote]
	if !ok {
		return fmt.Errorf("rdma: peer has no region %d", o.Remote)
	}
	if o.RemoteOff+n > r.Len || o.RemoteOff+n < o.RemoteOff {
		return fmt.Errorf("rdma: %d bytes at %d overrun the peer's region %d (%d bytes)", n, o.RemoteOff, o.Remote, r.Len)
	}
	for _, s := range o.Local {
		switch {
		case s.Region == nil || s.Region.mrs == nil:
			return fmt.Errorf("rdma: segment of an unregistered region")
		case s.Off+s.Len > s.Region.Len || s.Off+s.Len < s.Off:
			return fmt.Errorf("rdma: %d bytes at %d overrun %s (%d bytes)", s.Len, s.Off, s.Region.Name, s.Region.Len)
		}
	}
	return nil
}

// cutOp appends o's slices: a new slice starts every sliceBytes of the op
// and whenever the current one has maxSGE pieces.
func cutOp(out []wrSlice, idx int, o Op, sliceBytes uint64, maxSGE int) []wrSlice {
	cur := wrSlice{op: idx, remote: o.Remote, remoteOff: o.RemoteOff, lane: -1}
	for _, s := range o.Local {
		for s.Len > 0 {
			if cur.len == sliceBytes || len(cur.segs) == maxSGE {
				out = append(out, cur)
				cur = wrSlice{op: idx, remote: o.Remote, remoteOff: cur.remoteOff + cur.len, lane: -1}
			}
			n := min(s.Len, sliceBytes-cur.len)
			cur.segs = append(cur.segs, Segment{Region: s.Region, Off: s.Off, Len: n})
			cur.len += n
			s.Off += n
			s.Len -= n
		}
	}
	return append(out, cur)
}

// pickLane returns the next usable lane after prev in round-robin order,
// skipping avoid (the lane a retried slice failed on) while another is
// usable; -1 when none is usable. Pure.
func pickLane(usable []bool, prev, avoid int) int {
	n := len(usable)
	fallback := -1
	for k := 1; k <= n; k++ {
		i := ((prev+k)%n + n) % n
		if !usable[i] {
			continue
		}
		if i != avoid {
			return i
		}
		fallback = i
	}
	return fallback
}
