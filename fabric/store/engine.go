package store

import (
	"context"
	"fmt"
	"sync"

	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/transfer"
)

// Engine is what the store needs of an engine session for its saves and
// loads: the layout, the page size, the KV buffers and their geometry, and
// for CUDA sessions the device transport and the layer events. The engine
// API fills one per session (fabric/engineapi) before the session's first
// operation and leaves it unchanged afterwards.
type Engine struct {
	Layout    pagekey.Layout
	FP        pagekey.Fingerprint // Layout's fingerprint
	PageBytes uint64              // bytes of one page of this layout
	Geom      transfer.Geometry
	Bufs      []*transfer.Region
	GPU       DeviceCopier    // CUDA sessions: the device's transport (gpu.go); nil otherwise
	Marks     *transfer.Marks // CUDA sessions: one interprocess event per layer (layerwise.go)
	Stage     *HBMStage       // CUDA sessions: their GPU's HBM stage (hbmstage.go); nil without one

	turnOnce sync.Once
	turn     chan struct{} // one layer-wise load enqueuing at a time (layerwise.go)
}

// lwLock takes the session's layer-wise turn, or fails when ctx ends first.
func (e *Engine) lwLock(ctx context.Context) (release func(), err error) {
	e.turnOnce.Do(func() { e.turn = make(chan struct{}, 1) })
	select {
	case e.turn <- struct{}{}:
		return func() { <-e.turn }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the session's previous layer-wise load to be enqueued: %w", ctx.Err())
	}
}
