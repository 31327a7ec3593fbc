//go:build cgo && linux

package cuda

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// TestStartGroupsLayerMajor restores pages plane by plane (one group per
// plane, layer-major as a layer-wise load plans them), records an
// interprocess event after each group, and checks every plane's digest and
// that every event completed, for each copy method.
func TestStartGroupsLayerMajor(t *testing.T) {
	d := requireDevice(t)
	r := rand.New(rand.NewPCG(7, 8))
	const pages, slots, blocks = 8, 12, 24
	s := newScatter(t, d, r, pages, slots, blocks)
	// Consecutive pages in consecutive slots and blocks (a fresh engine's
	// allocation): each plane's group folds into one pitched copy.
	seq := newScatterAt(t, d, r, slots, blocks, []int{2, 3, 4, 5, 6, 7, 8, 9}, []int{5, 6, 7, 8, 9, 10, 11, 12})
	marks := make([]*Event, testPlanes)
	for p := range marks {
		e, err := d.NewIPCEvent()
		if err != nil {
			t.Fatalf("interprocess event: %v", err)
		}
		defer e.Close()
		if _, err := e.IPCHandle(); err != nil {
			t.Fatalf("event handle: %v", err)
		}
		marks[p] = e
	}
	for _, tc := range []struct {
		name string
		cfg  CopierConfig
		seq  bool // consecutive placement, page order
	}{
		{"streams", CopierConfig{Method: MethodStreams, Streams: 4}, false},
		{"batch", CopierConfig{Method: MethodBatch}, false},
		{"kernel", CopierConfig{Method: MethodKernel}, false},
		{"pitched", CopierConfig{Method: MethodPitched}, false},
		{"pitched, consecutive pages (folded groups)", CopierConfig{Method: MethodPitched}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, order := s, r
			if tc.seq {
				s, order = seq, nil
			}
			c, err := d.NewCopier(tc.cfg)
			if err != nil {
				skipOrFail(t, "copier %s: %v", tc.name, err)
			}
			defer c.Close()
			if err := d.Memset(s.pool.Ptr, sentinel, s.pool.Size); err != nil {
				t.Fatal(err)
			}
			groups := make([][]Segment, testPlanes)
			for _, sg := range s.segments(order, func(i int) int { return s.slots[i] }) {
				p := int((uint64(sg.Dev) - uint64(s.pool.Ptr)) / s.planeBytes())
				groups[p] = append(groups[p], sg)
			}
			last := groups[testPlanes-1] // left out here, restored after: an empty group takes its mark
			groups = append(groups[:5], append([][]Segment{nil}, groups[5:testPlanes-1]...)...)
			p, err := c.StartGroups(HostToDevice, s.host, groups, marks)
			if err != nil {
				t.Fatalf("start groups with %v: %v", c.Method(), err)
			}
			if _, err := c.Start(HostToDevice, s.host, last); err == nil {
				t.Fatal("a second batch was accepted while the grouped one was in flight")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for g, e := range marks {
				if err := e.Wait(ctx); err != nil {
					t.Fatalf("mark %d: %v", g, err)
				}
			}
			if err := p.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.Restore(ctx, s.host, last); err != nil { // the plane left out above
				t.Fatal(err)
			}
			if bad := s.verifyDevice(t, d); len(bad) > 0 {
				t.Fatalf("grouped restore with %v: digests differ for %v", c.Method(), bad)
			}
		})
	}
}
