package rdma

import (
	"math/rand/v2"
	"testing"
)

// TestPlanSlicesAgainstModel cuts random ops and checks the slices against
// a byte-by-byte model: together they cover every byte of every op exactly
// once and in order, remote and local, with no slice over sliceBytes or
// maxSGE.
func TestPlanSlicesAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	reg := &Region{Name: "local", Len: 1 << 20, mrs: []mrInfo{{}}}
	remote := map[uint32]RemoteRegion{7: {Key: 7, Len: 1 << 20}}
	for iter := range 150 {
		sliceBytes := uint64(1 + r.IntN(5000))
		maxSGE := 1 + r.IntN(4)
		ops := make([]Op, 1+r.IntN(4))
		for i := range ops {
			ops[i].Remote, ops[i].RemoteOff = 7, uint64(r.IntN(1<<19))
			for range 1 + r.IntN(5) {
				ops[i].Local = append(ops[i].Local, Segment{reg, uint64(r.IntN(1 << 19)), uint64(1 + r.IntN(3000))})
			}
		}
		slices, errs := planSlices(ops, remote, sliceBytes, maxSGE)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("iter %d op %d: %v", iter, i, err)
			}
		}
		// Model: the (remote offset, local offset) of each byte, in order.
		type pos struct{ remote, local uint64 }
		want := map[int][]pos{}
		for i, o := range ops {
			ro := o.RemoteOff
			for _, s := range o.Local {
				for k := range s.Len {
					want[i] = append(want[i], pos{ro, s.Off + k})
					ro++
				}
			}
		}
		got := map[int][]pos{}
		for _, s := range slices {
			if s.len > sliceBytes || len(s.segs) > maxSGE || s.len == 0 {
				t.Fatalf("iter %d: slice of %d bytes, %d SGEs (limits %d, %d)", iter, s.len, len(s.segs), sliceBytes, maxSGE)
			}
			ro := s.remoteOff
			for _, g := range s.segs {
				for k := range g.Len {
					got[s.op] = append(got[s.op], pos{ro, g.Off + k})
					ro++
				}
			}
		}
		for i := range ops {
			if len(got[i]) != len(want[i]) {
				t.Fatalf("iter %d op %d: slices cover %d bytes, want %d", iter, i, len(got[i]), len(want[i]))
			}
			for k := range want[i] {
				if got[i][k] != want[i][k] {
					t.Fatalf("iter %d op %d byte %d: %v, want %v", iter, i, k, got[i][k], want[i][k])
				}
			}
		}
	}
}

func TestPickLane(t *testing.T) {
	for _, c := range []struct {
		name              string
		usable            []bool
		prev, avoid, want int
	}{
		{"round robin", []bool{true, true, true}, 0, -1, 1},
		{"wraps", []bool{true, true, true}, 2, -1, 0},
		{"skips down lanes", []bool{true, false, true}, 0, -1, 2},
		{"avoids the failed lane", []bool{true, true}, 0, 1, 0},
		{"falls back to the failed lane when alone", []bool{false, true}, 0, 1, 1},
		{"none usable", []bool{false, false}, 0, -1, -1},
	} {
		if got := pickLane(c.usable, c.prev, c.avoid); got != c.want {
			t.Errorf("%s: pickLane = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestLegalTransitions(t *testing.T) {
	all := []QPState{QPReset, QPInit, QPRTR, QPRTS, QPErr}
	legal := map[[2]QPState]bool{
		{QPReset, QPInit}: true, {QPInit, QPInit}: true, {QPInit, QPRTR}: true,
		{QPRTR, QPRTS}: true, {QPRTS, QPRTS}: true,
	}
	for _, from := range all {
		for _, to := range all {
			want := legal[[2]QPState{from, to}] || to == QPReset || to == QPErr
			if got := legalTransition(from, to); got != want {
				t.Errorf("%s → %s: legal = %v, want %v", from, to, got, want)
			}
		}
	}
}

func TestRTRAttributes(t *testing.T) {
	l := laneEnd{Port: 1, GIDIndex: 3, LinkLayer: linkEthernet, MTU: 5, PSN: 42}
	peer := LaneInfo{QPN: 0x123, PSN: 0x456, MTU: 3, GID: GID{1}}
	a := rtrAttr(l, peer)
	if a.MTU != 3 || a.DestQPN != 0x123 || a.RQPSN != 0x456 || !a.Global || a.SGIDIndex != 3 || a.DGID != peer.GID {
		t.Fatalf("RTR attributes %+v", a)
	}
	if s := rtsAttr(l); s.SQPSN != 42 || s.Timeout == 0 || s.RetryCnt == 0 {
		t.Fatalf("RTS attributes %+v", s)
	}
	ib := rtrAttr(laneEnd{Port: 1, LinkLayer: linkIB, MTU: 4}, LaneInfo{QPN: 9, MTU: 5, LID: 7})
	if ib.Global || ib.DLID != 7 || ib.MTU != 4 {
		t.Fatalf("InfiniBand RTR attributes %+v (want LID routing, no GRH)", ib)
	}
}
