package store

import (
	"context"
	"fmt"
	"slices"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/tiers/ssd"
	"github.com/orbitkv/orbitkv/transfer"
)

// PageReq is one page of a Save or Load: its key and engine blocks.
type PageReq struct {
	Key    pagekey.Key
	Blocks []uint32
}

// saveItem tracks one page through a save.
type saveItem struct {
	i     int
	key   pagekey.Key
	slot  dram.Slot
	entry catalog.Entry
	loc   ssd.Loc
	// replaces is the DRAM slot of the DRAM-only copy another save left,
	// which our durable copy replaces (-1: none); see commitSaves.
	replaces int64
	// unsealed: the checksum is not computed yet (seal.go).
	unsealed bool
	// readmit: the page is held only on SSD, as prior; this save takes the
	// engine's bytes back into DRAM (readmit.go).
	readmit bool
	prior   catalog.Entry
}

// Save copies pages out of the session's buffers into DRAM (and, with
// toSSD, durably onto SSD) and records them in the catalog. It works in
// chunks: each chunk is committed (and so becomes evictable) before the next
// is gathered, so a request larger than the DRAM pool still goes through.
// res receives one result per page.
func (s *Store) Save(ctx context.Context, sess *Engine, reqs []PageReq, toSSD bool, res []Result) {
	chunk := s.chunkPages(sess)
	for lo := 0; lo < len(reqs); lo += chunk {
		hi := min(lo+chunk, len(reqs))
		if sess.GPU != nil {
			s.saveGPU(ctx, sess, reqs[lo:hi], toSSD, res[lo:hi]) // one device copy, fed as planned (gpu.go)
		} else {
			s.saveChunkOf(ctx, sess, reqs[lo:hi], toSSD, res[lo:hi])
		}
		// Everything saved so far, tail first: a later chunk that must evict
		// takes other prefixes' pages, then this one's tail, never its head.
		s.touchTailFirst(reqs[:hi])
	}
}

// touchTailFirst marks a request's pages used, last page first, so within a
// prefix the tail is the least recently used: eviction trims prefixes from
// the end and never strands a stored tail behind an evicted head.
func (s *Store) touchTailFirst(reqs []PageReq) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(reqs) - 1; i >= 0; i-- {
		k := reqs[i].Key
		if s.mu.dram.Contains(k) {
			s.mu.dram.Touch(k)
		}
		if s.mu.ssd.Contains(k) {
			s.mu.ssd.Touch(k)
		}
	}
}

// chunkPages is how many pages one save or load of sess commits at a
// time: a quarter of the DRAM pool's slots, at least 1, and for a session
// without a GPU at most 16. A CUDA session's chunk is one device batch,
// not capped: every device batch has a fixed cost, and an 8K-token
// restore is 128 pages.
func (s *Store) chunkPages(sess *Engine) int {
	slots := s.pool.Stats().CapacityBytes / dram.SlotBytes(sess.PageBytes)
	if sess.GPU != nil {
		return int(max(1, slots/4))
	}
	return int(max(1, min(16, slots/4)))
}

func (s *Store) saveChunkOf(ctx context.Context, sess *Engine, reqs []PageReq, toSSD bool, res []Result) {
	gathered := make([]*saveItem, len(reqs))
	parallel(len(reqs), func(i int) {
		it := s.admitSave(ctx, sess, i, reqs[i], toSSD, res)
		if it == nil {
			return
		}
		if err := s.gather(ctx, sess, reqs[i], it, toSSD); err != nil {
			res[i] = s.saveFailed(it, err)
			return
		}
		gathered[i] = it
	})
	items := slices.DeleteFunc(gathered, func(it *saveItem) bool { return it == nil })
	if toSSD && len(items) > 0 {
		items = s.writeThrough(ctx, items, res)
	}
	s.commitSaves(items, res)
}

// admitSave is the first step of every save's page i (CPU and CUDA): a
// page stored already for the save's purpose, or a readmission refused, is
// answered at once; any other takes the DRAM slot its bytes are copied
// into (allocSave). nil: res[i] is set, nothing held.
func (s *Store) admitSave(ctx context.Context, sess *Engine, i int, r PageReq, toSSD bool, res []Result) *saveItem {
	e, stored := s.storedFor(r.Key, toSSD)
	if ans, ok := s.storedAnswer(e, stored, toSSD, r.Key, sess.PageBytes); ok {
		res[i] = ans
		return nil
	}
	it := &saveItem{i: i, key: r.Key, readmit: stored, prior: e}
	slot, err := s.allocSave(ctx, sess.PageBytes, toSSD, stored)
	if err != nil {
		res[i] = s.saveFailed(it, fmt.Errorf("dram slot: %w", err))
		return nil
	}
	it.slot = slot
	return it
}

// saveFailed is the result of a page whose save got no copy into DRAM (no
// slot, or the copy failed): the error, or for a readmission the page as
// stored, on SSD (readmitFailed). The caller releases any slot it took.
func (s *Store) saveFailed(it *saveItem, err error) Result {
	if it.readmit {
		return s.readmitFailed(it.prior, err)
	}
	return FailResult(err)
}

// storedFor returns the entry of a page a save names when it is stored
// already for this save's purpose (any copy for a cache fill, an SSD copy
// for a durable save). A durable save acknowledged on an existing SSD copy
// makes that copy durable: it is never replaced (readmit.go).
func (s *Store) storedFor(k pagekey.Key, toSSD bool) (catalog.Entry, bool) {
	e, ok := s.cat.Get(k)
	switch {
	case !ok || (toSSD && !e.OnSSD):
		return catalog.Entry{}, false
	case !toSSD || !e.Demoted:
		// An SSD copy without the mark never gains it (only a demotion of a
		// DRAM-only page sets it): nothing to acknowledge, no lock to take.
		return e, true
	}
	// A demoted copy: look again and clear its mark under the lock, so that
	// no readmission replaces it between the look and the acknowledgement.
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok = s.cat.Get(k); !ok || !e.OnSSD || s.ackDurableLocked(&e) != nil {
		return catalog.Entry{}, false // gone, or not acknowledged on that copy: the save writes its own
	}
	return e, true
}

// gather copies one page into its item's DRAM slot; a save that must reach
// SSD, or a readmission, checksums the page while copying, any other is
// sealed later, off the engine's path (seal.go). On error the slot is freed.
func (s *Store) gather(ctx context.Context, sess *Engine, r PageReq, it *saveItem, toSSD bool) error {
	sum := toSSD || it.readmit
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	s.copying.Add(1)
	defer s.copying.Add(-1)
	descs, err := sess.Geom.Gather(nil, sess.Bufs, r.Blocks, s.dramR, s.pool.Offset(it.slot))
	var crc uint32
	switch {
	case err == nil && sum:
		crc, err = s.local.CopyChecksum(ctx, descs)
	case err == nil:
		err = s.local.Copy(ctx, descs)
	}
	if err != nil {
		s.freeDRAM(it.slot)
		s.noteCopyFault(err)
		return fmt.Errorf("gather page: %w", err)
	}
	buf := s.pool.Bytes(it.slot)
	clear(buf[sess.PageBytes:]) // O_DIRECT writes the padding too
	it.entry, it.unsealed = s.dramEntry(r.Key, sess.FP, sess.PageBytes, crc, it.slot), !sum
	return nil
}

// dramEntry is the catalog entry of a page just copied into a DRAM slot:
// a fresh generation, used now by the store's clock (which fillProtect
// judges it by); crc 0 while its checksum is pending (the sealer's,
// seal.go).
func (s *Store) dramEntry(k pagekey.Key, fp pagekey.Fingerprint, size uint64, crc uint32, slot dram.Slot) catalog.Entry {
	return catalog.Entry{Key: k, Layout: fp, Size: size, Checksum: crc, Generation: s.nextGen(), DRAMSlot: int64(slot), LastAccess: s.now().UnixNano()}
}

// writeThrough makes every item durable on SSD with one batched write; items
// that fail are dropped (slot freed, result set).
func (s *Store) writeThrough(ctx context.Context, items []*saveItem, res []Result) []*saveItem {
	if s.ssd == nil {
		for _, it := range items {
			res[it.i] = Result{Code: CodeNoSpace, Msg: "ssd tier disabled"}
			s.freeDRAM(it.slot)
		}
		return nil
	}
	var reqs []ssd.WriteReq
	var ok []*saveItem
	for _, it := range items {
		loc, err := s.allocSSD(it.entry.Size)
		if err != nil {
			res[it.i] = FailResult(fmt.Errorf("ssd slot: %w", err))
			s.freeDRAM(it.slot)
			continue
		}
		it.loc = loc
		reqs = append(reqs, ssd.WriteReq{Loc: loc, Header: header(it.entry), Data: s.pool.Bytes(it.slot)})
		ok = append(ok, it)
	}
	errs := s.ssd.Write(ctx, reqs)
	kept := ok[:0]
	for j, it := range ok {
		if errs[j] != nil {
			s.noteSSDError("write", errs[j])
			res[it.i] = FailResult(fmt.Errorf("ssd write: %w", errs[j]))
			s.freeSSD(it.loc)
			s.freeDRAM(it.slot)
			continue
		}
		it.entry.OnSSD, it.entry.SSD = true, catLoc(it.loc)
		kept = append(kept, it)
	}
	return kept
}

// commitSaves records the saved pages in the catalog with one commit. A page
// another save stored meanwhile keeps that copy and ours is freed, except
// that a durable copy replaces a DRAM-only one: the entry then names our
// DRAM and SSD copies, our generation and checksum (the SSD header's), so
// every copy it names holds the bytes its checksum covers even when the two
// saves' bytes differ (nondeterministic KV). The replaced DRAM slot is
// retired (retire.go): loads that pinned it finish from it first.
func (s *Store) commitSaves(items []*saveItem, res []Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var entries []catalog.Entry
	var fresh []*saveItem
	committing := make(map[pagekey.Key]bool, len(items))
	for _, it := range s.settleReadmitsLocked(items, res) {
		if s.storesLocked(it, committing, res) {
			entries = append(entries, it.entry)
			fresh = append(fresh, it)
		}
	}
	if err := s.cat.Put(entries...); err != nil {
		for _, it := range fresh {
			res[it.i] = FailResult(fmt.Errorf("catalog: %w", err))
			s.releaseLocked(it)
		}
		return
	}
	s.committedLocked(fresh, res)
}

// storesLocked reports whether the item's entry goes into the commit. If not, its
// result is set and its slots released: the same key earlier in the batch,
// or a copy already stored that ours does not replace (a durable save
// answered on an SSD copy makes that copy durable first). A durable save
// over a DRAM-only copy goes in with it.replaces naming that copy's slot.
func (s *Store) storesLocked(it *saveItem, committing map[pagekey.Key]bool, res []Result) bool {
	it.replaces = -1
	if committing[it.key] { // the same key twice in one batch: keep the first
		res[it.i] = okResult(it.entry.Tier())
		s.releaseLocked(it)
		return false
	}
	committing[it.key] = true
	e, ok := s.cat.Get(it.key)
	if !ok {
		return true
	}
	if !e.OnSSD && it.entry.OnSSD && e.DRAMSlot >= 0 {
		it.replaces = e.DRAMSlot // theirs is in DRAM only; ours is durable
		return true
	}
	if e.OnSSD && it.entry.OnSSD {
		if err := s.ackDurableLocked(&e); err != nil { // a durable save answered on that copy
			res[it.i] = FailResult(fmt.Errorf("catalog: %w", err))
			s.releaseLocked(it)
			return false
		}
	}
	res[it.i] = okResult(e.Tier())
	s.releaseLocked(it)
	return false
}

// committedLocked finishes the pages just committed: their LRU places (tail
// first: within one prefix the last page becomes the oldest, so eviction
// trims prefixes from the end and never strands a tail behind an evicted
// head), results, the DRAM copies they replaced (retired) and the sums
// still to compute.
func (s *Store) committedLocked(fresh []*saveItem, res []Result) {
	for j := len(fresh) - 1; j >= 0; j-- {
		it := fresh[j]
		if it.readmit { // saved anew after it had left DRAM: used again
			s.mu.dram.Promote(it.key)
		} else {
			s.mu.dram.Touch(it.key)
		}
		tier := catalog.TierDRAM
		if it.entry.OnSSD {
			s.mu.ssd.Touch(it.key)
			tier = catalog.TierSSD
		}
		res[it.i] = okResult(tier)
	}
	var unsealed []pagekey.Key
	for _, it := range fresh {
		if it.replaces >= 0 {
			delete(s.mu.unsealed, it.key) // the replaced copy's sum is moot; ours is sealed
			s.retireDRAMLocked(it.key, dram.Slot(it.replaces))
		}
		if it.unsealed {
			unsealed = append(unsealed, it.key)
		}
	}
	s.markUnsealedLocked(unsealed)
	s.m.savedPages.Add(float64(len(fresh)))
}

// settleReadmitsLocked settles a save's readmitted pages against the
// entries they were taken for (readmit.go), with one catalog commit for
// those attached and one for the SSD copies replaced, and returns the items
// left to commit: the others, and readmitted pages to store as fresh ones.
// s.mu is held.
func (s *Store) settleReadmitsLocked(items []*saveItem, res []Result) []*saveItem {
	var rest, attached, replacing []*saveItem
	var entries []catalog.Entry
	var drops []pagekey.Key
	seen := make(map[pagekey.Key]bool)
	for _, it := range items {
		if !it.readmit {
			rest = append(rest, it)
			continue
		}
		if seen[it.key] { // the same page twice in one save: the first decides
			s.keepReadmitLocked(it, it.prior, res)
			continue
		}
		seen[it.key] = true
		cur, ok := s.cat.Get(it.key)
		switch s.readmitVerdictLocked(cur, ok, it.prior, it.entry.Checksum) {
		case readmitFresh:
			rest = append(rest, it)
		case readmitAttach:
			cur.DRAMSlot = int64(it.slot)
			attached, entries = append(attached, it), append(entries, cur)
		case readmitReplace:
			replacing, drops = append(replacing, it), append(drops, it.key)
		default:
			s.keepReadmitLocked(it, cur, res)
		}
	}
	if len(drops) > 0 && s.dropSSDLocked(drops) != nil {
		for _, it := range replacing {
			s.keepReadmitLocked(it, it.prior, res)
		}
		replacing = nil
	}
	s.m.readmitted.WithLabelValues("replaced").Add(float64(len(replacing)))
	s.attachLocked(attached, entries, res)
	return append(rest, replacing...)
}

// attachLocked makes readmitted pages' slots the DRAM copies of their
// entries (same bytes as their SSD copies), in one catalog commit.
func (s *Store) attachLocked(items []*saveItem, entries []catalog.Entry, res []Result) {
	if len(items) == 0 {
		return
	}
	if err := s.cat.Put(entries...); err != nil {
		for i, it := range items {
			s.keepReadmitLocked(it, entries[i], res)
		}
		return
	}
	for _, it := range items {
		s.mu.dram.Promote(it.key) // used again: the protected segment (tiers.LRU)
		res[it.i] = okResult(catalog.TierDRAM)
	}
	s.m.readmitted.WithLabelValues("attached").Add(float64(len(items)))
}

// keepReadmitLocked frees a readmitted page's slot: the page stays as
// stored (cur's tier).
func (s *Store) keepReadmitLocked(it *saveItem, cur catalog.Entry, res []Result) {
	s.m.readmitted.WithLabelValues("kept").Inc()
	if cur.DRAMSlot >= 0 && cur.DRAMSlot == int64(it.slot) {
		cur.DRAMSlot = -1 // our slot, named only in the commit that failed
	}
	res[it.i] = okResult(cur.Tier())
	s.releaseLocked(it)
}

func (s *Store) releaseLocked(it *saveItem) {
	s.pool.Free(it.slot)
	if it.entry.OnSSD {
		s.ssd.Free(it.loc)
	}
}

func (s *Store) freeDRAM(slot dram.Slot) {
	s.mu.Lock()
	s.pool.Free(slot)
	s.mu.Unlock()
}

// A CUDA save's copy into the HBM stage (hbmstage.go).

// stageCopy is a save's copy into the HBM stage of its GPU, running beside
// the save's copy into DRAM (device to device beside device to host: HBM
// and PCIe, neither waits for the other).
type stageCopy struct {
	st    *HBMStage
	pages []stagedPage
	done  chan error
}

// startStage reserves stage slots for the pages a CUDA save is about to
// copy into DRAM (items: not those stored already) and starts their
// device-to-device copy from the engine's blocks, which hold the same bytes
// until the save answers. Best effort: nil when there is no stage or no
// free slot; the save's result never depends on it.
func (s *Store) startStage(ctx context.Context, sess *Engine, reqs []PageReq, items []*saveItem) *stageCopy {
	st := sess.Stage
	if st == nil || len(items) == 0 {
		return nil
	}
	pages := make([]stagedPage, len(items)) // a copy: the DRAM copy reuses items' array
	for k, it := range items {
		pages[k] = stagedPage{i: it.i, key: it.key, gen: 1} // gen: planned; set from the commit
	}
	pages, skipped := st.reserve(pages, sess.PageBytes)
	s.m.staged.WithLabelValues("skipped").Add(float64(skipped))
	if len(pages) == 0 {
		return nil
	}
	sc := &stageCopy{st: st, pages: pages, done: make(chan error, 1)}
	go func() { sc.done <- s.copyToStage(ctx, sess, reqs, sc) }() // planned there too: the DRAM copy starts at once
	return sc
}

// copyToStage plans a stage copy's pages from the engine's blocks into
// their slots and copies them as one device copy. A page that does not
// plan is left out (its generation 0: freed when the save finishes).
func (s *Store) copyToStage(ctx context.Context, sess *Engine, reqs []PageReq, sc *stageCopy) error {
	descs := make([]transfer.Desc, 0, len(sc.pages)*descsPerPage(sess))
	for k := range sc.pages {
		p := &sc.pages[k]
		d, err := sess.Geom.Gather(descs[len(descs):], sess.Bufs, reqs[p.i].Blocks, sc.st.region, sc.st.offsetOf(p.slot))
		if err != nil {
			p.gen = 0
			continue
		}
		descs = append(descs, d...)
	}
	return sess.GPU.CopyFrom(ctx, sess.GPU, descs) // into the stage of the session's own GPU
}

// finishStage waits for a save's stage copy (bounded: the copy's own
// deadline) and publishes the pages the save committed fresh into DRAM,
// with the generation the catalog still holds for them; the other slots
// (failed, readmissions settled on the SSD copy, replaced meanwhile) are
// freed.
func (s *Store) finishStage(sc *stageCopy, items []*saveItem, res []Result) {
	if sc == nil {
		return
	}
	err := <-sc.done
	gens := make(map[int]uint64, len(items))
	for _, it := range items {
		if res[it.i].Code == CodeOK {
			gens[it.i] = it.entry.Generation
		}
	}
	n := s.committedGens(sc.pages, gens)
	sc.st.filled(sc.pages, err)
	switch {
	case err != nil:
		s.m.staged.WithLabelValues("failed").Add(float64(n))
		s.log.Debug().Err(err).Int("device", sc.st.Ordinal).Int("pages", len(sc.pages)).Msg("hbm stage: copy failed; the pages load from dram")
	default:
		s.m.staged.WithLabelValues("staged").Add(float64(n))
	}
}

// committedGens sets each planned page's generation to the one its save
// committed, where the catalog still holds it in DRAM, else 0, and counts
// the pages kept.
func (s *Store) committedGens(pages []stagedPage, gens map[int]uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k := range pages {
		p := &pages[k]
		g, ok := gens[p.i]
		if e, in := s.cat.Get(p.key); p.gen == 0 || !ok || !in || e.Generation != g || e.DRAMSlot < 0 {
			p.gen = 0
			continue
		}
		p.gen = g
		n++
	}
	return n
}
