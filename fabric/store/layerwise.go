package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/orbitkv/orbitkv/transfer"
)

// Layer-wise loads (CUDA sessions). At OpenSession the peer creates one
// interprocess CUDA event per layer and returns their handles. A layer-wise
// Load plans its pages layer-major (every page's layer-0 K and V, then layer
// 1, …), enqueues them as one device batch that records event l right after
// layer l, and lets the Load RPC return as soon as that is enqueued: the
// engine makes its compute stream wait on event l before layer l's
// attention, so the restore overlaps the forward instead of preceding it.
// Page results, pins and DRAM slots work as for every load: pins and slots
// are held until the device copy completes, and Wait reports the pages.
//
// Concurrency: one layer-wise load per session is being planned and
// enqueued at a time (the session's lwTurn); a second one waits, bounded by
// its deadline, until the first is enqueued. The events are reused by every
// load of the session, so the engine must have enqueued its waits on one
// load's events before it starts the next (cudaStreamWaitEvent captures the
// event's latest record at the time of the call). Layer-wise loads are not
// split into chunks: all pages are one device batch (at most the copier's
// descriptor limit, 65,536 by default; more fails every page of the load).
//
// Gated loads (the default where the driver has stream memory operations,
// --cuda-layer-gates): after planning, the peer arms the session's events
// behind per-layer gates (transfer.CUDA.OpenGates: a few dozen small device
// operations) and answers the Load; then, still holding the session's
// turn, it enqueues the copies on the copy engines, each layer's copies
// opening that layer's gate. If anything fails after the answer, every gate
// is opened from the host and the pages are reported failed through Wait,
// so the engine's stream never hangs; the engine must then not use the
// layers' KV (its Wait says so).

// The phases of a layer-wise load before it answers (the enqueue
// histogram's phase label; "total" is their sum).
const (
	layerTurn = iota
	layerPin
	layerGates
	layerPlan
	layerStart
)

var layerPhaseNames = [...]string{"turn", "pin", "gates", "plan", "start"}

// LoadLayerwise is a layer-wise load; enqueued is called exactly once, when
// the device batch is enqueued or the load ended without one.
func (s *Store) LoadLayerwise(ctx context.Context, sess *Engine, reqs []PageReq, res []Result, enqueued func()) {
	clk := newClock(func(p int, d time.Duration) { s.m.enqueueSec.WithLabelValues(layerPhaseNames[p]).Observe(d.Seconds()) })
	release, err := sess.lwLock(ctx)
	if err != nil {
		enqueued()
		failPending(res, err)
		return
	}
	clk.lap(layerTurn)
	held, answered := true, false
	answer := func() {
		if !answered {
			answered = true
			enqueued()
		}
	}
	unlock := func() {
		if held {
			held = false
			release()
		}
		answer()
	}
	defer unlock()
	fetched := s.fetchRemote(ctx, sess, reqs, res)
	items := s.pinForLoad(sess, reqs, res, fetched)
	var stuck []*loadItem // set when the copy got stuck: the device may still read their slots
	defer func() { s.releaseLoads(items, stuck) }()
	s.readFromSSD(ctx, sess, items, res)
	clk.lap(layerPin)
	if !anyPending(items, res) {
		return
	}
	buf := getDescs(len(items) * descsPerPage(sess))
	defer putDescs(buf)
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	var f transfer.Flight
	var groups [][]transfer.Desc
	var moving []*loadItem
	gate, err := sess.GPU.OpenGates(sess.Marks)
	switch {
	case err != nil:
		failPending(res, fmt.Errorf("layer-wise load: %w", err))
		return
	case gate != nil:
		// Gated: the layer events are armed behind gates, so the Load
		// answers now, and the copies are planned and enqueued after it
		// (the engine's forward starts meanwhile); the session's turn is
		// held until they are, so loads open gates in order.
		clk.lap(layerGates)
		answer()
		groups, moving, err = s.planLayers(sess, items, res, buf)
		clk.lap(layerPlan)
		if err == nil && len(moving) > 0 {
			f, err = sess.GPU.StartGated(ctx, groups, gate)
		}
		if err != nil || len(moving) == 0 {
			gate.Release() // StartGated released it on error; idempotent
		}
		if len(moving) == 0 {
			return
		}
	default:
		groups, moving, err = s.planLayers(sess, items, res, buf)
		clk.lap(layerPlan)
		if len(moving) == 0 {
			return
		}
		if err == nil {
			f, err = sess.GPU.StartGroups(ctx, groups, sess.Marks)
		}
	}
	unlock()
	clk.lap(layerStart)
	s.m.enqueueSec.WithLabelValues("total").Observe(clk.total().Seconds())
	if err == nil {
		err = f.Wait(ctx)
		s.m.deviceSec.Observe(time.Since(clk.last).Seconds())
	}
	if err != nil && gate != nil {
		gate.Release() // never leave the engine's stream behind a closed gate
	}
	if errors.Is(err, transfer.ErrStuck) {
		stuck = moving
	}
	if err != nil {
		for _, it := range moving {
			res[it.i] = FailResult(fmt.Errorf("layer-wise scatter over cuda: %w", err))
		}
		return
	}
	for _, it := range moving {
		s.m.loadedPages.WithLabelValues(it.from.String()).Inc()
		res[it.i] = okResult(it.from)
	}
	s.m.loadedTokens.Add(float64(loadedTokens(sess, moving)))
	s.touchTailFirst(reqs)
}

// anyPending reports whether some item still needs copying.
func anyPending(items []*loadItem, res []Result) bool {
	for _, it := range items {
		if res[it.i].Code == CodePending {
			return true
		}
	}
	return false
}

// planLayers plans the pending items layer-major into *buf: group l holds
// layer l's K and V segments of every page, in page order.
func (s *Store) planLayers(sess *Engine, items []*loadItem, res []Result, buf *[]transfer.Desc) ([][]transfer.Desc, []*loadItem, error) {
	moving := make([]*loadItem, 0, len(items))
	for _, it := range items {
		if res[it.i].Code != CodePending {
			continue
		}
		if err := sess.Geom.CheckBlocks(it.req.Blocks); err != nil {
			res[it.i] = FailResult(err)
			continue
		}
		moving = append(moving, it)
	}
	layers := len(sess.Geom.Segments) / 2
	groups := make([][]transfer.Desc, layers)
	starts := make([]int, layers)
	for l := range layers {
		starts[l] = len(*buf)
		for j, it := range moving {
			err := appendPlan(buf, j == 0, func(dst []transfer.Desc) ([]transfer.Desc, error) {
				return sess.Geom.ScatterSegments(dst, sess.Bufs, it.req.Blocks, s.dramR, s.pool.Offset(it.slot), 2*l, 2*l+2)
			})
			if err != nil {
				return nil, moving, fmt.Errorf("plan layer %d: %w", l, err)
			}
		}
	}
	for l := range layers {
		hi := len(*buf)
		if l+1 < layers {
			hi = starts[l+1]
		}
		groups[l] = (*buf)[starts[l]:hi]
	}
	return groups, moving, nil
}

// failPending fails every page still pending.
func failPending(res []Result, err error) {
	for i := range res {
		if res[i].Code == CodePending {
			res[i] = FailResult(err)
		}
	}
}
