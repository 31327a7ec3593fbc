package store

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/crc32c"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/transfer"
)

// DeviceCopier is what a CUDA session's saves and loads need of the
// device's transport: *transfer.CUDA, or a fake where the CPU side is
// measured without a GPU.
type DeviceCopier interface {
	// CopyFrom copies device-to-device descriptors from src's GPU into this
	// one (hbmstage.go); PeerDevice names this transport's GPU to another.
	CopyFrom(ctx context.Context, src transfer.PeerSource, batch []transfer.Desc) error
	transfer.PeerSource
	Copy(ctx context.Context, batch []transfer.Desc) error
	// Begin starts a copy fed page by page (whole-request loads and DRAM
	// saves): planning overlaps the copy (transfer's stream.go).
	Begin(ctx context.Context) (transfer.CopyStream, error)
	CopyGroups(ctx context.Context, groups [][]transfer.Desc, done func(g int)) error
	// NewMarks and StartGroups serve layer-wise loads (layerwise.go).
	NewMarks(n int) (*transfer.Marks, error)
	StartGroups(ctx context.Context, groups [][]transfer.Desc, marks *transfer.Marks) (transfer.Flight, error)
	// OpenGates and StartGated serve gated layer-wise loads (transfer's
	// gates.go): OpenGates returns nil, nil where the marks have no gates.
	OpenGates(marks *transfer.Marks) (transfer.Gate, error)
	StartGated(ctx context.Context, groups [][]transfer.Desc, gate transfer.Gate) (transfer.Flight, error)
}

// saveGroupBytes is how many page bytes a save that must reach SSD copies
// before checksumming them while the next group copies (the D2H and the CRC
// overlap). A save into DRAM only is one group: its pages are sealed later.
const saveGroupBytes = 64 << 20

// descBufs recycles the descriptor lists of device batches: an 8K-token
// operation plans 9,216 descriptors (36,864 with 16-token blocks), and
// growing a fresh list each time cost more CPU than planning it (GC,
// write barriers), all of it before the copy starts.
var descBufs sync.Pool

func getDescs(n int) *[]transfer.Desc {
	if p, ok := descBufs.Get().(*[]transfer.Desc); ok && cap(*p) >= n {
		return p
	}
	d := make([]transfer.Desc, 0, n)
	return &d
}

func putDescs(p *[]transfer.Desc) {
	clear((*p)[:cap(*p)]) // drop the region pointers
	*p = (*p)[:0]
	descBufs.Put(p)
}

// appendPlan appends one page's descriptors, planned by plan onto the list
// it is given, to *buf. fresh starts a run that does not merge into the
// descriptor before it (a group boundary). On error *buf is unchanged.
func appendPlan(buf *[]transfer.Desc, fresh bool, plan func([]transfer.Desc) ([]transfer.Desc, error)) error {
	n := len(*buf)
	at := (*buf)[n:]
	var last transfer.Desc
	if !fresh && n > 0 {
		at, last = *buf, (*buf)[n-1] // plan may extend the last descriptor
	}
	d, err := plan(at)
	switch {
	case err != nil:
		if !fresh && n > 0 {
			(*buf)[n-1] = last
		}
		return err
	case !fresh:
		*buf = d
	case len(d) > 0 && n+len(d) <= cap(*buf) && &(*buf)[:n+1][n] == &d[0]:
		*buf = (*buf)[:n+len(d)] // planned in place
	default:
		*buf = append((*buf)[:n], d...)
	}
	return nil
}

// descsPerPage is how many descriptors a page plans at most.
func descsPerPage(sess *Engine) int { return len(sess.Geom.Segments) * sess.Geom.BlocksPerPage }

// saveGPU is save for a CUDA session: gather on the device, then the same
// write-through and catalog commit as every save.
func (s *Store) saveGPU(ctx context.Context, sess *Engine, reqs []PageReq, toSSD bool, res []Result) {
	clk := s.phases.start(gpuSave)
	items := s.allocSaves(ctx, sess, reqs, toSSD, res)
	clk.lap(phasePin)
	stage := s.startStage(ctx, sess, reqs, items) // beside the DRAM copy (save.go)
	items = s.gatherGPU(ctx, sess, reqs, items, toSSD, res, clk)
	if toSSD && len(items) > 0 {
		items = s.writeThrough(ctx, items, res)
	}
	s.commitSaves(items, res)
	s.finishStage(stage, items, res) // waits for the stage copy: in the finish phase
	clk.lap(phaseFinish)
}

// gatherGPU copies every page of a save out of the GPU into fresh DRAM
// slots. A save into DRAM is one device copy, fed as its pages are planned,
// and leaves the checksum to the sealer (seal.go). A save that must reach
// SSD copies in groups and checksums each group's pages on the host from
// their pinned slots while the next group copies.
func (s *Store) gatherGPU(ctx context.Context, sess *Engine, reqs []PageReq, items []*saveItem, toSSD bool, res []Result, clk *clock) []*saveItem {
	if len(items) == 0 {
		return nil
	}
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	if toSSD {
		return s.gatherSummed(ctx, sess, reqs, items, res, clk)
	}
	// Into DRAM: streamed, sealed later; pages readmitted from SSD are
	// summed while they copy, for the commit to compare (readmit.go).
	plain, readmits := splitReadmits(items)
	var out []*saveItem
	if len(plain) > 0 {
		out = s.gatherStream(ctx, sess, reqs, plain, res, clk)
	}
	if len(readmits) > 0 {
		out = append(out, s.gatherSummed(ctx, sess, reqs, readmits, res, clk)...)
	}
	return out
}

// splitReadmits separates a save's readmitted pages from the others.
func splitReadmits(items []*saveItem) (plain, readmits []*saveItem) {
	for _, it := range items {
		if it.readmit {
			readmits = append(readmits, it)
		} else {
			plain = append(plain, it)
		}
	}
	return plain, readmits
}

// gatherSummed copies pages in groups and checksums each group's pages on
// the host from their pinned slots while the next group copies.
func (s *Store) gatherSummed(ctx context.Context, sess *Engine, reqs []PageReq, items []*saveItem, res []Result, clk *clock) []*saveItem {
	per := max(1, int(saveGroupBytes/sess.PageBytes))
	buf := getDescs(len(items) * descsPerPage(sess))
	defer putDescs(buf)
	var starts []int // where each group's descriptors begin in *buf
	var members [][]*saveItem
	var planned []*saveItem
	for _, it := range items {
		fresh := len(members) == 0 || len(members[len(members)-1]) == per
		n := len(*buf)
		err := appendPlan(buf, fresh, func(dst []transfer.Desc) ([]transfer.Desc, error) {
			return sess.Geom.Gather(dst, sess.Bufs, reqs[it.i].Blocks, s.dramR, s.pool.Offset(it.slot))
		})
		if err != nil {
			res[it.i] = s.saveFailed(it, fmt.Errorf("gather page: %w", err))
			s.freeDRAM(it.slot)
			continue
		}
		if fresh {
			starts, members = append(starts, n), append(members, nil)
		}
		members[len(members)-1] = append(members[len(members)-1], it)
		planned = append(planned, it)
	}
	groups := make([][]transfer.Desc, len(starts))
	for g, lo := range starts {
		hi := len(*buf)
		if g+1 < len(starts) {
			hi = starts[g+1]
		}
		groups[g] = (*buf)[lo:hi]
	}
	clk.lap(phasePlan)
	padded := s.clearPadding(sess, planned)
	copied, err := s.copySums(ctx, sess, groups, members, len(reqs))
	padded()
	clk.lap(phaseCopy)
	stuck := errors.Is(err, transfer.ErrStuck)
	var out []*saveItem
	for _, it := range planned {
		if !copied[it.i] {
			res[it.i] = s.saveFailed(it, fmt.Errorf("gather page over cuda: %w", errors.Join(err, errors.New("page not copied"))))
			s.dropCopySlot(it.slot, stuck, sess.PageBytes)
			continue
		}
		it.entry = s.dramEntry(it.key, sess.FP, sess.PageBytes, it.entry.Checksum, it.slot)
		out = append(out, it)
	}
	return out
}

// gatherStream copies a DRAM save's pages out of the GPU as one device copy
// fed as the pages are planned; their checksums are left to the sealer.
func (s *Store) gatherStream(ctx context.Context, sess *Engine, reqs []PageReq, items []*saveItem, res []Result, clk *clock) []*saveItem {
	padded := s.clearPadding(sess, items)
	planErr, err := s.streamPages(ctx, sess, len(items), func(j int, dst []transfer.Desc) ([]transfer.Desc, error) {
		it := items[j]
		return sess.Geom.Gather(dst, sess.Bufs, reqs[it.i].Blocks, s.dramR, s.pool.Offset(it.slot))
	}, clk)
	padded()
	clk.lap(phaseCopy)
	stuck := errors.Is(err, transfer.ErrStuck)
	out := items[:0]
	for j, it := range items {
		switch {
		case planErr[j] != nil: // never handed to the device
			res[it.i] = s.saveFailed(it, fmt.Errorf("gather page: %w", planErr[j]))
			s.freeDRAM(it.slot)
		case err != nil:
			res[it.i] = s.saveFailed(it, fmt.Errorf("gather page over cuda: %w", err))
			s.dropCopySlot(it.slot, stuck, sess.PageBytes)
		default:
			it.entry = s.dramEntry(it.key, sess.FP, sess.PageBytes, 0, it.slot)
			it.unsealed = true
			out = append(out, it)
		}
	}
	return out
}

// dropCopySlot gives back the DRAM slot of a page a failed device copy
// did not bring: freed, or when the copy got stuck (the device may still
// write it) quarantined.
func (s *Store) dropCopySlot(slot dram.Slot, stuck bool, pageBytes uint64) {
	if stuck {
		s.quarantineSlot(pageBytes)
		return
	}
	s.freeDRAM(slot)
}

// clearPadding zeroes the slot padding of the items' DRAM slots (O_DIRECT
// writes it too) on another goroutine while the device copies; the
// function it returns waits for that.
func (s *Store) clearPadding(sess *Engine, items []*saveItem) func() {
	var pad sync.WaitGroup
	if dram.SlotBytes(sess.PageBytes) > sess.PageBytes {
		pad.Go(func() {
			for _, it := range items {
				clear(s.pool.Bytes(it.slot)[sess.PageBytes:])
			}
		})
	}
	return pad.Wait
}

// allocSaves takes a fresh DRAM slot for every page not stored already
// (admitSave, as every save does).
func (s *Store) allocSaves(ctx context.Context, sess *Engine, reqs []PageReq, toSSD bool, res []Result) []*saveItem {
	items := make([]*saveItem, 0, len(reqs))
	for i, r := range reqs {
		if it := s.admitSave(ctx, sess, i, r, toSSD, res); it != nil {
			items = append(items, it)
		}
	}
	return items
}

// copySums runs an SSD-bound save's device copy in groups and reports which
// pages landed, with their checksums in entry.Checksum, each group summed
// while the next copies.
func (s *Store) copySums(ctx context.Context, sess *Engine, groups [][]transfer.Desc, members [][]*saveItem, n int) ([]bool, error) {
	copied := make([]bool, n) // by request index
	s.copying.Add(1)          // the sealer waits (seal.go)
	defer s.copying.Add(-1)
	err := sess.GPU.CopyGroups(ctx, groups, func(g int) { // on this goroutine
		parallel(len(members[g]), func(j int) {
			it := members[g][j]
			it.entry.Checksum = crc32c.Checksum(s.pool.Bytes(it.slot)[:sess.PageBytes])
		})
		for _, it := range members[g] {
			copied[it.i] = true
		}
	})
	return copied, err
}

// scatterGPU copies every pending page of a load from its DRAM slot into the
// engine's GPU blocks as one device copy, fed as the pages are planned.
// When the copy got stuck (transfer.ErrStuck) it returns the items the
// device may still read: the caller quarantines those instead of unpinning
// them.
func (s *Store) scatterGPU(ctx context.Context, sess *Engine, items []*loadItem, res []Result, clk *clock) (stuck []*loadItem) {
	moving := make([]*loadItem, 0, len(items))
	for _, it := range items {
		if res[it.i].Code == CodePending {
			moving = append(moving, it)
		}
	}
	if rest := s.loadStaged(ctx, sess, moving, res); len(rest) != len(moving) { // GPU to GPU (hbmstage.go)
		clk.lap(phaseCopy) // the staged pages' plan and device copy
		moving = rest
	}
	if len(moving) == 0 {
		clk.lap(phasePlan)
		return nil
	}
	s.m.inflight.Inc()
	moved, err := s.streamPages(ctx, sess, len(moving), func(j int, dst []transfer.Desc) ([]transfer.Desc, error) {
		it := moving[j]
		return sess.Geom.Scatter(dst, sess.Bufs, it.req.Blocks, s.dramR, s.pool.Offset(it.slot))
	}, clk)
	s.m.inflight.Dec()
	clk.lap(phaseCopy)
	loaded := s.m.loadedPages.WithLabelValues(catalog.TierDRAM.String())
	var done []*loadItem
	for j, it := range moving {
		switch {
		case moved[j] != nil:
			res[it.i] = FailResult(moved[j])
			continue
		case err != nil:
			res[it.i] = FailResult(fmt.Errorf("scatter page over cuda: %w", err))
			continue
		case it.from == catalog.TierDRAM:
			loaded.Inc()
		default:
			s.m.loadedPages.WithLabelValues(it.from.String()).Inc()
		}
		res[it.i] = okResult(it.from)
		done = append(done, it)
	}
	s.m.loadedTokens.Add(float64(loadedTokens(sess, done)))
	if errors.Is(err, transfer.ErrStuck) {
		return moving
	}
	return nil
}

// quarantineSlot keeps a DRAM slot that a stuck device copy may still
// write out of use for the life of the process: it is never freed, so no
// page can be stored in it, and the bytes are counted.
func (s *Store) quarantineSlot(pageBytes uint64) {
	s.m.quarantined.Add(float64(dram.SlotBytes(pageBytes)))
}

// releaseLoads is unpinLoads for a load whose device copy got stuck: the
// pages the copy named (stuck) stay pinned (never evicted, their slots never
// reused while the device may still read them) and their private promotion
// slots stay allocated; every other item is released as usual.
func (s *Store) releaseLoads(items, stuck []*loadItem) {
	held := make(map[*loadItem]bool, len(stuck))
	for _, it := range stuck {
		held[it] = true
		s.quarantineSlot(it.entry.Size) // a DRAM slot: pinned or promoted
	}
	rest := make([]*loadItem, 0, len(items)-len(stuck))
	for _, it := range items {
		if !held[it] {
			rest = append(rest, it)
		}
	}
	s.unpinLoads(rest)
}

// streamPages plans n pages with plan and copies them as one device copy
// fed in parts, the first part as soon as it is planned (a few pages), so
// the device copies while the rest is planned. It returns each page's
// planning error (those pages were not copied) and the copy's error (then
// no planned page is known to be in place).
func (s *Store) streamPages(ctx context.Context, sess *Engine, n int, plan func(j int, dst []transfer.Desc) ([]transfer.Desc, error), clk *clock) ([]error, error) {
	planErr := make([]error, n)
	st, err := sess.GPU.Begin(ctx)
	if err != nil {
		clk.lap(phasePlan)
		return planErr, err
	}
	buf := getDescs(streamPartPages * descsPerPage(sess))
	defer putDescs(buf)
	part := 2 // pages in the first part; doubling to streamPartPages
	inPart := 0
	copying := false // the sealer waits while the device copies (seal.go)
	defer func() {
		if copying {
			s.copying.Add(-1)
		}
	}()
	for j := 0; j < n && err == nil; j++ {
		if err = ctx.Err(); err != nil {
			break // past the deadline: plan no more; Finish waits for what was enqueued
		}
		if e := appendPlan(buf, false, func(dst []transfer.Desc) ([]transfer.Desc, error) { return plan(j, dst) }); e != nil {
			planErr[j] = e
		} else {
			inPart++
		}
		if inPart == part || (j == n-1 && len(*buf) > 0) {
			if !copying {
				copying = true
				s.copying.Add(1)
			}
			err = st.Add(*buf)
			*buf, inPart, part = (*buf)[:0], 0, min(2*part, streamPartPages)
		}
	}
	clk.lap(phasePlan)
	return planErr, errors.Join(err, st.Finish(ctx))
}

// streamPartPages is the most pages one part of a streamed copy holds: big
// enough that enqueueing a part costs little beside copying it (16 pages of
// Qwen3-8B: 150 MB, 2.7 ms on PCIe gen5), small enough that the first
// parts start the copy early.
const streamPartPages = 16

// The HBM stages, sources of CUDA loads (save.go fills them, load.go reads them).

// AddHBMStage makes a device's stage a source for loads from every CUDA
// session (sessions on its device fill it: Engine.Stage).
func (s *Store) AddHBMStage(st *HBMStage) {
	s.stagesMu.Lock()
	defer s.stagesMu.Unlock()
	s.stages = append(s.stages, st)
}

func (s *Store) hbmStages() []*HBMStage {
	s.stagesMu.Lock()
	defer s.stagesMu.Unlock()
	return s.stages
}
