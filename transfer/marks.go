package transfer

// Memory ownership: Marks owns its interprocess events (package cuda keeps
// them off the Go heap) until Close; the handles are plain bytes. A Flight
// holds a copier of its transport until Wait returns nil (or gives up).

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/cuda"
)

// Marks are device events a grouped batch records between its groups, each
// exported by a 64-byte interprocess handle so that an engine process can
// make its own stream wait for one group (a layer-wise restore: one group
// and one mark per layer). Events may be nil in fakes.
type Marks struct {
	Events  []*cuda.Event
	Handles [][]byte

	gates gateDev       // nil: ungated (gates.go)
	gen   atomic.Uint32 // the latest generation armed on gates
}

// Len is the number of marks.
func (m *Marks) Len() int { return len(m.Events) }

// Close destroys the events. Idempotent; no batch may still record them.
func (m *Marks) Close() error {
	if m == nil {
		return nil
	}
	var errs []error
	if m.gates != nil {
		errs = append(errs, m.gates.Close())
		m.gates = nil
	}
	for _, e := range m.Events {
		errs = append(errs, e.Close())
	}
	m.Events, m.Handles = nil, nil
	return errors.Join(errs...)
}

// Flight is a batch enqueued on a device: Wait returns once it completed.
type Flight interface {
	Wait(ctx context.Context) error
}

// NewMarks creates n interprocess events on the transport's device.
func (c *CUDA) NewMarks(n int) (*Marks, error) {
	m := &Marks{}
	for range n {
		e, err := c.dev.NewIPCEvent()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("cuda transport: %w", err), m.Close())
		}
		m.Events = append(m.Events, e)
		h, err := e.IPCHandle()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("cuda transport: %w", err), m.Close())
		}
		m.Handles = append(m.Handles, h[:])
	}
	if !c.noGates && c.dev.HasStreamMemOps() {
		if g, err := c.dev.NewGates(n); err == nil {
			m.gates = g
		} // else: ungated marks, as without stream memory operations
	}
	return m, nil
}

// StartGroups enqueues the groups in order on one copier as one device
// batch, recording marks' event g right after group g's copies, and returns
// once all of it is enqueued (not completed): the caller's Flight.Wait says
// when the bytes are in place. Every group must fit one copier batch
// together (the copier's MaxSegments). The copier stays taken until Wait.
func (c *CUDA) StartGroups(ctx context.Context, groups [][]Desc, marks *Marks) (Flight, error) {
	if marks == nil || marks.Len() != len(groups) {
		return nil, fmt.Errorf("cuda transport: %d groups need as many marks", len(groups))
	}
	slot, err := c.acquire(ctx)
	if err != nil {
		return nil, err
	}
	segs := make([][]cuda.Segment, len(groups))
	var dir cuda.Direction
	for g, batch := range groups {
		var d cuda.Direction
		if d, segs[g], err = c.lower(nil, batch); err != nil {
			c.copiers <- slot
			return nil, err
		}
		if len(batch) > 0 {
			dir = d
		}
	}
	p, err := slot.cp.StartGroups(dir, c.host, segs, marks.Events)
	if err != nil {
		c.copiers <- slot
		return nil, fmt.Errorf("cuda %s of %d groups: %w", dir, len(groups), err)
	}
	c.started(p)
	return &cudaFlight{c: c, slot: slot, p: p, start: time.Now()}, nil
}

type cudaFlight struct {
	c     *CUDA
	slot  *copierSlot
	p     *cuda.Pending
	start time.Time
	done  bool
}

// Wait waits for the batch; after ctx ends it still waits (bounded) for the
// device, as CopyGroups does, and returns the copier to the pool unless the
// copy never finished. Not safe for concurrent use.
func (f *cudaFlight) Wait(ctx context.Context) error {
	if f.done {
		return nil
	}
	err := f.c.wait(ctx, f.p)
	if errors.Is(err, ErrStuck) {
		f.done = true
		return err
	}
	if err == nil || ctx.Err() != nil {
		f.done = true
		f.c.copyNanos.Add(int64(time.Since(f.start)))
		f.c.copiers <- f.slot
	}
	return err
}
