//go:build cgo && linux

package cuda

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// TestGatesLayerMajorRestore arms interprocess marks behind gates before any
// copy is enqueued, then enqueues the grouped restore with StartGroupsGated
// (copy engines, whatever the copier's method): every mark completes, every
// word holds the generation, and every plane's bytes are exact. Run twice,
// so the second load reuses the words with the next generation.
func TestGatesLayerMajorRestore(t *testing.T) {
	d := requireDevice(t)
	if !d.HasStreamMemOps() {
		skipOrFail(t, "driver has no stream memory operations")
	}
	r := rand.New(rand.NewPCG(9, 10))
	marks := make([]*Event, testPlanes)
	for p := range marks {
		e, err := d.NewIPCEvent()
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		marks[p] = e
	}
	g, err := d.NewGates(testPlanes)
	if err != nil {
		t.Fatalf("gates: %v", err)
	}
	defer g.Close()
	gen := uint32(0)
	for _, tc := range []struct {
		name  string
		s     *scatter
		cfg   CopierConfig
		order *rand.Rand // nil: page order
	}{
		{"scattered, batched copies", newScatter(t, d, r, 8, 12, 24), CopierConfig{Method: MethodKernel}, r},
		// Consecutive pages in consecutive slots and blocks: auto folds each
		// layer's group into pitched copies.
		{"consecutive, auto (pitched groups)", newScatterAt(t, d, r, 12, 24, []int{1, 2, 3, 4, 5, 6, 7, 8}, []int{9, 10, 11, 12, 13, 14, 15, 16}), CopierConfig{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			c, err := d.NewCopier(tc.cfg)
			if err != nil {
				c, err = d.NewCopier(CopierConfig{})
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for range 2 {
				gen++
				if err := d.Memset(s.pool.Ptr, sentinel, s.pool.Size); err != nil {
					t.Fatal(err)
				}
				if err := g.Arm(marks, gen); err != nil {
					t.Fatalf("arm: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
				if done, _ := marks[0].Done(); done {
					t.Fatal("mark 0 completed before its gate opened")
				}
				groups := make([][]Segment, testPlanes)
				for _, sg := range s.segments(tc.order, func(i int) int { return s.slots[i] }) {
					p := int((uint64(sg.Dev) - uint64(s.pool.Ptr)) / s.planeBytes())
					groups[p] = append(groups[p], sg)
				}
				p, err := c.StartGroupsGated(HostToDevice, s.host, groups, g, gen)
				if err != nil {
					t.Fatalf("gated start: %v", err)
				}
				for l, e := range marks {
					if err := e.Wait(ctx); err != nil {
						t.Fatalf("load %d mark %d: %v", gen, l, err)
					}
				}
				if err := p.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				for l := range testPlanes {
					if w := g.Word(l); w != gen {
						t.Errorf("load %d: word %d = %d", gen, l, w)
					}
				}
				if bad := s.verifyDevice(t, d); len(bad) > 0 {
					t.Fatalf("gated restore load %d: digests differ for %v", gen, bad)
				}
			}
		})
	}
}

func TestGatesReleaseBound(t *testing.T) {
	d := requireDevice(t)
	if !d.HasStreamMemOps() {
		skipOrFail(t, "driver has no stream memory operations")
	}
	const n = 36
	marks := make([]*Event, n)
	for l := range marks {
		e, err := d.NewIPCEvent()
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		marks[l] = e
	}
	g, err := d.NewGates(n)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Arm(marks, 7); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if done, _ := marks[n-1].Done(); done {
		t.Fatal("last mark completed with its gate closed")
	}
	start := time.Now()
	g.Release(7)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for l, e := range marks {
		if err := e.Wait(ctx); err != nil {
			t.Fatalf("mark %d not released within 2s: %v", l, err)
		}
	}
	t.Logf("all %d gates released in %v", n, time.Since(start))
}
