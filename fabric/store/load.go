package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/tiers/ssd"
	"github.com/orbitkv/orbitkv/transfer"
)

// loadItem tracks one page through a load.
type loadItem struct {
	i      int
	req    PageReq
	entry  catalog.Entry
	slot   dram.Slot
	tier   catalog.Tier // where the bytes are read from here
	from   catalog.Tier // where they came from for this load: tier, or TierRemote when fetched for it
	pinned *pinRef      // the pin this load holds
	owned  bool         // slot is a promotion buffer this load allocated
}

// pinRef remembers which LRU a pin was taken in, so it is released there.
type pinRef struct{ ssd bool }

// Load copies pages from the tiers into the session's buffers: DRAM pages
// directly, SSD pages through a DRAM slot (read, verified, promoted), all
// SSD reads of the request in one batch.
// It works in chunks (chunkPages) so a request larger than the DRAM pool
// still goes through.
func (s *Store) Load(ctx context.Context, sess *Engine, reqs []PageReq, res []Result) {
	chunk := s.chunkPages(sess)
	for lo := 0; lo < len(reqs); lo += chunk {
		hi := min(lo+chunk, len(reqs))
		s.loadChunk(ctx, sess, reqs[lo:hi], res[lo:hi])
	}
	s.touchTailFirst(reqs)
}

func (s *Store) loadChunk(ctx context.Context, sess *Engine, reqs []PageReq, res []Result) {
	var clk *clock
	if sess.GPU != nil {
		clk = s.phases.start(gpuLoad)
	}
	fetched := s.fetchRemote(ctx, sess, reqs, res)
	items := s.pinForLoad(sess, reqs, res, fetched)
	s.readFromSSD(ctx, sess, items, res)
	s.corruptForTest(sess, items, res)
	if sess.GPU != nil {
		clk.lap(phasePin)
		stuck := s.scatterGPU(ctx, sess, items, res, clk) // one device copy (gpu.go)
		s.releaseLoads(items, stuck)
		clk.lap(phaseFinish)
		return
	}
	parallel(len(items), func(j int) {
		it := items[j]
		if res[it.i].Code != CodePending {
			return
		}
		if err := s.scatter(ctx, sess, it); err != nil {
			res[it.i] = FailResult(err)
			return
		}
		res[it.i] = okResult(it.from)
	})
	s.unpinLoads(items)
}

// pinForLoad resolves every page still pending and pins it where it is.
// A page fetched for this load (fetched[i]) reports TierRemote as its source.
func (s *Store) pinForLoad(sess *Engine, reqs []PageReq, res []Result, fetched []bool) []*loadItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	items := make([]*loadItem, 0, len(reqs))
	for i := len(reqs) - 1; i >= 0; i-- { // tail first: see commitSaves
		r := reqs[i]
		if res[i].Code != CodePending {
			continue // failed already (a remote fetch)
		}
		e, ok := s.cat.Get(r.Key)
		switch {
		case !ok:
			res[i] = notFound("page %s", r.Key)
			continue
		case e.Layout != sess.FP || e.Size != sess.PageBytes:
			res[i] = notFound("page %s has another layout (%d bytes)", r.Key, e.Size)
			continue
		}
		it := &loadItem{i: i, req: r, entry: e, tier: e.Tier(), from: e.Tier()}
		if fetched != nil && fetched[i] {
			it.from = catalog.TierRemote
		}
		s.pinItemLocked(it)
		items = append(items, it)
	}
	slices.Reverse(items)
	return items
}

// pinItemLocked pins and touches an item's page in the LRU of the tier it
// is read from; s.mu is held.
func (s *Store) pinItemLocked(it *loadItem) {
	k, e := it.req.Key, it.entry
	if e.DRAMSlot >= 0 {
		s.mu.dram.Pin(k)
		s.mu.dram.Promote(k) // restored: used again (tiers.LRU's protected segment)
		it.slot, it.pinned = dram.Slot(e.DRAMSlot), &pinRef{}
		return
	}
	s.mu.ssd.Pin(k)
	s.mu.ssd.Touch(k)
	it.pinned = &pinRef{ssd: true}
}

// readFromSSD reads the SSD-resident items into fresh DRAM slots, verifying
// each page, and promotes the good ones. A corrupt page leaves the catalog.
func (s *Store) readFromSSD(ctx context.Context, sess *Engine, items []*loadItem, res []Result) {
	var reads []ssd.ReadReq
	var pending []*loadItem
	for _, it := range items {
		if it.tier != catalog.TierSSD {
			continue
		}
		slot, err := s.allocDRAM(ctx, it.entry.Size)
		if err != nil {
			res[it.i] = FailResult(fmt.Errorf("dram slot for ssd read: %w", err))
			continue
		}
		it.slot, it.owned = slot, true
		reads = append(reads, ssd.ReadReq{Loc: ssdLoc(it.entry.SSD), Want: header(it.entry), Dst: s.pool.Bytes(slot)})
		pending = append(pending, it)
	}
	if len(reads) == 0 {
		return
	}
	s.m.inflight.Inc()
	start := s.now()
	errs := s.ssd.Read(ctx, reads)
	var got uint64
	for j, it := range pending {
		if errs[j] == nil {
			got += it.entry.Size
		}
	}
	end := s.now()
	s.ssdReads.note(got, end.Sub(start), end)
	s.m.inflight.Dec()
	for j, it := range pending {
		if errs[j] != nil {
			s.failRead(it, errs[j], res)
			continue
		}
		s.promote(it)
	}
}

// failRead fails an item whose SSD read failed. A page that cannot be read
// (an I/O error, a short read: a truncated file) or fails verification is
// dropped from the catalog, so it stops being offered and announced, and
// counted; the engine recomputes it. A read cut short by the caller's
// context or a closing tier leaves the page alone.
func (s *Store) failRead(it *loadItem, err error, res []Result) {
	if s.noteSSDError("read", err) {
		reason := "io_error"
		if isCorrupt(err) {
			reason = "corrupt"
			s.m.corruptPages.Inc()
		}
		s.dropUnreadable(it)
		s.m.ssdDropped.WithLabelValues(reason).Inc()
	}
	res[it.i] = FailResult(fmt.Errorf("ssd read: %w", err))
	s.freeDRAM(it.slot)
	it.owned = false
}

// dropUnreadable removes a page whose SSD copy failed to read or verify.
func (s *Store) dropUnreadable(it *loadItem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.cat.Get(it.req.Key)
	if !ok || e.Generation != it.entry.Generation || !e.OnSSD || e.SSD != it.entry.SSD {
		return // someone else already moved or dropped the copy we read
	}
	if e.DRAMSlot >= 0 {
		// A concurrent load promoted a verified copy: keep it, drop the SSD one.
		if _, _, err := s.cat.Update(e.Key, func(c *catalog.Entry) bool { c.OnSSD, c.SSD, c.Demoted = false, catalog.SSDLoc{}, false; return true }); err != nil {
			return
		}
	} else if err := s.cat.Delete(e.Key); err != nil {
		return
	}
	if !s.mu.ssd.Pinned(e.Key) {
		// A pinned node stays (its holders unpin it later); with no SSD copy
		// behind it, eviction drops it as a stale key.
		s.mu.ssd.Remove(e.Key)
	}
	s.ssd.Free(ssdLoc(e.SSD))
}

// promote records a verified SSD read as the page's DRAM copy, unless
// another load promoted it first (then ours stays private to this load).
func (s *Store) promote(it *loadItem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.cat.Get(it.req.Key)
	if !ok || e.DRAMSlot >= 0 || e.Generation != it.entry.Generation {
		return
	}
	_, ok, err := s.cat.Update(e.Key, func(c *catalog.Entry) bool { c.DRAMSlot = int64(it.slot); return true })
	if !ok || err != nil {
		return
	}
	s.mu.dram.Promote(e.Key)
	s.mu.dram.Pin(e.Key)
	s.mu.ssd.Unpin(e.Key)
	it.pinned, it.owned = &pinRef{}, false
	s.m.promotedPages.Inc()
}

// scatter copies one page blob from its DRAM slot into the engine blocks.
func (s *Store) scatter(ctx context.Context, sess *Engine, it *loadItem) error {
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	s.copying.Add(1)
	defer s.copying.Add(-1)
	descs, err := sess.Geom.Scatter(nil, sess.Bufs, it.req.Blocks, s.dramR, s.pool.Offset(it.slot))
	if err != nil {
		return err
	}
	if err := s.local.Copy(ctx, descs); err != nil {
		s.noteCopyFault(err)
		return fmt.Errorf("scatter page: %w", err)
	}
	s.m.loadedPages.WithLabelValues(it.from.String()).Inc()
	s.m.loadedTokens.Add(float64(loadedTokens(sess, []*loadItem{it})))
	return nil
}

// noteCopyFault counts a copy that faulted in an engine's buffer (its file
// shrank while the copy ran, past the operation's checkBuffers); the
// session's next operation is refused, and logged, by that check.
func (s *Store) noteCopyFault(err error) {
	var fe *transfer.FaultError
	if errors.As(err, &fe) {
		s.m.engineFaults.Inc()
	}
}

// unpinLoads releases the pins and private slots of a finished load.
func (s *Store) unpinLoads(items []*loadItem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range items {
		if it.pinned != nil {
			if it.pinned.ssd {
				s.mu.ssd.Unpin(it.req.Key)
			} else {
				s.unpinDRAMLocked(it.req.Key)
			}
		}
		if it.owned {
			s.pool.Free(it.slot)
		}
	}
}

// loadedTokens counts the tokens a load wrote into the engine: the blocks
// it copied, skipped ones (already computed by the engine) excluded.
func loadedTokens(sess *Engine, items []*loadItem) int {
	blockTokens := int(sess.Layout.PageTokens) / sess.Geom.BlocksPerPage
	n := 0
	for _, it := range items {
		for _, b := range it.req.Blocks {
			if b != transfer.SkipBlock {
				n += blockTokens
			}
		}
	}
	return n
}

// corruptForTest flips the bit in the first pending page of items when
// this load is the Nth.
func (s *Store) corruptForTest(sess *Engine, items []*loadItem, res []Result) {
	if s.corrupt.every == 0 || s.corrupt.loads.Add(1)%s.corrupt.every != 0 {
		return
	}
	for _, it := range items {
		if res[it.i].Code != CodePending {
			continue
		}
		b := s.pool.Bytes(it.slot)
		elem, ok := pagekey.DTypeBytes(sess.Layout.DType)
		if !ok {
			elem = 2
		}
		if i := int(elem) - 1; i < len(b) {
			b[i] ^= 0x40
			s.corrupt.done.Add(1)
		}
		return
	}
}

// TestCorruptedPages is how many pages the test-only hook corrupted.
func (s *Store) TestCorruptedPages() int64 { return s.corrupt.done.Load() }

// CUDA loads from the HBM stages (hbmstage.go).

// stagedLoad is a load's pages found in one stage, pinned there.
type stagedLoad struct {
	st    *HBMStage
	items []*loadItem
	slots []int
}

// pinStaged finds, in every stage, the DRAM pages of a load whose staged
// copy has the generation the load pinned, and pins those slots.
func (s *Store) pinStaged(sess *Engine, items []*loadItem) []stagedLoad {
	var out []stagedLoad
	taken := make(map[*loadItem]bool)
	for _, st := range s.hbmStages() {
		l := stagedLoad{st: st}
		for _, it := range items {
			if taken[it] || it.tier != catalog.TierDRAM {
				continue
			}
			if j, ok := st.pin(it.req.Key, it.entry.Generation, sess.PageBytes); ok {
				taken[it] = true
				l.items, l.slots = append(l.items, it), append(l.slots, j)
			}
		}
		if len(l.items) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// unpin releases a staged load's slots; after a stuck copy they stay
// pinned for good (the device may still read them).
func (l stagedLoad) unpin(stuck bool) {
	if !stuck {
		l.st.unpin(l.slots)
	}
}

// loadStaged copies the load's pages that a stage holds straight from HBM
// into the session's blocks, one device copy per stage, and returns the
// items still to load from DRAM: those no stage holds, and those of a stage
// whose copy failed. Items of a copy that got stuck fail (their blocks may
// still be written) and are not returned.
func (s *Store) loadStaged(ctx context.Context, sess *Engine, items []*loadItem, res []Result) []*loadItem {
	if len(s.hbmStages()) == 0 {
		return items
	}
	done := make(map[*loadItem]bool)
	var loaded []*loadItem
	for _, l := range s.pinStaged(sess, items) {
		err := s.copyStaged(ctx, sess, l)
		stuck := errors.Is(err, transfer.ErrStuck)
		l.unpin(stuck)
		switch {
		case err == nil:
			for _, it := range l.items {
				res[it.i] = okResult(it.tier)
				done[it] = true
			}
			loaded = append(loaded, l.items...)
			s.m.loadedPages.WithLabelValues("hbm").Add(float64(len(l.items)))
		case stuck:
			for _, it := range l.items {
				res[it.i] = FailResult(fmt.Errorf("load from the hbm stage of device %d: %w", l.st.Ordinal, err))
				done[it] = true
			}
		default:
			s.log.Debug().Err(err).Int("device", l.st.Ordinal).Int("pages", len(l.items)).Msg("hbm stage: load failed; loading from dram")
		}
	}
	if len(done) == 0 {
		return items
	}
	s.m.loadedTokens.Add(float64(loadedTokens(sess, loaded)))
	rest := items[:0:0]
	for _, it := range items {
		if !done[it] {
			rest = append(rest, it)
		}
	}
	return rest
}

// copyStaged plans a staged load's pages out of its stage's slots into the
// session's blocks and copies them as one device copy.
func (s *Store) copyStaged(ctx context.Context, sess *Engine, l stagedLoad) error {
	var descs []transfer.Desc
	var err error
	for k, it := range l.items {
		if descs, err = sess.Geom.Scatter(descs, sess.Bufs, it.req.Blocks, l.st.region, l.st.offsetOf(l.slots[k])); err != nil {
			return fmt.Errorf("plan a load from the hbm stage: %w", err)
		}
	}
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	return sess.GPU.CopyFrom(ctx, l.st.src, descs)
}
