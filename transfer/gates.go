package transfer

// Memory ownership: a Gate holds no memory of its own; the gate words,
// stream and events are its Marks' (cuda.Gates) until Marks.Close.

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/cuda"
)

// Gated layer-wise loads. The ungated StartGroups answers only once every
// copy is enqueued, and enqueueing an 8K-token restore's 9,216 copies on the
// copy engines blocks for 11–35 ms on an H200 (the stream's queue fills):
// the engine's forward starts that late. A gated load splits it in two.
// OpenGates arms the marks — per layer, on the marks' own gate stream, a
// wait until the layer's gate word reaches the load's generation, then the
// record of the layer's event — which is 2 operations per layer and returns
// at once: the Load can answer, and an engine that now waits on event l
// waits on this load's record, never a stale one. StartGated then enqueues
// the copies, each layer's group followed by a device write of the
// generation into its word, which opens that gate. The generation grows by
// one per load of the marks, so a word left from an earlier load never
// satisfies a later wait. Whatever fails after OpenGates (a copier not
// free in time, an enqueue error, a copy that fails or never finishes) ends
// in Gate.Release, which writes the generation into every word from the
// host: the engine's stream is never left waiting, and the load's pages are
// reported failed through Wait.

// gateDev is the device side of gated marks: *cuda.Gates, or a fake.
type gateDev interface {
	Arm(marks []*cuda.Event, gen uint32) error
	Release(gen uint32)
	Close() error
}

// Gate is one armed gated load. Release opens every gate of the load from
// the host; it is idempotent and safe to call after the copies opened them.
type Gate interface {
	Release()
}

type cudaGate struct {
	m        *Marks
	gen      uint32
	released atomic.Bool
}

func (g *cudaGate) Release() {
	if !g.released.Swap(true) {
		g.m.gates.Release(g.gen)
	}
}

// Gated reports whether loads on these marks can be gated.
func (m *Marks) Gated() bool { return m != nil && m.gates != nil }

// OpenGates arms a gated load on marks and returns its Gate; nil and no
// error when the marks have no gates (the caller uses StartGroups). After an
// Arm error the gates are released and the error returned.
func (c *CUDA) OpenGates(m *Marks) (Gate, error) {
	if !m.Gated() {
		return nil, nil
	}
	return openGates(m)
}

func openGates(m *Marks) (Gate, error) {
	g := &cudaGate{m: m, gen: m.gen.Add(1)}
	if err := m.gates.Arm(m.Events, g.gen); err != nil {
		g.Release()
		return nil, fmt.Errorf("cuda transport: arm layer gates: %w", err)
	}
	return g, nil
}

// StartGated enqueues a gated load's copies, group g opening gate g once its
// copies are done. On any error the gate is released before returning, and
// the returned Flight's Wait releases it too when the copies fail.
func (c *CUDA) StartGated(ctx context.Context, groups [][]Desc, gate Gate) (Flight, error) {
	g, ok := gate.(*cudaGate)
	if !ok || g == nil {
		if gate != nil {
			gate.Release()
		}
		return nil, fmt.Errorf("cuda transport: not a gate of this transport")
	}
	f, err := c.startGated(ctx, groups, g)
	if err != nil {
		g.Release()
		return nil, err
	}
	return &gatedFlight{Flight: f, g: g}, nil
}

func (c *CUDA) startGated(ctx context.Context, groups [][]Desc, g *cudaGate) (Flight, error) {
	gates, ok := g.m.gates.(*cuda.Gates)
	if !ok || gates.Len() != len(groups) {
		return nil, fmt.Errorf("cuda transport: %d groups need as many gates", len(groups))
	}
	slot, err := c.acquire(ctx)
	if err != nil {
		return nil, err
	}
	segs := make([][]cuda.Segment, len(groups))
	var dir cuda.Direction
	for i, batch := range groups {
		var d cuda.Direction
		if d, segs[i], err = c.lower(nil, batch); err != nil {
			c.copiers <- slot
			return nil, err
		}
		if len(batch) > 0 {
			dir = d
		}
	}
	p, err := slot.cp.StartGroupsGated(dir, c.host, segs, gates, g.gen)
	if err != nil {
		c.copiers <- slot
		return nil, fmt.Errorf("cuda %s of %d gated groups: %w", dir, len(groups), err)
	}
	c.started(p)
	return &cudaFlight{c: c, slot: slot, p: p, start: time.Now()}, nil
}

// gatedFlight releases its gate when the copies did not complete.
type gatedFlight struct {
	Flight
	g Gate
}

func (f *gatedFlight) Wait(ctx context.Context) error {
	err := f.Flight.Wait(ctx)
	if err != nil {
		f.g.Release()
	}
	return err
}
